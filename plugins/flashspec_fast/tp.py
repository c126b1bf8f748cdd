"""The fast target sharded over ``tensor_parallel`` processes with ``torch.distributed``.

Each rank holds a slice of every layer, as in Megatron-LM, vLLM and gpt-fast: the QKV
projection by heads and the gate-up projection by columns (column-parallel: no traffic),
the output and down projections by their input columns (row-parallel: one all-reduce of
the residual update each, two per layer), and the embedding and the LM head by
vocabulary: a rank looks up the tokens in its rows (zeros for the others, summed by one
all-reduce per forward), and rank 0 gathers the logits.

Rank 0 is the process that built the pipeline: its draft, verifier and step policy run
there alone. Every call that changes the target (``prefill``, ``prefill_rows``, ``score``,
``score_tree``, ``commit_path``, ``rollback``) is broadcast to the other ranks before rank 0 makes it,
and every rank makes it on its own shard, so each rank's KV cache holds the same
sequences and rolls back alike. Host arguments travel over a gloo group as one byte
tensor (:func:`pack_calls`: a JSON header of names, integers and tensor shapes, then the
CPU tensors' raw bytes; no pickle, so a message can carry no code); device tensors (the
draft tokens) by a broadcast on the device group, with no host sync. A
``rollback`` or ``commit_path`` (no collective in it) is made on rank 0 at once and sent
with the next call, so a decode step costs one message, not two.

Start: ``[target] tensor_parallel = N``. A process that is not part of a process group
spawns ``N - 1`` workers (:func:`spawn_workers`, ``torch.multiprocessing``); under
``torchrun --nproc-per-node N`` every rank runs the same command and ranks above 0 serve
rank 0 from inside :func:`make_tp_target` until it closes, then exit. A rank that dies
ends the others: rank 0 checks its workers before each call and names a dead one
(:class:`TensorParallelError`), collectives time out after ``timeout_s``, and a worker
whose parent process is gone exits.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist
import torch.nn.functional as F

from flashspec_fast.model import Layer, ModelArgs, Transformer, Weights, linear, read_config, shape_config
from flashspec_fast.options import SHAPE_PREFIX, FastOptions, FastTargetOptions, build_model
from flashspec_fast.target import FastTarget, make_target
from flashspec_models.tokenizer import load_tokenizer
from flashspec_models.weights import resolve_model

TIMEOUT_S = 300.0  # a call's collectives wait this long for a rank: a 32B shape's first graph capture stays well under it
START_S = 1800.0  # the ranks wait this long for each other to start and build their shards (a cold checkpoint load)
IDLE = timedelta(days=30)  # a worker waits this long for rank 0's next call: a user may pause between requests
REPLAYED = ("prefill", "prefill_rows", "score", "score_tree", "commit_path", "rollback")  # the calls every rank makes
GATHERED = ("score", "score_tree")  # calls whose logits rank 0 gathers
DEFERRED = ("commit_path", "rollback")  # calls without a collective: sent with the next call, one message a step
STOP = "stop"
RUNNING: list[TensorParallelTarget] = []  # this process's running target: torch allows one default process group


class TensorParallelError(RuntimeError):
    """A rank of a tensor-parallel target died or stopped answering."""


def collective(op: Any, *args: Any, **kwargs: Any) -> Any:
    """``op(*args, **kwargs)``, a ``torch.distributed`` call whose failure (a peer gone, a
    timeout: gloo raises them as plain RuntimeErrors) becomes a :class:`TensorParallelError`,
    told apart from the forward's own errors."""
    try:
        return op(*args, **kwargs)
    except RuntimeError as exc:
        raise TensorParallelError(f"{op.__name__} failed ({exc})") from exc


@attrs.frozen
class Ranks:
    """This process's place in the group: ``device`` carries activations (nccl on CUDA,
    gloo on the CPU), ``host`` the packed commands (always gloo, :func:`pack_calls`)."""

    rank: int
    world: int
    device: Any  # torch.distributed ProcessGroup
    host: Any
    timeout: timedelta  # of a call's collectives


