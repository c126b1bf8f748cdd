"""The serving engine: continuous batching over a pipeline's components.

One thread runs the decode loop, so the event loop never waits on the model. Requests
wait in a bounded FIFO queue and *join the running batch between steps*; a row leaves
when it finishes, is cancelled or its client disconnects.

Joining is exact and simple: when rows join (or finished rows make up half the batch) the
engine *rebuilds* the batch from the rows' current sequences (prompt + tokens so far),
re-prefills the target and resets the draft providers (``StepPolicy.begin``). The
sequences are the source of truth and every component catches up from them, so a row's
tokens do not depend on when it joined (greedy: exactly what it gets alone). The cost is
a re-prefill of every live row per rebuild, counted by ``flashspec:batch_rebuilds`` and
``flashspec:batch_rebuild_prefill_tokens``; a per-row prefill would remove it.

Requests with different temperatures, top-k and top-p share a batch: each step hands the
pipeline a :class:`~flashspec_core.contracts.RowSampling` (one setting per row), which a
uniform batch turns back into one :class:`SamplingParams` at no extra cost. A seeded
request's tokens are a function of its seed and its sequence alone (Gumbel-max coupling,
docs/exactness.md "Seeded rows"): the same whatever else is in the batch, whichever arm
drafts and whenever it joined. Unseeded rows draw from the engine's one generator.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import structlog
import torch

from flashspec_core.contracts import HasContext, RowSampling, SamplingParams, StepRecord
from flashspec_core.pipeline import Pipeline
from flashspec_serve.metrics import Metrics
from flashspec_serve.text import TextStream

log = structlog.get_logger("flashspec_serve")


class QueueFull(RuntimeError):
    """The waiting queue is full (HTTP 429)."""


class EngineClosed(RuntimeError):
    """The engine is shutting down and takes no new requests (HTTP 503)."""


class ContextError(ValueError):
    """A request does not fit the model's context; the message names both lengths."""


@attrs.frozen
class Job:
    """What one request asks the engine to decode."""

    prompt: tuple[int, ...]
    max_tokens: int
    params: SamplingParams
    seed: int | None = None
    stop: tuple[str, ...] = ()


@attrs.frozen
class Speculation:
    """A request's speculation record: drafted and accepted tokens, and acceptances per draft position."""

    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    steps: int


@attrs.frozen
class Event:
    """New text for a request; the last event of a request has ``finish`` set."""

    text: str
    token_ids: tuple[int, ...]
    finish: str | None = None  # "stop" (EOS or a stop string), "length", "abort" (shutdown), "error"
    completion_tokens: int = 0
    speculation: Speculation | None = None
    error: str | None = None


class Handle:
    """The app's side of one request: its events, and a way to cancel it."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job, self.loop = job, loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.arrived = time.perf_counter()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop decoding this request; its row is freed at the next step."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event: Event) -> None:
        """From the engine thread: hand ``event`` to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self.queue.get()
            yield event
            if event.finish is not None:
                return


def context_length(pipeline: Pipeline) -> int | None:
    """The target's context in tokens where it declares one (:class:`HasContext`); else None."""
    target = pipeline.target
    return int(target.max_context) if isinstance(target, HasContext) else None


