"""Host time per decode step of the serving path beside ``Pipeline.generate``, on the CPU.

    python benchmarks/serve_host_cost.py [--tokens 200] [--repeats 5] [--modes generate,engine,http,...]
        [--loop auto|asyncio|uvloop] [--http auto|h11|httptools] [--out FILE]

Over the tiny random models (:mod:`flashspec_core.testing.tiny`, float32, one draft arm,
EOS ignored so every run decodes ``--tokens``), each mode decodes the same prompts; the
pipeline's ``step`` is wrapped to time ``step_ms`` (the step itself) and ``loop_ms`` (from
one step's end to the next's start: what the loop around the step does); ``cpu_ms`` is
this process's CPU time per step over all its threads, and ``host_cpu_ms`` the part of it
spent outside the steps (the step's own thread time taken out: the serving path's cost
without the model's, whose CPU time swings by milliseconds on a shared machine). Modes,
all greedy:

``generate`` / ``generate8`` / ``generate32``  ``Pipeline.generate`` on one prompt / eight / 32.
``engine`` / ``engine8``      the serving engine, one / eight requests, read by a coroutine.
``http`` / ``http8`` / ``http32``  the HTTP server streaming to one / eight / 32 clients in a child process.
``whole8``                   eight non-streaming clients (``stream: false``) in a child process.

The streaming modes also report ``ttft_ms``, the clients' median time to first token.
``summary`` gives ``ttft_ms_c1`` / ``ttft_ms_c8`` / ``ttft_ms_c32`` (``http`` / ``http8`` /
``http32``) and ``extra_cpu_ms_c1`` / ``extra_cpu_ms_c8`` / ``extra_cpu_ms_c32``: the server's
``host_cpu_ms`` beyond ``generate``'s (``http - generate``, ``http8 - generate8``,
``http32 - generate32``), the CPU serving adds per step.
The clients (in a child process) first send one untimed request each, so a TTFT is the
server's, not the client process's first use of its HTTP library.

Modes run in turn, ``--repeats`` times (ABAB), after one untimed round; each field is the
median over the repeats. Prints JSON with its provenance; with ``--out`` writes it too
(docs/benchmarks/serve-host-cost-cpu.json is the committed run). The numbers are the
CPU's: they rank the host costs, not a GPU's step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPTS = [[1, 2, 3, 4, 5], [3, 4], [7, 8, 9, 1, 2], [5], [2, 2, 6], [9, 8, 7, 6], [11, 3, 5, 1], [4, 12]]
PROMPTS32 = PROMPTS * 4  # 32 clients: each prompt four times
MODES = ("generate", "engine", "http", "generate8", "engine8", "http8", "whole8", "generate32", "http32")
STREAMED = ("http", "http8", "http32")  # the modes whose clients see a first token before the end
FIELDS = ("step_ms", "loop_ms", "cpu_ms", "host_cpu_ms", "steps", "ttft_ms")


def timed_step(pipeline: Any) -> list[tuple[float, float, float]]:
    """Wrap ``pipeline.step`` to record each call's start and end (perf_counter) and the CPU
    time its thread spent in it (thread_time; torch runs on that one thread); the marks. The
    server's delivery of the last step, which runs inside the step (``on_queued``), is serving
    work: its CPU time is left out of the step's."""
    marks: list[tuple[float, float, float]] = []
    inner = pipeline.step

    def step(*args: Any, **kwargs: Any) -> Any:
        queued, served = kwargs.get("on_queued"), [0.0]
        if queued is not None:
            def timed_queued() -> None:
                c = time.thread_time()
                queued()
                served[0] += time.thread_time() - c

            kwargs["on_queued"] = timed_queued
        c0, t0 = time.thread_time(), time.perf_counter()
        out = inner(*args, **kwargs)
        marks.append((t0, time.perf_counter(), time.thread_time() - c0 - served[0]))
        return out

    pipeline.step = step
    return marks


def per_step(marks: list[tuple[float, float, float]], cpu_s: float) -> dict[str, float]:
    """Mean step and loop milliseconds, and CPU milliseconds per step: all of the process's
    (``cpu_ms``) and what it spent outside the steps (``host_cpu_ms``: the serving path's own
    cost, without the model's, which varies more from run to run than the host's)."""
    loop = [marks[i + 1][0] - marks[i][1] for i in range(len(marks) - 1)]
    inside = sum(m[2] for m in marks)
    return {"step_ms": statistics.mean(b - a for a, b, _ in marks) * 1e3,
            "loop_ms": statistics.mean(loop) * 1e3 if loop else 0.0,
            "cpu_ms": cpu_s / len(marks) * 1e3, "host_cpu_ms": (cpu_s - inside) / len(marks) * 1e3,
            "steps": len(marks)}


def build(root: Path) -> Callable[[], Any]:
    """A maker of pipelines over the tiny target and its close draft, EOS ignored."""
    from flashspec_core.build import build_pipeline
    from flashspec_core.testing.tiny import pipeline_dict, tiny_family

    models = tiny_family(root)
    config = pipeline_dict(models["target"], [models["close"]], "fixed", dtype="float32")
    config["arm"] = config["arm"][:1]

    def make() -> Any:
        pipeline = build_pipeline(config)
        target = pipeline.target  # this target only: a subclass whose EOS set is empty
        target.__class__ = type(f"NoEos{type(target).__name__}", (type(target),), {"eos_token_ids": frozenset()})
        return pipeline

    return make


