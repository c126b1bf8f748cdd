"""Throughput and latency of ``flashspec serve`` under concurrent clients, beside offline
``generate`` and the other project published on PyPI as ``flashspec`` (0.3.1, "the peer").

Our server runs in this process (uvicorn in a thread, 127.0.0.1, a free port) over a pipeline
from a TOML config; ``clients`` closed-loop clients, in a child process of their own (as real
clients are: in the server's, they would take the GIL from its engine thread), each send
``requests_per_client`` completions one after another. Per request: the time to the first text chunk (TTFT), the
gaps between text chunks (ITL: a chunk holds one step's tokens) and the completion tokens
(the response's ``usage``). Per concurrency: output tokens/s over the wall time, and the
medians and p99s. The systems, each over the same prompts, max tokens and sampling:

``spec``     our server, streaming.
``offline``  the same pipeline, before it serves: ``Pipeline.generate`` (what ``flashspec
             generate`` runs) on each prompt alone, on the token ids the server encodes.
``spec_plain`` our server with ``stream = false``, loaded like the peer (the peer has no
             streaming, so this is the row it is compared with).
``no_spec``  (``--no-spec``) our server again with one plain-decoding arm.
``peer``     (``--peer DIR``) ``python -m flashspec.serve`` from DIR, a ``pip install --target``
             folder (its package name is ours too, so it never goes into our environment), in
             a child process over the same model folders, non-streaming; its defaults
             otherwise (batch size 1, the only size its default drafter runs at). Bounded by
             ``--peer-deadline`` (and what ``--deadline`` leaves): a level past it is recorded
             as ``timed_out`` and the peer's process group is killed. It needs no network
             (it starts offline in seconds), but on CUDA its default ``--compile auto`` runs
             ``torch.compile(mode="reduce-overhead")`` on its first requests, once per input
             width of each model: minutes before the first answer (on the CPU, forced on, the
             tiny models' first request takes 100 s). So on CUDA it is tried with its default
             for half of its time, then with ``--compile off`` for the rest.

Every request is also checked: ``load_test`` counts the requests sent, lost (an error, or no
complete response), duplicated (a response id seen twice, or a stream that finished twice)
and mixed up (a text that agrees with another prompt's offline output for longer than with
its own).

The prompts: by default the 8 of :data:`PROMPTS`, every level sending them in turn from the
first, so a server that remembers earlier requests (the suffix arm) sees each again and again.
``--distinct`` draws from a pool of distinct prompts instead (:func:`distinct_pool`: HumanEval's
and ``workloads/domains.jsonl``'s), each load of a server going on where the last stopped
(warm-up, levels, the non-streaming levels), so no request repeats one an earlier request to that
server sent, as far as the pool goes; every row counts the requests that did (``repeated_prompts``).

``--smoke`` serves the tiny random models of :mod:`flashspec_core.testing.tiny` (CPU, a few
seconds); its result goes under ``benchmarks/.results``, never into the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
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
WARM_CLIENTS, WARM_PER_CLIENT = 2, 2  # the untimed load before a server's levels
PEER = "flashspec==0.3.1"
# Characters two texts must share from their start before a response counts as another
# prompt's: shorter openings ("def ", a newline) are shared by chance.
MIN_AGREE = 8
PEER_START_S = 900  # model loads and CUDA-graph captures before its /health answers
# The peer system's whole share of a run (start, warm-up and every level): a peer that never
# answers must not eat the time the lease gives the stage to copy its results out.
PEER_S = 300
STOP_S = 10  # from SIGTERM to SIGKILL for the peer's process group


@attrs.frozen
class Request:
    """One request as the client saw it; ``error`` set when it got no complete response."""

    ttft_s: float
    gaps_s: tuple[float, ...]  # between consecutive text chunks
    tokens: int
    total_s: float
    prompt: int = 0  # index into the prompts
    text: str = ""
    response_id: str | None = None
    finishes: int = 1  # chunks that carried a finish_reason (1 for a whole response)
    error: str | None = None


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
    """Output tokens/s over ``wall_s``, and TTFT / ITL / TPOT medians and p99s in milliseconds,
    over the requests that completed (``failed`` counts the others).

    ITL pools the gaps between text chunks as the client read them (chunks that arrive in one
    read are ~0 apart); TPOT is each request's time after its first chunk per further token.
    """
    ok = [r for r in requests if r.error is None]
    ttft = [r.ttft_s * 1e3 for r in ok]
    itl = [g * 1e3 for r in ok for g in r.gaps_s]
    tpot = [(r.total_s - r.ttft_s) * 1e3 / (r.tokens - 1) for r in ok if r.tokens > 1]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": len(requests),
        "failed": len(requests) - len(ok),
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


def common_prefix(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share from their start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


References = Mapping[int, str]  # the offline text per prompt index


def mixed_up(text: str, own: int, references: References) -> bool:
    """Whether ``text`` agrees with another prompt's reference (one that differs from its
    own) for longer than with ``references[own]``, and for at least MIN_AGREE characters.
    A prefix, not equality: greedy outputs of a batched bf16 server may part from the
    offline ones after a while without being another request's."""
    mine = common_prefix(text, references[own])
    other = max((common_prefix(text, ref) for ref in references.values() if ref != references[own]), default=0)
    return other > mine and other >= MIN_AGREE


def audit(requests: Sequence[Request], references: References | None) -> dict[str, int | None]:
    """The load test's counts over ``requests``: sent, lost, duplicated; and over the completed
    requests whose prompt has a reference (``references``: the offline text per prompt index;
    with ``--distinct`` only the c1 level's prompts have one) how many were checked, mixed up
    and differ from their prompt's reference at all (those three None without references)."""
    ok = [r for r in requests if r.error is None]
    ids = Counter(r.response_id for r in ok if r.response_id is not None)
    duplicated = sum(n - 1 for n in ids.values()) + sum(r.finishes - 1 for r in ok if r.finishes > 1)
    out: dict[str, int | None] = {"sent": len(requests), "lost": len(requests) - len(ok), "duplicated": duplicated,
                                  "checked_against_offline": None, "mixed_up": None, "differs_from_offline": None}
    if references is not None:
        checked = [r for r in ok if r.prompt in references]
        out["checked_against_offline"] = len(checked)
        out["mixed_up"] = sum(mixed_up(r.text, r.prompt, references) for r in checked)
        out["differs_from_offline"] = sum(r.text != references[r.prompt] for r in checked)
    return out


# ------------------------------------------------------------------ the servers


