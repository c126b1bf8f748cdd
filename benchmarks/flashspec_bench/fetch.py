"""Prefetch the embedded default models from a shell: ``python -m flashspec_bench.fetch list|fetch NAME``.

A tool over :mod:`flashspec_models.weights` (the product builds a model on first use anyway);
a machine without network access can be given its checkpoints ahead of a run this way.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from flashspec_models.weights import (
    CACHE_DTYPE_ENV,
    CACHE_DTYPES,
    DTYPES,
    KNOWN_MODELS,
    WeightsError,
    cache_dtype_problem,
    cache_root,
    ensure_model,
    is_valid_checkpoint,
)


def _cmd_list(args: argparse.Namespace) -> int:
    if args.dtype is None and (problem := cache_dtype_problem()) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    # without a dtype, the copy ensure_model would serve: the default dtype's, else a float32 one
    requested = args.dtype or os.environ.get(CACHE_DTYPE_ENV, "").strip()
    dtypes = [requested] if requested else list(CACHE_DTYPES)
    root = cache_root(args.cache_dir)
    for model in KNOWN_MODELS.values():
        paths = [root / "models" / f"{model.name}-{dtype}" for dtype in dtypes]
        found = [p for p, dtype in zip(paths, dtypes, strict=True) if is_valid_checkpoint(p, model, dtype)]
        state = str(found[0]) if found else "not fetched"
        print(f"{model.name:32} {len(model.parts):3} part(s)  {model.summary}  [{state}]")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    try:
        path = ensure_model(
            args.name, args.cache_dir, progress=not args.quiet, dtype=args.dtype, keep_gguf=args.keep_gguf
        )
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flashspec_bench.fetch", description="Fetch the embedded default models."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", default=None, help="cache root (default: $FLASHSPEC_CACHE or user cache)")
    common.add_argument("--dtype", default=None, choices=DTYPES,
                        help=f"default: ${CACHE_DTYPE_ENV}, else {CACHE_DTYPES[0]}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", parents=[common], help="list embedded models and whether they are cached")
    fetch = sub.add_parser("fetch", parents=[common], help="download and convert one model; print its path")
    fetch.add_argument("name", help=f"one of: {', '.join(KNOWN_MODELS)}")
    fetch.add_argument("--keep-gguf", action="store_true", help="keep the verified GGUF next to the checkpoint")
    fetch.add_argument("--quiet", action="store_true", help="no progress output")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m flashspec_bench.fetch``; returns the exit status."""
    args = _parser().parse_args(argv)
    return _cmd_list(args) if args.command == "list" else _cmd_fetch(args)


if __name__ == "__main__":
    raise SystemExit(main())
