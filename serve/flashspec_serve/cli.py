"""``flashspec serve --config my.toml [--host 127.0.0.1 --port 8000]``.

Registered in the ``flashspec.commands`` entry-point group, so ``flashspec serve`` finds
it; ``main(argv)`` parses its own options and returns the exit status.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from flashspec_core.cli import DEFAULT_CONFIG, bundled_config
from flashspec_core.config import check_config_file

WARMUP_LEVELS = ("full", "basic", "off")  # flashspec_serve.warmup.LEVELS and "off" (named here: it imports torch)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashspec serve", description="An OpenAI-compatible server over a pipeline.")
    p.add_argument("--config", help=f"pipeline TOML (default: the bundled {DEFAULT_CONFIG})")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the model id clients send (default: the target's model name)")
    p.add_argument("--max-batch", type=int, default=32, help="most requests decoded together")
    p.add_argument("--max-waiting", type=int, default=256, help="most requests waiting; more get 429")
    p.add_argument("--max-model-len", type=int, help="context in tokens (default: the target's)")
    p.add_argument("--shutdown-grace", type=float, default=10.0, metavar="S",
                   help="seconds running requests get to finish on shutdown before they are aborted")
    p.add_argument("--warmup", choices=WARMUP_LEVELS, default="basic",
                   help="graph captures made before the server listens: full (every slot count, span and width: "
                        "no capture left to a request, minutes on a GPU), basic (sequences up to 512 tokens, no "
                        "draft prewarm: a longer request captures its graphs then), off (default: %(default)s)")
    p.add_argument("--no-warmup", dest="warmup", action="store_const", const="off",
                   help="--warmup off: take requests at once (captures and compiles then fall inside the first "
                        "requests; for tests and development)")
    return p


def model_name(config: object) -> str:
    """The target's ``model`` key (a directory's last part), or ``flashspec``."""
    model = getattr(getattr(getattr(config, "target", None), "config", None), "model", None)
    return Path(model).name if isinstance(model, str) and model else "flashspec"


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    config = Path(args.config) if args.config else bundled_config(DEFAULT_CONFIG)
    check_config_file(config)
    import uvicorn

    from flashspec_core.build import load_pipeline
    from flashspec_serve.app import ServeSettings, create_app

    pipeline = load_pipeline(config, progress=lambda msg: print(f"[flashspec] {msg}", file=sys.stderr, flush=True))
    settings = ServeSettings(model_name=args.served_model_name or model_name(pipeline.config),
                             max_batch=args.max_batch, max_waiting=args.max_waiting, context=args.max_model_len,
                             shutdown_grace_s=args.shutdown_grace, warmup=args.warmup)
    app = create_app(pipeline, settings)
    # Streamed chunks need TCP_NODELAY on every connection; uvicorn (0.55) never sets it, but it
    # binds host:port with loop.create_server, whose sockets have proto IPPROTO_TCP, so asyncio's
    # transport sets it on each accepted connection, and uvloop (the serve extra) sets it always
    # (flashspec_serve.app.listening_socket says why a socket made by hand needs more).
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=int(args.shutdown_grace) + 1)
    return 0
