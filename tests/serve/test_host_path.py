"""The engine's host path per step: how its events reach the event loop, and what a step re-reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import make_pipeline

from flashspec_core.contracts import RowSampling, SamplingParams
from flashspec_serve import warmup
from flashspec_serve.app import _Reply
from flashspec_serve.engine import Engine, Event, Handle, Job, Speculation, hand_over
from flashspec_serve.metrics import Metrics
from flashspec_serve.text import TextStream

PROMPTS = [(1, 2, 3), (3, 4), (7, 8, 9, 1, 2), (5,)]


class _Loop:
    """An event loop that only records what is handed to it from another thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
        self.calls.append((fn, args))


def test_events_a_lagging_coroutine_has_not_taken_are_joined_but_a_failure_stays_apart() -> None:
    """While the request's coroutine lags, its events join into one (one chunk and one write
    per loop turn instead of one per step); the text and tokens stay in order, the finish and
    statistics are the last event's. A failure is never joined to the text before it, which
    the client still gets; a taken event starts a new one."""
    spec = Speculation(draft_tokens=6, accepted_tokens=4, accepted_per_position=(2, 2), steps=3)

    async def run() -> tuple[list[Event], list[Event]]:
        loop = asyncio.get_running_loop()
        handle = Handle(Job((1,), 8, SamplingParams()), loop)
        assert handle.get_nowait() is None
        handle.deliver(Event("a", (1,)))
        first = await handle.get()  # taken before the next arrives: alone
        for event in (Event("b", (2,)), Event("", (3,)), Event("c", (4,)), Event("", (), "length", 4, spec)):
            handle.deliver(event)
        ok = [first, *[e async for e in handle.events()]]
        failing = Handle(Job((1,), 8, SamplingParams()), loop)
        for event in (Event("x", (5,)), Event("y", (6,)), Event("", (), "error", error="boom")):
            failing.deliver(event)
        return ok, [e async for e in failing.events()]

    ok, failed = asyncio.run(run())
    assert ok == [Event("a", (1,)), Event("bc", (2, 3, 4), "length", 4, spec)]
    assert failed == [Event("xy", (5, 6)), Event("", (), "error", error="boom")]



@pytest.mark.parametrize("kind", ["text_completion", "chat.completion"])
def test_a_text_chunk_is_the_general_chunk_with_only_the_text_encoded(kind: str) -> None:
    """The per-step chunk, built around the request's fixed JSON, has the general path's very
    characters for any text: quotes, escapes, NUL (the marker it is built with), non-BMP."""
    reply = _Reply(kind, 'a "model" \x00', 12)
    for text in ["", "a", ' "q" \\ \n\t\x00 \u00e9 \u6f22 \U0001f642', "\x00", "\\u0000"]:
        assert reply.text_chunk(text) == reply.chunk([reply.choice(text, None, delta=True)])

def test_hand_over_wakes_each_loop_once_with_its_events_in_order() -> None:
    a, b = _Loop(), _Loop()
    job = Job((1,), 1, SamplingParams())
    ha1, ha2, hb = (Handle(job, loop) for loop in (a, a, b))  # type: ignore[arg-type]
    events = [(ha1, Event("x", (1,))), (hb, Event("y", (2,))), (ha2, Event("z", (3,))), (ha1, Event("", (), "stop"))]
    hand_over(events)
    assert len(a.calls) == 1 and len(b.calls) == 1
    assert a.calls[0][1][0] == [events[0], events[2], events[3]] and b.calls[0][1][0] == [events[1]]



def _serve(engine: Engine, budgets: list[int],
           on_loop: Callable[[asyncio.AbstractEventLoop], None] | None = None) -> list[list[Event]]:
    """Every request's events: PROMPTS with their token budgets, greedy, all submitted before the
    engine starts so they join in one batch (``on_loop`` sees the event loop first)."""

    async def run() -> list[list[Event]]:
        loop = asyncio.get_running_loop()
        if on_loop is not None:
            on_loop(loop)
        greedy = SamplingParams(temperature=0.0)
        handles = [engine.submit(Job(p, n, greedy), loop) for p, n in zip(PROMPTS, budgets, strict=True)]
        engine.start()
        return [[e async for e in h.events()] for h in handles]

    try:
        return asyncio.run(run())
    finally:
        engine.stop()