Call = tuple[str, Sequence[Any]]  # a method of FastTarget and its arguments


@attrs.frozen
class OnDevice:
    """A device tensor's place in a command: it follows by a broadcast on the device group."""

    shape: tuple[int, ...]
    dtype: torch.dtype


# --- sharding ------------------------------------------------------------------------


def split(n: int, world: int, what: str) -> int:
    if n % world:
        raise ValueError(f"tensor_parallel = {world} must divide the model's {what} ({n})")
    return n // world


def part(t: torch.Tensor, rank: int, world: int, dim: int = 0) -> torch.Tensor:
    """Rank ``rank``'s contiguous ``1/world`` of ``t`` along ``dim``, as its own storage
    (so the full tensor can be freed)."""
    return t.chunk(world, dim)[rank].contiguous().clone()


class RowParallel:
    """A row-parallel linear: ``x`` holds this rank's columns of the input, ``weight`` the same
    columns of the matrix; the partial products are summed over the ranks (one all-reduce).
    Called as a quantized weight is (:func:`~flashspec_fast.model.linear`), so the fast
    model's forward runs it unchanged."""

    def __init__(self, weight: torch.Tensor, group: Any) -> None:
        self.weight, self.group = weight, group  # [D_out, D_in / world]

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = linear(x, self.weight)
        collective(dist.all_reduce, y, group=self.group)
        return y if bias is None else y + bias


def shard_layer(layer: Layer, args: ModelArgs, rank: int, world: int, group: Any) -> Layer:
    """Rank ``rank``'s slice of a layer: its heads of Q, K and V (K and V of the KV heads its
    query heads read), its columns of gate and up, and the matching input columns of the
    output and down projections."""
    hd = args.head_dim
    sizes = [args.heads * hd, args.kv_heads * hd, args.kv_heads * hd]
    wqkv = torch.cat([part(w, rank, world) for w in layer.wqkv.split(sizes)])
    bqkv = None if layer.bqkv is None else torch.cat([part(b, rank, world) for b in layer.bqkv.split(sizes)])
    gate_up = torch.cat([part(w, rank, world) for w in layer.w_gate_up.chunk(2)])
    return Layer(attn_norm=layer.attn_norm, wqkv=wqkv, bqkv=bqkv, wo=RowParallel(part(layer.wo, rank, world, 1), group),
                 mlp_norm=layer.mlp_norm, w_gate_up=gate_up, w_down=RowParallel(part(layer.w_down, rank, world, 1), group))


def shard_vocab(head: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank ``rank``'s rows of the embedding or LM head ``[V, D]``: ``ceil(V / world)`` of them,
    the last rank's padded with zero rows (no token looks them up; their logits are cut after
    the gather)."""
    rows = -(-head.shape[0] // world)
    mine = head[rank * rows : (rank + 1) * rows]
    return torch.cat([mine, mine.new_zeros(rows - mine.shape[0], mine.shape[1])]).contiguous()


class ShardedTransformer(Transformer):
    """A rank's slice of the model (:func:`shard_model`): its embedding holds the vocabulary
    rows ``first .. first + len``, so a lookup is this rank's rows, zeros for the tokens it
    lacks, summed over the ranks (exact: one term is not zero)."""

    def __init__(self, args: ModelArgs, weights: Weights, max_len: int, first: int, group: Any, fuse: bool,
                 attention: str) -> None:
        super().__init__(args, weights, max_len, fuse=fuse, attention=attention, kernels="torch")
        self.first, self.group = first, group

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = self.w.embed.shape[0]
        local = tokens - self.first
        mine = (local >= 0) & (local < rows)
        x = F.embedding(local.clamp(0, rows - 1), self.w.embed).masked_fill(~mine[..., None], 0)
        collective(dist.all_reduce, x, group=self.group)
        return x


def shard_model(model: Transformer, opts: FastOptions, rank: int, world: int, group: Any) -> ShardedTransformer:
    """Rank ``rank``'s slice of ``model``, taking its layers one by one (``model`` is left without
    them), so that the device holds the whole model and one layer's slice at most."""
    a, w = model.args, model.w
    local = local_args(a, world)
    layers = []
    while w.layers:
        layers.append(shard_layer(w.layers.pop(0), a, rank, world, group))
    embed = shard_vocab(w.embed, rank, world)
    head = embed if w.lm_head is w.embed else shard_vocab(w.lm_head, rank, world)  # tied: one slice serves both
    weights = Weights(embed=embed, layers=layers, norm=w.norm, lm_head=head)
    return ShardedTransformer(local, weights, opts.max_len, rank * local.vocab, group,
                              fuse=opts.fuse and model.device.type == "cuda", attention=opts.attention)


