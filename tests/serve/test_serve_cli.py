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