def test_one_wake_up_of_the_event_loop_per_step_whatever_the_rows(tiny_models: dict[str, Path]) -> None:
    """Four rows decode together: each step's events (their last ones included) reach the
    event loop in one thread-safe call, not one per row."""
    pipeline = make_pipeline(tiny_models)
    steps: list[Any] = []
    pipeline.on_step = steps.append
    engine = Engine(pipeline, max_batch=len(PROMPTS))
    wake_ups = 0

    def count_wake_ups(loop: asyncio.AbstractEventLoop) -> None:
        threadsafe = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wake_ups
            wake_ups += 1
            return threadsafe(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]

    got = _serve(engine, [12] * len(PROMPTS), count_wake_ups)
    assert all(events[-1].finish in ("stop", "length") for events in got)
    assert all(s.batch_size == len(PROMPTS) for s in steps[:1])  # they did share the steps
    assert wake_ups == len(steps)



def test_a_steps_text_reaches_the_loop_while_the_next_step_runs(tiny_models: dict[str, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's text and last events are handed to the event loop once the next step's device
    work is queued (the loop sends them while the engine waits on the device), or once a
    rebuild's or join's prefill is (the engine waits for it before the next step), and those of
    the batch's last step right after it; what every request gets is unchanged."""
    import flashspec_serve.engine as engine_module

    pipeline = make_pipeline(tiny_models)
    engine = Engine(pipeline, max_batch=len(PROMPTS), overlap=True)  # the CUDA default, on the CPU
    marks: list[str] = []
    inner, real_hand_over = pipeline.step, engine_module.hand_over

    def step(*args: Any, **kwargs: Any) -> Any:
        marks.append("step")
        out = inner(*args, **kwargs)
        marks.append("end")
        return out

    def hand_over(events: Any) -> None:
        marks.append("hand")
        real_hand_over(events)

    pipeline.step = step  # type: ignore[method-assign]
    monkeypatch.setattr(engine_module, "hand_over", hand_over)
    prefill = pipeline.target.prefill
    monkeypatch.setattr(pipeline.target, "prefill", lambda *a: (marks.append("prefill"), prefill(*a))[1])

    got = _serve(engine, [5, 9, 12, 12])
    assert [len([t for e in events for t in e.token_ids]) for events in got] == [5, 9, 12, 12]
    assert marks[:3] == ["prefill", "step", "end"] and marks[-2:] == ["end", "hand"]
    inside = [(marks[i - 1] == "step" and marks[i + 1] == "end") or marks[i - 1] == "prefill"
              for i, m in enumerate(marks[:-1]) if m == "hand"]
    assert inside and all(inside)  # every hand-over but the last ran inside the next step or a prefill
    assert any(marks[i - 1] == "step" for i, m in enumerate(marks[:-1]) if m == "hand")
    assert not Engine(pipeline).overlap  # on the CPU a step's work is done when queued: delivered after it


def test_a_uniform_batch_hands_the_steps_its_one_setting(tiny_models: dict[str, Path]) -> None:
    """A batch whose rows share one unseeded setting is stepped with that SamplingParams (what
    the pipeline would derive from the RowSampling every step); a seeded row keeps the rows."""
    engine = Engine(make_pipeline(tiny_models), max_batch=2)

    async def run(seeds: tuple[int | None, ...]) -> Any:
        loop = asyncio.get_running_loop()
        for prompt, seed in zip(PROMPTS, seeds, strict=False):
            engine._waiting.append(Handle(Job(prompt, 4, SamplingParams(temperature=0.7), seed=seed), loop))
        engine._admit()
        engine._build()
        return engine._sampling

    assert asyncio.run(run((None, None))) == SamplingParams(temperature=0.7)
    engine._rows, engine._active = [], []
    assert isinstance(asyncio.run(run((None, 5))), RowSampling)


def test_step_metrics_reuse_their_labelled_children() -> None:
    metrics = Metrics()
    for accepted in ([2, 0], [3, 1], [0, 0]):
        metrics.step("d0", 3, accepted, 0.001)
    metrics.step("lookup", 0, [], 0.001)
    text = metrics.render().decode()

    def value(name: str) -> float:
        return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))

    assert value('flashspec:spec_decode_arm_selections_total{arm="d0"}') == 3
    assert value('flashspec:spec_decode_arm_selections_total{arm="lookup"}') == 1
    assert value('flashspec:arm_step_seconds_total{arm="d0"}') == pytest.approx(0.003)
    assert value('flashspec:arm_row_steps_total{arm="d0"}') == 6
    assert value('flashspec:arm_emitted_tokens_total{arm="d0"}') == 12  # 6 accepted and one per row
    assert value('flashspec:arm_emitted_tokens_total{arm="lookup"}') == 0
    per_pos = [value(f'flashspec:spec_decode_num_accepted_tokens_per_pos_total{{position="{p}"}}') for p in range(3)]
    assert per_pos == [3, 2, 1]
    assert value("flashspec:spec_decode_num_drafts_total") == 6
    assert value("flashspec:spec_decode_num_accepted_tokens_total") == 6
    with pytest.raises(StopIteration):
        value('flashspec:spec_decode_num_accepted_tokens_per_pos_total{position="3"}')