def local_args(a: ModelArgs, world: int) -> ModelArgs:
    """One rank's shapes: its heads, KV heads and MLP columns, and ``ceil(V / world)`` vocabulary rows."""
    return attrs.evolve(a, heads=split(a.heads, world, "attention heads"), kv_heads=split(a.kv_heads, world, "KV heads"),
                        ffn=split(a.ffn, world, "MLP width"), vocab=-(-a.vocab // world))


def model_args(opts: FastOptions) -> ModelArgs:
    """The model's shapes from its config alone (no weights), to refuse a bad split before any process starts."""
    if opts.model.startswith(SHAPE_PREFIX):
        return ModelArgs.from_hf(shape_config(opts.model.removeprefix(SHAPE_PREFIX)))
    return ModelArgs.from_hf(read_config(Path(resolve_model(opts.model))))


def rank_device(opts: FastOptions, rank: int) -> str:
    """Rank ``rank``'s device: the next GPU after the configured one per rank; the CPU stays the CPU."""
    device = opts.torch_device()
    if device.type != "cuda":
        return str(device)
    return f"cuda:{(device.index or 0) + rank}"


def build_shard(opts: FastOptions, ranks: Ranks) -> tuple[FastTarget, int]:
    """This rank's target over its shard, and the full vocabulary. The whole model is built
    first (the same weights, from the same seed, that one process would hold) and sliced."""
    placed = attrs.evolve(opts, device=rank_device(opts, ranks.rank))
    full, path = build_model(placed)
    vocab = full.args.vocab
    model = shard_model(full, placed, ranks.rank, ranks.world, ranks.device)
    del full
    tokenizer = load_tokenizer(path) if path is not None and ranks.rank == 0 else None
    return FastTarget(model, tokenizer, path, placed), vocab


# --- commands --------------------------------------------------------------------------


# dtypes a command's tensors may have (pack_calls): a name outside it is refused, not looked up
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.int64, torch.int32, torch.uint8, torch.bool,
                                                    torch.float32, torch.bfloat16, torch.float16)}


