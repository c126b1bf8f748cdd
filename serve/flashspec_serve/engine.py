"""The serving engine: continuous batching over a pipeline's components.

One thread runs the decode loop, so the event loop never waits on the model. Requests
wait in a bounded FIFO queue and *join the running batch between steps*; a row leaves
when it finishes, is cancelled or its client disconnects.

The batch is a set of *slots*: row ``b`` of the token tensor and of every component's
state. A finished row frees its slot. A joining request takes a free slot and is prefilled
alone (:class:`~flashspec_core.contracts.PrefillsRows`): the draft providers forget just
that row (:class:`~flashspec_core.contracts.ResetsRows`) and catch up on it from its
sequence at their next proposal, and no live row is touched. Where the target or a
provider lacks the capability, more rows join than slots are free, or the batch is empty,
the engine instead *rebuilds* the batch from the live rows' sequences (prompt + tokens so
far): it re-prefills the target and resets the providers (``StepPolicy.begin``), giving
itself free slots up to the next power of two of the live rows (at most ``max_batch``) so
later joins need no rebuild. When no more than a quarter of the slots are live (half
without per-row prefill) and nobody joins, a rebuild shrinks the batch, since every slot
costs each step's forward. The sequences are the source of truth either way, so a row's
tokens do not depend on when it joined (greedy: exactly what it gets alone).
``flashspec:batch_row_prefills`` counts rows prefilled alone, ``flashspec:batch_rebuilds``
rebuilds, and ``flashspec:batch_rebuild_prefill_tokens`` the tokens both prefilled.

Requests with different temperatures, top-k and top-p share a batch: each step hands the
pipeline a :class:`~flashspec_core.contracts.RowSampling` (one setting per row), which a
uniform batch turns back into one :class:`SamplingParams` at no extra cost. A seeded
request's tokens are a function of its seed and its sequence alone (Gumbel-max coupling,
docs/exactness.md "Seeded rows"): the same whatever else is in the batch, whichever arm
drafts and whenever it joined. Unseeded rows draw from the engine's one generator.

``start(warmup=True)`` first warms the engine on its own thread (:mod:`flashspec_serve.warmup`):
every graph capture and compile the slot counts above can meet is made before the first
request is taken, and :meth:`Engine.wait_ready` returns when it is done.
``flashspec:graph_captures_while_serving`` counts the graphs captured after that (the
target's, the verifier's and the providers' :class:`~flashspec_core.contracts.CapturesGraphs`
counters), each one a stall inside some request, by cache (label ``cache``:
:func:`~flashspec_serve.warmup.graph_caches`); a ``graph_captured_while_serving`` log line
names the cache and key of each.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import attrs
import structlog
import torch

from flashspec_core.contracts import (
    PrefillsRows,
    ResetsRows,
    RowSampling,
    SamplingParams,
    SeesRefills,
    StepRecord,
)
from flashspec_core.pipeline import Pipeline, wait_device
from flashspec_serve import warmup
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
    stream: bool = True  # False: the text is wanted once, at the end (no per-step decode without stop strings)


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

    def joined(self, later: Event) -> Event:
        """This event and the ``later`` one as one: the texts and tokens in order, the rest the later's."""
        return Event(self.text + later.text, self.token_ids + later.token_ids, later.finish, later.completion_tokens,
                     later.speculation, later.error)


FAILED = ("abort", "error")  # the finishes whose event carries a failure, never joined to text before it


class Handle:
    """The app's side of one request: its events, and a way to cancel it.

    Events the request's coroutine has not taken yet are joined into one (:meth:`Event.joined`),
    as vLLM's output collector merges a request's outputs while its consumer lags: where the
    event loop falls behind the steps (many streaming clients), each request then costs it one
    wake-up, one chunk and one socket write per loop turn instead of one per step. A failed
    request's last event is kept apart, so the text before it still reaches the client."""

    def __init__(self, job: Job, loop: asyncio.AbstractEventLoop) -> None:
        self.job, self.loop = job, loop
        self._events: collections.deque[Event] = collections.deque()
        self._ready = asyncio.Event()
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
        hand_over([(self, event)])

    def deliver(self, event: Event) -> None:
        """On the event loop's thread: queue ``event``, joined to the one not yet taken if any."""
        last = self._events[-1] if self._events else None
        if last is not None and last.finish is None and event.finish not in FAILED:
            self._events[-1] = last.joined(event)
        else:
            self._events.append(event)
        self._ready.set()

    def get_nowait(self) -> Event | None:
        """The next event (all queued since the last one, joined); None where there is none yet."""
        return self._events.popleft() if self._events else None

    async def get(self) -> Event:
        """The next event, waiting for one."""
        while not self._events:
            self._ready.clear()
            await self._ready.wait()
        return self._events.popleft()

    async def events(self) -> AsyncIterator[Event]:
        while True:
            event = await self.get()
            yield event
            if event.finish is not None:
                return