# The engine warms up before the server listens (flashspec_serve.warmup): graphs for every slot
# count it can run, which on the first server over a pipeline can take minutes on the GPU.
SERVER_START_S = 900.0


@contextmanager
def serving(pipeline: Any, max_batch: int, model: str = "bench", start_s: float = SERVER_START_S,
            say: Callable[[str], None] | None = None) -> Iterator[str]:
    """The app over ``pipeline`` on a free port of 127.0.0.1 while the block runs; yields its URL."""
    import uvicorn

    from flashspec_serve.app import ServeSettings, create_app, listening_socket

    app = create_app(pipeline, ServeSettings(model_name=model, max_batch=max_batch, max_waiting=4096))
    sock = listening_socket("127.0.0.1", 0)  # TCP_NODELAY: no Nagle wait per streamed chunk
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_keep_alive=600))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    t0 = time.monotonic()
    while not server.started:
        if time.monotonic() > t0 + start_s or not thread.is_alive():
            raise RuntimeError(f"the server did not start within {start_s:.0f} s (warm-up included)")
        time.sleep(0.01)
    if say is not None:
        say(f"server started in {time.monotonic() - t0:.1f} s (engine warm-up included)")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@attrs.frozen
class PeerSetup:
    """How the peer's server is started: its install folder and what it serves."""

    site: Path  # a `pip install --target` folder holding the peer's package
    target: str  # a local HF-format model folder
    draft: str
    dtype: str  # float32 | bfloat16 | float16
    temperature: float
    max_tokens: int
    extra: tuple[str, ...] = ()  # more arguments for `python -m flashspec.serve`


