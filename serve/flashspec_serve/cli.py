"""``flashspec serve --config my.toml [--host 127.0.0.1 --port 8000]``.

Registered in the ``flashspec.commands`` entry-point group, so ``flashspec serve`` finds
it; ``main(argv)`` parses its own options and returns the exit status.
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from flashspec_core.cli import DEFAULT_CONFIG, GPU_CONFIG, bundled_config, default_config_name
from flashspec_core.config import check_components, check_config_file
from flashspec_core.registry import build_catalogue

WARMUP_LEVELS = ("full", "basic", "off")  # flashspec_serve.warmup.LEVELS and "off" (named here: it imports torch)


def _integer(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, high]``, refused by argparse (one line, rc 2) otherwise."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"must be an integer {bound}, got {value}")
        return value
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashspec serve", description="An OpenAI-compatible server over a pipeline.")
    p.add_argument("--config", help=f"pipeline TOML (default: the bundled {DEFAULT_CONFIG}; {GPU_CONFIG}, the fast "
                                     "back-end, where an NVIDIA GPU and a CUDA torch are there)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_integer(0, 65535), default=8000, help="0 picks a free port (default: %(default)s)")
    p.add_argument("--served-model-name", help="the model id clients send (default: the target's model name)")
    p.add_argument("--max-batch", type=_integer(1), default=32, help="most requests decoded together")
    p.add_argument("--max-waiting", type=_integer(0), default=256, help="most requests waiting; more get 429")
    p.add_argument("--max-model-len", type=_integer(1), help="context in tokens (default: the target's)")
    p.add_argument("--shutdown-grace", type=_seconds, default=10.0, metavar="S",
                   help="seconds running requests get to finish on shutdown before they are aborted")
    p.add_argument("--warmup", choices=WARMUP_LEVELS, default="basic",
                   help="graph captures made before the server listens: full (every slot count, span and width: "
                        "no capture left to a request, minutes on a GPU), basic (sequences up to 512 tokens, no "
                        "draft prewarm: a longer request captures its graphs then), off (default: %(default)s)")
    p.add_argument("--seed", type=_integer(0, 2**63 - 1), help="seed of the draws of requests that give no seed of their own "
                   "(default: a fresh one each start); a request's own seed gives it the same tokens whatever else "
                   "is in the batch")
    p.add_argument("--no-warmup", dest="warmup", action="store_const", const="off",
                   help="--warmup off: take requests at once (captures and compiles then fall inside the first "
                        "requests; for tests and development)")
    return p


def model_name(config: object) -> str:
    """The target's ``model`` key (a directory's last part), or ``flashspec``."""
    model = getattr(getattr(getattr(config, "target", None), "config", None), "model", None)
    return Path(model).name if isinstance(model, str) and model else "flashspec"


def _check_address(host: str, port: int) -> None:
    """Refuse a host or port the server could not listen on now (taken, not this machine's),
    rather than after the models have loaded.

    :raises OSError: naming ``--host``/``--port``.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
        try:
            sock.bind(address)
        except OSError as exc:
            raise OSError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    name = None if args.config else default_config_name()
    config = Path(args.config) if args.config else bundled_config(name or DEFAULT_CONFIG)
    if name == GPU_CONFIG:
        print(f"[flashspec] config: the bundled {GPU_CONFIG} (an NVIDIA GPU and a CUDA build of torch are here; "
              "--config for another)", file=sys.stderr, flush=True)
    # All of the config and the address are checked before torch is imported and any model loads.
    check_components(check_config_file(config), build_catalogue(), str(config), base_dir=config.parent)
    _check_address(args.host, args.port)
    import uvicorn

    from flashspec_core.build import load_pipeline
    from flashspec_serve.app import ServeSettings, create_app

    pipeline = load_pipeline(config, progress=lambda msg: print(f"[flashspec] {msg}", file=sys.stderr, flush=True))
    settings = ServeSettings(model_name=args.served_model_name or model_name(pipeline.config),
                             max_batch=args.max_batch, max_waiting=args.max_waiting, context=args.max_model_len,
                             shutdown_grace_s=args.shutdown_grace, warmup=args.warmup, seed=args.seed)
    app = create_app(pipeline, settings)
    # Streamed chunks need TCP_NODELAY on every connection; uvicorn (0.55) never sets it, but it
    # binds host:port with loop.create_server, whose sockets have proto IPPROTO_TCP, so asyncio's
    # transport sets it on each accepted connection, and uvloop (the serve extra) sets it always
    # (flashspec_serve.app.listening_socket says why a socket made by hand needs more).
    uvicorn.run(app, host=args.host, port=args.port, timeout_graceful_shutdown=int(args.shutdown_grace) + 1)
    return 0