class _Row:
    """A request in the running batch."""

    def __init__(self, handle: Handle, decode: Any) -> None:
        self.handle, self.job = handle, handle.job
        self.out: list[int] = []
        self.text = TextStream(decode, handle.job.stop)
        self.last: float | None = None  # when tokens were last delivered
        self.drafted = self.accepted = self.steps = 0
        self.per_pos: list[int] = []

    @property
    def sequence(self) -> list[int]:
        return [*self.job.prompt, *self.out]

    def count(self, width: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += width
        self.accepted += accepted
        self.per_pos.extend([0] * (accepted - len(self.per_pos)))
        for pos in range(accepted):
            self.per_pos[pos] += 1

    def speculation(self) -> Speculation:
        return Speculation(self.drafted, self.accepted, tuple(self.per_pos), self.steps)


class Engine:
    """Continuous batching over ``pipeline``'s target, policy and verifier (module docstring)."""

    def __init__(self, pipeline: Pipeline, metrics: Metrics | None = None, max_batch: int = 32,
                 max_waiting: int = 256, context: int | None = None) -> None:
        if max_batch < 1 or max_waiting < 0:
            raise ValueError(f"max_batch must be >= 1 and max_waiting >= 0, got {max_batch} and {max_waiting}")
        self.pipeline, self.metrics = pipeline, metrics or Metrics()
        self.max_batch, self.max_waiting = max_batch, max_waiting
        self.context = context if context is not None else context_length(pipeline)
        self.max_gamma = max(a.gamma for a in pipeline.arms)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Handle] = collections.deque()
        self._rows: list[_Row] = []  # the batch, row b is self._rows[b]
        self._active: list[bool] = []
        self._joining: list[_Row] = []  # admitted, in the batch from the next build on
        self._tokens = torch.zeros((0, 0), dtype=torch.long)
        self._lengths: list[int] = []
        self._sampling: SamplingParams | RowSampling = SamplingParams()
        self._generator = torch.Generator(device=pipeline.target.device).manual_seed(secrets.randbits(63))
        self._closing = False
        self._deadline: float | None = None  # shutdown: running rows are aborted after this
        self._thread = threading.Thread(target=self._run, name="flashspec-engine", daemon=True)
        self.rebuilds = 0

    # ------------------------------------------------------------------ the app's side

    def start(self) -> None:
        self._thread.start()

    def stop(self, grace_s: float = 10.0) -> None:
        """Take no new requests, abort the waiting ones, let running ones finish for
        ``grace_s`` seconds, then abort the rest; returns when the loop has ended."""
        with self._cond:
            self._closing = True
            self._deadline = time.perf_counter() + grace_s
            while self._waiting:
                self._waiting.popleft().put(Event("", (), finish="abort", error="the server is shutting down"))
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def room(self, prompt_len: int) -> int:
        """The most tokens a prompt of ``prompt_len`` tokens may generate; :class:`ContextError` if none."""
        if self.context is None:
            return 1 << 30
        reserve = self.max_gamma + 1  # a step scores the last token and up to gamma draft tokens
        room = self.context - reserve - prompt_len
        if room < 1:
            raise ContextError(f"the prompt has {prompt_len} tokens but the model's context is {self.context} tokens "
                               f"({reserve} of them kept for drafting): shorten the prompt")
        return room

    def submit(self, job: Job, loop: asyncio.AbstractEventLoop) -> Handle:
        """Queue ``job``; :class:`QueueFull` or :class:`EngineClosed` if it cannot wait."""
        handle = Handle(job, loop)
        with self._cond:
            if self._closing:
                raise EngineClosed("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                self.metrics.rejected.inc()
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_waiting = {self.max_waiting})")
            self._waiting.append(handle)
            self.metrics.waiting.set(len(self._waiting))
            self._cond.notify_all()
        return handle

    @property
    def running(self) -> int:
        return sum(self._active) + len(self._joining)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._closing or self._waiting or self._joining or any(self._active)):
                    self._cond.wait()
                if self._closing and not any(self._active) and not self._joining:
                    return
                self._admit()
            try:
                self._cycle()
            except Exception as exc:  # the batch is lost; the next build starts afresh from the sequences
                log.exception("engine_step_failed")
                self._abort_all("error", f"{type(exc).__name__}: {exc}")

    def _admit(self) -> bool:
        """Move waiting requests into the batch (FIFO, room permitting; any sampling settings)."""
        live = sum(self._active) + len(self._joining)
        while self._waiting and live < self.max_batch and not self._closing:
            head = self._waiting.popleft()
            if head.cancelled:
                continue
            live += 1
            self._joining.append(_Row(head, self.pipeline.target.decode))
            self.metrics.prompt_tokens.inc(len(head.job.prompt))
        self.metrics.waiting.set(len(self._waiting))
        return bool(self._joining)

    def _cycle(self) -> None:
        self._drop_cancelled()
        dead = len(self._active) - sum(self._active)
        if self._joining or (dead and dead * 2 >= len(self._active)):
            self._build()
        self.metrics.running.set(self.running)
        if not any(self._active):
            return
        record, emitted = self._step()
        self._deliver(record, emitted)
        self.metrics.running.set(self.running)

    def _drop_cancelled(self) -> None:
        past_deadline = self._deadline is not None and time.perf_counter() > self._deadline
        for b, row in enumerate(self._rows):
            if self._active[b] and (row.handle.cancelled or past_deadline):
                self._active[b] = False
                self._finish(row, "abort", "the server is shutting down" if past_deadline else None)
        for row in [r for r in self._joining if r.handle.cancelled or past_deadline]:
            self._joining.remove(row)
            self._finish(row, "abort", "the server is shutting down" if past_deadline else None)

    def _build(self) -> None:
        """Rebuild the batch from the live rows' sequences: re-prefill the target, reset the providers."""
        rows = [r for b, r in enumerate(self._rows) if self._active[b]] + self._joining
        self._rows, self._active, self._joining = rows, [True] * len(rows), []
        if not rows:
            return
        seqs = [r.sequence for r in rows]
        width = max(len(r.job.prompt) + r.job.max_tokens for r in rows) + self.max_gamma + 1
        self._tokens = torch.zeros((len(rows), width), dtype=torch.long)
        for b, seq in enumerate(seqs):
            self._tokens[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        self._lengths = [len(s) for s in seqs]
        self._sampling = RowSampling([r.job.params for r in rows], seeds=[r.job.seed for r in rows])
        self.pipeline.policy.begin(len(rows))
        self.pipeline.target.prefill(self._tokens, self._lengths)
        self.rebuilds += 1
        self.metrics.rebuilds.inc()
        self.metrics.rebuild_tokens.inc(sum(self._lengths))

    def _step(self) -> tuple[StepRecord, list[list[int]]]:
        # The pipeline's own step (plan -> propose -> score -> verify -> commit), so the engine's
        # steps are logged, observed by flashspec_step_end and counted exactly as generate()'s.
        return self.pipeline.step(self._tokens, self._lengths, self._active, self._sampling, self._generator)

    def _deliver(self, record: StepRecord, emitted: list[list[int]]) -> None:
        eos = self.pipeline.target.eos_token_ids
        now = time.perf_counter()
        accepted = []
        for b, row in enumerate(self._rows):
            if not self._active[b]:
                continue
            accepted.append(len(emitted[b]) - 1)
            row.count(record.gamma, len(emitted[b]) - 1)
            new = emitted[b][: row.job.max_tokens - len(row.out)]
            stop = next((i for i, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new = new[: stop + 1]
            self._tokens[b, self._lengths[b] : self._lengths[b] + len(new)] = torch.tensor(new, dtype=torch.long)
            self._lengths[b] += len(new)
            row.out.extend(new)
            self._observe_latency(row, now)
            self.metrics.generation_tokens.inc(len(new))
            piece = row.text.feed(new)
            if row.text.stopped or stop is not None or len(row.out) >= row.job.max_tokens:
                self._active[b] = False
                reason = "stop" if row.text.stopped or stop is not None else "length"
                row.handle.put(Event(piece, tuple(new)))
                self._finish(row, reason)
            else:
                row.handle.put(Event(piece, tuple(new)))
        self.metrics.step(record.arm_name, record.gamma, accepted, record.step_ms / 1e3)

    def _observe_latency(self, row: _Row, now: float) -> None:
        if row.last is None:
            self.metrics.ttft.observe(now - row.handle.arrived)
        else:
            self.metrics.itl.observe(now - row.last)
        row.last = now

    def _finish(self, row: _Row, reason: str, error: str | None = None) -> None:
        tail = row.text.flush() if reason in ("stop", "length") else ""
        row.handle.put(Event(tail, (), finish=reason, completion_tokens=len(row.out),
                             speculation=row.speculation(), error=error))

    def _abort_all(self, reason: str, error: str) -> None:
        for row in [r for b, r in enumerate(self._rows) if self._active[b]] + self._joining:
            self._finish(row, reason, error)
        self._rows, self._active, self._joining = [], [], []
