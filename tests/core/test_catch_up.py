"""Providers that index the prompts while the target prefills (CatchesUp)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_lm

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import CatchesUp
from flashspec_suffix.suffix import SuffixConfig, SuffixDraft

GREEDY = SamplingParams(temperature=0.0)


def _batch(*rows: list[int]) -> tuple[torch.Tensor, list[int]]:
    width = max(len(r) for r in rows) + 4
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), [len(r) for r in rows]


def test_a_suffix_draft_that_caught_up_proposes_what_one_that_did_not_proposes() -> None:
    earlier = [[1, 2, 3, 4, 5, 1, 2, 3, 6], [7, 7, 8, 9]]
    now = [[4, 1, 2, 3], [9, 7, 7]]
    drafts = [SuffixDraft(SuffixConfig(min_match=1)) for _ in range(2)]
    for draft in drafts:
        draft.propose(*_batch(*earlier), 4, GREEDY, None)
        draft.reset()
    ahead, lazy = drafts
    assert isinstance(ahead, CatchesUp)
    ahead.catch_up(*_batch(*now))
    assert [len(row.ids) for row in ahead._rows] == [len(r) for r in now]  # the prompts are in already
    got = ahead.propose(*_batch(*now), 4, GREEDY, None).tokens.tolist()
    assert got == lazy.propose(*_batch(*now), 4, GREEDY, None).tokens.tolist()
    assert got[0][0] == 6  # the corpus's newest continuation of 1 2 3: the drafts compared are not empty



def test_a_lookup_draft_that_caught_up_proposes_what_one_that_did_not_proposes() -> None:
    from flashspec_lookup.lookup import LookupConfig, PromptLookupDraft

    now = [[4, 1, 2, 3, 5, 1, 2, 3], [9, 7, 7, 8, 9, 7], [1]]
    ahead, lazy = (PromptLookupDraft(LookupConfig(min_ngram=1, fill=False)) for _ in range(2))
    assert isinstance(ahead, CatchesUp)
    ahead.catch_up(*_batch(*now))
    assert [len(row.seq) for row in ahead._rows] == [len(r) for r in now]  # the prompts are in already
    got = ahead.propose(*_batch(*now), 4, GREEDY, None).tokens.tolist()
    assert got == lazy.propose(*_batch(*now), 4, GREEDY, None).tokens.tolist()
    assert got[0][:2] == [5, 1] and got[1][:2] == [7, 8]  # what followed the longest earlier n-gram

@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("catch_up")
    tiny_lm(root / "target", vocab=16, scale=4.0)
    return root / "target"


def test_generate_hands_each_request_to_the_provider_once_after_the_prefill(
        tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = {"target": {"model": str(tiny_target), "dtype": "float32"},
              "arm": [{"use": "suffix", "gamma": 4, "min_match": 1}], "selector": {"use": "fixed"}}
    pipe = build_pipeline(config)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6]]
    lazy = pipe.generate(prompts, max_new_tokens=10, temperature=0.0)

    calls: list[tuple[list[int], int]] = []
    prefills = pipe.target.prefill
    real = SuffixDraft.catch_up

    def prefill(*args: Any) -> Any:
        calls.append(([], -1))  # marks where the prefill came
        return prefills(*args)

    def spy(self: SuffixDraft, tokens: torch.Tensor, lengths: list[int]) -> None:
        calls.append((list(lengths), int(tokens.shape[0])))
        real(self, tokens, lengths)

    monkeypatch.setattr(pipe.target, "prefill", prefill)
    monkeypatch.setattr(SuffixDraft, "catch_up", spy)
    ahead = pipe.generate(prompts, max_new_tokens=10, temperature=0.0)
    assert calls == [([], -1), ([5, 7], 2)]
    assert ahead.token_ids == lazy.token_ids


def spy_catch_up(monkeypatch: pytest.MonkeyPatch, provider: type) -> list[list[int]]:
    """The lengths of every ``catch_up`` call on ``provider``'s instances from now on (the calls
    still go through)."""
    calls: list[list[int]] = []
    real = provider.catch_up  # type: ignore[attr-defined]

    def spy(self: Any, tokens: torch.Tensor, lengths: list[int]) -> None:
        calls.append(list(lengths))
        real(self, tokens, lengths)

    monkeypatch.setattr(provider, "catch_up", spy)
    return calls


class _PlainOnly:
    """A selector that plays its second arm (plain) and says so (NarrowsArms)."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def select(self) -> int:
        return 1

    def update(self, arm: int, reward: float) -> None:
        pass

    def likely_arms(self, rows: int) -> list[int]:
        self.asked.append(rows)
        return [1]


