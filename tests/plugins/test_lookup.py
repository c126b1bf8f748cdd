"""Prompt lookup: longest recent n-gram match, deterministic, no weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import one_arm_dict, tiny_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.tree import fan_depths, fan_parents
from flashspec_lookup.lookup import LookupConfig, NgramIndex, NoDraft, PromptLookupDraft, lookup, lookup_branches


def _t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.long)


def test_copies_continuation_of_longest_most_recent_match() -> None:
    seq = _t([1, 2, 3, 9, 9, 5, 2, 3, 7, 8, 1, 2, 3])
    # suffix (1,2,3) occurs at 0 -> continuation 9 9 5; (2,3) alone would pick the later 7 8
    assert lookup(seq, 3, LookupConfig(max_ngram=3)) == [9, 9, 5]
    assert lookup(seq, 3, LookupConfig(max_ngram=2)) == [7, 8, 1]


def test_short_match_is_padded_and_no_match_repeats_last() -> None:
    assert lookup(_t([4, 5, 4]), 3, LookupConfig()) == [5, 4, 4]
    assert lookup(_t([1, 2, 3]), 2, LookupConfig()) == [3, 3]
    assert lookup(_t([7]), 2, LookupConfig()) == [7, 7]


def test_propose_batch_is_deterministic_one_hot() -> None:
    draft = PromptLookupDraft(LookupConfig())
    tokens = _t([[1, 2, 1, 2, 0], [3, 3, 3, 0, 0]][0]).reshape(1, -1).repeat(2, 1)
    tokens[1] = _t([3, 3, 3, 0, 0])
    out = draft.propose(tokens, [4, 3], 2, SamplingParams(), None)
    assert out.probs is None
    assert out.tokens.tolist() == [[1, 2], [3, 3]]


def test_none_arm_drafts_nothing() -> None:
    out = NoDraft().propose(torch.zeros(3, 4, dtype=torch.long), [1, 2, 3], 0, SamplingParams(), None)
    assert out.tokens.shape == (3, 0) and out.probs is None


def test_bad_lookup_config() -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        LookupConfig(max_ngram=1, min_ngram=2)


def test_without_fill_only_the_match_is_proposed() -> None:
    cfg = LookupConfig(min_ngram=2, fill=False)
    assert lookup(_t([4, 5, 6, 4, 5]), 3, cfg) == [6, 4, 5]
    assert lookup(_t([4, 5, 6, 7, 4, 5]), 8, cfg) == [6, 7, 4, 5]  # shorter than gamma: not padded
    assert lookup(_t([4, 5, 6, 5]), 3, cfg) == []  # only a one-token match: below min_ngram


def test_without_fill_the_batch_takes_the_widest_row() -> None:
    draft = PromptLookupDraft(LookupConfig(min_ngram=2, fill=False))
    tokens = _t([[1, 2, 3, 1, 2], [9, 8, 7, 6, 5]])
    out = draft.propose(tokens, [5, 5], 4, SamplingParams(), None)
    assert out.tokens.tolist() == [[3, 1, 2], [5, 5, 5]]  # no match: the row repeats its last token
    none = draft.propose(tokens[1:], [5], 4, SamplingParams(), None)
    assert none.tokens.shape == (1, 0)  # no row matched: a plain decoding step


@settings(max_examples=200, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=40), min_size=1, max_size=3),
    steps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 6)), min_size=1, max_size=12),
    max_ngram=st.integers(1, 4),
    min_two=st.booleans(),
    window=st.sampled_from([2, 5, 16, 4096]),
    fill=st.booleans(),
)
def test_incremental_index_proposes_what_a_full_scan_does(
    seqs: list[list[int]], steps: list[tuple[int, int]], max_ngram: int, min_two: bool, window: int, fill: bool
) -> None:
    """The provider's per-row n-gram index against lookup() on the whole sequence, as rows grow."""
    cfg = LookupConfig(max_ngram=max(max_ngram, 2 if min_two else 1), min_ngram=2 if min_two else 1, window=window,
                       fill=fill)
    width = max(len(s) for s in seqs)
    tokens = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    draft, lengths = PromptLookupDraft(cfg), [1] * len(seqs)
    for grow, gamma in steps:
        lengths = [min(n + grow, len(s)) for n, s in zip(lengths, seqs, strict=True)]
        got = draft.propose(tokens, lengths, gamma, SamplingParams(), None).tokens
        want = [lookup(tokens[b, :n], gamma, cfg) for b, n in enumerate(lengths)]
        for b, row in enumerate(want):
            assert got[b, : len(row)].tolist() == row
            assert got.shape[1] == max(len(r) for r in want)


