"""The command line, on a tiny model (and once on a real one, marked real_model)."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _tiny import tiny_lm

from flashspec_core import cli
from flashspec_core.cli import bundled_config, main


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    tiny_lm(root / "target", vocab=16, scale=4.0)
    tiny_lm(root / "draft", vocab=16, seed=3, scale=4.0)
    path = root / "tiny.toml"
    path.write_text(
        '[target]\nmodel = "target"\ndtype = "float32"\n'
        '[[arm]]\nuse = "hf"\nmodel = "draft"\ngamma = 3\n'
        '[[arm]]\nuse = "prompt_lookup"\ngamma = 4\n'
        '[selector]\nuse = "ucb1"\n'
        "[generation]\nmax_new_tokens = 12\n"
    )
    return path


def test_generate_streams_text_and_writes_json_log(tiny_config: Path, tmp_path: Path, capsys) -> None:
    log = tmp_path / "steps.jsonl"
    code = main(["generate", "t1 t2 t3 t1 t2", "--config", str(tiny_config), "--log-json", str(log), "--seed", "4"])
    assert code == 0
    captured = capsys.readouterr()
    assert captured.out.strip()  # the generated words
    assert "tokens/s" in captured.err and "mean accepted length" in captured.err
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [entry for entry in lines if entry["event"] == "step"]
    assert steps and all("run_id" in e and "accepted" in e and "verify_ms" in e for e in steps)
    assert lines[-1]["event"] == "summary"


def test_bad_input_is_one_clear_line(tiny_config: Path, capsys) -> None:
    assert main(["generate", "t1", "--config", str(tiny_config), "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "flashspec: error: --temperature must be a finite number >= 0, got -1\n"
    assert "Traceback" not in err
    assert main(["generate", "t1", "--config", "/nowhere.toml"]) == 2
    assert "/nowhere.toml: [-]: file not found" in capsys.readouterr().err


def _run(tiny_config: Path, *extra: str) -> int:
    return main(["generate", "t1 t2 t3 t1 t2", "--config", str(tiny_config), "--seed", "4", *extra])


def _steps(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def _absolute(tiny_config: Path, dest: Path) -> Path:
    """A copy of the tiny config at ``dest`` whose model paths do not depend on its folder."""
    text = tiny_config.read_text()
    for model in ("target", "draft"):
        text = text.replace(f'"{model}"', f'"{tiny_config.parent / model}"')
    dest.write_text(text)
    return dest


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError("device lost")], ids=["interrupt", "error"])
def test_failed_run_leaves_the_log_as_it_was(
    tiny_config: Path, tmp_path: Path, monkeypatch, capsys, failure: BaseException
) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("an earlier run\n")

    def fail(self: object, row: int, new: list[int]) -> None:
        raise failure  # after the first step's log line was written

    monkeypatch.setattr(cli._Streamer, "__call__", fail)
    assert _run(tiny_config, "--log-json", str(log)) == (130 if failure is KeyboardInterrupt else 2)
    assert log.read_text() == "an earlier run\n" and list(tmp_path.iterdir()) == [log]
    if failure is not KeyboardInterrupt:
        assert capsys.readouterr().err.endswith("flashspec: error: device lost\n")


def test_bad_config_leaves_the_log_as_it_was(tiny_config: Path, tmp_path: Path, capsys) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("an earlier run\n")
    broken = _absolute(tiny_config, tmp_path / "broken.toml")
    broken.write_text(broken.read_text().replace("max_new_tokens = 12", "max_new_tokens = 0"))
    assert main(["generate", "t1", "--config", str(broken), "--log-json", str(log)]) == 2
    assert "[generation] key 'max_new_tokens'" in capsys.readouterr().err
    assert log.read_text() == "an earlier run\n" and sorted(tmp_path.iterdir()) == [broken, log]


def test_log_replaces_the_file_keeping_its_mode(tiny_config: Path, tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    log.write_text("an earlier run\n")
    log.chmod(0o640)
    assert _run(tiny_config, "--log-json", str(log)) == 0
    lines = _steps(log.read_text())
    assert lines[0]["event"] == "step" and lines[-1]["event"] == "summary"
    assert log.stat().st_mode & 0o777 == 0o640 and list(tmp_path.iterdir()) == [log]


def test_append_adds_a_runs_lines(tiny_config: Path, tmp_path: Path) -> None:
    log = tmp_path / "steps.jsonl"
    assert _run(tiny_config, "--log-json", str(log), "--append") == 0  # a missing file is created
    first = log.read_text()
    assert _run(tiny_config, "--log-json", str(log), "--append") == 0
    both = _steps(log.read_text())
    assert log.read_text().startswith(first) and len(both) == 2 * len(_steps(first))
    assert len({e["run_id"] for e in both}) == 2 and list(tmp_path.iterdir()) == [log]


@pytest.mark.parametrize("append", [False, True], ids=["replace", "append"])
def test_log_to_a_pipe_writes_into_it(tiny_config: Path, tmp_path: Path, append: bool) -> None:
    """A FIFO (like /dev/stdout or /dev/null) gets the lines and stays what it was: a rename
    over it would make it a plain file, which for /dev/null as root damages the machine."""
    fifo = tmp_path / "steps.fifo"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert _run(tiny_config, "--log-json", str(fifo), *(["--append"] if append else [])) == 0
    reader.join(timeout=60)
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and list(tmp_path.iterdir()) == [fifo]
    lines = _steps(got[0])
    assert lines[0]["event"] == "step" and lines[-1]["event"] == "summary"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{config}", "--log-json {config}: is the input file {config}; refusing to overwrite it"),
        ("{tmp}/link.toml", "--log-json {tmp}/link.toml: is the input file {config}; refusing to overwrite it"),
        ("{tmp}", "--log-json {tmp}: is a directory"),
        ("{tmp}/no/such/dir/log.jsonl", "--log-json {tmp}/no/such/dir/log.jsonl: directory {tmp}/no/such/dir does not exist"),
    ],
    ids=["the-config", "a-link-to-the-config", "a-directory", "no-directory"],
)
def test_unusable_log_path_is_refused_first(tiny_config: Path, tmp_path: Path, capsys, target: str, message: str) -> None:
    config = _absolute(tiny_config, tmp_path / "tiny.toml")
    (tmp_path / "link.toml").symlink_to(config)
    before = config.read_text()
    fields = {"config": config, "tmp": tmp_path}
    assert main(["generate", "t1", "--config", str(config), "--log-json", target.format(**fields)]) == 2
    err = capsys.readouterr().err
    assert err == f"flashspec: error: {message.format(**fields)}\n"
    assert config.read_text() == before


def test_a_verifier_that_is_not_exact_is_announced(tiny_config: Path, tmp_path: Path, capsys) -> None:
    """The synthetic verifier accepts by a fixed rate: its text is not the target's, so the run says so."""
    config = _absolute(tiny_config, tmp_path / "synthetic.toml")
    config.write_text(config.read_text() + '[verifier]\nuse = "synthetic"\n')
    assert main(["generate", "t1 t2", "--config", str(config), "--max-new-tokens", "3"]) == 0
    err = capsys.readouterr().err
    assert ("[flashspec] warning: verifier 'synthetic' is not exact (timing studies only): the text below is not "
            "what the target would generate\n[flashspec] generating\n") in err, err


