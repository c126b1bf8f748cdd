"""``flashspec serve`` as a user runs it: found through the flashspec.commands entry point."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flashspec_core.cli import commands


def test_serve_is_a_flashspec_command() -> None:
    assert commands()["serve"].value == "flashspec_serve.cli:main"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(shutil.which("flashspec", path=os.path.dirname(sys.executable)) is None,
                    reason="the flashspec command is not installed beside this python")
def test_flashspec_serve_answers_and_stops_on_sigint(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "tiny.toml"
    config.write_text(f'[target]\nmodel = "{tiny_models["target"]}"\ndtype = "float64"\n\n'
                      '[[arm]]\nname = "lookup"\nuse = "prompt_lookup"\ngamma = 3\n\n[selector]\nuse = "fixed"\n')
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "flashspec")
    proc = subprocess.Popen([exe, "serve", "--config", str(config), "--port", str(port),
                             "--served-model-name", "tiny", "--no-warmup"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "t1 t2 t3", "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


HEAVY = ("torch", "transformers", "triton", "fastapi", "uvicorn")
GOOD = '[target]\nmodel = "{model}"\n[[arm]]\nuse = "prompt_lookup"\n'


@pytest.mark.parametrize(
    ("options", "config", "message"),
    [
        (["--port", "70000"], GOOD, "flashspec serve: error: argument --port: must be an integer in 0..65535, got 70000"),
        (["--port", "http"], GOOD, "flashspec serve: error: argument --port: must be an integer, got 'http'"),
        (["--max-batch", "0"], GOOD, "flashspec serve: error: argument --max-batch: must be an integer >= 1, got 0"),
        (["--max-waiting", "-1"], GOOD, "flashspec serve: error: argument --max-waiting: must be an integer >= 0, got -1"),
        (["--max-model-len", "0"], GOOD, "flashspec serve: error: argument --max-model-len: must be an integer >= 1, got 0"),
        (["--seed", "-1"], GOOD, "flashspec serve: error: argument --seed: must be an integer in 0..9223372036854775807, got -1"),
        (["--shutdown-grace", "nan"], GOOD,
         "flashspec serve: error: argument --shutdown-grace: must be a finite number of seconds >= 0, got nan"),
        ([], GOOD + "gama = 3\n", "flashspec: error: {config}: [arm.0] key 'gama': unknown key for draft 'prompt_lookup'"),
        (["--port", "{busy}"], GOOD, "flashspec: error: --host 127.0.0.1 --port {busy}: cannot listen there ("),
        (["--host", "no.such.host.invalid"], GOOD, "flashspec: error: --host no.such.host.invalid: not an address"),
    ],
    ids=["port-range", "port-text", "max-batch-0", "max-waiting-negative", "max-model-len-0", "seed-negative", "grace-nan",
         "config-key", "port-taken", "host-unknown"],
)
def test_serve_refuses_bad_arguments_before_torch(options: list[str], config: str, message: str, tmp_path: Path) -> None:
    """Each is one line and exit status 2 before torch is imported or a model loads (port 70000
    used to end in uvicorn's OverflowError after the models loaded, with the engine's thread
    keeping the process alive: a hang)."""
    path = tmp_path / "serve.toml"
    path.write_text(config.format(model=tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory to the config check; nothing loads it
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        fields = {"config": path, "busy": busy.getsockname()[1]}
        argv = ["serve", "--config", str(path), *(o.format(**fields) for o in options)]
        code = ("import sys\nfrom flashspec_core.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
                "except SystemExit as exc:\n    rc = exc.code\n"
                f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])")
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert out.stdout == "2 []\n", out
    assert out.stderr.splitlines()[-1].startswith(message.format(**fields)), out.stderr
    assert "Traceback" not in out.stderr