@pytest.mark.parametrize("case", ["narrowed", "limited", "any"])
def test_only_the_providers_of_arms_that_may_play_catch_up(
        tiny_target: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A selector that says only plain decoding may play, or a batch past the batch limit,
    spares the suffix arm's indexing (up to 80 ms a batch of 32 on the H100's host); a
    selector that says nothing has every provider catch up; the tokens are the same."""
    selector: dict[str, Any] = {"use": "fixed"} | ({"speculate_max_batch": 1} if case == "limited" else {})
    config = {"target": {"model": str(tiny_target), "dtype": "float32"},
              "arm": [{"use": "suffix", "gamma": 4, "min_match": 1}, {"use": "none"}], "selector": selector}
    pipe = build_pipeline(config)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6]]
    want = pipe.generate(prompts, max_new_tokens=10, temperature=0.0).token_ids
    stub = _PlainOnly()
    if case == "narrowed":
        pipe.policy.selectors[0] = stub  # type: ignore[assignment]
    calls = spy_catch_up(monkeypatch, SuffixDraft)
    got = pipe.generate(prompts, max_new_tokens=10, temperature=0.0).token_ids
    assert calls == ([] if case in ("narrowed", "limited") else [[5, 7]])
    if case == "narrowed":  # asked at the prefill and during each step, with the live rows
        assert stub.asked and set(stub.asked) == {2}
    else:
        assert stub.asked == []
    if case != "narrowed":
        assert got == want  # (the stub plays plain: its tokens are the target's greedy ones either way)
    assert got == pipe.generate(prompts, max_new_tokens=10, temperature=0.0).token_ids


def test_a_provider_that_did_not_propose_catches_up_during_the_steps(
        tiny_target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain decoding plays every step; the lookup arm beside it is handed the sequences a step
    started from once it has sat out IDLE_CATCH_UP_TOKENS tokens a row (so its next proposal
    indexes a few steps' tokens, not all since its last play); the provider that proposed is
    not (it caught up in its proposal); the tokens are the same as without the calls."""
    from flashspec_core.policy import IDLE_CATCH_UP_TOKENS
    from flashspec_lookup.lookup import PromptLookupDraft

    config = {"target": {"model": str(tiny_target), "dtype": "float32"},
              "arm": [{"use": "none"}, {"use": "prompt_lookup", "gamma": 3, "min_ngram": 1}],
              "selector": {"use": "fixed", "arm": 0}}
    prompts = [[1, 2, 3, 1, 2], [4, 5, 4, 5, 4, 5, 6]]
    steps = 2 * IDLE_CATCH_UP_TOKENS + 4
    want = build_pipeline(config).generate(prompts, max_new_tokens=steps, temperature=0.0)

    calls = spy_catch_up(monkeypatch, PromptLookupDraft)
    pipe = build_pipeline(config)
    got = pipe.generate(prompts, max_new_tokens=steps, temperature=0.0)
    assert got.token_ids == want.token_ids and all(len(t) == steps for t in got.token_ids)
    # the prefill's call, then one each IDLE_CATCH_UP_TOKENS steps (a token a row a step)
    k = IDLE_CATCH_UP_TOKENS
    assert calls == [[5, 7], [5 + k, 7 + k], [5 + 2 * k, 7 + 2 * k]]
    lookup = pipe.policy.arms[1].provider
    assert [len(row.seq) for row in lookup._rows] == [5 + 2 * k, 7 + 2 * k]

    # the arm that proposes is not handed what it has just read
    calls.clear()
    config["selector"] = {"use": "fixed", "arm": 1}
    build_pipeline(config).generate(prompts, max_new_tokens=steps, temperature=0.0)
    assert calls == [[5, 7]]
