"""Throughput and latency of ``flashspec serve`` under concurrent streaming clients.

The server runs in this process (uvicorn in a thread, 127.0.0.1, a free port) over a
pipeline from a TOML config; ``clients`` closed-loop clients each send
``requests_per_client`` streaming completions one after another. Per request: the time to
the first text chunk (TTFT), the gaps between text chunks (ITL: a chunk holds one
step's tokens) and the completion tokens (the stream's ``usage`` chunk). Per concurrency:
output tokens/s over the wall time, and the medians and p99s. ``--no-spec`` runs the same
server again with one plain-decoding arm, for the speedup of speculation.

``--smoke`` serves the tiny random models of :mod:`flashspec_core.testing.tiny` (CPU, a few
seconds); its result goes under ``benchmarks/.results``, never into the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from flashspec_bench.provenance import DOCS, RESULTS, logger, provenance, write_json

SCRIPT = "benchmarks/serve_bench.py"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash table is.",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "List three differences between TCP and UDP.",
    "Translate to French: The weather is nice today and we are going for a walk.",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "class Stack:\n    \"\"\"A LIFO stack backed by a list.\"\"\"\n",
    "What is the time complexity of binary search, and why?",
]
SMOKE_PROMPTS = ["t1 t2 t3", "t3 t4", "t7 t8 t9 t1 t2", "t5", "t2 t2 t6", "t9 t8 t7 t6"]


@attrs.frozen
class Request:
    """One streamed request as the client saw it."""

    ttft_s: float
    gaps_s: tuple[float, ...]  # between consecutive text chunks
    tokens: int
    total_s: float


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(requests: Sequence[Request], wall_s: float) -> dict[str, Any]:
    """Output tokens/s over ``wall_s``, and TTFT / ITL / TPOT medians and p99s in milliseconds.

    ITL pools the gaps between text chunks as the client read them (chunks that arrive in one
    read are ~0 apart); TPOT is each request's time after its first chunk per further token.
    """
    ttft = [r.ttft_s * 1e3 for r in requests]
    itl = [g * 1e3 for r in requests for g in r.gaps_s]
    tpot = [(r.total_s - r.ttft_s) * 1e3 / (r.tokens - 1) for r in requests if r.tokens > 1]
    tokens = sum(r.tokens for r in requests)
    return {
        "requests": len(requests),
        "output_tokens": tokens,
        "wall_s": round(wall_s, 4),
        "output_tokens_per_s": round(tokens / wall_s, 3) if wall_s > 0 else None,
        "ttft_ms_p50": _round(percentile(ttft, 50)),
        "ttft_ms_p99": _round(percentile(ttft, 99)),
        "itl_ms_p50": _round(percentile(itl, 50)),
        "itl_ms_p99": _round(percentile(itl, 99)),
        "tpot_ms_p50": _round(percentile(tpot, 50)),
        "tpot_ms_p99": _round(percentile(tpot, 99)),
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# ------------------------------------------------------------------ the server


@contextmanager
def serving(pipeline: Any, max_batch: int, model: str = "bench") -> Iterator[str]:
    """The app over ``pipeline`` on a free port of 127.0.0.1 while the block runs; yields its URL."""
    import uvicorn

    from flashspec_serve.app import ServeSettings, create_app

    app = create_app(pipeline, ServeSettings(model_name=model, max_batch=max_batch, max_waiting=4096))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=600))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


# ------------------------------------------------------------------ the clients


async def _one(client: Any, body: dict[str, Any]) -> Request:
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                raise RuntimeError(f"the server failed a request: {chunk['error']}")
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                arrivals.append(time.perf_counter())
    end = time.perf_counter()
    first = arrivals[0] if arrivals else end
    gaps = tuple(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return Request(first - start, gaps, tokens, end - start)


async def load(url: str, model: str, prompts: Sequence[str], clients: int, per_client: int, max_tokens: int,
               sampling: dict[str, Any]) -> tuple[list[Request], float]:
    """``clients`` clients, each sending ``per_client`` streaming requests in turn; the
    requests and the wall time of the whole load."""
    import httpx

    async def client_loop(client: Any, c: int) -> list[Request]:
        out = []
        for k in range(per_client):
            body = {"model": model, "prompt": prompts[(c * per_client + k) % len(prompts)], "max_tokens": max_tokens,
                    "stream": True, "stream_options": {"include_usage": True}, **sampling}
            out.append(await _one(client, body))
        return out

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        done = await asyncio.gather(*(client_loop(client, c) for c in range(clients)))
        wall = time.perf_counter() - start
    return [r for rs in done for r in rs], wall


# ------------------------------------------------------------------ pipelines


def no_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The same pipeline config with one plain-decoding arm (speculation off)."""
    return {**config, "arm": [{"use": "none", "name": "plain"}], "selector": {"use": "fixed"}}


