"""The Target contract, for every registered target (see flashspec_core.testing.target_contract)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from _contract_keys import VOCAB, KeysFor, keys_for, model_keys

from flashspec_core.contracts import Target
from flashspec_core.testing import target_contract as tc

TINY_KEYS: dict[str, KeysFor] = {
    "hf": lambda tiny: model_keys("hf", tiny["target"]),
    "fast": lambda tiny: model_keys("fast", tiny["target"]),
}


@pytest.fixture(params=tc.target_names())
def make(request: pytest.FixtureRequest, tiny: dict[str, Path]) -> Callable[[], Target]:
    keys = keys_for("target", request.param, TINY_KEYS, tiny)
    return lambda: tc.load_target(request.param, keys)


def test_metadata_and_text(make: Callable[[], Target]) -> None:
    target = make()
    tc.check_metadata(target)
    assert target.vocab == VOCAB and target.eos_token_ids == {VOCAB - 1}
    tc.check_encode_decode(target, "t3 t1 t4 t1 t5")


@pytest.mark.parametrize("script", [tc.Script(batch=3, seed=0), tc.Script(batch=1, seed=1, gammas=(4, 1, 0, 2))],
                         ids=["batch3", "batch1"])
def test_decode_script(make: Callable[[], Target], script: tc.Script) -> None:
    tc.check_decode_script(make, script, rtol=1e-9, atol=1e-9)


class _KeepsRejected:
    """A target whose rollback keeps every draft token (a planted bug)."""

    def __init__(self, inner: Target) -> None:
        self.inner = inner
        self._gamma = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def score(self, tokens, lengths, draft_tokens):  # type: ignore[no-untyped-def]
        self._gamma = draft_tokens.shape[1]
        return self.inner.score(tokens, lengths, draft_tokens)

    def rollback(self, num_accepted):  # type: ignore[no-untyped-def]
        self.inner.rollback([self._gamma] * len(num_accepted))


def test_the_script_catches_a_rollback_that_keeps_rejected_drafts(tiny: dict[str, Path]) -> None:
    keys = model_keys("hf", tiny["target"])
    with pytest.raises(AssertionError, match="freshly prefilled"):
        tc.check_decode_script(lambda: _KeepsRejected(tc.load_target("hf", keys)), tc.Script(), atol=1e-9, rtol=1e-9)  # type: ignore[arg-type,return-value]