@settings(max_examples=200, deadline=None)
@given(
    seq=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    steps=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 8)), min_size=1, max_size=10),
    branches=st.integers(2, 4),
    window=st.sampled_from([3, 8, 4096]),
    fill=st.booleans(),
)
def test_branches_from_the_index_are_those_of_a_full_scan(
    seq: list[int], steps: list[tuple[int, int]], branches: int, window: int, fill: bool
) -> None:
    cfg = LookupConfig(max_ngram=3, window=window, fill=fill, branches=branches)
    index, n = NgramIndex(cfg), 0
    for grow, gamma in steps:
        index.extend(seq[n : n + grow])
        n = len(index.seq)
        assert index.propose_branches(gamma) == lookup_branches(_t(seq[:n]), gamma, cfg)


def _index_token_by_token(seq: list[int], cuts: list[int], lo: int, hi: int) -> tuple[dict, dict]:
    """The index as a loop over each end and each n builds it, fed in ``cuts``-sized pieces."""
    latest: dict[tuple[int, ...], int] = {}
    recent: dict[tuple[int, ...], list[int]] = {}
    indexed = 0
    for grown in cuts:
        for end in range(indexed, grown - 1):
            for n in range(lo, min(hi, end + 1) + 1):
                gram = tuple(seq[end - n + 1 : end + 1])
                latest[gram] = end - n + 1
                recent.setdefault(gram, []).append(end - n + 1)
        indexed = max(indexed, grown - 1)
    return latest, recent


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(0, 3), min_size=0, max_size=60),
    grows=st.lists(st.integers(0, 9), min_size=1, max_size=12),
    ngrams=st.tuples(st.integers(1, 4), st.integers(0, 3)),
    branches=st.integers(1, 3),
)
def test_the_index_is_the_one_a_loop_over_every_end_builds(
    seq: list[int], grows: list[int], ngrams: tuple[int, int], branches: int
) -> None:
    lo, hi = ngrams[0], ngrams[0] + ngrams[1]
    index, cuts = NgramIndex(LookupConfig(min_ngram=lo, max_ngram=hi, branches=branches)), []
    for grow in grows:
        index.extend(seq[len(index.seq) : len(index.seq) + grow])
        cuts.append(len(index.seq))
    latest, recent = _index_token_by_token(seq[: len(index.seq)], cuts, lo, hi)
    assert index.latest == latest
    assert index.recent == (recent if branches > 1 else {})


def test_branches_are_recent_matches_with_distinct_first_tokens() -> None:
    seq = _t([1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2, 5, 6, 8, 1, 2])
    # (1, 2) was followed by 5 6 8, 5 6 7, 3 4 1: most recent first, 6 // 2 = 3 tokens each;
    # 5 6 7 begins as 5 6 8 does, so it opens no chain of its own
    assert lookup_branches(seq, 6, LookupConfig(branches=2)) == [[5, 6, 8], [3, 4, 1]]
    assert lookup_branches(seq, 9, LookupConfig(branches=3)) == [[5, 6, 8], [3, 4, 1]]
    # the first chain takes the nodes the others leave over: 8 = 4 + 2 + 2
    assert lookup_branches(seq, 8, LookupConfig(branches=3)) == [[5, 6, 8, 1], [3, 4]]
    assert lookup_branches(_t([4, 5, 6]), 4, LookupConfig(branches=2, fill=False)) == []
    assert lookup_branches(_t([4, 5, 6]), 4, LookupConfig(branches=2)) == [[6, 6]]