def smoke_config(root: Path) -> dict[str, Any]:
    """A pipeline config over the tiny random target and its close draft, written under ``root``."""
    from flashspec_core.testing.tiny import pipeline_dict, tiny_family

    models = tiny_family(root)
    return pipeline_dict(models["target"], [models["close"]], "ucb1", dtype="float32")


def build(config: dict[str, Any], base_dir: Path | None) -> Any:
    from flashspec_core.build import build_pipeline
    from flashspec_core.config import parse_config
    from flashspec_core.registry import build_registry

    registry = build_registry()
    return build_pipeline(parse_config(config, registry, "<serve bench>", base_dir=base_dir), registry)


def warm_up(url: str, model: str, prompts: Sequence[str], max_tokens: int) -> None:
    """A few requests first, so that one-off costs (allocations, graph captures) are not timed."""
    asyncio.run(load(url, model, prompts, 2, 2, max_tokens, {"temperature": 0.0}))


def bench(config: dict[str, Any], base_dir: Path | None, concurrency: Sequence[int], per_client: int,
          max_tokens: int, prompts: Sequence[str], sampling: dict[str, Any], say: Any) -> dict[str, Any]:
    """Per concurrency level, :func:`summarize` of a load against one server over ``config``."""
    pipeline = build(config, base_dir)
    out: dict[str, Any] = {}
    with serving(pipeline, max(concurrency)) as url:
        warm_up(url, "bench", prompts, max_tokens)
        for c in concurrency:
            requests, wall = asyncio.run(load(url, "bench", prompts, c, per_client, max_tokens, sampling))
            out[f"c{c}"] = summarize(requests, wall)
            say(f"c={c}: {out[f'c{c}']}")
    return out


def summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The headline numbers: per concurrency TTFT / ITL of the speculative server, and its
    throughput over the no-speculation server's at 32 clients where both ran."""
    spec = runs.get("spec", {})
    out: dict[str, Any] = {
        level: {k: v for k, v in row.items() if k.startswith(("ttft", "itl", "tpot", "output_tokens_per_s"))}
        for level, row in spec.items()
    }
    plain = runs.get("no_spec", {})
    if "c32" in spec and "c32" in plain and plain["c32"]["output_tokens_per_s"]:
        out["throughput_vs_no_spec_c32"] = round(
            spec["c32"]["output_tokens_per_s"] / plain["c32"]["output_tokens_per_s"], 3)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serve_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="pipeline TOML (required unless --smoke)")
    p.add_argument("--smoke", action="store_true", help="the tiny random models on the CPU")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated numbers of clients")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-spec", action="store_true", help="also run the server with speculation off")
    p.add_argument("--prompts", type=Path, help="a file of prompts, one JSON string per line")
    p.add_argument("--out", type=Path, help="the result JSON (default: docs/benchmarks/serve-h200.json; "
                                             "benchmarks/.results/serve-smoke.json with --smoke)")
    p.add_argument("--commit", help="the measured commit, where the checkout has no git")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.smoke and args.config is None:
        parser().error("--config is required unless --smoke")
    say = logger("serve-bench")
    concurrency = [int(c) for c in args.concurrency.split(",")]
    sampling = {"temperature": args.temperature}
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            config, base_dir, prompts = smoke_config(Path(tmp)), None, SMOKE_PROMPTS
        else:
            from flashspec_core.config import read_config

            config, base_dir, prompts = read_config(args.config), args.config.parent, PROMPTS
        if args.prompts is not None:
            prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
        runs = {"spec": bench(config, base_dir, concurrency, args.requests_per_client, args.max_tokens, prompts,
                              sampling, say)}
        if args.no_spec:
            runs["no_spec"] = bench(no_spec(config), base_dir, concurrency, args.requests_per_client,
                                    args.max_tokens, prompts, sampling, say)
    out = args.out or (RESULTS / "serve-smoke.json" if args.smoke else DOCS / "serve-h200.json")
    result = {
        **provenance(SCRIPT, args.commit),
        "config": {"pipeline": str(args.config) if args.config else "smoke: tiny random target and close draft",
                   "concurrency": concurrency, "requests_per_client": args.requests_per_client,
                   "max_tokens": args.max_tokens, "sampling": sampling, "prompts": len(prompts)},
        "runs": runs,
        "summary": summary(runs),
    }
    say(f"wrote {write_json(out, result)}")
    return 0
