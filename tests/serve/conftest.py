"""A tiny pipeline served on 127.0.0.1 by uvicorn in a thread, one server per test module."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

import uvicorn  # noqa: E402
from _tiny import pipeline_dict, tiny_family  # noqa: E402

from flashspec_core.build import build_pipeline  # noqa: E402
from flashspec_core.pipeline import Pipeline  # noqa: E402
from flashspec_serve.app import ServeSettings, create_app, listening_socket  # noqa: E402

MODEL = "tiny"
# The target's words joined by spaces: a chat is its messages' contents, each followed by a space.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


class Server:
    """``app`` on a free port of 127.0.0.1 until :meth:`stop`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sock = listening_socket("127.0.0.1", 0)  # TCP_NODELAY: no Nagle wait per streamed chunk
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # keep-alive longer than any test, so a pooled connection is never closed as a client reuses it
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, timeout_keep_alive=120)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    @property
    def engine(self) -> Any:
        return self.app.state.engine


def with_chat_template(target: Path) -> Path:
    cfg_path = target / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    return target


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    models = tiny_family(tmp_path_factory.mktemp("serve-tiny"))
    with_chat_template(models["target"])
    return models


def make_pipeline(models: dict[str, Path], selector: str = "fixed") -> Pipeline:
    return build_pipeline(pipeline_dict(models["target"], [models["close"]], selector))


def serve(pipeline: Pipeline, **settings: Any) -> Server:
    """A server of ``pipeline``, without the warm-up unless ``warmup=True`` (test_warmup's)."""
    settings.setdefault("warmup", False)
    return Server(create_app(pipeline, ServeSettings(model_name=MODEL, **settings))).start()


@pytest.fixture(scope="module")
def server(tiny_models: dict[str, Path]) -> Iterator[Server]:
    srv = serve(make_pipeline(tiny_models))
    yield srv
    srv.stop()
