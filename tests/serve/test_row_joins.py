"""Rows that join the running batch are prefilled alone, in a free slot (PrefillsRows, ResetsRows).

The engine is driven directly (no HTTP), with requests submitted from the step hook, so
each one joins before a known step: a row's greedy tokens must be exactly what it gets
alone whenever it joined, and a join must prefill only the joining row.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import pipeline_dict

from flashspec_core.build import build_pipeline
from flashspec_core.contracts import PrefillsRows, ResetsRows, SamplingParams, StepRecord
from flashspec_core.pipeline import Pipeline
from flashspec_serve.engine import Engine, Event, Job

GREEDY = SamplingParams(temperature=0.0)
LONG = (1, 2, 3)  # the tiny target's greedy continuations of these run to any length
OTHER = (9, 8, 7, 6)
THIRD = (7, 8, 9, 1, 2)
SHORT = (2, 2, 6)  # ends at EOS after two tokens


def _pipeline(models: dict[str, Path], target: str = "hf") -> Pipeline:
    """The tiny target in float32 with the close hf draft and the lookup arms (fixed selector)."""
    config = pipeline_dict(models["target"], [models["close"]], "fixed", dtype="float32")
    if target == "fast":
        config["target"] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
        config["arm"][0] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
    return build_pipeline(config)


@pytest.fixture(scope="module")
def alone(tiny_models: dict[str, Path]) -> Pipeline:
    return _pipeline(tiny_models)


def _expected(alone: Pipeline, job: Job) -> list[int]:
    return alone.generate([list(job.prompt)], max_new_tokens=job.max_tokens, temperature=0.0).token_ids[0]


class Calls:
    """Records the target's prefills: ('all', lengths) for a rebuild, ('rows', rows, lengths) for a join."""

    def __init__(self, target: Any) -> None:
        self.log: list[tuple[Any, ...]] = []
        prefill, rows = target.prefill, target.prefill_rows

        def record_prefill(tokens: torch.Tensor, lengths: Sequence[int]) -> None:
            self.log.append(("all", list(lengths)))
            prefill(tokens, lengths)

        def record_rows(tokens: torch.Tensor, lengths: Sequence[int], seats: Sequence[int]) -> None:
            self.log.append(("rows", list(seats), [lengths[b] for b in seats]))
            rows(tokens, lengths, seats)

        target.prefill, target.prefill_rows = record_prefill, record_rows


def _run(pipeline: Pipeline, first: list[Job], later: dict[int, list[Job]], max_batch: int = 4,
         per_row: bool | None = None) -> tuple[Engine, list[list[int]]]:
    """Decode ``first`` (admitted together), submitting ``later[k]`` from step ``k``'s hook;
    each job's token ids, in submission order."""
    engine = Engine(pipeline, max_batch=max_batch)
    if per_row is not None:
        engine.per_row = per_row
    total = len(first) + sum(len(jobs) for jobs in later.values())

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        handles = [engine.submit(job, loop) for job in first]
        steps = itertools.count()

        def on_step(_record: StepRecord) -> None:
            handles.extend(engine.submit(job, loop) for job in later.get(next(steps), []))

        pipeline.on_step = on_step
        engine.start()
        while len(handles) < total:
            await asyncio.sleep(0.01)
        outs = []
        for handle in handles:
            events: list[Event] = [e async for e in handle.events()]
            assert events[-1].finish in ("stop", "length"), events[-1]
            outs.append([t for e in events for t in e.token_ids])
        return outs

    try:
        outs = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        engine.stop(0.0)
        pipeline.on_step = None
    return engine, outs


def test_the_bundled_back_ends_join_rows_one_by_one(alone: Pipeline) -> None:
    assert isinstance(alone.target, PrefillsRows)
    assert all(isinstance(arm.provider, ResetsRows) for arm in alone.policy.arms)
    assert Engine(alone).per_row


