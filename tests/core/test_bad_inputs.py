"""The catalogue of bad inputs (docs/faults.md, "Inputs, files and cache").

Every row is refused with one line that names it as its user wrote it, or has the
behaviour the page documents. Command-line rows run ``main()`` (rc 2, one
``flashspec: error:`` line, no traceback); config rows run through the command line and,
where the check needs no torch, through :func:`check_config_file` and :func:`check_components`
against the plugins' light catalogue too, as the command line runs them before torch is
imported (tests/core/test_catalogue.py shows that path imports no torch); API rows call ``Pipeline.generate`` on a tiny
pipeline. The --log-json rows are in test_cli.py, the model-cache rows in
tests/models/test_weights.py.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_lm

from flashspec_core import machine
from flashspec_core.build import build_pipeline, load_pipeline
from flashspec_core.cli import main
from flashspec_core.config import BoundsError, ConfigError, check_components, check_config_file
from flashspec_core.pipeline import Pipeline
from flashspec_core.registry import build_catalogue

RULES = {
    "max_new_tokens": "must be an integer >= 1",
    "temperature": "must be a finite number >= 0",
    "top_k": "must be an integer >= 0 (0 = off)",
    "top_p": "must be a number in (0, 1]",
    "seed": "must be an integer in [0, 2**64)",
}
NAN, INF = math.nan, math.inf
BAD: list[tuple[str, object]] = [  # every sampling parameter beyond its bounds, or of the wrong type
    ("max_new_tokens", 0), ("max_new_tokens", -1), ("max_new_tokens", 1.5), ("max_new_tokens", 2.0),
    ("max_new_tokens", INF), ("max_new_tokens", "ten"),
    ("temperature", -1), ("temperature", -0.1), ("temperature", NAN), ("temperature", INF), ("temperature", -INF),
    ("temperature", "hot"),
    ("top_k", -1), ("top_k", 1.5), ("top_k", NAN), ("top_k", "all"),
    ("top_p", 0), ("top_p", 0.0), ("top_p", -0.5), ("top_p", 1.0000001), ("top_p", 2), ("top_p", NAN), ("top_p", INF),
    ("top_p", "most"),
    ("seed", -1), ("seed", 2**64), ("seed", 1.5), ("seed", "lucky"),
]
NOT_ON_THE_COMMAND_LINE: list[tuple[str, object]] = [  # a TOML or Python bool is not a number
    ("max_new_tokens", True), ("temperature", False), ("top_k", True), ("top_p", True), ("seed", False),
]
AT_THE_BOUNDS = {"max_new_tokens": 1, "temperature": 0, "top_k": 0, "top_p": 1, "seed": 2**64 - 1}
JUST_INSIDE = {"max_new_tokens": 2, "temperature": 1e300, "top_k": 10**6, "top_p": 5e-324, "seed": 0}


def _id(row: tuple[str, object]) -> str:
    return f"{row[0]}={row[1]!r}"


def _cli_text(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return str(value)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return repr(value)


def _toml(data: dict[str, Any]) -> str:
    """Just enough TOML for these configs: scalars, tables and arrays of tables."""
    lines = [f"{k} = {_toml_value(v) if not isinstance(v, list) else '[' + ', '.join(map(_toml_value, v)) + ']'}"
             for k, v in data.items() if not isinstance(v, dict) and not _is_tables(v)]
    for name, table in data.items():
        for t in [table] if isinstance(table, dict) else table if _is_tables(table) else []:
            lines.append(f"[[{name}]]" if _is_tables(table) else f"[{name}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in t.items()]
    return "\n".join(lines) + "\n"


def _is_tables(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    tiny_lm(root / "target", vocab=16, scale=4.0)
    tiny_lm(root / "draft", vocab=16, seed=3, scale=4.0)
    tiny_lm(root / "other-tokens", vocab=16, seed=3, scale=4.0, tokenizer_prefix="u")
    return root


def _base(models: Path) -> dict[str, Any]:
    return {
        "target": {"model": str(models / "target"), "dtype": "float32"},
        "arm": [{"use": "hf", "model": str(models / "draft"), "gamma": 3}, {"use": "prompt_lookup", "gamma": 4}],
        "selector": {"use": "ucb1"},
        "generation": {"max_new_tokens": 4},
    }


@pytest.fixture(scope="module")
def pipe(models: Path) -> Pipeline:
    return build_pipeline(_base(models))


def _one_error_line(err: str) -> str:
    """The single ``flashspec: error:`` line of a failed run's stderr (progress lines may precede it)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("flashspec: error: ")]
    assert len(errors) == 1, err
    return errors[0].removeprefix("flashspec: error: ")


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], alone: bool = True) -> str:
    """The error line of a run that fails with rc 2; ``alone``: nothing else on stderr (no model was loaded)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    line = _one_error_line(err)
    assert not alone or err.count("\n") == 1, err
    return line


# --- sampling parameters: the command line, a config's [generation] table, the Python API ---------


@pytest.mark.parametrize("row", BAD, ids=_id)
def test_option_out_of_bounds(row: tuple[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    key, value = row
    option = "--" + key.replace("_", "-")
    text = _cli_text(value)
    # argparse reads "-inf" after a space as an option; "-1" and "-0.5" it reads as values
    argv = [f"{option}={text}"] if text == "-inf" else [option, text]
    assert main(["generate", "t1", *argv]) == 2
    assert capsys.readouterr().err == f"flashspec: error: {option} {RULES[key]}, got {value!r}\n"  # nothing before it


@pytest.mark.parametrize("row", BAD + NOT_ON_THE_COMMAND_LINE, ids=_id)
def test_generation_key_out_of_bounds(
    row: tuple[str, object], models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, value = row
    path = tmp_path / "bad.toml"
    path.write_text(_toml({**_base(models), "generation": {key: value}}))
    read = float(value) if key in ("temperature", "top_p") and type(value) is int else value  # TOML 1 -> 1.0
    expected = f"{path}: [generation] key {key!r}: {key} {RULES[key]}, got {read!r}"
    with pytest.raises(ConfigError) as info:
        check_config_file(path)  # needs no plugin: refused before torch
    assert str(info.value) == expected
    assert _refused(["generate", "t1", "--config", str(path)], capsys) == expected


@pytest.mark.parametrize("row", BAD + NOT_ON_THE_COMMAND_LINE, ids=_id)
def test_generate_argument_out_of_bounds(row: tuple[str, object], pipe: Pipeline) -> None:
    key, value = row
    with pytest.raises(BoundsError) as info:
        pipe.generate(["t1"], **{key: value})  # type: ignore[arg-type]
    assert str(info.value) == f"{key} {RULES[key]}, got {value!r}" and info.value.key == key


@pytest.mark.parametrize("values", [AT_THE_BOUNDS, JUST_INSIDE], ids=["at-the-bounds", "just-inside"])
def test_values_at_the_bounds_are_accepted(
    values: dict[str, Any], pipe: Pipeline, models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = pipe.generate(["t1 t2"], **values)
    assert 1 <= len(result.token_ids[0]) <= values["max_new_tokens"]
    path = tmp_path / "edge.toml"
    path.write_text(_toml({**_base(models), "generation": values}))
    check_config_file(path)
    options = [a for k, v in values.items() for a in ("--" + k.replace("_", "-"), str(v))]
    assert main(["generate", "t1 t2", "--config", str(path), *options]) == 0, capsys.readouterr().err


# --- config keys: wrong type, out of range, unknown name -----------------------------------------

Edit = Callable[[dict[str, Any]], None]


def _set(table: str, key: str, value: object, arm: int = 0) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        (data["arm"][arm] if table == "arm" else data.setdefault(table, {}))[key] = value

    return edit


def _drop(table: str, key: str | None = None) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        if key is None:
            del data[table]
        else:
            del data["arm"][0][key]

    return edit


def _whole(name: str, value: object) -> Edit:
    return lambda data: data.__setitem__(name, value)


def _parent_dir(table: str) -> Edit:
    """``model`` set to the directory holding the tiny checkpoints: it exists but has no config.json."""
    def edit(data: dict[str, Any]) -> None:
        keys = data[table] if table != "arm" else data["arm"][0]
        keys["model"] = str(Path(keys["model"]).parent)

    return edit


# (id, edit, "[table] key 'k'" the line names, a fragment of its message, refused before torch)
CONFIG_ROWS: list[tuple[str, Edit, str, str, bool]] = [
    ("unknown-table", _whole("targets", {"model": "x"}), "[targets]", "unknown table", True),
    ("no-arm", _drop("arm"), "[arm]", 'at least one [[arm]] table is required (one with use = "none" alone', True),
    ("arm-not-a-table", _whole("arm", [3]), "[arm.0]", "each [[arm]] must be a table", True),
    ("gamma-string", _set("arm", "gamma", "4"), "[arm.0] key 'gamma'", "must be an integer, got '4'", True),
    ("gamma-float", _set("arm", "gamma", 1.5), "[arm.0] key 'gamma'", "must be an integer, got 1.5", True),
    ("gamma-bool", _set("arm", "gamma", True), "[arm.0] key 'gamma'", "must be an integer, got True", True),
    ("gamma-zero", _set("arm", "gamma", 0), "[arm.0] key 'gamma'", "must be in 1..64 for draft 'hf', got 0", True),
    ("gamma-65", _set("arm", "gamma", 65), "[arm.0] key 'gamma'", "must be in 1..64 for draft 'hf', got 65", True),
    ("gamma-negative", _set("arm", "gamma", -1), "[arm.0] key 'gamma'", "got -1", True),
    ("arm-name-space", _set("arm", "name", "a b"), "[arm.0] key 'name'", "must be a word", True),
    ("arm-name-int", _set("arm", "name", 3), "[arm.0] key 'name'", "must be a word", True),
    ("arm-names-clash", lambda d: [a.__setitem__("name", "x") for a in d["arm"]], "[arm] key 'name'",
     "arm names must be unique", True),
    ("select-string", _set("arm", "select", "yes"), "[arm.0] key 'select'", "must be true or false", True),
    ("fallback-int", _set("arm", "fallback", 3), "[arm.0] key 'fallback'", "must be another arm's name", True),
    ("fallback-unknown", _set("arm", "fallback", "nope"), "[arm.0] key 'fallback'", "must name another arm", True),
    ("use-int", _set("arm", "use", 3), "[arm.0] key 'use'", "must be a component's name (a string), got 3", True),
    ("use-unknown", _set("arm", "use", "hff"), "[arm.0] key 'use'", "hff", True),
    ("use-missing", _drop("arm", "use"), "[arm.0] key 'use'", "missing: name a draft component", True),
    ("arm-unknown-key", _set("arm", "gama", 3), "[arm.0] key 'gama'",
     "; the arm's own: use, gamma, name, fallback, select; did you mean 'gamma'?", True),
    ("target-use-int", _set("target", "use", 1), "[target] key 'use'", "must be a component's name", True),
    ("target-use-unknown", _set("target", "use", "tf"), "[target] key 'use'", "tf", True),
    ("target-unknown-key", _set("target", "modle", "x"), "[target] key 'modle'", "unknown key for target 'hf'", True),
    ("target-dtype", _set("target", "dtype", "float8"), "[target] key 'dtype'",
     "'dtype' must be in ('auto', 'float32', 'float64', 'bfloat16', 'float16') (got 'float8')", True),
    ("target-model-missing", _set("target", "model", "/nowhere/model"), "[target] key 'model'",
     "is neither an existing directory nor a known model name (known: smollm2-135m-instruct, ", True),
    ("target-model-no-config", _parent_dir("target"), "[target] key 'model'",
     "has no config.json (a Hugging Face checkpoint directory holds it beside the weights)", True),
    ("arm-model-no-config", _parent_dir("arm"), "[arm.0] key 'model'", "has no config.json", True),
    ("device-not-a-device", _set("target", "device", "tpu"), "[target] key 'device'", "is not a torch device", True),
    ("device-meta", _set("target", "device", "meta"), "[target] key 'device'",
     "device 'meta' is not a torch device FlashSpec runs on ('cpu', 'cuda', 'mps', 'xpu'", True),
    # a component key of the wrong type: refused by its annotated type, before any validator sees it
    ("model-int", _set("target", "model", 3), "[target] key 'model'", "model must be a string, got 3", True),
    ("model-empty", _set("target", "model", ""), "[target] key 'model'", "model is required", True),
    ("device-int", _set("target", "device", 3), "[target] key 'device'", "device must be a string, got 3", True),
    ("arm-device-list", _set("arm", "device", ["cpu"]), "[arm.0] key 'device'",
     "device must be a string, got ['cpu']", True),
    ("device-map-int", _set("target", "device_map", 1), "[target] key 'device_map'",
     "device_map must be a string or left out, got 1", True),
    ("chat-template-string", _set("target", "chat_template", "yes"), "[target] key 'chat_template'",
     "chat_template must be true or false, got 'yes'", True),
    ("tree-width-int", _set("arm", "tree_width", 3), "[arm.0] key 'tree_width'",
     "tree_width must be a list of integers, got 3", True),
    ("tree-depth-float", _set("arm", "tree_depth", 2.5), "[arm.0] key 'tree_depth'",
     "tree_depth must be an integer, got 2.5", True),
    ("ngram-float", _set("arm", "max_ngram", 2.5, arm=1), "[arm.1] key 'max_ngram'",
     "max_ngram must be an integer, got 2.5", True),
    ("ngram-string", _set("arm", "min_ngram", "2", arm=1), "[arm.1] key 'min_ngram'",
     "min_ngram must be an integer, got '2'", True),
    ("fill-int", _set("arm", "fill", 3, arm=1), "[arm.1] key 'fill'", "fill must be true or false, got 3", True),
    ("selector-number-string", _set("selector", "c", "2"), "[selector] key 'c'", "c must be a number, got '2'", True),
    ("verifier-unknown", _set("verifier", "use", "strict"), "[verifier] key 'use'", "strict", True),
    ("reward-unknown", _set("selector", "reward", "speed"), "[selector] key 'reward'", "must be one of", True),
    ("batch-zero", _set("selector", "speculate_max_batch", 0), "[selector] key 'speculate_max_batch'",
     "must be an integer >= 1", True),
    ("batch-float", _set("selector", "speculate_max_batch", 1.5), "[selector] key 'speculate_max_batch'",
     "must be an integer >= 1", True),
    ("draw-ahead-string", _set("selector", "draw_ahead", "yes"), "[selector] key 'draw_ahead'",
     "must be true or false", True),
    ("first-unknown", _set("selector", "first", "nope"), "[selector] key 'first'", "must name an arm", True),
    ("first-explore-negative", _set("selector", "first_explore", -1), "[selector] key 'first_explore'",
     "must be an integer >= 0", True),
    ("first-explore-bool", _set("selector", "first_explore", True), "[selector] key 'first_explore'",
     "must be an integer >= 0", True),
    ("first-tokens-one", _set("selector", "first_tokens", 1), "[selector] key 'first_tokens'",
     "must be an integer >= 2", True),
    ("first-tokens-without-first", _set("selector", "first_tokens", 128), "[selector] key 'first_tokens'",
     "names no first arm", True),
    ("selector-unknown", _set("selector", "use", "ucb2"), "[selector] key 'use'", "ucb2", True),
    ("fixed-arm-out-of-range", lambda data: data.__setitem__("selector", {"use": "fixed", "arm": 5}),
     "[selector] key 'arm'", "must be below the number of arms the selector chooses between (", True),
    ("selector-unknown-key", _set("selector", "window", 3), "[selector] key 'window'", "unknown key", True),
    ("generation-unknown-key", _set("generation", "temprature", 1.0), "[generation] key 'temprature'",
     "unknown key for generation settings", True),
    ("generation-not-a-table", _whole("generation", 3), "[generation]", "must be a table, got int", True),
]


@pytest.mark.parametrize(("edit", "where", "fragment", "early"), [r[1:] for r in CONFIG_ROWS], ids=[r[0] for r in CONFIG_ROWS])
def test_bad_config_key(
    edit: Edit, where: str, fragment: str, early: bool, models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = _base(models)
    edit(data)
    path = tmp_path / "bad.toml"
    path.write_text(_toml(data))
    line = _refused(["generate", "t1", "--config", str(path)], capsys)  # one line: no model was loaded
    assert line.startswith(f"{path}: {where}: ") and fragment in line, line
    assert "Attribute(" not in line, line  # attrs' own repr is not for users
    if early:
        with pytest.raises(ConfigError) as info:
            _check_before_torch(path, monkeypatch)
        assert str(info.value) == line
    else:  # needs torch (a device the machine has): refused after that import
        _check_before_torch(path, monkeypatch)


@pytest.mark.parametrize("table", ["target", "arm"])
def test_checkpoint_directory_without_weights(
    table: str, models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A directory with a checkpoint's config.json but no weight file (an interrupted copy): named before torch."""
    data = _base(models)
    keys = data[table] if table != "arm" else data["arm"][0]
    weightless = tmp_path / "ckpt"
    weightless.mkdir()
    shutil.copy(Path(keys["model"]) / "config.json", weightless / "config.json")
    keys["model"] = str(weightless)
    path = tmp_path / "bad.toml"
    path.write_text(_toml(data))
    line = _refused(["generate", "t1", "--config", str(path)], capsys)
    where = "[target]" if table == "target" else "[arm.0]"
    assert line.startswith(f"{path}: {where} key 'model': ") and f"the directory {weightless} has a config.json but no weights" in line, line
    with pytest.raises(ConfigError) as info:
        _check_before_torch(path, monkeypatch)
    assert str(info.value) == line


