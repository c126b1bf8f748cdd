"""Bad configs fail at load time with a message naming file, table and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from _tiny import tiny_lm

from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError, load_config, parse_config
from flashspec_core.registry import build_registry
from flashspec_hf.draft import TokenizerMismatch


@pytest.fixture(scope="module")
def registry():
    return build_registry()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("cfg") / "target", vocab=16)


def _base(target: Path) -> dict:
    return {"target": {"model": str(target)}, "arm": [{"use": "prompt_lookup", "gamma": 3}]}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipe.toml"
    path.write_text(text)
    return path


def test_valid_file_loads_with_relative_model_path(tmp_path: Path, target: Path, registry) -> None:
    (tmp_path / "m").symlink_to(target)
    path = _write(tmp_path, '[target]\nmodel = "m"\n[[arm]]\nuse = "prompt_lookup"\ngamma = 5\n[selector]\nuse = "ucb1"\n')
    cfg = load_config(path, registry)
    assert cfg.arms[0].gamma == 5 and cfg.selector.use == "ucb1" and cfg.target.config.model == str(tmp_path / "m")


def test_unknown_plugin_name(tmp_path: Path, target: Path, registry) -> None:
    path = _write(tmp_path, f'[target]\nmodel = "{target}"\n[[arm]]\nuse = "prompt_lookup"\n[selector]\nuse = "ucb9"\n')
    with pytest.raises(ConfigError, match=r"pipe.toml: \[selector\] key 'use': unknown selector component 'ucb9'"):
        load_config(path, registry)


def test_unknown_key(target: Path, registry) -> None:
    data = _base(target)
    data["arm"][0]["max_ngramz"] = 2
    with pytest.raises(ConfigError, match=r"\[arm.0\] key 'max_ngramz': unknown key for draft 'prompt_lookup'; allowed: max_ngram"):
        parse_config(data, registry)


@pytest.mark.parametrize("gamma", [0, -1])
def test_gamma_not_positive(target: Path, registry, gamma: int) -> None:
    data = _base(target)
    data["arm"][0]["gamma"] = gamma
    with pytest.raises(ConfigError, match=rf"\[arm.0\] key 'gamma': must be in 1..64 for draft 'prompt_lookup', got {gamma}"):
        parse_config(data, registry)


def test_none_arm_is_gamma_zero(target: Path, registry) -> None:
    data = _base(target)
    data["arm"].append({"use": "none"})
    assert parse_config(data, registry).arms[1].gamma == 0
    data["arm"][1]["gamma"] = 2
    with pytest.raises(ConfigError, match="the 'none' arm drafts nothing: gamma must be 0"):
        parse_config(data, registry)


def test_negative_temperature(target: Path, registry) -> None:
    data = _base(target)
    data["generation"] = {"temperature": -0.5}
    with pytest.raises(ConfigError, match=r"\[generation\].*temperature must be a finite number >= 0, got -0.5"):
        parse_config(data, registry)


def test_temperature_below_zero_at_call_time(target: Path, registry) -> None:
    pipe = build_pipeline(_base(target), registry)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got -1.0"):
        pipe.generate([[1, 2]], temperature=-1.0)


def test_missing_model_path(registry) -> None:
    data = {"target": {"model": "/nowhere/model"}, "arm": [{"use": "prompt_lookup"}]}
    with pytest.raises(ConfigError, match=r"\[target\] key 'model': model '/nowhere/model' is neither an existing directory"):
        parse_config(data, registry)


def test_missing_required_key(registry) -> None:
    with pytest.raises(ConfigError, match=r"\[target\] key 'model': missing required key"):
        parse_config({"target": {}, "arm": [{"use": "prompt_lookup"}]}, registry)


def test_bad_value(target: Path, registry) -> None:
    data = _base(target)
    data["target"]["dtype"] = "float8"
    with pytest.raises(ConfigError, match=r"\[target\] key 'dtype'"):
        parse_config(data, registry)


def test_unknown_table_and_not_toml(tmp_path: Path, target: Path, registry) -> None:
    with pytest.raises(ConfigError, match=r"\[targets\]: unknown table"):
        parse_config({"targets": {}}, registry)
    with pytest.raises(ConfigError, match="pipe.toml: .*not valid TOML"):
        load_config(_write(tmp_path, "[target\n"), registry)
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "missing.toml", registry)


def test_mismatched_tokenizer(tmp_path: Path, target: Path, registry) -> None:
    other = tiny_lm(tmp_path / "other", vocab=16, tokenizer_prefix="w")
    data = _base(target)
    data["arm"] = [{"use": "hf", "model": str(other), "gamma": 2}]
    with pytest.raises(TokenizerMismatch, match="does not share the target's tokenizer"):
        build_pipeline(data, registry)


def test_padded_draft_vocab_is_accepted(tmp_path: Path, target: Path, registry) -> None:
    padded = tiny_lm(tmp_path / "padded", vocab=16, embed_vocab=24, seed=5)
    data = _base(target)
    data["arm"] = [{"use": "hf", "model": str(padded), "gamma": 2}]
    pipe = build_pipeline(data, registry)
    result = pipe.generate([[1, 2, 3]], max_new_tokens=6, temperature=1.0)
    assert all(0 <= t < 16 for t in result.token_ids[0])


def test_batch_buckets_load_as_a_tuple_and_default_to_one_bucket(tmp_path: Path, target: Path, registry) -> None:
    text = f'[target]\nmodel = "{target}"\n[[arm]]\nuse = "prompt_lookup"\n[selector]\nuse = "ucb1"\n'
    assert load_config(_write(tmp_path, text), registry).batch_buckets == (1,)
    cfg = load_config(_write(tmp_path, text + "batch_buckets = [1, 2, 4, 8, 16, 32]\n"), registry)
    assert cfg.batch_buckets == (1, 2, 4, 8, 16, 32)
    assert build_pipeline(cfg, registry).policy.settings.batch_buckets == (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize(("value", "rule"), [
    ("[]", "must be a non-empty list"),
    ("4", "must be a non-empty list"),
    ('"1,2"', "must be a non-empty list"),
    ("[1, 2.5]", "must hold integers"),
    ("[1, true]", "must hold integers"),
    ("[0, 1]", "must start at 1"),
    ("[2, 4]", "must start at 1"),
    ("[1, 4, 2]", "must be strictly increasing"),
    ("[1, 2, 2]", "must be strictly increasing"),
])
def test_bad_batch_buckets_name_file_table_key_and_value(tmp_path: Path, target: Path, registry, value: str,
                                                         rule: str) -> None:
    path = _write(tmp_path, f'[target]\nmodel = "{target}"\n[[arm]]\nuse = "prompt_lookup"\n'
                            f'[selector]\nuse = "ucb1"\nbatch_buckets = {value}\n')
    with pytest.raises(ConfigError, match=r"pipe.toml: \[selector\] key 'batch_buckets': " + rule + ".*, got "):
        load_config(path, registry)