def test_a_prompt_that_starts_with_a_dash(tiny_config: Path, capsys) -> None:
    """argparse reads "-hello" as -h with 'ello': the error says to put the prompt after '--', which works."""
    with pytest.raises(SystemExit) as info:
        main(["generate", "-hello", "--config", str(tiny_config)])
    err = capsys.readouterr().err.splitlines()[-1]
    assert info.value.code == 2 and err.endswith("; a prompt that starts with '-' goes after '--': "
                                                 "flashspec generate [options] -- '-text'"), err
    assert main(["generate", "--config", str(tiny_config), "--max-new-tokens", "2", "--", "-hello"]) == 0


def test_append_needs_a_log(tiny_config: Path, capsys) -> None:
    assert main(["generate", "t1", "--config", str(tiny_config), "--append"]) == 2
    assert capsys.readouterr().err == "flashspec: error: --append needs --log-json FILE\n"


def test_bad_option_fails_fast_without_torch(tmp_path: Path) -> None:
    """The acceptance check: an out-of-range option is refused before torch is imported, in < 2 s."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys\n"
        "from flashspec_core import cli\n"
        "real = cli.check_generation\n"
        "def spy(values, label=str):\n"
        "    try:\n"
        "        return real(values, label)\n"
        "    finally:\n"
        "        print('heavy at the check:', sorted({'torch', 'transformers', 'triton'} & set(sys.modules)), file=sys.stderr)\n"
        "cli.check_generation = spy\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    start = time.perf_counter()
    out = subprocess.run([sys.executable, str(probe), "generate", "x", "--top-p", "2"], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    assert out.returncode == 2 and elapsed < 2.0, (out.returncode, elapsed)
    assert out.stderr == "heavy at the check: []\nflashspec: error: --top-p must be a number in (0, 1], got 2\n"
    cmd = [sys.executable, "-X", "importtime", "-m", "flashspec_core.cli", "generate", "x", "--top-p", "2"]
    trace = subprocess.run(cmd, capture_output=True, text=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in trace.stderr.splitlines() if line.startswith("import time:")}
    assert trace.returncode == 2 and "flashspec_core.config" in imported
    assert not {"torch", "transformers", "triton"} & imported  # the whole run, not only up to the check


def test_version_without_torch() -> None:
    cmd = [sys.executable, "-X", "importtime", "-m", "flashspec_core.cli", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert out.returncode == 0 and out.stdout == "flashspec 0.1.0\n", out
    assert not {"torch", "transformers", "triton"} & imported


_BENCH = ["--workload", "{tmp}/w.jsonl", "--config", "{tmp}/run.toml", "--out", "{tmp}/out"]
# Each command's bad arguments, with the one line it prints: argparse's own (rc 2) and the
# command's checks of values, files and the config (rc 2 too, through main's handler).
BAD_ARGUMENTS = [
    (["generate", "x", "--bogus"], "flashspec: error: unrecognized arguments: --bogus"),
    (["plugins", "--bogus"], "flashspec: error: unrecognized arguments: --bogus"),
    (["serve", "--bogus"], "flashspec serve: error: unrecognized arguments: --bogus"),
    (["serve", "--port", "http"], "flashspec serve: error: argument --port: must be an integer, got 'http'"),
    (["bench", *_BENCH, "--bogus"], "flashspec bench: error: unrecognized arguments: --bogus"),
    (["bench", "--workload", "w.jsonl"], "flashspec bench: error: the following arguments are required: --config, --out"),
    (["bench", *_BENCH, "--batch-size", "x"], "flashspec bench: error: argument --batch-size: invalid int value: 'x'"),
    (["bench", *_BENCH, "--synthetic-gammas", "4,x"],
     "flashspec bench: error: argument --synthetic-gammas: expected a comma list of integers, got '4,x'"),
    (["bench", *_BENCH[:5], "{tmp}/w.jsonl"],
     "flashspec: error: --out {tmp}/w.jsonl: is not a folder (bench.json is written in it)"),
    (["bench", *_BENCH, "--batch-size", "0"], "flashspec: error: --batch-size must be an integer >= 1, got 0"),
    (["bench", *_BENCH, "--temperature", "nan"], "flashspec: error: --temperature must be a finite number >= 0, got nan"),
    (["bench", *_BENCH, "--systems", "flashspec,hf_eagre"],
     "flashspec: error: --systems: unknown systems ['hf_eagre']; choose from flashspec, target_only, hf_eager, "
     "hf_compiled, hf_assisted, hf_lookup"),
    (["bench", *_BENCH[:1], "{tmp}/missing.jsonl", *_BENCH[2:]],
     "flashspec: error: --workload {tmp}/missing.jsonl: No such file or directory"),
    (["bench", *_BENCH, "--dtype", "fp16"],
     "flashspec: error: {tmp}/run.toml: [target] key 'dtype': 'dtype' must be in ('auto', 'bf16', 'bfloat16', "
     "'float16', 'float32', 'float64') (got 'fp16')"),
    (["bandit-sim", "--bogus"], "flashspec bandit-sim: error: unrecognized arguments: --bogus"),
    (["bandit-sim", "--horizon", "x"], "flashspec bandit-sim: error: argument -T/--horizon: invalid int value: 'x'"),
    (["bandit-sim", "--seeds", "0"], "flashspec bandit-sim: error: --horizon and --seeds must be >= 1"),
    (["bandit-sim", "--selectors", "ucb1,ucb2"],
     "flashspec bandit-sim: error: unknown selector 'ucb2'; known: discounted_thompson, factored, fixed, glr_thompson, "
     "request_thompson, sliding_window_ucb, thompson, ucb1"),
    (["bandit-sim", "--set", "ucb1.cc=2"], "flashspec bandit-sim: error: --set ucb1.cc: selector 'ucb1' has no key 'cc'; "
                                           "its keys: c"),
    (["bandit-sim", "--set", "fixed.arm=1"], "flashspec bandit-sim: error: --set fixed.arm: selector 'fixed' is not "
                                             "among --selectors (ucb1, thompson, sliding_window_ucb, discounted_thompson)"),
    (["bandit-sim", "--set", "sliding_window_ucb.window=-3"],
     "flashspec bandit-sim: error: selector 'sliding_window_ucb': window must be an integer >= 1, got -3"),
]


def test_every_command_has_a_bad_argument_case() -> None:
    assert {argv[0] for argv, _ in BAD_ARGUMENTS} == {"generate", "plugins", *cli.commands()}


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS, ids=[" ".join(a[:2]) + "-" + a[-1] for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_fail_fast_without_torch(tmp_path: Path, argv: list[str], message: str) -> None:
    """Every command refuses a bad argument in one line, in < 2 s, before torch, transformers or triton is imported."""
    (tmp_path / "w.jsonl").write_text('{"prompt": "hello"}\n')
    (tmp_path / "run.toml").write_text('[target]\nuse = "fast"\nmodel = "shape:qwen2.5-0.5b"\n'
                                       '[[arm]]\nuse = "fast"\nmodel = "shape:qwen2.5-0.5b"\ngamma = 2\n')
    cmd = [sys.executable, "-X", "importtime", "-m", "flashspec_core.cli", *(a.format(tmp=tmp_path) for a in argv)]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    elapsed = time.perf_counter() - start
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    said = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert out.returncode == 2 and elapsed < 2.0, (out.returncode, elapsed, said)
    assert said[-1] == message.format(tmp=tmp_path) and not out.stdout, said
    assert "Traceback" not in out.stderr
    assert not {"torch", "transformers", "triton"} & imported


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, recording what came when."""

    def __init__(self, events: list[str], name: str) -> None:
        super().__init__()
        self.events, self.name = events, name

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.events.append(self.name)
        return super().write(text)