def test_a_tree_proposal_is_a_fan_of_chains_the_batch_shares() -> None:
    draft = PromptLookupDraft(LookupConfig(branches=2))
    assert draft.proposes_trees and not PromptLookupDraft(LookupConfig()).proposes_trees
    rows = [[1, 2, 3, 4, 1, 2, 5, 6, 7, 1, 2, 5, 6, 8, 1, 2], [9, 3, 9, 4, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 3, 9]]
    out = draft.propose(_t(rows), [16, 16], 6, SamplingParams(), None)
    assert out.probs is None and out.parents is not None
    # row 0: 5 6 8 | 3 4 1; row 1: (9 3 9) was followed by 4 9 9, (9) last by 3 9 (padded)
    assert out.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert out.tokens.tolist() == [[5, 6, 8, 3, 4, 1], [4, 9, 9, 3, 9, 9]]
    draft.reset()
    one = draft.propose(_t([rows[0], [9] * 15 + [3]]), [16, 16], 6, SamplingParams(), None)
    assert one.tokens.tolist()[1] == [3, 3, 3, 3, 3, 3]  # a row without a match: its last token, its parent's
    narrow = draft.propose(_t(rows), [16, 16], 4, SamplingParams(), None)
    assert narrow.parents is not None and narrow.parents.tolist() == [-1, 0, -1, 2]


def test_a_tree_of_one_branch_in_every_row_is_proposed_as_a_chain() -> None:
    draft = PromptLookupDraft(LookupConfig(branches=3))
    out = draft.propose(_t([[1, 2, 3, 1, 2]]), [5], 6, SamplingParams(), None)
    assert out.parents is None and out.tokens.tolist() == [[3, 1]]


# --- on the pipeline: a few tree shapes, the target's greedy output -------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A context-dependent V = 16 model (init 0.3), saved in float32."""
    return tiny_lm(tmp_path_factory.mktemp("lookup") / "target", vocab=16, seed=0, init=0.3, dtype=torch.float32)


def _pipeline(target: Path, arm: dict[str, Any]) -> Any:
    return build_pipeline(one_arm_dict(target, arm))


@pytest.mark.parametrize(("gamma", "branches"), [(6, 2), (12, 3), (7, 3)])
def test_a_tree_arm_proposes_few_shapes_and_the_targets_greedy_output(target: Path, gamma: int, branches: int) -> None:
    """A target that captures a CUDA graph per tree shape meets at most ``branches`` of them
    (the fan's first j chains), however long the run; the output is the target's alone."""
    alone = _pipeline(target, {"use": "none"})
    pipe = _pipeline(target, {"use": "prompt_lookup", "gamma": gamma, "branches": branches, "fill": False})
    shapes: set[tuple[int, ...]] = set()
    score, score_tree = pipe.target.score, pipe.target.score_tree

    def chain(tokens: Any, lengths: Any, ids: torch.Tensor) -> Any:
        shapes.add(tuple(range(-1, ids.shape[1] - 1)))
        return score(tokens, lengths, ids)

    def tree(tokens: Any, lengths: Any, ids: torch.Tensor, parents: torch.Tensor) -> Any:
        shapes.add(tuple(parents.tolist()))
        return score_tree(tokens, lengths, ids, parents)

    pipe.target.score, pipe.target.score_tree = chain, tree
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3, 6, 1, 2], [3, 4, 3, 5, 3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11, 7, 8]]
    accepted = 0
    for batch in ([prompts[0]], prompts, prompts[1:]):
        result = pipe.generate(batch, max_new_tokens=60)
        assert result.token_ids == alone.generate(batch, max_new_tokens=60).token_ids
        accepted += sum(n for step in result.steps for n in step.accepted)
    fans = {tuple(fan_parents(fan_depths(gamma, branches)[:j])) for j in range(1, branches + 1)}
    assert shapes <= fans | {()}  # () : a plain step (no match in any row)
    assert len(shapes - {()}) >= 2 and accepted > 20  # trees ran, and were accepted