def peer_command(setup: PeerSetup, port: int, device: str) -> list[str]:
    # a queue as deep as ours, so that a 429 never stands in for a slow answer
    return [sys.executable, "-m", "flashspec.serve", "--target", setup.target, "--drafter", setup.draft,
            "--device", device, "--port", str(port), "--dtype", setup.dtype, "--temperature", str(setup.temperature),
            "--max-new-tokens", str(setup.max_tokens), "--max-queue", "4096", *setup.extra]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def peer_serving(setup: PeerSetup, log: Path, device: str, start_s: float = PEER_START_S) -> Iterator[str]:
    """The peer's server in a child process while the block runs; yields its URL. Its
    folder leads PYTHONPATH and it runs from an empty folder, so that ``import flashspec``
    finds the peer and nothing of ours. It leads a process group of its own, killed as a
    whole at the end (its workers too); :class:`TimedOut` when /health does not answer
    within ``start_s``."""
    import httpx

    port = _free_port()
    # Offline: it loads local folders only. Its torch.compile logs each (re)compile, so a log cut
    # short at a deadline says whether it was still compiling.
    env = {"TORCH_LOGS": "recompiles", **os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(setup.site), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as cwd, log.open("w") as out:
        proc = subprocess.Popen(peer_command(setup, port, device), cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + start_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the peer's server exited ({proc.returncode}): {_tail(log)}")
                if time.monotonic() > deadline:
                    raise TimedOut(f"the peer's server did not answer /health in {start_s:.0f} s: {_tail(log)}")
                try:
                    if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            yield url
        finally:
            stop_group(proc)


class TimedOut(RuntimeError):
    """A system did not answer within its share of the run."""


def stop_group(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to ``proc``'s process group, SIGKILL after at most STOP_S: a server that ignores
    the first, and workers that outlive their leader, still go."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_S)
        except subprocess.TimeoutExpired:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # the whole group is gone already
        pass
    proc.wait()


def _tail(log: Path, chars: int = 1500) -> str:
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# ------------------------------------------------------------------ the clients


async def _one(client: Any, body: dict[str, Any], prompt: int) -> Request:
    """One request; any failure becomes a Request with ``error`` (the load goes on)."""
    start = time.perf_counter()
    try:
        if body.get("stream"):
            return await _streamed(client, body, prompt, start)
        r = await client.post("/v1/completions", json=body)
        end = time.perf_counter()
        if r.status_code != 200:
            return _lost(start, prompt, f"HTTP {r.status_code}: {r.text[:300]}")
        obj = r.json()
        return Request(end - start, (), int(obj["usage"]["completion_tokens"]), end - start, prompt,
                       obj["choices"][0]["text"], obj.get("id"))
    except Exception as exc:  # noqa: BLE001  # counted as lost, named in the row
        return _lost(start, prompt, f"{type(exc).__name__}: {exc}")


def _lost(start: float, prompt: int, error: str) -> Request:
    t = time.perf_counter() - start
    return Request(t, (), 0, t, prompt, error=error)


async def _streamed(client: Any, body: dict[str, Any], prompt: int, start: float) -> Request:
    arrivals: list[float] = []
    pieces: list[str] = []
    ids: set[str] = set()
    tokens, finishes, done = None, 0, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return _lost(start, prompt, f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            if not line.startswith("data: ") or done:
                continue
            chunk = json.loads(line[len("data: "):])
            if "error" in chunk:
                return _lost(start, prompt, f"the server failed the request: {chunk['error']}")
            ids.add(chunk["id"])
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk["choices"]:
                finishes += choice.get("finish_reason") is not None
                if choice["text"]:
                    arrivals.append(time.perf_counter())
                    pieces.append(choice["text"])
    end = time.perf_counter()
    if not done or tokens is None or len(ids) != 1:
        return _lost(start, prompt, f"incomplete stream: [DONE] {done}, usage {tokens}, ids {sorted(ids)}")
    first = arrivals[0] if arrivals else end
    gaps = tuple(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))
    return Request(first - start, gaps, tokens, end - start, prompt, "".join(pieces), ids.pop(), finishes)


def plan(clients: int, per_client: int, n_prompts: int, first: int = 0) -> list[list[int]]:
    """The prompt indices each client sends, in order: the prompts in turn over all requests,
    from index ``first``."""
    return [[(first + c * per_client + k) % n_prompts for k in range(per_client)] for c in range(clients)]


def repeated(sent: Sequence[str], seen: Set[str]) -> int:
    """How many of ``sent`` (one load's prompts) repeat a prompt of ``seen`` (what the server
    was sent before the load) or another request of the load: all but the first of each
    new prompt, as the load's clients send at once."""
    return len(sent) - len(set(sent) - seen)


async def load(url: str, model: str, prompts: Sequence[str], clients: int, per_client: int, max_tokens: int,
               sampling: dict[str, Any], stream: bool = True, first: int = 0) -> tuple[list[Request], float]:
    """:func:`load_here` in a child process, as real clients are: in ours, their Python (HTTP
    parsing, JSON) would hold the GIL that our server's engine thread needs between its
    device calls, and slow the server it measures. Killed if cancelled (a deadline)."""
    job = {"url": url, "model": model, "prompts": list(prompts), "clients": clients, "per_client": per_client,
           "max_tokens": max_tokens, "sampling": sampling, "stream": stream, "first": first}
    here = str(Path(__file__).resolve().parents[1])  # the folder that holds flashspec_bench
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from flashspec_bench.serve import load_child; load_child()", env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await proc.communicate(json.dumps(job).encode())
    except asyncio.CancelledError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the load's client process failed ({proc.returncode}): {err.decode()[-1500:]}")
    done = json.loads(out)
    return [Request(**{**r, "gaps_s": tuple(r["gaps_s"])}) for r in done["requests"]], done["wall_s"]


def load_child() -> None:
    """The child of :func:`load`: a load's arguments as JSON on stdin, its requests and wall time on stdout."""
    job = json.loads(sys.stdin.read())
    requests, wall = asyncio.run(load_here(**job))
    json.dump({"requests": [attrs.asdict(r) for r in requests], "wall_s": wall}, sys.stdout)


async def load_here(url: str, model: str, prompts: Sequence[str], clients: int, per_client: int, max_tokens: int,
                    sampling: dict[str, Any], stream: bool = True, first: int = 0) -> tuple[list[Request], float]:
    """``clients`` clients, each sending ``per_client`` requests in turn (:func:`plan` from
    ``first``); the requests and the wall time of the whole load."""
    import httpx

    async def client_loop(client: Any, todo: list[int]) -> list[Request]:
        out = []
        for i in todo:
            body = {"model": model, "prompt": prompts[i], "max_tokens": max_tokens, "stream": stream, **sampling}
            if stream:
                body["stream_options"] = {"include_usage": True}
            out.append(await _one(client, body, i))
        return out

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
        # Untimed: the client's first request in this fresh process (httpx's and anyio's first
        # use, about 35 ms on a CPU) and one connection per client, so a TTFT is the server's.
        # A server that fails these fails the timed requests too, where it is counted.
        await asyncio.gather(*(client.get("/health") for _ in range(clients)), return_exceptions=True)
        start = time.perf_counter()
        todo = plan(clients, per_client, len(prompts), first)
        done = await asyncio.gather(*(client_loop(client, mine) for mine in todo))
        wall = time.perf_counter() - start
    return [r for rs in done for r in rs], wall


# ------------------------------------------------------------------ prompts


def distinct_pool() -> tuple[str, tuple[str, ...]]:
    """The pool ``--distinct`` draws from, and its name: HumanEval's 164 prompts
    (:func:`flashspec_bench.workloads.humaneval_rows`) and, where the file is there,
    ``workloads/domains.jsonl``'s, their domains spread evenly over the pool (:func:`spread`), so
    each level gets a mix and the run's first levels are not all code."""
    from flashspec_bench.workloads import DOMAINS, humaneval_rows, read_rows

    rows = humaneval_rows() + (read_rows(DOMAINS) if DOMAINS.exists() else [])
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row["domain"], []).append(row["prompt"])
    name = "humaneval+domains" if DOMAINS.exists() else "humaneval"
    return name, tuple(dict.fromkeys(spread(list(groups.values()))))  # a prompt twice in the files counts once


def spread(groups: Sequence[Sequence[str]]) -> list[str]:
    """Every item of ``groups``, each group's in its order and spread evenly over the whole
    list (an item at fraction ``(i + 0.5) / len(group)`` of its group lands near that fraction
    of the list)."""
    keyed = [((i + 0.5) / len(group), g, item) for g, group in enumerate(groups) for i, item in enumerate(group)]
    return [item for *_, item in sorted(keyed, key=lambda k: k[:2])]


def smoke_pool() -> tuple[str, ...]:
    """Distinct prompts for the tiny models: every three of their words t1..t14 (t0 is their
    unknown word, t15 their EOS), 2,744 prompts."""
    return tuple(" ".join(f"t{w}" for w in words) for words in itertools.product(range(1, 15), repeat=3))


def prompt_pool(smoke: bool, distinct: bool, path: Path | None) -> tuple[str, tuple[str, ...]]:
    """The prompts a run draws from and their name for the JSON: ``path``'s (one JSON string a
    line), else with ``distinct`` :func:`distinct_pool` (:func:`smoke_pool` with ``smoke``), else
    the 8 built-in prompts (the 6 smoke ones)."""
    if path is not None:
        return f"file:{path}", tuple(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    if distinct:
        return ("smoke-tiny", smoke_pool()) if smoke else distinct_pool()
    prompts = SMOKE_PROMPTS if smoke else PROMPTS
    return f"{'smoke' if smoke else 'builtin'}-{len(prompts)}", tuple(prompts)


# ------------------------------------------------------------------ pipelines


def no_spec(config: dict[str, Any]) -> dict[str, Any]:
    """The same pipeline config with one plain-decoding arm (speculation off)."""
    return {**config, "arm": [{"use": "none", "name": "plain"}], "selector": {"use": "fixed"}}


def smoke_config(root: Path) -> dict[str, Any]:
    """A pipeline config over the tiny random target and its close draft, written under ``root``."""
    from flashspec_core.testing.tiny import pipeline_dict, tiny_family

    models = tiny_family(root)
    return pipeline_dict(models["target"], [models["close"]], "ucb1", dtype="float32")


def local_models(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """``config`` with every ``model`` that names a known model replaced by its converted
    folder ``root/<name>-bf16`` where that exists (how the GPU lease lays the models out)."""
    def fix(table: dict[str, Any]) -> dict[str, Any]:
        folder = root / f"{table.get('model')}-bf16"
        return {**table, "model": str(folder)} if "model" in table and folder.is_dir() else table

    return {**config, "target": fix(config["target"]), "arm": [fix(a) for a in config.get("arm", [])]}


def model_folders(config: dict[str, Any], base_dir: Path | None) -> tuple[str, str]:
    """The target's and the first draft model's folders in ``config``, for the peer."""
    drafts = [a["model"] for a in config.get("arm", []) if "model" in a]
    if not drafts:
        raise ValueError("the config has no draft model for the peer to use")

    def where(model: str) -> str:
        path = Path(model) if base_dir is None else base_dir / model
        return str(path.resolve()) if path.is_dir() else model

    return where(config["target"]["model"]), where(drafts[0])


def peer_dtype(config: dict[str, Any], cuda: bool) -> str:
    """The target's dtype in the peer's words (it has no float64; ``auto`` as ours reads it)."""
    dtype = str(config["target"].get("dtype", "auto"))
    return {"bf16": "bfloat16", "bfloat16": "bfloat16", "float16": "float16", "fp16": "float16"}.get(
        dtype, "bfloat16" if dtype == "auto" and cuda else "float32")


def build(config: dict[str, Any], base_dir: Path | None) -> Any:
    from flashspec_core.build import build_pipeline
    from flashspec_core.config import parse_config
    from flashspec_core.registry import build_registry

    registry = build_registry()
    return build_pipeline(parse_config(config, registry, "<serve bench>", base_dir=base_dir), registry)


def server_ids(pipeline: Any, prompt: str) -> list[int]:
    """The token ids our server sends to the pipeline for ``prompt`` (no chat template)."""
    tokenizer = getattr(pipeline.target, "tokenizer", None)
    return list(tokenizer(prompt)["input_ids"]) if tokenizer is not None else list(pipeline.target.encode(prompt))


def forget_requests(pipeline: Any) -> int:
    """Empty what ``pipeline``'s draft providers learned from earlier requests
    (:class:`~flashspec_core.contracts.ForgetsRequests`: the suffix arm's corpus); how many did."""
    from flashspec_core.contracts import ForgetsRequests

    providers = {id(a.provider): a.provider for a in pipeline.arms}.values()
    learners = [p for p in providers if isinstance(p, ForgetsRequests)]
    for provider in learners:
        provider.forget_requests()
    return len(learners)


def offline(pipeline: Any, prompts: Sequence[str], max_tokens: int, temperature: float, forget: bool = False
            ) -> tuple[list[tuple[int, float, str]], int]:
    """``Pipeline.generate`` on each prompt alone, after the server's own warm-up at one row
    and an untimed pass over every prompt: per prompt the new tokens, the seconds and the
    text, and the graphs the timed pass captured (0 where the warm-ups met every shape). The
    server warms every arm at every draft width before its timed loads, so offline does too:
    with the untimed pass alone an arm the selector first played in the timed pass captured
    its graphs there (2 captures, offline at 0.61x the streaming server on the H100; with one
    warm-up prompt, 0.51x on the H200). With ``forget``, the pipeline forgets the requests
    it learned from (:func:`forget_requests`) after the untimed pass and after the timed one,
    so neither the timed pass nor the server after it meets these prompts again in the suffix
    arm's corpus. It runs in a worker thread, as the
    server's engine does: on a busy CPU, torch's intra-op threads make the main thread's
    decoding many times slower than a worker thread's, which would credit the server with the
    difference."""
    from flashspec_serve.warmup import graph_captures, graph_counters, warm_up

    def work() -> tuple[list[tuple[int, float, str]], int]:
        encoded = [server_ids(pipeline, prompt) for prompt in prompts]
        warm_up(pipeline, [1], pipeline.max_context, per_row=False, level="basic")
        for ids in encoded:
            pipeline.generate([ids], max_new_tokens=max_tokens, temperature=temperature)
        if forget:
            forget_requests(pipeline)
        before = graph_captures(graph_counters(pipeline))
        out = []
        for ids in encoded:
            start = time.perf_counter()
            result = pipeline.generate([ids], max_new_tokens=max_tokens, temperature=temperature)
            out.append((len(result.token_ids[0]), time.perf_counter() - start, result.texts[0]))
        captures = graph_captures(graph_counters(pipeline)) - before
        if forget:
            forget_requests(pipeline)
        return out, captures

    result: tuple[list[tuple[int, float, str]], int] = in_thread(work)
    return result


def in_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a new thread; its result, or its exception raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="serve-bench-offline")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def offline_row(timed: Mapping[int, tuple[int, float, str]], order: Sequence[int]) -> dict[str, Any]:
    """Tokens/s of the offline runs of the prompts in ``order`` (what one client sends)."""
    tokens = sum(timed[i][0] for i in order)
    wall = sum(timed[i][1] for i in order)
    return {"requests": len(order), "output_tokens": tokens, "wall_s": round(wall, 4),
            "output_tokens_per_s": round(tokens / wall, 3) if wall > 0 else None}


def warm_up(url: str, model: str, prompts: Sequence[str], max_tokens: int, sampling: dict[str, Any],
            stream: bool) -> list[Request]:
    """A few requests first, so that one-off costs (allocations, graph captures) are not timed:
    the first WARM_CLIENTS * WARM_PER_CLIENT prompts, which a distinct load's levels leave to it."""
    return asyncio.run(load(url, model, prompts, WARM_CLIENTS, WARM_PER_CLIENT, max_tokens, sampling, stream))[0]


@attrs.frozen
class Load:
    """What every load of one system shares."""

    prompts: tuple[str, ...]
    concurrency: tuple[int, ...]
    per_client: int
    max_tokens: int
    sampling: dict[str, Any]
    # None: each level sends the prompts in turn from the first (the same ones at every level);
    # a number (--distinct): the first level starts at that index and each level goes on where
    # the one before it stopped
    start: int | None = None
    pool: str = ""  # where the prompts came from, for the JSON

    @property
    def distinct(self) -> bool:
        return self.start is not None

    def firsts(self) -> list[int]:
        """Per level, the index of the prompt its first request sends."""
        if self.start is None:
            return [0] * len(self.concurrency)
        starts = itertools.accumulate((c * self.per_client for c in self.concurrency), initial=self.start)
        return list(starts)[:-1]

    def sent(self) -> int:
        """The requests of all its levels."""
        return sum(self.concurrency) * self.per_client

    def after(self) -> int | None:
        """Where a distinct load after this one starts (None when this one is not distinct)."""
        return None if self.start is None else self.start + self.sent()

    def c1_order(self) -> list[int]:
        """The prompt indices the one client of the c1 level sends (where there is no such
        level: what one client would send from the first level's start)."""
        first = self.firsts()[self.concurrency.index(1)] if 1 in self.concurrency else (self.start or 0)
        return plan(1, self.per_client, len(self.prompts), first)[0]


def levels(url: str, model: str, spec: Load, stream: bool, say: Callable[[str], None], name: str,
           end: float | None = None, ours: bool = False, seen: set[str] | None = None
           ) -> tuple[dict[str, Any], list[Request]]:
    """Per concurrency level, :func:`summarize` of a load on ``url`` and ``repeated_prompts``
    (:func:`repeated`, against ``seen``: the prompts the server was sent before, which each
    level's are added to); and every request. ``end`` (``time.monotonic()``): a level not done
    by then is cancelled and recorded as ``{"timed_out": ...}``, and the levels after it are
    not run. With ``ours``, each level also gets ``server``: what our ``/metrics`` counted
    during it (:func:`server_delta`)."""
    out: dict[str, Any] = {}
    sent: list[Request] = []
    seen = set() if seen is None else seen
    for c, first in zip(spec.concurrency, spec.firsts(), strict=True):
        before = scrape(url) if ours else None
        try:
            requests, wall = bounded(load(url, model, spec.prompts, c, spec.per_client, spec.max_tokens,
                                          spec.sampling, stream, first), end)
        except TimedOut as exc:
            out[f"c{c}"] = {"timed_out": str(exc)}
            say(f"{name} c={c}: {exc}")
            break
        out[f"c{c}"] = {**summarize(requests, wall), "repeated_prompts": note_sent(requests, spec, seen, say,
                                                                                 f"{name} c={c}")}
        if before is not None:
            out[f"c{c}"]["server"] = server_delta(before, scrape(url))
        sent += requests
        say(f"{name} c={c}: {out[f'c{c}']}")
    return out, sent


def note_sent(requests: Sequence[Request], spec: Load, seen: set[str], say: Callable[[str], None], what: str) -> int:
    """:func:`repeated` over the prompts ``requests`` sent, which join ``seen``; said aloud when a
    distinct load repeats any (its pool is too small for the run)."""
    prompts = [spec.prompts[r.prompt] for r in requests]
    n = repeated(prompts, seen)
    seen.update(prompts)
    if n and spec.distinct:
        say(f"{what}: {n} of {len(prompts)} requests repeat a prompt this server was sent before: the pool "
            f"({spec.pool}, {len(spec.prompts)} prompts) is smaller than the run")
    return n


def scrape(url: str) -> dict[str, float]:
    """Our server's ``/metrics`` as ``{sample name with labels: value}`` (counters and the
    step-time histogram's sum and count)."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        return parse_metrics(response.read().decode())


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus exposition ``text`` as ``{sample name with labels: value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """What the server counted between two scrapes: steps per arm and, per arm, its mean step
    time, live rows, tokens per row-step and tokens per millisecond of step; decode steps, mean step
    time (ms) and their sum (s: the rest of a level's wall time is the host's, admission and
    prefill included), draft tokens proposed and accepted, batch rebuilds and rows prefilled
    alone and the seconds spent starting rows (prefills, the device wait included), and graphs captured while serving, so a level's tokens/s can be read against the
    arms the selector played and what they accepted."""
    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    arms = {key.split("arm=", 1)[1].rstrip("}"): int(grew(key)) for key in after
            if key.startswith("flashspec:spec_decode_arm_selections_total{")}
    per_arm = {}
    for arm, n in arms.items():
        if n:
            label = f'{{arm={arm}}}'
            seconds, rows = grew(f"flashspec:arm_step_seconds_total{label}"), grew(f"flashspec:arm_row_steps_total{label}")
            emitted = grew(f"flashspec:arm_emitted_tokens_total{label}")
            per_arm[arm] = {"step_ms_mean": round(1000 * seconds / n, 3), "rows_mean": round(rows / n, 2),
                            "tokens_per_row_step": round(emitted / rows, 3) if rows else None,
                            "tokens_per_step_ms": round(emitted / (1000 * seconds), 3) if seconds else None}
    steps, seconds = grew("flashspec:step_time_seconds_count"), grew("flashspec:step_time_seconds_sum")
    captures = sum(grew(key) for key in after if key.startswith("flashspec:graph_captures_while_serving_total"))
    return {"arm_steps": {a: n for a, n in arms.items() if n}, "arms": per_arm, "steps": int(steps),
            "step_ms_mean": round(1000 * seconds / steps, 3) if steps else None,
            "step_s_total": round(seconds, 4),
            "draft_tokens": int(grew("flashspec:spec_decode_num_draft_tokens_total")),
            "accepted_tokens": int(grew("flashspec:spec_decode_num_accepted_tokens_total")),
            "rebuilds": int(grew("flashspec:batch_rebuilds_total")),
            "row_prefills": int(grew("flashspec:batch_row_prefills_total")),
            "prefill_s_total": round(grew("flashspec:batch_prefill_seconds_total"), 4),
            "graph_captures_while_serving": int(captures)}


def bounded(work: Any, end: float | None) -> Any:
    """``asyncio.run(work)``, cancelled at ``end`` (``time.monotonic()``; None: no bound) with :class:`TimedOut`."""
    if end is None:
        return asyncio.run(work)
    left = end - time.monotonic()

    async def until() -> Any:
        return await asyncio.wait_for(work, max(left, 0.0))

    try:
        return asyncio.run(until())
    except TimeoutError:
        raise TimedOut(f"no answer within the system's deadline ({max(left, 0.0):.0f} s left at the start of the load)"
                       ) from None


class StepTrace:
    """Appends one JSON line per served decode step (the pipeline's ``on_step``) to ``path``:
    the system, seconds since the trace began, the arm, rows, tokens proposed, accepted per
    row, step milliseconds and their draft, target and verify parts, whether it captured a
    graph, and, between them, what the bench said (its level lines), so a selector's choices
    can be replayed offline from the real costs. Steps are kept in memory and written at each
    line the bench says (between levels) and at :meth:`flush`: no file I/O on the engine's
    thread between two steps it times."""

    def __init__(self, path: Path, system: str) -> None:
        self.path, self.system, self.t0 = path, system, time.monotonic()
        self.rows: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)

    def _add(self, row: dict[str, Any]) -> None:
        self.rows.append({"system": self.system, "t": round(time.monotonic() - self.t0, 4), **row})

    def __call__(self, record: Any) -> None:
        self._add({"arm": record.arm_name, "rows": record.batch_size, "gamma": record.gamma,
                   "accepted": list(record.accepted), "step_ms": round(record.step_ms, 4),
                   **{k: round(getattr(record, k), 4) for k in ("draft_ms", "target_ms", "verify_ms")},
                   "captured": record.captured})

    def note(self, text: str) -> None:
        self._add({"say": text})
        self.flush()

    def flush(self) -> None:
        """Append the lines kept so far to the file."""
        rows, self.rows = self.rows, []
        if rows:
            with self.path.open("a") as f:
                f.writelines(json.dumps(row) + "\n" for row in rows)


def bench_ours(config: dict[str, Any], base_dir: Path | None, spec: Load, plain: Load | None,
               with_offline: bool, say: Callable[[str], None], name: str, soak_requests: int = 0,
               trace: Path | None = None
               ) -> tuple[dict[str, dict[str, Any]], dict[str, list[Request]], dict[int, str] | None]:
    """Our server over ``config``: streaming loads (``name``), then, with ``plain``,
    non-streaming ones (``name``_plain, as the peer is loaded), then with ``soak_requests``
    the memory soak (``name``_soak, :func:`soak`); with ``with_offline``, offline generation first
    (on every prompt; a distinct load: on the c1 level's, forgotten before the server starts);
    with ``trace``, every served step appended to that JSONL (:class:`StepTrace`).
    The rows per system, the requests per system, and the offline text per prompt index."""
    pipeline = build(config, base_dir)
    if trace is not None:
        steps = StepTrace(trace, name)
        pipeline.on_step, said = steps, say

        def say(text: str) -> None:
            said(text)
            steps.note(text)
    rows: dict[str, dict[str, Any]] = {}
    requests: dict[str, list[Request]] = {}
    references = None
    seen: set[str] = set()  # the prompts this pipeline met before a load: it may have learned them
    if with_offline:
        c1 = spec.c1_order()
        ran = list(dict.fromkeys(c1)) if spec.distinct else list(range(len(spec.prompts)))
        timed, captures = offline(pipeline, [spec.prompts[i] for i in ran], spec.max_tokens,
                                  spec.sampling["temperature"], forget=spec.distinct)
        by_prompt = dict(zip(ran, timed, strict=True))
        references = {i: t[2] for i, t in by_prompt.items()}
        if not spec.distinct:
            seen.update(spec.prompts[i] for i in ran)
        rows["offline"] = {"c1": {**offline_row(by_prompt, c1), "graph_captures": captures}}
        say(f"offline c1: {rows['offline']['c1']}")
    with serving(pipeline, max(spec.concurrency + (plain.concurrency if plain else ())), say=say) as url:
        note_sent(warm_up(url, "bench", spec.prompts, spec.max_tokens, spec.sampling, True), spec, seen, say,
                  f"{name} warm-up")
        rows[name], requests[name] = levels(url, "bench", spec, True, say, name, ours=True, seen=seen)
        if plain is not None:
            rows[f"{name}_plain"], requests[f"{name}_plain"] = levels(url, "bench", plain, False, say,
                                                                          f"{name}_plain", ours=True, seen=seen)
        if soak_requests > 0:
            rows[f"{name}_soak"] = soak(url, spec, soak_requests, say)
    if trace is not None:
        steps.flush()
    return rows, requests, references


SOAK_ROUND = 100  # requests between two memory readings
SOAK_TOKENS = 32  # new tokens per soak request: many requests, each joining and leaving the batch


def soak(url: str, spec: Load, total: int, say: Callable[[str], None]) -> dict[str, Any]:
    """``total`` streaming requests of :data:`SOAK_TOKENS` new tokens in rounds of
    :data:`SOAK_ROUND` (clients: the most of ``spec``'s levels, at most 64), reading after each
    round this process's resident memory and the CUDA memory torch holds (the server runs in
    this process): a leak per request shows as growth from the first reading to the last."""
    import torch

    clients = min(max(spec.concurrency), 64)
    rss, cuda, failed, sent = [], [], 0, 0
    while sent < total:
        n = min(SOAK_ROUND, total - sent)
        live = min(clients, n)
        requests, _ = asyncio.run(load(url, "bench", spec.prompts, live, n // live, SOAK_TOKENS, spec.sampling, True))
        sent += len(requests)
        failed += sum(r.error is not None for r in requests)
        rss.append(round(resident_mib(), 1))
        if torch.cuda.is_available():
            cuda.append(round(torch.cuda.memory_allocated() / 2**20, 1))
    row = {"requests": sent, "failed": failed, "clients": clients, "new_tokens": SOAK_TOKENS,
           "rss_mib": rss, "rss_growth_mib": round(rss[-1] - rss[0], 1) if rss else None,
           "cuda_allocated_mib": cuda or None, "cuda_growth_mib": round(cuda[-1] - cuda[0], 1) if cuda else None}
    say(f"soak: {sent} requests, {failed} failed, resident memory {rss[0]} -> {rss[-1]} MiB"
        + (f", CUDA {cuda[0]} -> {cuda[-1]} MiB" if cuda else ""))
    return row


def resident_mib() -> float:
    """This process's resident set (VmRSS) in MiB; 0.0 where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def bench_peer(setup: PeerSetup, spec: Load, log: Path, say: Callable[[str], None], deadline_s: float = PEER_S
               ) -> tuple[dict[str, Any], list[Request]]:
    """The peer's rows per level (non-streaming) and its requests, all within ``deadline_s``
    (start, warm-up and levels; a level past it is a ``timed_out`` row). Raises when it cannot
    serve the prompts at all (its warm-up requests all fail), :class:`TimedOut` when it does
    not start or warm up in time."""
    import torch

    end = time.monotonic() + deadline_s
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    with peer_serving(setup, log, device, min(PEER_START_S, deadline_s)) as url:
        try:
            warm = bounded(load(url, "peer", spec.prompts, WARM_CLIENTS, WARM_PER_CLIENT, spec.max_tokens,
                                spec.sampling, False), end)[0]
        except TimedOut as exc:  # its log says what it was doing (its compiles are logged)
            raise TimedOut(f"its warm-up requests got {exc}; its log ends: {_tail(log)}") from None
        if all(r.error is not None for r in warm):
            raise RuntimeError(f"the peer failed every warm-up request: {warm[0].error}")
        seen: set[str] = set()
        note_sent(warm, spec, seen, say, "peer warm-up")
        return levels(url, "peer", spec, False, say, "peer", end, seen=seen)


def _ratio(rows: dict[str, dict[str, Any]], num: str, den: str, level: str) -> float | None:
    a = rows.get(num, {}).get(level, {}).get("output_tokens_per_s")
    b = rows.get(den, {}).get(level, {}).get("output_tokens_per_s")
    return round(a / b, 3) if a and b else None


def summary(runs: dict[str, dict[str, Any]], load_test: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headline numbers, each from the measured rows (None where a side did not run):
    per concurrency TTFT / ITL of the streaming speculative server; ``throughput_vs_peer_c32``
    (ours non-streaming over the peer's, both at 32 clients), ``spec_vs_nospec_c32`` (streaming,
    32 clients; ``spec_vs_nospec``: at every level both ran), ``stream_vs_offline_c1`` (one streaming client over offline generate on the
    same prompts) and the load test's totals over every system. ``throughput_vs_peer_highest``
    is that ratio at the most clients both servers were measured at (the peer decodes one
    request at a time, so a level of many clients may outlast its deadline)."""
    spec = runs.get("spec", {})
    out: dict[str, Any] = {
        level: {k: v for k, v in row.items() if k.startswith(("ttft", "itl", "tpot", "output_tokens_per_s"))}
        for level, row in spec.items()
    }
    out["throughput_vs_peer_c32"] = _ratio(runs, "spec_plain", "peer", "c32")
    out["throughput_vs_peer_highest"] = _highest_common(runs, "spec_plain", "peer")
    out["spec_vs_nospec_c32"] = _ratio(runs, "spec", "no_spec", "c32")
    out["spec_vs_nospec"] = {lv: r for lv in spec if (r := _ratio(runs, "spec", "no_spec", lv)) is not None}
    out["stream_vs_offline_c1"] = _ratio(runs, "spec", "offline", "c1")
    if load_test is not None:
        out["load_test"] = total(load_test)
    soaked = runs.get("spec_soak")
    if soaked:
        out["memory"] = {k: soaked[k] for k in ("requests", "failed", "rss_growth_mib", "cuda_growth_mib")}
    return out


def _highest_common(runs: dict[str, dict[str, Any]], num: str, den: str) -> dict[str, Any] | None:
    levels = [lv for lv in runs.get(num, {}) if _ratio(runs, num, den, lv) is not None]
    if not levels:
        return None
    level = max(levels, key=lambda lv: int(lv.removeprefix("c")))
    return {"clients": int(level.removeprefix("c")), "ratio": _ratio(runs, num, den, level)}


def total(load_test: dict[str, dict[str, int | None]]) -> dict[str, int | None]:
    """The load test's counts added up over the systems (None where no system had references)."""
    keys = ("sent", "lost", "duplicated", "checked_against_offline", "mixed_up", "differs_from_offline")
    out: dict[str, int | None] = {}
    for k in keys:
        values = [v[k] for v in load_test.values() if v.get(k) is not None]
        out[k] = sum(v for v in values if v is not None) if values else None
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="serve_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="pipeline TOML (required unless --smoke)")
    p.add_argument("--smoke", action="store_true", help="the tiny random models on the CPU")
    p.add_argument("--local-models", type=Path, metavar="DIR",
                   help="serve every known model the config names from DIR/<name>-bf16 (the GPU lease's layout)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated numbers of clients")
    p.add_argument("--requests-per-client", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--no-spec", action="store_true", help="also run the server with speculation off")
    p.add_argument("--no-offline", action="store_true", help="skip offline generate (and so the mixed-up check)")
    p.add_argument("--soak", type=int, default=1000, metavar="N",
                   help=f"after the speculative server's levels, N short requests with its memory read every "
                        f"{SOAK_ROUND} (0: none)")
    p.add_argument("--peer", type=Path, metavar="DIR",
                   help=f"also run the peer ({PEER}) installed with `pip install --target DIR`")
    p.add_argument("--peer-concurrency", default="1,8,32",
                   help="the levels of the non-streaming loads of the peer and of ours beside it (the peer decodes "
                        "one request at a time, so each level costs it the sum of its requests)")
    p.add_argument("--peer-requests-per-client", type=int, default=1,
                   help="requests per client for the non-streaming loads of the peer and of ours beside it")
    p.add_argument("--peer-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for the peer's server (repeat), e.g. --peer-arg=--compile=off")
    p.add_argument("--peer-deadline", type=float, default=PEER_S, metavar="S",
                   help="seconds for the peer's start, warm-up and levels together; a level past them is recorded "
                        "as timed_out and the peer's process group is killed")
    p.add_argument("--deadline", type=float, default=None, metavar="S",
                   help="seconds for the whole run: the peer gets at most what is left of them (less STOP_S), so "
                        "a wall-clock limit a little above S never cuts a system off")
    p.add_argument("--prompts", type=Path, help="a file of prompts, one JSON string per line")
    p.add_argument("--distinct", action="store_true",
                   help="no request repeats a prompt an earlier request to the same server sent (warm-up, levels, "
                        "non-streaming levels; the soak still repeats), drawn from HumanEval's and "
                        "workloads/domains.jsonl's prompts (--smoke: the tiny models' word triples; --prompts: that "
                        "file's): a server that remembers earlier requests (the suffix arm) is then measured on new "
                        "text. Where the pool runs out, prompts repeat, said in the log and counted per level "
                        "(repeated_prompts)")
    p.add_argument("--out", type=Path, help="the result JSON (default: docs/benchmarks/serve-h200.json; "
                                             "benchmarks/.results/serve-smoke.json with --smoke)")
    p.add_argument("--commit", help="the measured commit, where the checkout has no git")
    p.add_argument("--trace", type=Path, metavar="JSONL",
                   help="append every served decode step (arm, rows, width, accepted, step time) to this file: "
                        "raw data for replaying the selector, never for git")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.smoke and args.config is None:
        parser().error("--config is required unless --smoke")
    say = logger("serve-bench")
    # a wall-clock limit (`timeout`) ends the run by SIGTERM: exit through the context
    # managers, so the peer's child process goes with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = args.out or (RESULTS / "serve-smoke.json" if args.smoke else DOCS / "serve-h200.json")
    pool, prompts = prompt_pool(args.smoke, args.distinct, args.prompts)
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            config, base_dir = smoke_config(Path(tmp)), None
        else:
            from flashspec_core.config import read_config

            config, base_dir = read_config(args.config), args.config.parent
        if args.local_models is not None:
            config = local_models(config, args.local_models)
        # a distinct load's levels leave the pool's first prompts to the warm-up
        spec = Load(prompts, tuple(int(c) for c in args.concurrency.split(",")), args.requests_per_client,
                    args.max_tokens, {"temperature": args.temperature},
                    WARM_CLIENTS * WARM_PER_CLIENT if args.distinct else None, pool)
        run(args, config, base_dir, spec, out, Path(tmp), say, time.monotonic())
    return 0


def run(args: argparse.Namespace, config: dict[str, Any], base_dir: Path | None, spec: Load, out: Path, tmp: Path,
        say: Callable[[str], None], start: float) -> None:
    """Every system in turn, rewriting ``out`` after each, so a run cut short keeps what it
    measured; the peer last, as the slowest and the likeliest to fail."""
    notes = ["spec, no_spec: streaming (SSE) clients; spec_plain and peer: non-streaming clients, since the peer "
             "has no streaming; throughput_vs_peer_c32 compares those two",
             f"peer: {PEER} from PyPI (another project of the same name), `python -m flashspec.serve` over the same "
             "model folders, its defaults otherwise (batch size 1, its default drafter strategy)"]
    plain = attrs.evolve(spec, concurrency=tuple(int(c) for c in args.peer_concurrency.split(",")),
                         per_client=args.peer_requests_per_client, start=spec.after())
    wanted = WARM_CLIENTS * WARM_PER_CLIENT + spec.sent() + (plain.sent() if args.peer else 0)
    if spec.distinct and wanted > len(spec.prompts):
        notes.append(f"distinct: our speculative server is sent {wanted} requests (warm-up and levels) from a pool of "
                     f"{len(spec.prompts)} prompts ({spec.pool}), so {wanted - len(spec.prompts)} repeat an earlier "
                     "one; runs.*.*.repeated_prompts counts them per level")
        say(notes[-1])
    runs, requests, references = bench_ours(config, base_dir, spec, plain if args.peer else None,
                                            not args.no_offline, say, "spec", args.soak, args.trace)
    _write(args, out, spec, runs, requests, references, notes, say)
    if args.no_spec:
        rows, reqs, _ = bench_ours(no_spec(config), base_dir, spec, None, False, say, "no_spec", trace=args.trace)
        runs |= rows
        requests |= reqs
        _write(args, out, spec, runs, requests, references, notes, say)
    if args.peer is None:
        runs["peer"] = {"skipped": "not asked for (--peer DIR)"}
        _write(args, out, spec, runs, requests, references, notes, say)
        return
    import torch

    end = time.monotonic() + peer_budget(args.peer_deadline, args.deadline, time.monotonic() - start)
    cuda = torch.cuda.is_available()

    def setup(extra: tuple[str, ...]) -> PeerSetup:
        target, draft = model_folders(config, base_dir)
        return PeerSetup(args.peer, target, draft, peer_dtype(config, cuda), args.temperature, args.max_tokens, extra)

    runs["peer"], sent, peer_notes, failures = peer_runs(setup, peer_attempts(tuple(args.peer_arg), cuda), plain,
                                                         tmp / "peer.log", say, end)
    if sent is not None:
        requests["peer"] = sent
    notes += peer_notes
    if failures and args.smoke:
        notes.append("smoke: the peer's AutoTokenizer reads the tiny models' word-level tokenizer as Qwen2's BPE, "
                     "which encodes the smoke prompts to no tokens, so the peer cannot serve them")
    _write(args, out, spec, runs, requests, references, notes, say)


def peer_runs(setup: Callable[[tuple[str, ...]], PeerSetup], attempts: Sequence[tuple[str, ...]], spec: Load,
              log: Path, say: Callable[[str], None], end: float
              ) -> tuple[dict[str, Any], list[Request] | None, list[str], list[str]]:
    """The peer's rows from the first of ``attempts`` (extra arguments each) that serves, all by
    ``end`` (``time.monotonic()``); every attempt but the last gets an equal share of the time
    left, so the fallback still runs after a first attempt that never answers (the compiled
    path compiling for minutes). Its rows (``skipped`` with every failure where none served),
    requests (None then), notes, and the failures."""
    failures: list[str] = []
    notes: list[str] = []
    for i, extra in enumerate(attempts):
        left = end - time.monotonic()
        try:
            if left < 1:
                raise TimedOut("no time left of the peer's deadline for this attempt")
            chosen = setup(extra)
            rows, requests = bench_peer(chosen, spec, log, say, left / (len(attempts) - i))
        except Exception as exc:  # noqa: BLE001  # the other systems' numbers still count
            failures.append(f"with {list(extra)}: {'timed_out' if isinstance(exc, TimedOut) else type(exc).__name__}: "
                            f"{exc}")
            say(f"peer failed {failures[-1]}")
            continue
        notes.append("peer command: " + " ".join(peer_command(chosen, 0, "DEVICE")[1:]))
        late = {k: v["timed_out"] for k, v in rows.items() if "timed_out" in v}
        if late:
            notes.append(f"peer timed_out at {', '.join(late)}: " + "; ".join(sorted(set(late.values()))))
        if failures:
            notes.append("peer attempts that failed: " + "; ".join(failures))
        return rows, requests, notes, failures
    if failures:
        notes.append("peer attempts that failed: " + "; ".join(failures))
    return {"skipped": "; ".join(failures)}, None, notes, failures


def peer_budget(peer_s: float, run_s: float | None, elapsed_s: float) -> float:
    """Seconds the peer may take: ``peer_s``, or less where the run's own limit ``run_s``
    (None: none) leaves less after ``elapsed_s``, with STOP_S kept back to kill its group."""
    return peer_s if run_s is None else max(0.0, min(peer_s, run_s - elapsed_s - STOP_S))


def peer_attempts(extra: tuple[str, ...], cuda: bool) -> list[tuple[str, ...]]:
    """The peer's argument sets to try in turn: as given, then, on CUDA where the compile
    mode was not given, without its static-cache CUDA-graph path (its ``auto`` turns that on
    with CUDA: it compiles for minutes on its first requests, and it is the part likeliest to
    break on another transformers)."""
    if cuda and not any(a.startswith("--compile") for a in extra):
        return [extra, (*extra, "--compile", "off")]
    return [extra]


def _write(args: argparse.Namespace, out: Path, spec: Load, runs: dict[str, Any], requests: dict[str, list[Request]],
           references: References | None, notes: list[str], say: Callable[[str], None]) -> None:
    load_test = {name: audit(reqs, references) for name, reqs in requests.items()}
    errors = {name: sorted({r.error for r in reqs if r.error})[:5] for name, reqs in requests.items()}
    for name, rows in runs.items():  # levels cut at the system's deadline sent requests that never came back
        late = [f"{level}: timed_out: {row['timed_out']}" for level, row in rows.items()
                if isinstance(row, dict) and "timed_out" in row]
        if late:
            errors[name] = [*errors.get(name, []), *late]
    result = {
        **provenance(SCRIPT, args.commit),
        "config": {"pipeline": str(args.config) if args.config else "smoke: tiny random target and close draft",
                   "local_models": str(args.local_models) if args.local_models else None,
                   "concurrency": list(spec.concurrency), "requests_per_client": spec.per_client,
                   "peer_concurrency": args.peer_concurrency, "peer_requests_per_client": args.peer_requests_per_client,
                   "max_tokens": spec.max_tokens,
                   "sampling": spec.sampling, "prompts": len(spec.prompts), "prompt_pool": spec.pool,
                   "distinct": spec.distinct},
        "notes": notes,
        "runs": runs,
        "load_test": load_test,
        "errors": {k: v for k, v in errors.items() if v},
        "summary": summary(runs, load_test),
    }
    say(f"wrote {write_json(out, result)}")
