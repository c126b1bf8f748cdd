"""The DraftProvider contract, for every registered draft provider (see flashspec_core.testing.draft_contract)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from _contract_keys import SELF_DRAFT_KEYS, VOCAB, Keys, KeysFor, draft_target, keys_for, model_keys

from flashspec_core.contracts import Draft, DraftContext, DraftProvider, SamplingParams
from flashspec_core.testing import draft_contract as dc
from flashspec_core.testing import target_contract as tc

TINY_KEYS: dict[str, KeysFor] = {
    "hf": lambda tiny: model_keys("hf", tiny["draft"]),
    "fast": lambda tiny: model_keys("fast", tiny["draft"]),
    **SELF_DRAFT_KEYS,
    # The suffix arm learns from earlier requests on purpose, so its proposals differ from a fresh
    # provider's; with no corpus budget it keeps only the live rows and the script's comparison holds.
    "suffix": lambda tiny: {"max_tokens": 0},
}
# Further configs per draft: a lookup that proposes only what a match gives (often nothing).
EXTRA_KEYS: dict[str, list[Keys]] = {"prompt_lookup": [{"fill": False, "min_ngram": 2}]}
CASES = [(name, None) for name in dc.draft_names()] + [
    (name, keys) for name, extra in EXTRA_KEYS.items() if name in dc.draft_names() for keys in extra
]


def _context(backend: str, tiny: dict[str, Path]) -> DraftContext:
    target = tc.load_target(backend, model_keys(backend, tiny["target"]))
    return DraftContext(target=target, vocab=target.vocab, device=target.device)


@pytest.fixture(scope="module")
def context(tiny: dict[str, Path]) -> DraftContext:
    return _context("hf", tiny)


@pytest.fixture(scope="module")
def fast_context(tiny: dict[str, Path]) -> DraftContext:
    """For a draft that runs the fast target's own layers."""
    return _context("fast", tiny)


@pytest.fixture(params=CASES, ids=lambda case: case[0] + ("" if case[1] is None else "-" + str(case[1])))
def make(request: pytest.FixtureRequest, tiny: dict[str, Path]) -> Callable[[], DraftProvider]:
    name, extra = request.param
    keys = extra if extra is not None else keys_for("draft", name, TINY_KEYS, tiny)
    context = request.getfixturevalue("fast_context" if draft_target(name) == "fast" else "context")
    return lambda: dc.load_draft(name, context, keys)


@pytest.mark.parametrize("sampling", dc.SAMPLINGS, ids=lambda s: f"T{s.temperature}")
def test_script(make: Callable[[], DraftProvider], sampling: SamplingParams) -> None:
    dc.check_script(make, VOCAB, sampling)


@pytest.mark.parametrize("sampling", dc.SAMPLINGS, ids=lambda s: f"T{s.temperature}")
def test_repetitive_script(make: Callable[[], DraftProvider], sampling: SamplingParams) -> None:
    """Ids from 3 tokens only, so n-gram lookups match (and then often propose fewer tokens)."""
    dc.check_script(make, VOCAB, sampling, dc.Script(seed=1, gammas=(4, 1, 3)), token_range=3)


class _KeepsRejected:
    """A draft whose rollback keeps every drafted token in its cache (a planted bug)."""

    def __init__(self, inner: DraftProvider) -> None:
        self.inner = inner
        self.width = 0

    def reset(self) -> None:
        self.inner.reset()

    def propose(self, tokens, lengths, gamma, sampling, generator):  # type: ignore[no-untyped-def]
        draft = self.inner.propose(tokens, lengths, gamma, sampling, generator)
        self.width = draft.tokens.shape[1]
        return draft

    def rollback(self, num_accepted):  # type: ignore[no-untyped-def]
        self.inner.rollback([self.width] * len(num_accepted))


def test_the_script_catches_a_rollback_that_keeps_rejected_drafts(tiny: dict[str, Path], context: DraftContext) -> None:
    keys = model_keys("hf", tiny["draft"])
    with pytest.raises(AssertionError, match="a fresh provider proposes"):
        dc.check_script(lambda: _KeepsRejected(dc.load_draft("hf", context, keys)), VOCAB, dc.SAMPLINGS[0])


def test_check_proposal_catches_bad_probs_and_ranges() -> None:
    tokens = torch.tensor([[1, 2], [3, 4]])
    q = torch.full((2, 2, VOCAB), 1.0 / VOCAB)
    dc.check_proposal(Draft(tokens, q), batch=2, gamma=2, vocab=VOCAB)
    with pytest.raises(AssertionError, match="sum to"):
        dc.check_proposal(Draft(tokens, 2 * q), batch=2, gamma=2, vocab=VOCAB)
    with pytest.raises(AssertionError, match="q\\(x\\) = 0"):
        dc.check_proposal(Draft(tokens, torch.zeros_like(q).index_fill_(-1, torch.tensor([0]), 1.0)), 2, 2, VOCAB)
    with pytest.raises(AssertionError, match="outside"):
        dc.check_proposal(Draft(tokens + VOCAB, None), batch=2, gamma=2, vocab=VOCAB)
    with pytest.raises(AssertionError, match="<= gamma = 1"):
        dc.check_proposal(Draft(tokens, None), batch=2, gamma=1, vocab=VOCAB)