def serve(pipeline: Any, loop: str = "auto", http: str = "auto") -> str:
    """The app over ``pipeline`` on a free port of 127.0.0.1, in a daemon thread, with uvicorn's
    ``loop`` and ``http`` implementations; its URL."""
    import uvicorn

    from flashspec_serve.app import ServeSettings, create_app, listening_socket

    app = create_app(pipeline, ServeSettings(model_name="m", max_batch=32, warmup=False))
    sock = listening_socket("127.0.0.1", 0)  # TCP_NODELAY: no Nagle wait per streamed chunk
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", loop=loop, http=http))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def runners(make: Callable[[], Any], tokens: int, loop: str = "auto",
            http: str = "auto") -> tuple[dict[str, Callable[[], dict[str, float]]], Any]:
    """Per mode a function that runs it once and returns its per-step times; and the engine."""
    from flashspec_bench.serve import load
    from flashspec_core.contracts import SamplingParams
    from flashspec_serve.engine import Engine, Job

    offline, engined, served = make(), make(), make()
    marks = {id(p): timed_step(p) for p in (offline, engined, served)}
    engine = Engine(engined, max_batch=8)
    engine.start()
    url = serve(served, loop, http)
    texts = [" ".join(f"t{i}" for i in p) for p in PROMPTS32]

    def timed(pipeline: Any, work: Callable[[], Any], streamed: bool = False) -> dict[str, float]:
        mine = marks[id(pipeline)]
        mine.clear()
        c0 = time.process_time()
        out = work()
        row = per_step(mine, time.process_time() - c0)
        if streamed:  # out: the clients' requests
            row["ttft_ms"] = statistics.median(r.ttft_s for r in out) * 1e3
        return row

    async def engine_run(k: int) -> None:
        loop = asyncio.get_running_loop()
        handles = [engine.submit(Job(tuple(p), tokens, SamplingParams(temperature=0.0)), loop) for p in PROMPTS[:k]]

        async def drain(h: Any) -> None:
            async for _ in h.events():
                pass

        await asyncio.gather(*(drain(h) for h in handles))

    def http_run(k: int, stream: bool) -> Any:
        requests, _wall = asyncio.run(load(url, "m", texts[:k], k, 1, tokens, {"temperature": 0.0}, stream))
        if failed := [r.error for r in requests if r.error]:
            raise RuntimeError(f"{len(failed)} of {len(requests)} requests failed: {failed[0]}")
        return requests

    return {
        "generate": lambda: timed(offline, lambda: offline.generate(PROMPTS[:1], max_new_tokens=tokens)),
        "generate8": lambda: timed(offline, lambda: offline.generate(PROMPTS, max_new_tokens=tokens)),
        "engine": lambda: timed(engined, lambda: asyncio.run(engine_run(1))),
        "engine8": lambda: timed(engined, lambda: asyncio.run(engine_run(8))),
        "http": lambda: timed(served, lambda: http_run(1, True), streamed=True),
        "http8": lambda: timed(served, lambda: http_run(8, True), streamed=True),
        "generate32": lambda: timed(offline, lambda: offline.generate(PROMPTS32, max_new_tokens=tokens)),
        "http32": lambda: timed(served, lambda: http_run(32, True), streamed=True),
        "whole8": lambda: timed(served, lambda: http_run(8, False)),
    }, engine


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="uvicorn's event loop")
    p.add_argument("--http", choices=("auto", "h11", "httptools"), default="auto", help="uvicorn's HTTP protocol")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}")
    import torch

    from flashspec_bench.provenance import provenance, write_json

    torch.set_num_threads(1)  # the host's share, not the intra-op pool's
    with tempfile.TemporaryDirectory() as tmp:
        run, engine = runners(build(Path(tmp)), args.tokens, args.loop, args.http)
        try:
            for mode in modes:  # untimed: first allocations, first imports
                run[mode]()
            rounds = [{mode: run[mode]() for mode in modes} for _ in range(args.repeats)]
        finally:
            engine.stop()
    rows = {m: {k: round(statistics.median(r[m][k] for r in rounds), 4) for k in FIELDS if k in rounds[0][m]}
            for m in modes}
    result = {**provenance("benchmarks/serve_host_cost.py"), "setup": "tiny random models, float32, 1 torch thread",
              "tokens": args.tokens, "repeats": args.repeats, "uvicorn": uvicorn_setup(args.loop, args.http),
              "summary": summary(rows), "modes": rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        write_json(args.out, result)
    return 0


def uvicorn_setup(loop: str, http: str) -> dict[str, str | None]:
    """What uvicorn ran: the options, and the loop and parser ``auto`` resolves to here."""
    import importlib.util

    def have(name: str) -> bool:
        return importlib.util.find_spec(name) is not None

    return {"loop": loop, "http": http,
            "loop_used": loop if loop != "auto" else ("uvloop" if have("uvloop") else "asyncio"),
            "http_used": http if http != "auto" else ("httptools" if have("httptools") else "h11")}


def summary(rows: dict[str, dict[str, float]]) -> dict[str, float | None]:
    """Time to first token, and the server's CPU per step outside the step beyond generate's,
    at 1, 8 and 32 clients."""

    def get(mode: str, key: str) -> float | None:
        return rows[mode][key] if mode in rows else None

    def extra(served: str, offline: str) -> float | None:
        a, b = get(served, "host_cpu_ms"), get(offline, "host_cpu_ms")
        return None if a is None or b is None else round(a - b, 4)

    return {"ttft_ms_c1": get("http", "ttft_ms"), "ttft_ms_c8": get("http8", "ttft_ms"),
            "ttft_ms_c32": get("http32", "ttft_ms"),
            "extra_cpu_ms_c1": extra("http", "generate"), "extra_cpu_ms_c8": extra("http8", "generate8"),
            "extra_cpu_ms_c32": extra("http32", "generate32")}


if __name__ == "__main__":
    sys.exit(main())
