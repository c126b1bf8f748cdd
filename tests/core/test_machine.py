"""A CUDA device, or the triton verifier, on a machine certainly without CUDA is refused with
the config, before torch is imported; where CUDA may be there, the check after the import decides."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flashspec_core import machine
from flashspec_core.config import ConfigError, check_components
from flashspec_core.registry import build_catalogue
from flashspec_models.weights import KNOWN_MODELS

ABSENT = "a test says so"
CPU_TORCH = "__version__ = '2.13.0+cpu'\ndebug = False\ncuda: Optional[str] = None\nhip: Optional[str] = None\n"


# --- the probe's signs ----------------------------------------------------------------------------


@pytest.mark.parametrize(("visible", "hidden"), [
    (None, False), ("0", False), ("0,1", False), ("-1,0", False), ("GPU-1234", False),
    ("", True), ("-1", True), (" ", True),
])
def test_cuda_visible_devices(visible: str | None, hidden: bool) -> None:
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert (machine.hidden_by_env(environ) is not None) is hidden


@pytest.mark.parametrize(("text", "without"), [
    (CPU_TORCH, True),
    (CPU_TORCH.replace("cuda: Optional[str] = None", "cuda: Optional[str] = '12.8'"), False),
    (CPU_TORCH.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.4.1'"), False),  # ROCm serves "cuda"
    ("cuda = None\nhip = None\n", True),
    ("cuda = None\n", False),  # a layout it does not know
    (None, False),  # no torch found
])
def test_torch_build(text: str | None, without: bool) -> None:
    assert (machine.built_without_gpu(text) is not None) is without


@pytest.mark.parametrize(("platform", "files", "libraries", "none"), [
    ("linux", set(), set(), True),
    ("linux", {"/proc/driver/nvidia/version"}, set(), False),
    ("linux", {"/dev/nvidiactl"}, set(), False),
    ("linux", {"/dev/kfd"}, set(), False),
    ("linux", set(), {"cuda"}, False),
    ("linux", set(), {"amdhip64"}, False),
    ("win32", set(), set(), False),  # its driver has other names: left to torch
])
def test_driver(platform: str, files: set[str], libraries: set[str], none: bool) -> None:
    reason = machine.no_driver(platform, files.__contains__, lambda lib: f"lib{lib}.so" if lib in libraries else None)
    assert (reason is not None) is none


def test_the_probe_reads_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine.no_cuda() == "CUDA_VISIBLE_DEVICES is '', which hides every GPU"


# --- the config check, with the probe patched -----------------------------------------------------


MODEL = next(iter(KNOWN_MODELS))


def _config(**extra: Any) -> dict[str, Any]:
    return {"target": {"model": MODEL}, "arm": [{"use": "prompt_lookup"}], **extra}


def _check(data: dict[str, Any]) -> None:
    check_components(data, build_catalogue(autoload=False), "run.toml")


@pytest.mark.parametrize(("table", "value"), [("target", "cuda"), ("target", "cuda:1"), ("arm.0", "cuda")])
def test_a_cuda_device_without_cuda(table: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "no_cuda", lambda: ABSENT)
    data = _config()
    if table == "target":
        data["target"]["device"] = value
    else:
        data["arm"] = [{"use": "hf", "model": MODEL, "device": value}]
    with pytest.raises(ConfigError) as err:
        _check(data)
    assert str(err.value) == (f"run.toml: [{table}] key 'device': device {value!r} is not on this machine: {ABSENT}, "
                              "so torch sees no cuda device (use \"cpu\" or \"auto\")")


@pytest.mark.parametrize("value", ["cpu", "auto"])
def test_other_devices_pass_without_cuda(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "no_cuda", lambda: ABSENT)
    data = _config()
    data["target"]["device"] = value
    _check(data)


def test_a_cuda_device_is_left_to_torch_when_cuda_may_be_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "no_cuda", lambda: None)
    data = _config()
    data["target"]["device"] = "cuda:7"
    _check(data)


def test_the_triton_verifier_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "no_cuda", lambda: ABSENT)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError) as err:
        _check(_config(verifier={"use": "triton"}))
    assert str(err.value) == (
        f"run.toml: [verifier] key 'use': verifier 'triton' cannot run on this machine: its Triton kernels need a "
        f"CUDA GPU and {ABSENT}: use = \"reference\" (or \"auto\", which takes triton only on CUDA), or set "
        "TRITON_INTERPRET=1 to run them through Triton's interpreter")


@pytest.mark.parametrize(("probe", "interpret"), [(None, None), (ABSENT, "1"), (None, "1")])
def test_the_triton_verifier_is_left_to_the_build(probe: str | None, interpret: str | None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA perhaps there, or Triton's interpreter asked for, the config passes: the build
    checks the device the target is on (``test_bad_inputs``)."""
    monkeypatch.setattr(machine, "no_cuda", lambda: probe)
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    _check(_config(verifier={"use": "triton"}))


# --- the command line -----------------------------------------------------------------------------


@pytest.mark.parametrize(("toml", "starts"), [
    (f'[target]\nmodel = "{MODEL}"\ndevice = "cuda"\n', "[target] key 'device': device 'cuda' "),
    (f'[target]\nmodel = "{MODEL}"\n[verifier]\nuse = "triton"\n', "[verifier] key 'use': verifier 'triton' "),
], ids=["device", "triton"])
def test_the_command_line_refuses_at_once_without_torch(toml: str, starts: str, tmp_path: Path) -> None:
    """The acceptance check: one line naming the file, rc 2, torch never imported. The goal is
    under 2 s; the bound leaves room for a loaded CI machine (importing torch alone takes longer)."""
    path = tmp_path / "bad.toml"
    path.write_text(toml + '[[arm]]\nuse = "prompt_lookup"\n')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-X", "importtime", "-m", "flashspec_core.cli", "generate", "x", "--config", str(path)]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    lines = out.stderr.splitlines()
    imported = {line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")}
    errors = [line for line in lines if not line.startswith("import time:")]
    assert out.returncode == 2 and elapsed < 5.0, (out.returncode, elapsed, errors)
    assert len(errors) == 1 and errors[0].startswith(f"flashspec: error: {path}: {starts}"), errors
    assert "CUDA_VISIBLE_DEVICES is ''" in errors[0]
    assert "flashspec_core.config" in imported and not {"torch", "transformers", "triton"} & imported