def pack_calls(calls: Sequence[Call], moved: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """``calls`` as one uint8 CPU tensor: 8 bytes of header length, a JSON header (each call's
    name and arguments: ints, lists of ints, None, a CPU tensor's dtype, shape and byte range,
    or a tensor of ``moved`` as :class:`OnDevice`), then the CPU tensors' bytes. Only those
    types travel (a ``TypeError`` names any other), and nothing in a message is executed:
    :func:`unpack_calls` reads back data only."""
    blobs: list[bytes] = []
    offset = 0

    def arg(a: Any) -> dict[str, Any]:
        nonlocal offset
        if isinstance(a, torch.Tensor):
            name = str(a.dtype).removeprefix("torch.")
            if name not in DTYPES:
                raise TypeError(f"tensor-parallel command: tensors of {a.dtype} do not travel (one of {', '.join(DTYPES)})")
            if any(a is m for m in moved):
                return {"device": name, "shape": list(a.shape)}
            raw = a.detach().contiguous().view(torch.uint8).numpy().tobytes() if a.numel() else b""
            blobs.append(raw)
            offset += len(raw)
            return {"tensor": name, "shape": list(a.shape), "end": offset}
        if a is None or isinstance(a, bool | int) or (isinstance(a, list | tuple) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in a)):
            return {"value": list(a) if isinstance(a, list | tuple) else a}
        raise TypeError(f"tensor-parallel command: an argument of type {type(a).__name__} does not travel")

    header = json.dumps([[name, [arg(a) for a in args]] for name, args in calls]).encode()
    data = len(header).to_bytes(8, "little") + header + b"".join(blobs)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def unpack_calls(data: torch.Tensor) -> list[tuple[str, list[Any]]]:
    """:func:`pack_calls`' calls back: CPU tensors rebuilt from their bytes, :class:`OnDevice`
    markers for the device tensors that follow; a malformed message is a ``ValueError``."""
    raw = data.numpy().tobytes()
    size = int.from_bytes(raw[:8], "little")
    try:
        header = json.loads(raw[8 : 8 + size])
    except ValueError as exc:
        raise ValueError(f"tensor-parallel command: unreadable header ({exc})") from None
    body, start, calls = raw[8 + size :], 0, []
    for name, args in header:
        out: list[Any] = []
        for a in args:
            if "value" in a:
                out.append(a["value"])
                continue
            kind = "tensor" if "tensor" in a else "device"
            dtype = DTYPES.get(a[kind])
            if dtype is None:
                raise ValueError(f"tensor-parallel command: unknown dtype {a[kind]!r}")
            if kind == "device":
                out.append(OnDevice(tuple(a["shape"]), dtype))
                continue
            end = int(a["end"])
            chunk = bytearray(body[start:end])
            start = end
            flat = torch.frombuffer(chunk, dtype=torch.uint8) if chunk else torch.empty(0, dtype=torch.uint8)
            out.append(flat.view(dtype).reshape(a["shape"]))
        calls.append((str(name), out))
    return calls


def send(ranks: Ranks, calls: Sequence[Call]) -> None:
    """Rank 0: broadcast calls in one message (:func:`pack_calls`), device tensors after it."""
    moved = [a for _, args in calls for a in args if isinstance(a, torch.Tensor) and a.device.type != "cpu"]
    data = pack_calls(calls, moved)
    collective(host_broadcast, ranks, torch.tensor([data.numel()]), ranks.timeout)
    collective(host_broadcast, ranks, data, ranks.timeout)
    for a in moved:
        collective(dist.broadcast, a.contiguous(), src=0, group=ranks.device)


def receive(ranks: Ranks, device: torch.device) -> list[Call]:
    """Ranks above 0: the next message's calls, their device tensors received onto ``device``."""
    size = torch.zeros(1, dtype=torch.long)
    collective(host_broadcast, ranks, size, IDLE)
    data = torch.empty(int(size), dtype=torch.uint8)
    collective(host_broadcast, ranks, data, ranks.timeout)
    calls: list[Call] = []
    for name, meta in unpack_calls(data):
        args = []
        for m in meta:
            if isinstance(m, OnDevice):
                m = torch.empty(m.shape, dtype=m.dtype, device=device)
                collective(dist.broadcast, m, src=0, group=ranks.device)
            args.append(m)
        calls.append((name, args))
    return calls


def host_broadcast(ranks: Ranks, t: torch.Tensor, timeout: timedelta) -> None:
    """Broadcast a CPU tensor from rank 0 over the gloo group, each rank with its own ``timeout``
    (rank 0 gives up on a hung worker after a call's timeout; a worker waits out an idle rank 0)."""
    ranks.host.broadcast(t, 0, timeout).wait()