def hand_over(events: list[tuple[Handle, Event]]) -> None:
    """From the engine thread: each event to its request's coroutine, with one wake-up per
    event loop. A wake-up lets that loop's thread take the GIL from the engine's, so a step's
    events go in one call, not one per row; each loop receives them in order."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Handle, Event]]] = {}
    for handle, event in events:
        by_loop.setdefault(handle.loop, []).append((handle, event))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, items)
        except RuntimeError:  # the loop is closed: nobody is listening
            pass


def _put_all(items: list[tuple[Handle, Event]]) -> None:
    for handle, event in items:
        handle.deliver(event)


class _Row:
    """A request in the running batch."""

    def __init__(self, handle: Handle, decode: Any) -> None:
        self.handle, self.job = handle, handle.job
        self.out: list[int] = []
        self.text = TextStream(decode, handle.job.stop, lazy=not handle.job.stream)
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
                 max_waiting: int = 256, context: int | None = None, overlap: bool | None = None,
                 seed: int | None = None) -> None:
        if max_batch < 1 or max_waiting < 0:
            raise ValueError(f"max_batch must be >= 1 and max_waiting >= 0, got {max_batch} and {max_waiting}")
        self.pipeline, self.metrics = pipeline, metrics or Metrics()
        # Deliver a step's text while the next step's device work runs (:meth:`_settle`): on CUDA,
        # whose work is queued; on the CPU a step's work is done by the time it is queued, so
        # waiting for it would only hold each token back by a step.
        self.overlap = pipeline.target.device.type == "cuda" if overlap is None else overlap
        self.max_batch, self.max_waiting = max_batch, max_waiting
        held = pipeline.max_context  # the least of the target's and the drafts' contexts
        if context is not None and held is not None and context > held:
            # a request past what the caches hold would fail inside a step, taking the batch with it
            raise ValueError(f"--max-model-len {context} is above the pipeline's context of {held} tokens (the "
                             f"least of its target's and drafts' contexts): pass at most {held}, or raise the "
                             "max_len keys in the config")
        self.context = context if context is not None else held
        self.max_gamma = max(a.gamma for a in pipeline.arms)
        for selector in pipeline.policy.selectors:  # finished rows' slots take new requests here
            if isinstance(selector, SeesRefills):
                selector.rows_refilled(True)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Handle] = collections.deque()
        self._rows: list[_Row | None] = []  # the batch's slots: slot b holds row self._rows[b] (None: never filled)
        self._active: list[bool] = []  # slot b's row is decoding (False: a free slot)
        self._joining: list[_Row] = []  # admitted, in the batch from the next build on
        # settled steps' rows not yet handed their text: (row, new tokens, text where already read, end reason)
        self._undelivered: list[tuple[_Row, list[int], str | None, str | None]] = []
        self._tokens = torch.zeros((0, 0), dtype=torch.long)
        self._lengths: list[int] = []
        self._sampling: SamplingParams | RowSampling = SamplingParams()
        # Unseeded rows' draws: from ``seed`` where given (a run whose requests are all queued before
        # :meth:`start` is then replayable), else from a seed drawn at random.
        self._generator = torch.Generator(device=pipeline.target.device).manual_seed(
            secrets.randbits(63) if seed is None else seed)
        self._closing = False
        self._deadline: float | None = None  # shutdown: running rows are aborted after this
        self._thread = threading.Thread(target=self._run, name="flashspec-engine", daemon=True)
        self.rebuilds = 0
        self.row_prefills = 0
        self.warmed: warmup.Warmup | None = None  # what start(warmup=True)'s warm-up did
        self._warm, self._level = False, "full"
        self._ready = threading.Event()
        self._warm_error: BaseException | None = None
        self._caches: dict[str, Any] = {}  # the graph caches whose captures count as captures while serving
        self._counters: list[Any] = []  # the same caches, for a cheap sum
        self._captures = 0
        self._seen: dict[str, int] = {}  # cache name -> its captures already logged
        self._shown_running = 0  # what the running gauge shows
        # Rows join one by one where the target prefills single rows and every arm's provider
        # forgets single rows (read once: isinstance on a Protocol costs microseconds a step).
        self.per_row = isinstance(pipeline.target, PrefillsRows) and all(
            isinstance(arm.provider, ResetsRows) for arm in pipeline.policy.arms)

    # ------------------------------------------------------------------ the app's side

    def start(self, warmup: bool = False, level: str = "full") -> None:
        """Start the engine's thread; with ``warmup`` it warms up first, at ``level`` (a key of
        :data:`flashspec_serve.warmup.LEVELS`; :meth:`wait_ready`)."""
        self._warm, self._level = warmup, level
        self._thread.start()

    def wait_ready(self) -> warmup.Warmup | None:
        """Block until the engine takes requests (after its warm-up, if any); the warm-up's
        record, or its error raised here."""
        self._ready.wait()
        if self._warm_error is not None:
            raise self._warm_error
        return self.warmed

    def slot_sizes(self) -> list[int]:
        """Every slot count a batch rebuild can make (module docstring)."""
        return warmup.slot_sizes(self.max_batch, self.per_row)

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
        if not self._warm_up():
            return
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
            self._count_captures()

    def _warm_up(self) -> bool:
        """On the engine's thread, the one that serves: the warm-up (if asked), then the capture
        counters' baseline; False where the warm-up failed (the engine then serves nothing)."""
        try:
            if self._warm:
                self.warmed = w = warmup.warm_up(self.pipeline, self.slot_sizes(), self.context, self.per_row,
                                                 level=self._level)
                log.info("engine_warmed_up", level=w.level, seconds=round(w.seconds, 3), captures=w.captures,
                         prewarmed=w.prewarmed, steps=w.steps, sizes=list(w.sizes), lengths=list(w.lengths))
            self._caches = warmup.graph_caches(self.pipeline)
            self._counters = list(self._caches.values())
            self._captures = warmup.graph_captures(self._counters)
            self._seen = {name: int(cache.captures) for name, cache in self._caches.items()}
        except BaseException as exc:
            self._warm_error = exc
            log.exception("engine_warm_up_failed")
            return False
        finally:
            self._ready.set()
        return True

    def _count_captures(self) -> None:
        """Graphs captured since the last look: each one a stall some request just paid for,
        logged and counted by cache with its key, so an operator sees what the warm-up missed."""
        if not self._counters:
            return
        now = warmup.graph_captures(self._counters)  # one sum a step; the caches are read only when it moved
        if now == self._captures:
            return
        self._captures = now
        for name, cache in self._caches.items():
            seen, self._seen[name] = self._seen[name], int(cache.captures)
            keys: list[Any] = list(cache.captured[seen : self._seen[name]])
            keys += [None] * (self._seen[name] - seen - len(keys))  # a counter that does not keep its keys
            for key in keys:
                self.metrics.captures_while_serving.labels(cache=name).inc()
                log.warning("graph_captured_while_serving", cache=name, key=str(key), slots=len(self._active),
                            live=sum(self._active))

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
        prefilled, started = True, time.perf_counter()
        if self._joining:
            if not self._seat():
                self._build()
        elif self._shrinks():
            self._build()
        else:
            prefilled = False
        if prefilled:
            # The prefill is queued on the device: without this wait the next step's time would
            # hold it, and the selector would price that step's arm by a join's prefill (at 32
            # clients on the H100, plain steps read 5-7 ms against 2.6 ms and were never chosen).
            # The last step's tokens go out meanwhile, not after the wait.
            self._deliver()
            wait_device(self.pipeline.target.device)
            self.metrics.prefill_seconds.inc(time.perf_counter() - started)
        self._gauge_running()
        if not any(self._active):
            self._deliver()
            return
        record, emitted = self._step()
        self._settle(record, emitted)
        if not (self.overlap and any(self._active)):  # no step follows for this one's delivery to overlap
            self._deliver()
        self._gauge_running()

    def _gauge_running(self) -> None:
        running = self.running
        if running != self._shown_running:  # a gauge's set takes a lock: not on every step for nothing
            self._shown_running = running
            self.metrics.running.set(running)

    def _drop_cancelled(self) -> None:
        past_deadline = self._deadline is not None and time.perf_counter() > self._deadline
        for b, row in enumerate(self._rows):
            if row is not None and self._active[b] and (row.handle.cancelled or past_deadline):
                self._active[b] = False
                self._finish(row, "abort", "the server is shutting down" if past_deadline else None)
        for row in [r for r in self._joining if r.handle.cancelled or past_deadline]:
            self._joining.remove(row)
            self._finish(row, "abort", "the server is shutting down" if past_deadline else None)

    def _shrinks(self) -> bool:
        """Few enough live rows that a rebuild pays for itself: a quarter of the slots with
        per-row prefill (so a batch rebuilt with headroom is not shrunk back at once), half without."""
        live, slots = sum(self._active), len(self._active)
        return slots > 0 and live * (4 if self.per_row else 2) <= slots

    def _seat(self) -> bool:
        """Seat the joining rows in free slots, each prefilled alone (module docstring);
        False, changing nothing, where they cannot be."""
        free = [b for b, on in enumerate(self._active) if not on]
        if not (any(self._active) and len(self._joining) <= len(free) and self.per_row):
            return False
        seats, rows, self._joining = free[: len(self._joining)], self._joining, []
        width = max(len(r.job.prompt) + r.job.max_tokens for r in rows) + self.max_gamma + 1
        if width > self._tokens.shape[1]:  # only the host tensor widens: no component keeps its width
            grown = torch.zeros((self._tokens.shape[0], width), dtype=torch.long)
            grown[:, : self._tokens.shape[1]] = self._tokens
            self._tokens = grown
        for b, row in zip(seats, rows, strict=True):
            seq = row.sequence
            self._rows[b], self._active[b], self._lengths[b] = row, True, len(seq)
            self._tokens[b] = 0
            self._tokens[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        self._sampling = self._row_sampling()
        for provider in {id(a.provider): a.provider for a in self.pipeline.policy.arms}.values():
            cast(ResetsRows, provider).reset_rows(seats)
        cast(PrefillsRows, self.pipeline.target).prefill_rows(self._tokens, self._lengths, seats)
        # host-side indexing while the device prefills
        self.pipeline.policy.catch_up(self._tokens, self._lengths, rows=sum(self._active))
        self.row_prefills += len(seats)
        self.metrics.row_prefills.inc(len(seats))
        self.metrics.rebuild_tokens.inc(sum(self._lengths[b] for b in seats))
        return True

    def _build(self) -> None:
        """Rebuild the batch from the live rows' sequences: re-prefill the target, reset the providers."""
        rows = [r for b, r in enumerate(self._rows) if r is not None and self._active[b]] + self._joining
        self._joining = []
        if not rows:
            self._rows, self._active = [], []
            return
        slots = len(rows)
        if self.per_row:  # headroom: the next joins take free slots instead of a rebuild
            slots = max(slots, min(self.max_batch, 1 << (slots - 1).bit_length()))
        self._rows = [*rows, *[None] * (slots - len(rows))]
        self._active = [True] * len(rows) + [False] * (slots - len(rows))
        seqs = [r.sequence for r in rows] + [[0]] * (slots - len(rows))  # a free slot holds one dummy token
        width = max(len(r.job.prompt) + r.job.max_tokens for r in rows) + self.max_gamma + 1
        self._tokens = torch.zeros((slots, width), dtype=torch.long)
        for b, seq in enumerate(seqs):
            self._tokens[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        self._lengths = [len(s) for s in seqs]
        self._sampling = self._row_sampling()
        self.pipeline.policy.begin(len(rows))
        self.pipeline.target.prefill(self._tokens, self._lengths)
        self.pipeline.policy.catch_up(self._tokens, self._lengths, rows=len(rows))
        self.rebuilds += 1
        self.metrics.rebuilds.inc()
        self.metrics.rebuild_tokens.inc(sum(len(r.sequence) for r in rows))

    def _row_sampling(self) -> SamplingParams | RowSampling:
        """One setting per slot; a never-filled slot copies the first row's (unseeded), so a
        batch of one setting stays uniform, and is handed to the steps as that one setting
        (what the pipeline would make of it each step)."""
        first = next(r for r in self._rows if r is not None)
        rows = [first if r is None else r for r in self._rows]
        seeds = [None if r is None else r.job.seed for r in self._rows]
        sampling = RowSampling([r.job.params for r in rows], seeds=seeds)
        return sampling.uniform or sampling

    def _step(self) -> tuple[StepRecord, list[list[int]]]:
        # The pipeline's own step (plan -> propose -> score -> verify -> commit), so the engine's
        # steps are logged, observed by flashspec_step_end and counted exactly as generate()'s.
        # The last step's tokens are delivered once this step's device work is queued.
        return self.pipeline.step(self._tokens, self._lengths, self._active, self._sampling, self._generator,
                                  on_queued=self._deliver if self.overlap else None)

    def _settle(self, record: StepRecord, emitted: list[list[int]]) -> None:
        """What the next step needs of this one: each live row's new tokens in the sequences, and
        the rows that ended (EOS, their token budget, a stop string) out of the batch. Their text
        and events wait for :meth:`_deliver`, which (with ``overlap``) runs while the next step's
        device work does: the event loop, woken by it, then sends the chunks while the engine
        thread waits on the device, instead of holding the GIL between two steps. A row with stop
        strings is detokenized here, since its text decides whether it ends."""
        eos = self.pipeline.target.eos_token_ids
        accepted = []
        generated = 0
        ids = self._tokens.numpy()  # a view: a row's writes cost ~0.3 us through it, ~7 us as torch tensors
        for b, row in enumerate(self._rows):
            if row is None or not self._active[b]:
                continue
            accepted.append(len(emitted[b]) - 1)
            row.count(record.gamma, len(emitted[b]) - 1)
            new = emitted[b][: row.job.max_tokens - len(row.out)]
            stop = next((i for i, t in enumerate(new) if t in eos), None)
            if stop is not None:
                new = new[: stop + 1]
            ids[b, self._lengths[b] : self._lengths[b] + len(new)] = new
            self._lengths[b] += len(new)
            row.out.extend(new)
            generated += len(new)
            text = row.text.feed(new) if row.text.stop else None
            reason = None
            if row.text.stopped or stop is not None or len(row.out) >= row.job.max_tokens:
                self._active[b] = False
                reason = "stop" if row.text.stopped or stop is not None else "length"
            self._undelivered.append((row, new, text, reason))
        self.metrics.generation_tokens.inc(generated)
        self.metrics.step(record.arm_name, record.gamma, accepted, record.step_ms / 1e3)

    def _deliver(self) -> None:
        """Hand the settled steps' text and last events to the requests, in one wake-up of the loop."""
        pending, self._undelivered = self._undelivered, []
        if not pending:
            return
        now = time.perf_counter()
        events: list[tuple[Handle, Event]] = []
        for row, new, text, reason in pending:
            self._observe_latency(row, now)
            events.append((row.handle, Event(row.text.feed(new) if text is None else text, tuple(new))))
            if reason is not None:
                events.append((row.handle, self._last(row, reason)))
        hand_over(events)

    def _observe_latency(self, row: _Row, now: float) -> None:
        if row.last is None:
            self.metrics.ttft.observe(now - row.handle.arrived)
        else:
            self.metrics.itl.observe(now - row.last)
        row.last = now

    def _finish(self, row: _Row, reason: str, error: str | None = None) -> None:
        self._deliver()  # what the row (or another) was given before goes first
        row.handle.put(self._last(row, reason, error))

    def _last(self, row: _Row, reason: str, error: str | None = None) -> Event:
        """A request's last event: the text held back, why it ended and its statistics."""
        tail = row.text.flush() if reason in ("stop", "length") else ""
        return Event(tail, (), finish=reason, completion_tokens=len(row.out), speculation=row.speculation(),
                     error=error)

    def _abort_all(self, reason: str, error: str) -> None:
        for row in [r for b, r in enumerate(self._rows) if r is not None and self._active[b]] + self._joining:
            self._finish(row, reason, error)
        self._rows, self._active, self._joining = [], [], []