@pytest.mark.parametrize("target", ["hf", "fast"])
def test_joining_rows_are_prefilled_alone_and_decode_as_alone(tiny_models: dict[str, Path], alone: Pipeline,
                                                              target: str) -> None:
    """Three rows start (four slots); one joins the free slot, one the slot of a row that ended
    at EOS: every row gets its continuation alone, the target is prefilled once for the whole
    batch and then once per joining row, with that row's slot and sequence only."""
    pipeline = _pipeline(tiny_models, target)
    calls = Calls(pipeline.target)
    first = [Job(LONG, 20, GREEDY), Job(SHORT, 8, GREEDY), Job(OTHER, 16, GREEDY)]
    later = {1: [Job(THIRD, 12, GREEDY)], 4: [Job((3, 4), 10, GREEDY)]}
    engine, outs = _run(pipeline, first, later)
    jobs = first + later[1] + later[4]
    assert outs == [_expected(alone, job) for job in jobs]
    # each joiner takes one free slot: SHORT's once it ends, or the never-filled one
    joins, shrinks = calls.log[1:3], calls.log[3:]
    assert calls.log[0] == ("all", [3, 3, 4, 1])
    assert [c[0] for c in joins] == ["rows", "rows"] and [c[2] for c in joins] == [[5], [2]]
    assert all(c[1] in ([1], [3]) for c in joins)
    # once the joins are in, only a shrink (one live row left in four slots) may rebuild
    assert all(c[0] == "all" and len(c[1]) == 1 for c in shrinks)
    assert (engine.rebuilds, engine.row_prefills) == (1 + len(shrinks), 2)
    rendered = engine.metrics.render().decode()
    assert "flashspec:batch_row_prefills_total 2.0" in rendered
    prefill_s = [line for line in rendered.splitlines() if line.startswith("flashspec:batch_prefill_seconds_total ")]
    assert len(prefill_s) == 1 and float(prefill_s[0].split()[1]) > 0
    # the live rows' tokens are not prefilled again at a join: only the joining rows' prompts count
    tokens = 3 + 3 + 4 + 5 + 2 + sum(c[1][0] for c in shrinks)
    assert f"flashspec:batch_rebuild_prefill_tokens_total {tokens:.1f}" in rendered


def test_without_per_row_prefill_every_join_rebuilds(tiny_models: dict[str, Path], alone: Pipeline) -> None:
    pipeline = _pipeline(tiny_models)
    calls = Calls(pipeline.target)
    first = [Job(LONG, 12, GREEDY), Job(OTHER, 12, GREEDY)]
    later = {1: [Job(THIRD, 6, GREEDY)]}
    engine, outs = _run(pipeline, first, later, per_row=False)
    assert outs == [_expected(alone, job) for job in first + later[1]]
    assert [c[0] for c in calls.log] == ["all", "all"] and len(calls.log[1][1]) == 3  # the live rows again
    assert (engine.rebuilds, engine.row_prefills) == (2, 0)


def test_a_join_with_no_free_slot_rebuilds_with_headroom(tiny_models: dict[str, Path], alone: Pipeline) -> None:
    """Two rows fill two slots; a third rebuilds the batch with four slots, so a fourth joins alone."""
    pipeline = _pipeline(tiny_models)
    calls = Calls(pipeline.target)
    first = [Job(LONG, 16, GREEDY), Job(OTHER, 16, GREEDY)]
    later = {0: [Job(THIRD, 10, GREEDY)], 2: [Job((3, 4), 6, GREEDY)]}
    engine, outs = _run(pipeline, first, later)
    assert outs == [_expected(alone, job) for job in first + later[0] + later[2]]
    shrinks = calls.log[3:]  # the last live row alone in four slots
    assert [c[0] for c in calls.log[:3]] == ["all", "all", "rows"] and all(len(c[1]) == 1 for c in shrinks)
    assert len(calls.log[1][1]) == 4 and calls.log[2][1] == [3]
    assert (engine.rebuilds, engine.row_prefills) == (2 + len(shrinks), 1)


# ------------------------------------------------------------------ the targets alone


def _score_twice(target: Any, join: Callable[[torch.Tensor, list[int]], None] | None) -> torch.Tensor:
    """Prefill three rows, score and commit a step, let ``join`` replace row 1, score again: the
    second step's logits [3, 3, V]."""
    seqs = [[1, 2, 3, 1, 4, 5], [7, 8, 9], [9, 8, 7, 6, 4]]
    tokens = torch.zeros((3, 24), dtype=torch.long)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
    lengths = [len(s) for s in seqs]
    target.prefill(tokens, lengths)
    target.score(tokens, lengths, torch.tensor([[4], [1], [3]]))
    target.rollback([1, 0, 1])  # rows 0 and 2 keep their draft token, and each gets one more
    for b, new in enumerate([[4, 3], [2], [3, 1]]):
        tokens[b, lengths[b] : lengths[b] + len(new)] = torch.tensor(new)
        lengths[b] += len(new)
    if join is not None:
        join(tokens, lengths)
    return target.score(tokens, lengths, torch.tensor([[4, 3], [1, 4], [3, 1]]))  # type: ignore[no-any-return]