def gather_vocab(local: torch.Tensor, vocab: int, ranks: Ranks) -> torch.Tensor | None:
    """Rank 0: every rank's logits ``[..., V / world]`` side by side, cut to ``[..., V]``; None elsewhere."""
    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(ranks.world)] if ranks.rank == 0 else None
    collective(dist.gather, local, parts, dst=0, group=ranks.device)
    return None if parts is None else torch.cat(parts, dim=-1)[..., :vocab]


def execute(target: FastTarget, ranks: Ranks, vocab: int, name: str, args: Sequence[Any]) -> Any:
    """Make a replayed call on this rank's shard; the same code on every rank."""
    if name not in REPLAYED:
        raise ValueError(f"{name!r} is not a tensor-parallel call (one of {', '.join(REPLAYED)})")
    out = getattr(target, name)(*args)
    return gather_vocab(out, vocab, ranks) if name in GATHERED else None


def serve(target: FastTarget, ranks: Ranks, vocab: int) -> None:
    """Ranks above 0: make rank 0's calls until it stops. A call that raises here raised on
    rank 0 too (the argument checks are the same), so the loop goes on."""
    while True:
        for name, args in receive(ranks, target.device):
            if name == STOP:
                return
            try:
                execute(target, ranks, vocab, name, args)
            except (ValueError, IndexError) as exc:
                print(f"flashspec tensor-parallel rank {ranks.rank}: {name} refused: {exc}", file=sys.stderr)


# --- processes -------------------------------------------------------------------------


