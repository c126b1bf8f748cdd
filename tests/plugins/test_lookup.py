"""Prompt lookup: longest recent n-gram match, deterministic, no weights."""

from __future__ import annotations

import pytest
import torch

from flashspec_core import SamplingParams
from flashspec_lookup.lookup import LookupConfig, NoDraft, PromptLookupDraft, lookup


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