def test_the_warm_up_runs_after_generate_drew_a_choice_ahead(tiny_models: dict[str, Path]) -> None:
    """The serve bench times generate() on the pipeline before it serves: the choice UCB1 drew
    ahead at generate's last step (an index into all four arms) must not reach the warm-up's
    forced single arm."""
    pipeline = make_pipeline(tiny_models, "ucb1")
    pipeline.generate(["t1 t2 t3"], max_new_tokens=6)
    warmed = warmup.warm_up(pipeline, [1], None, True, level="basic")
    assert warmed.steps > 0
    assert pipeline.generate(["t1 t2 t3"], max_new_tokens=6).token_ids  # the policy's own arms are back


def test_a_text_sent_whole_is_decoded_once_at_the_end() -> None:
    words = {1: "a", 2: " b", 3: "c", 4: "\ufffd"}
    calls: list[int] = []

    def decode(ids: Any) -> str:
        calls.append(len(ids))
        return "".join(words[i] for i in ids)

    lazy = TextStream(decode, lazy=True)
    assert [lazy.feed(new) for new in ([1], [2, 4], [3])] == ["", "", ""] and calls == []
    assert lazy.flush() == "a b\ufffdc" and calls == [4]
    eager = TextStream(decode, lazy=False)
    assert "".join([eager.feed(new) for new in ([1], [2, 4], [3])] + [eager.flush()]) == "a b\ufffdc"
    assert calls[1:] == [1, 1, 3, 1, 4]  # a window per feed (the text before it, then with the new tokens)
    assert not TextStream(decode, stop=("c",), lazy=True).lazy  # stop strings are looked for at every step


def test_the_engine_decodes_a_request_sent_whole_once(tiny_models: dict[str, Path]) -> None:
    pipeline = make_pipeline(tiny_models)
    decode, calls = pipeline.target.decode, []
    pipeline.target.decode = lambda ids: calls.append(len(ids)) or decode(ids)  # type: ignore[method-assign]
    engine = Engine(pipeline, max_batch=1)
    tokens = 40

    async def run(stream: bool) -> str:
        handle = engine.submit(Job((1, 2, 3), tokens, SamplingParams(temperature=0.0), stream=stream),
                               asyncio.get_running_loop())
        return "".join([e.text async for e in handle.events()])

    engine.start()
    try:
        whole = asyncio.run(run(False))
        assert calls == [tokens]
        calls.clear()
        assert asyncio.run(run(True)) == whole and len(calls) > 2  # streamed: a decode per step
        # each a window of the last steps' tokens, not the whole continuation
        width = 2 * (engine.max_gamma + 1)
        assert max(calls) <= width < tokens
    finally:
        engine.stop()