def join_group(rank: int, world: int, init: str, device: torch.device, timeout_s: float) -> Ranks:
    """Join (or, under torchrun, reuse) the default process group, waiting up to ``START_S`` for
    the others, and make the two groups a call uses, whose collectives time out after ``timeout_s``."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=START_S))
    timeout = timedelta(seconds=timeout_s)
    ranks = Ranks(rank=dist.get_rank(), world=dist.get_world_size(), device=dist.new_group(backend=backend,
                  timeout=timeout), host=dist.new_group(backend="gloo", timeout=timeout), timeout=timeout)
    return ranks


def ready(ranks: Ranks, vocab: int) -> None:
    """Wait (up to ``START_S``) until every rank has built its shard, and check they built the same model."""
    seen = torch.tensor([vocab])
    ranks.host.broadcast(seen, 0, timedelta(seconds=START_S)).wait()
    if int(seen) != vocab:
        raise TensorParallelError(f"rank {ranks.rank} built a vocabulary of {vocab}, rank 0 one of {int(seen)}")


def watch_parent(parent: int, every_s: float = 0.5) -> None:
    """Exit this worker once the process that spawned it is gone (it cannot send ``stop`` then)."""

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        print(f"flashspec tensor-parallel worker {os.getpid()}: rank 0 (pid {parent}) is gone; exiting",
              file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=loop, name="flashspec-tp-watchdog", daemon=True).start()


def worker(opts: FastOptions, ranks: Ranks) -> None:
    """A rank above 0, spawned or under torchrun: build its shard, say it is ready, serve rank 0."""
    target, vocab = build_shard(opts, ranks)
    collective(ready, ranks, vocab)
    serve(target, ranks, vocab)


def first_dead(workers: Sequence[Any], wait_s: float = 0.0) -> str | None:
    """The first spawned worker (rank 1, 2, ...) that has exited, waiting up to ``wait_s`` for one to."""
    deadline = time.monotonic() + wait_s
    while True:
        for r, p in enumerate(workers, start=1):
            if p.exitcode is not None:
                return f"rank {r} (pid {p.pid}) exited with code {p.exitcode}"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def worker_main(opts: FastOptions, rank: int, world: int, init: str, timeout_s: float, parent: int) -> None:
    """A spawned worker: join, build its shard, serve rank 0, leave."""
    watch_parent(parent)
    ranks = join_group(rank, world, init, torch.device(rank_device(opts, rank)), timeout_s)
    try:
        worker(opts, ranks)
    except TensorParallelError as exc:
        print(f"flashspec tensor-parallel rank {rank}: lost rank 0: {exc}; exiting",
              file=sys.stderr, flush=True)
        os._exit(1)
    dist.destroy_process_group()


def spawn_workers(opts: FastOptions, world: int, init: str, timeout_s: float) -> list[Any]:
    """Start ranks ``1..world-1`` (``torch.multiprocessing``, spawned: no CUDA state forks)."""
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=worker_main, args=(opts, r, world, init, timeout_s, os.getpid()), daemon=True,
                         name=f"flashspec-tp-rank{r}") for r in range(1, world)]
    for p in procs:
        p.start()
    return procs


class TensorParallelTarget:
    """Rank 0's target: the fast target over this rank's shard, each call replayed by the others.

    Offers what the pipeline and the server ask of the fast target (``Target``, ``ScoresTrees``,
    ``LimitsTreeNodes``, ``PrefillsRows``, ``HasContext``, ``HasTokenizer``, ``CapturesGraphs``)
    with the logits of the whole vocabulary.
    """

    def __init__(self, local: FastTarget, ranks: Ranks, vocab: int, workers: Sequence[Any] = (),
                 store: str | None = None) -> None:
        self.local, self.ranks, self.vocab, self.workers = local, ranks, vocab, list(workers)
        self._store = store  # the file the spawned group met through, removed at close
        self.device = local.device
        self.eos_token_ids = local.eos_token_ids
        self.tokenizer = local.tokenizer
        self.graphs = local.graphs
        self._broken: str | None = None
        self._pending: list[Call] = []  # DEFERRED calls made here and not yet sent
        self._closed: str | None = None  # why it no longer runs
        atexit.register(self.close)
        RUNNING.append(self)

    @property
    def max_context(self) -> int:
        return self.local.max_context

    @property
    def max_tree_nodes(self) -> int:
        return self.local.max_tree_nodes

    @property
    def tensor_parallel(self) -> int:
        return self.ranks.world

    def encode(self, prompt: str) -> list[int]:
        return self.local.encode(prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self.local.decode(ids)

    def prefill(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        self._call("prefill", tokens[:, : max(lengths)], list(lengths))

    def prefill_rows(self, tokens: torch.Tensor, lengths: Sequence[int], rows: Sequence[int]) -> None:
        """Prefill ``rows`` alone on every rank (see :meth:`FastTarget.prefill_rows`)."""
        self._call("prefill_rows", tokens[:, : max(lengths)], list(lengths), [int(b) for b in rows])

    def score(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, gamma+1, V]`` on rank 0 (see :meth:`FastTarget.score`)."""
        return self._call("score", tokens[:, : max(lengths)], list(lengths), draft_tokens)  # type: ignore[no-any-return]

    def score_tree(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor,
                   parents: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, N+1, V]`` on rank 0 (see :meth:`FastTarget.score_tree`)."""
        return self._call("score_tree", tokens[:, : max(lengths)], list(lengths), draft_tokens,  # type: ignore[no-any-return]
                          parents)

    def commit_path(self, paths: torch.Tensor) -> None:
        self._call("commit_path", paths)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        self._call("rollback", [int(n) for n in num_accepted])

    def _call(self, name: str, *args: Any) -> Any:
        self._check()
        try:
            if name in DEFERRED:
                out = execute(self.local, self.ranks, self.vocab, name, args)
                self._pending.append((name, args))  # made here; the others make it before the next call
                return out
            send(self.ranks, [*self._pending, (name, args)])
            self._pending.clear()
            return execute(self.local, self.ranks, self.vocab, name, args)
        except TensorParallelError as exc:
            dead = first_dead(self.workers, wait_s=1.0)  # a peer's socket closes a moment before its exit is seen
            self._broken = dead or f"a rank stopped answering: {exc}"
            raise TensorParallelError(f"tensor-parallel target, {name}: {self._broken}") from exc
        except KeyboardInterrupt:  # the workers may have made the call or not: their caches may differ from ours
            self._broken = f"interrupted during {name}; start a new target"
            raise

    def _check(self) -> None:
        if self._closed:
            raise TensorParallelError(f"tensor-parallel target: {self._closed}")
        self._broken = self._broken or first_dead(self.workers)
        if self._broken is not None:
            raise TensorParallelError(f"tensor-parallel target: {self._broken}; it cannot run on without it")

    def close(self, why: str = "closed") -> None:
        """Stop the workers (if they still listen) and leave the process group; later calls raise ``why``."""
        if self._closed:
            return
        self._closed = why
        atexit.unregister(self.close)
        if self in RUNNING:
            RUNNING.remove(self)
        if self._broken is None and first_dead(self.workers) is None:
            try:
                send(self.ranks, [(STOP, ())])
            except TensorParallelError:
                pass  # a worker went away meanwhile: it is joined or terminated below
        deadline = time.monotonic() + 10.0
        for p in self.workers:
            p.join(max(deadline - time.monotonic(), 0.1))
            if p.exitcode is None:
                p.terminate()
                p.join(1.0)
        if dist.is_initialized():
            dist.destroy_process_group()
        remove(self._store)


def remove(path: str | None) -> None:
    if path is not None and os.path.exists(path):
        os.unlink(path)


def make_tp_target(opts: FastOptions, world: int, timeout_s: float = TIMEOUT_S) -> TensorParallelTarget:
    """Rank 0's target over ``world`` ranks. Outside a process group it spawns ranks
    ``1..world-1``; under ``torchrun`` (``WORLD_SIZE`` set) ranks above 0 serve here and exit."""
    local_args(model_args(opts), world)  # a clear error now, not one per rank after the start
    for old in list(RUNNING):  # its group must go first; a failed pipeline build leaves no other handle to it
        old.close("closed: a newer tensor-parallel target replaced it in this process")
    launched = "WORLD_SIZE" in os.environ
    if launched and int(os.environ["WORLD_SIZE"]) != world:
        raise ValueError(f"tensor_parallel = {world} but torchrun started {os.environ['WORLD_SIZE']} processes")
    rank = int(os.environ.get("RANK", "0")) if launched else 0
    device = torch.device(rank_device(opts, rank))
    workers: list[Any] = []
    store = None
    if launched:
        ranks = join_group(rank, world, "env://", device, timeout_s)
    else:
        fd, store = tempfile.mkstemp(prefix="flashspec-tp-")
        os.close(fd)
        os.unlink(store)  # the file store creates it; a stale one would hold a previous group's keys
        init = f"file://{store}"
        workers = spawn_workers(opts, world, init, timeout_s)
        ranks = join_group(0, world, init, device, timeout_s)
    if ranks.rank != 0:
        worker(opts, ranks)
        dist.destroy_process_group()
        raise SystemExit(0)
    try:
        local, vocab = build_shard(opts, ranks)
        collective(ready, ranks, vocab)
    except BaseException as exc:
        dead = first_dead(workers, wait_s=1.0)
        for p in workers:
            p.terminate()
        dist.destroy_process_group()
        remove(store)
        if dead is not None:
            raise TensorParallelError(f"tensor-parallel target, start: {dead}") from exc
        raise
    return TensorParallelTarget(local, ranks, vocab, workers, store)


def make_fast_target(opts: FastTargetOptions) -> FastTarget | TensorParallelTarget:
    """The ``fast`` target component: one process (:func:`~flashspec_fast.target.make_target`),
    or sharded over ``tensor_parallel`` ranks."""
    if opts.tensor_parallel == 1:
        return make_target(opts)
    return make_tp_target(opts, opts.tensor_parallel)
