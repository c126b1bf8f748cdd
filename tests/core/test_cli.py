"""The command line, on a tiny model (and once on a real one, marked real_model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _tiny import tiny_lm

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
    assert "flashspec: error: temperature must be a finite number >= 0, got -1.0" in err
    assert "Traceback" not in err
    assert main(["generate", "t1", "--config", "/nowhere.toml"]) == 2
    assert "/nowhere.toml: [-]: file not found" in capsys.readouterr().err


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
    assert gpu.first == "lookup" and [a.gamma for a in gpu.arms if a.draft.use == "fast"] == [1, 2, 3]


@pytest.mark.real_model
def test_real_model_through_the_cli() -> None:
    cmd = [sys.executable, "-m", "flashspec_core.cli", "generate", "List three colours.", "--config"]
    cmd += [str(bundled_config("smollm2.toml")), "--max-new-tokens", "24"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 5
    assert "arm lookup" in out.stderr
