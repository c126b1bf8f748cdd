"""A fast target sharded over two processes (gloo, CPU) decodes as one process does.

The pipeline of ``tensor_parallel = 2`` spawns one worker; rank 0 (this process) runs the
draft and the verifier. Its logits equal the one-process target's up to float32 rounding
(the row-parallel sums add two partial products), and its tokens equal the one-process
pipeline's: greedy and seeded sampling, a chain arm and a tree arm (score_tree and
commit_path replayed on the worker)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _tp_pair import ARMS, PROMPTS, one_and_two, play

from flashspec_core.contracts import (
    CapturesGraphs,
    HasContext,
    HasTokenizer,
    LimitsTreeNodes,
    PrefillsRows,
    SamplingParams,
    ScoresTrees,
    StepRecord,
)
from flashspec_core.pipeline import Pipeline
from flashspec_serve.engine import Engine, Job


@pytest.fixture(scope="module")
def pipes(family: dict[str, Path]) -> Iterator[tuple[Pipeline, Pipeline]]:
    with one_and_two(family, "cpu") as pair:
        yield pair


def test_the_sharded_target_offers_what_the_fast_target_does(pipes: tuple[Pipeline, Pipeline]) -> None:
    one, two = pipes
    for protocol in (ScoresTrees, LimitsTreeNodes, PrefillsRows, HasContext, HasTokenizer, CapturesGraphs):
        assert isinstance(two.target, protocol) == isinstance(one.target, protocol) == True  # noqa: E712
    assert (two.target.vocab, two.target.max_context) == (one.target.vocab, one.target.max_context) == (16, 255)
    assert two.target.max_tree_nodes == one.target.max_tree_nodes == 63
    assert two.target.workers[0].is_alive()
    w = two.target.local.model.w  # rank 0's shard: half the vocabulary, heads and MLP columns
    assert (w.embed.shape, w.lm_head.shape, w.layers[0].w_down.weight.shape) == ((8, 32), (8, 32), (32, 32))
    assert two.target.encode("t3 t4") == one.target.encode("t3 t4") == [3, 4]


def batch() -> tuple[torch.Tensor, list[int]]:
    tokens = torch.zeros((4, 32), dtype=torch.long)
    for b, p in enumerate(PROMPTS):
        tokens[b, : len(p)] = torch.tensor(p)
    return tokens, [len(p) for p in PROMPTS]


def test_logits_equal_one_process(pipes: tuple[Pipeline, Pipeline]) -> None:
    one, two = (p.target for p in pipes)
    tokens, lengths = batch()
    draft = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]])
    for t in (one, two):
        t.prefill(tokens, lengths)
    want, got = one.score(tokens, lengths, draft), two.score(tokens, lengths, draft)
    assert got.shape == want.shape == (4, 4, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(want[0], want[1])  # the rows differ, so a swapped or stale row would show
    parents = torch.tensor([-1, -1, 0, 1])
    want = one.score_tree(tokens, lengths, draft[:, :1].repeat(1, 4), parents)  # type: ignore[attr-defined]
    torch.testing.assert_close(two.score_tree(tokens, lengths, draft[:, :1].repeat(1, 4), parents), want,
                               rtol=1e-5, atol=1e-5)


def test_a_row_prefilled_alone_scores_as_in_one_process(pipes: tuple[Pipeline, Pipeline]) -> None:
    """The server's join: row 1 takes a new sequence, the other rows keep their caches."""
    one, two = (p.target for p in pipes)
    tokens, lengths = batch()
    draft = torch.tensor([[1, 2], [4, 5], [7, 8], [10, 11]])
    for t in (one, two):
        t.prefill(tokens, lengths)
        t.score(tokens, lengths, draft)
    tokens[1, :9], lengths[1] = torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1]), 9
    for t in (one, two):
        t.prefill_rows(tokens, lengths, [1])  # type: ignore[attr-defined]
    torch.testing.assert_close(two.score(tokens, lengths, draft), one.score(tokens, lengths, draft),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 3}, {"temperature": 0.8, "top_k": 5, "seed": 11}],
                         ids=["greedy", "sampled", "top_k"])
def test_tokens_equal_one_process(pipes: tuple[Pipeline, Pipeline], arm: str, sampling: dict[str, Any]) -> None:
    one, two = (play(p, arm) for p in pipes)
    want = one.generate(PROMPTS, max_new_tokens=24, **sampling)
    got = two.generate(PROMPTS, max_new_tokens=24, **sampling)
    assert got.token_ids == want.token_ids
    assert sum(map(len, want.token_ids)) >= 8  # EOS may end rows early, but not all at once
    assert {s.arm_name for s in got.steps} == {arm}
    assert [s.accepted for s in got.steps] == [s.accepted for s in want.steps]


def test_the_server_seats_a_joining_request_in_one_row_of_the_sharded_target(pipes: tuple[Pipeline, Pipeline]) -> None:
    """The serving engine over the sharded pipeline: three requests start (in four rows), a
    fourth joins at the second step, prefilled alone in the free row (replayed on the worker);
    each gets the tokens it gets alone from the one-process pipeline."""
    one, two = (play(p, "chain") for p in pipes)
    greedy = SamplingParams(temperature=0.0)
    first = [Job((1, 2, 3), 16, greedy), Job((9, 8, 7, 6), 12, greedy), Job((3, 4), 14, greedy)]
    late = Job((7, 8, 9, 1, 2), 10, greedy)
    engine = Engine(two, max_batch=4)
    assert engine.per_row

    async def main() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        handles = [engine.submit(job, loop) for job in first]
        steps = itertools.count()

        def on_step(_record: StepRecord) -> None:
            if next(steps) == 1:
                handles.append(engine.submit(late, loop))

        two.on_step = on_step
        engine.start()
        while len(handles) < 4:
            await asyncio.sleep(0.01)
        return [[t for e in [e async for e in h.events()] for t in e.token_ids] for h in handles]

    try:
        outs = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        engine.stop(0.0)
        two.on_step = None
    want = [one.generate([list(j.prompt)], max_new_tokens=j.max_tokens).token_ids[0] for j in [*first, late]]
    assert outs == want
    assert engine.row_prefills == 1  # the join; rebuilds are the start and shrinks as rows end