def _load(models: dict[str, Path], backend: str) -> Any:
    return _pipeline(models, backend).target


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_prefill_rows_leaves_the_other_rows_as_they_were(tiny_models: dict[str, Path], backend: str) -> None:
    """After row 1 starts a new sequence, rows 0 and 2 score what they score without the join,
    and row 1 what its new sequence scores when prefilled with the batch."""
    fresh = [5, 4, 4, 2, 1, 3, 3]

    def join(tokens: torch.Tensor, lengths: list[int]) -> None:
        tokens[1] = 0
        tokens[1, : len(fresh)] = torch.tensor(fresh)
        lengths[1] = len(fresh)
        target.prefill_rows(tokens, lengths, [1])

    def fresh_batch(tokens: torch.Tensor, lengths: list[int]) -> None:
        tokens[1] = 0
        tokens[1, : len(fresh)] = torch.tensor(fresh)
        lengths[1] = len(fresh)
        reference.prefill(tokens, lengths)

    target, reference = _load(tiny_models, backend), _load(tiny_models, backend)
    joined = _score_twice(target, join)
    untouched = _score_twice(reference, None)
    assert torch.equal(joined[[0, 2]], untouched[[0, 2]]) if backend == "fast" else \
        torch.allclose(joined[[0, 2]], untouched[[0, 2]], atol=1e-5, rtol=0)
    rebuilt = _score_twice(reference, fresh_batch)
    torch.testing.assert_close(joined[1], rebuilt[1], atol=1e-5, rtol=0)


def test_fast_prefill_rows_writes_no_other_rows_slot(tiny_models: dict[str, Path]) -> None:
    target = _load(tiny_models, "fast")
    tokens = torch.randint(0, 15, (3, 40), generator=torch.Generator().manual_seed(0))
    target.prefill(tokens, [30, 20, 25])
    before_k, before_v = target.model.k_cache.clone(), target.model.v_cache.clone()
    target.prefill_rows(tokens.flip(1), [30, 33, 25], [1])
    keep = [0, 2]
    assert torch.equal(target.model.k_cache[:, keep], before_k[:, keep])
    assert torch.equal(target.model.v_cache[:, keep], before_v[:, keep])
    assert not torch.equal(target.model.k_cache[:, 1, :32], before_k[:, 1, :32])
    assert target.cached == [29, 32, 24]


@pytest.mark.parametrize("backend", ["hf", "fast"])
@pytest.mark.parametrize("rows", [[], [3], [1, 1]])
def test_prefill_rows_refuses_rows_outside_the_batch(tiny_models: dict[str, Path], backend: str,
                                                     rows: list[int]) -> None:
    target = _load(tiny_models, backend)
    tokens = torch.ones((3, 8), dtype=torch.long)
    target.prefill(tokens, [4, 4, 4])
    with pytest.raises(ValueError, match="rows must be distinct indices in"):
        target.prefill_rows(tokens, [4, 4, 4], rows)