@pytest.mark.parametrize("verbose", [False, True])
def test_verbose_on_a_terminal_keeps_the_text_in_one_piece(
    tiny_config: Path, monkeypatch: pytest.MonkeyPatch, verbose: bool
) -> None:
    """-v on a terminal: every step line comes before the text, which is printed whole; without
    -v the text streams (written once per step)."""
    events: list[str] = []
    out, err = _Terminal(events, "out"), _Terminal(events, "err")
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert main(["generate", "t1 t2 t3", "--config", str(tiny_config), *(["-v"] if verbose else [])]) == 0
    text = [i for i, e in enumerate(events) if e == "out"]
    assert out.getvalue().strip()
    if verbose:
        assert "step" in err.getvalue()
        steps = [i for i, e in enumerate(events) if e == "err" and i < text[-1]]
        assert text[-1] - text[0] <= 1 and all(i < text[0] for i in steps), events  # the text, then its newline
    else:
        assert len(text) > 2, events


@pytest.mark.parametrize("command", sorted(cli.commands()))
def test_added_commands_help_uses_no_undefined_labels(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Help names things in words: no "(a)"/"(b)" labels a reader cannot look up."""
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "usage" in out
    assert not re.findall(r"\([a-h]\)", out), out


def test_help_everywhere() -> None:
    for args in (["--help"], ["generate", "--help"], ["plugins", "--help"]):
        out = subprocess.run([sys.executable, "-m", "flashspec_core.cli", *args], capture_output=True, text=True)
        assert out.returncode == 0 and "usage" in out.stdout


def test_bundled_configs_load() -> None:
    """Every shipped config parses against the bundled plugins (names, keys, arm references)."""
    from flashspec_core.config import load_config
    from flashspec_core.registry import build_registry

    registry = build_registry()
    for name in ("default.toml", "smollm2.toml", "gpu.toml"):
        config = load_config(bundled_config(name), registry)
        assert config.arms, name
    gpu = load_config(bundled_config("gpu.toml"), registry)
    assert gpu.first is None and [(a.name, a.fallback) for a in gpu.arms] == [
        ("draft", None), ("suffix", "draft"), ("lookup", "draft"), ("plain", None)]


@pytest.mark.real_model
def test_real_model_through_the_cli() -> None:
    cmd = [sys.executable, "-m", "flashspec_core.cli", "generate", "List three colours.", "--config"]
    cmd += [str(bundled_config("smollm2.toml")), "--max-new-tokens", "24"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 5
    assert "arm lookup" in out.stderr



@pytest.mark.parametrize(("usable", "expected"), [(True, "gpu.toml"), (False, "default.toml")])
def test_default_config_is_the_gpu_config_only_where_an_nvidia_gpu_is_usable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usable: bool, expected: str) -> None:
    """The probe itself (driver list, CUDA_VISIBLE_DEVICES, torch's build tag) is tested in
    tests/models/test_precision.py."""
    from flashspec_core.cli import default_config_name
    from flashspec_models import precision

    seen: list[Path] = []
    monkeypatch.setattr(precision, "nvidia_gpu_usable", lambda driver: seen.append(driver) or usable)
    assert default_config_name(tmp_path / "gpus") == expected and seen == [tmp_path / "gpus"]