def _check_before_torch(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's checks before its torch import, with torch unimportable as if not loaded yet."""
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "torch", None)  # type: ignore[arg-type]
        check_components(check_config_file(path), build_catalogue(autoload=False), str(path), path.parent)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "file not found"),
        ("directory", "is a directory, not a config file"),
        (b"[target\n", "not valid TOML"),
        (b'[target]\nmodel = "caf\xe9"\n', "not valid UTF-8 (byte 0xe9 at offset 21)"),
    ],
    ids=["missing", "a-directory", "not-toml", "not-utf-8"],
)
def test_bad_config_file(content: bytes | str | None, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.toml"
    if content == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    line = _refused(["generate", "t1", "--config", str(path)], capsys)
    assert line.startswith(f"{path}: [-]: {message}"), line


# --- devices, prompts, tokenizers ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this machine has a cuda:7")
@pytest.mark.parametrize("table", ["target", "arm"])
def test_device_the_machine_lacks(table: str, models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused when the config is read, before any model loads, naming the devices there are."""
    data = _base(models)
    (data["target"] if table == "target" else data["arm"][0])["device"] = "cuda:7"
    path = tmp_path / "cuda7.toml"
    path.write_text(_toml(data))
    line = _refused(["generate", "t1", "--config", str(path)], capsys)
    where = "[target]" if table == "target" else "[arm.0]"
    assert line.startswith(f"{path}: {where} key 'device': device 'cuda:7' is not on this machine: "), line
    if not torch.cuda.is_available():
        assert line.endswith("torch sees no cuda device (use \"cpu\" or \"auto\")"), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="the triton verifier runs on this machine")
def test_triton_verifier_without_a_gpu(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(machine, "no_cuda", lambda: None)  # where CUDA may be there, the build decides
    path = tmp_path / "triton.toml"
    path.write_text(_toml({**_base(models), "verifier": {"use": "triton"}}))
    line = _refused(["generate", "t1", "--config", str(path)], capsys, alone=False)
    assert line.startswith("the 'triton' verifier runs on a CUDA GPU and the target is on cpu: use verifier "
                           "'reference'"), line


def test_prompt_with_control_characters_is_passed_on(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Documented: tabs, NUL, ESC... go to the tokenizer as they are (this one splits on whitespace)."""
    path = tmp_path / "ok.toml"
    path.write_text(_toml(_base(models)))
    assert main(["generate", "t1\x00\x07\x1b[31m\tt2", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip()


def test_prompt_that_is_not_utf8(models: Path, tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(_toml(_base(models)))
    cmd = [sys.executable.encode(), b"-m", b"flashspec_core.cli", b"generate", b"t1\xff t2", b"--config", bytes(path)]
    out = subprocess.run(cmd, capture_output=True)
    assert out.returncode == 2
    assert out.stderr == b"flashspec: error: the prompt is not valid UTF-8 (byte 0xff at character 2)\n"


def test_api_prompt_that_is_not_utf8(pipe: Pipeline) -> None:
    with pytest.raises(ValueError, match=r"^prompt is not valid UTF-8 \(lone surrogate U\+D800 at character 3\)$"):
        pipe.generate(["t1 \ud800"])


@pytest.mark.parametrize(("prompt", "what"), [("", "empty"), (" \n\t ", "only whitespace (4 characters)")],
                         ids=["empty", "whitespace"])
def test_empty_prompt(prompt: str, what: str, pipe: Pipeline, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before torch is imported (a chat template would turn it into tokens to answer)."""
    config = "/nowhere.toml"  # never read: the prompt is refused first
    assert _refused(["generate", prompt, "--config", config], capsys) == f"the prompt is {what}: give the text to continue"
    with pytest.raises(ValueError, match=rf"^prompt is {re.escape(what)}: give the text to continue$"):
        pipe.generate([prompt])


def test_prompt_that_gives_no_token(pipe: Pipeline) -> None:
    with pytest.raises(ValueError, match=r"^empty prompt: at least one token is needed$"):
        pipe.generate([[]])


def test_bare_string_is_one_prompt(pipe: Pipeline) -> None:
    bare = pipe.generate("t1 t2 t3", max_new_tokens=3)
    listed = pipe.generate(["t1 t2 t3"], max_new_tokens=3)
    assert len(bare.texts) == 1 and bare.token_ids == listed.token_ids


@pytest.mark.parametrize(("prompts", "message"), [
    ([], "prompts must be a non-empty list of prompts"),
    ([1, 2, 3], "prompts is a list of token ids, not of prompts: pass [ids] for one prompt of ids"),
    ([[1.5, 3]], "prompt token ids must be integers, got 1.5 at position 0"),  # int() would make it 1
    ([[2, True]], "prompt token ids must be integers, got True at position 1"),
    ([b"t1 t2"], "a prompt is bytes: decode it to a string"),  # one token id per byte otherwise
    ([None], "a prompt must be a string or a list of token ids, got None"),
], ids=["no-prompts", "flat-token-ids", "float-id", "bool-id", "bytes", "none"])
def test_prompts_that_are_not_a_list_of_prompts(prompts: Any, message: str, pipe: Pipeline) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        pipe.generate(prompts)


def test_prompt_longer_than_the_context(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused before the prefill, naming the prompt's length and the context's (tiny models: 512)."""
    from flashspec_hf.target import HFTarget

    monkeypatch.setattr(HFTarget, "prefill", lambda *args: pytest.fail("the prompt was prefilled"))
    path = tmp_path / "ok.toml"
    path.write_text(_toml(_base(models)))
    line = _refused(["generate", " ".join(["t1"] * 600), "--config", str(path)], capsys, alone=False)
    assert line == ("a prompt of 600 tokens plus max_new_tokens = 4 plus 4 draft slots exceeds the target's "
                    "context of 512 tokens"), line


def test_draft_with_another_tokenizer(models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _base(models)
    data["arm"][0]["model"] = str(models / "other-tokens")
    path = tmp_path / "mismatch.toml"
    path.write_text(_toml(data))
    line = _refused(["generate", "t1", "--config", str(path)], capsys, alone=False)
    assert line.startswith(f"draft {str(models / 'other-tokens')!r} does not share the target's tokenizer"), line
    with pytest.raises(ValueError, match="does not share the target's tokenizer"):
        load_pipeline(path)