def test_hf_joins_keep_the_cache_as_wide_as_its_fullest_row(tiny_models: dict[str, Path]) -> None:
    """Each join invalidates a row's slots; compaction drops them, so the slot count does not
    grow with the number of joins."""
    target = _load(tiny_models, "hf")
    tokens = torch.ones((2, 64), dtype=torch.long)
    target.prefill(tokens, [20, 5])
    for _ in range(6):
        target.prefill_rows(tokens, [20, 18], [1])
    assert target.lm.valid.shape[1] == 19
    assert target.lm.valid.sum(1).tolist() == [19, 17]


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_reset_rows_starts_a_provider_row_over(tiny_models: dict[str, Path], backend: str) -> None:
    """A row that takes a new (longer) sequence after ``reset_rows`` gets the proposal a fresh
    provider makes for it, and so does the row beside it: the model draft and prompt lookup."""
    used = [a.provider for a in _pipeline(tiny_models, backend).policy.arms[1::-1]]  # lookup, then the model
    fresh = [a.provider for a in _pipeline(tiny_models, backend).policy.arms[1::-1]]
    old, new = [7, 8, 9, 7, 8, 9, 7, 8], [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    tokens = torch.zeros((2, 16), dtype=torch.long)
    tokens[0, :7], tokens[1, :8] = torch.tensor([5, 4, 3, 2, 1, 5, 4]), torch.tensor(old)
    for provider in used:
        provider.propose(tokens, [7, 8], 3, GREEDY, None)
        provider.rollback([0, 0])
    tokens[0, 7], tokens[1, :10] = 3, torch.tensor(new)  # row 0 gains its step's token
    for provider, reference in zip(used, fresh, strict=True):
        assert isinstance(provider, ResetsRows)
        provider.reset_rows([1])
        got = provider.propose(tokens, [8, 10], 3, GREEDY, None).tokens
        assert torch.equal(got, reference.propose(tokens, [8, 10], 3, GREEDY, None).tokens), type(provider).__name__


def test_the_engine_hands_each_new_sequence_to_catching_up_providers_after_its_prefill(
        tiny_models: dict[str, Path], alone: Pipeline) -> None:
    """A provider with CatchesUp sees the batch right after the whole-batch prefill and right
    after each join's row prefill, with the joiner's sequence in its slot."""
    pipeline = _pipeline(tiny_models)
    calls = Calls(pipeline.target)

    class Ahead:
        def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
            calls.log.append(("catch_up", list(lengths)))

    pipeline.policy.arms[0].provider.catch_up = Ahead().catch_up  # type: ignore[attr-defined]
    first = [Job(LONG, 20, GREEDY), Job(SHORT, 8, GREEDY), Job(OTHER, 16, GREEDY)]  # four slots, one free
    later = {1: [Job(THIRD, 12, GREEDY)]}
    _engine, outs = _run(pipeline, first, later)
    assert outs == [_expected(alone, job) for job in first + later[1]]
    kinds = [c[0] for c in calls.log]
    assert kinds[:4] == ["all", "catch_up", "rows", "catch_up"]
    assert calls.log[3][1][calls.log[2][1][0]] == len(THIRD)  # the joiner's slot holds its prompt


def test_the_engine_tells_a_factored_selector_that_finished_rows_are_refilled(tiny_models: dict[str, Path]) -> None:
    """generate's fixed batch waits on its slowest row (static_batch on); the server seats new
    requests in finished rows, so its factored selector scores the mean row."""
    config = pipeline_dict(tiny_models["target"], [tiny_models["close"]], "factored", dtype="float32")
    pipeline = build_pipeline(config)
    selector = pipeline.policy.selectors[0]
    assert selector.static_batch  # type: ignore[attr-defined]
    Engine(pipeline, max_batch=4)
    assert not selector.static_batch  # type: ignore[attr-defined]
    config["selector"] |= {"static_batch": False}
    off = build_pipeline(config).policy.selectors[0]
    off.rows_refilled(False)  # type: ignore[attr-defined]
    assert not off.static_batch  # type: ignore[attr-defined]  # the config's choice stands


def test_the_engine_waits_for_a_prefill_before_the_step_after_it(tiny_models: dict[str, Path], alone: Pipeline,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild's or a join's prefill is queued on the device; the engine waits for it before
    the next step, so that step's time (what the selector prices its arm by) holds no prefill:
    every prefill is followed by a wait before any score."""
    from flashspec_serve import engine as engine_module

    pipeline = _pipeline(tiny_models)
    calls = Calls(pipeline.target)
    score = pipeline.target.score
    monkeypatch.setattr(pipeline.target, "score", lambda *a: (calls.log.append(("score",)), score(*a))[1])
    monkeypatch.setattr(engine_module, "wait_device", lambda device: calls.log.append(("wait", device.type)))
    first = [Job(LONG, 20, GREEDY), Job(SHORT, 8, GREEDY), Job(OTHER, 16, GREEDY)]
    later = {1: [Job(THIRD, 12, GREEDY)]}
    _engine, outs = _run(pipeline, first, later)
    assert outs == [_expected(alone, job) for job in first + later[1]]
    kinds = [c[0] for c in calls.log]
    prefills = [i for i, k in enumerate(kinds) if k in ("all", "rows")]
    assert kinds.count("rows") >= 1 and kinds.count("all") >= 1
    for i in prefills:
        assert "wait" in kinds[i + 1 : kinds.index("score", i)], kinds[i : i + 4]
    assert kinds.count("wait") == len(prefills)  # and no wait where nothing was prefilled
