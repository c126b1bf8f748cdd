"""The optional capabilities (flashspec_core.contracts.CAPABILITIES) the bundled components declare.

The Protocols are runtime-checkable, so these are the isinstance checks the callers
make; a component that stopped matching (a renamed method) would silently lose its
capability there, and fails here instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _contract_keys import model_keys

from flashspec_core.contracts import (
    CapturesGraphs,
    DeclaresExactness,
    DraftContext,
    HasTokenizer,
    LimitsChainTokens,
    LimitsTreeNodes,
    NamesModel,
    NarrowsArms,
    Prewarmable,
    RequestAware,
    VerifiesWithNoise,
)
from flashspec_core.testing import draft_contract as dc
from flashspec_core.testing import selector_contract as sc
from flashspec_core.testing import target_contract as tc
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.components import component_spec


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_model_backends(backend: str, tiny: dict[str, Path]) -> None:
    target = tc.load_target(backend, model_keys(backend, tiny["target"]))
    assert isinstance(target, HasTokenizer) and target.tokenizer is not None
    assert isinstance(target, CapturesGraphs) == (backend == "fast")
    assert isinstance(target, LimitsTreeNodes) == (backend == "fast")  # hf: a dense tree mask, any size
    context = DraftContext(target=target, vocab=target.vocab, device=target.device)
    draft = dc.load_draft(backend, context, model_keys(backend, tiny["draft"]))
    assert isinstance(draft, Prewarmable) == isinstance(draft, CapturesGraphs) == (backend == "fast")
    for kind in ("target", "draft"):
        config = component_spec(kind, backend).config_cls
        assert config is not None and isinstance(config(**model_keys(backend, tiny["target"])), NamesModel)


def test_weightless_drafts_declare_nothing(tiny: dict[str, Path]) -> None:
    target = tc.load_target("hf", model_keys("hf", tiny["target"]))
    context = DraftContext(target=target, vocab=target.vocab, device=target.device)
    for name in ("prompt_lookup", "none"):
        draft = dc.load_draft(name, context)
        assert not isinstance(draft, Prewarmable | CapturesGraphs)


@pytest.mark.parametrize(("name", "with_noise", "exact"), [("reference", True, True), ("synthetic", False, False)])
def test_verifiers(name: str, with_noise: bool, exact: bool) -> None:
    verifier = vc.load_verifier(name)
    assert isinstance(verifier, VerifiesWithNoise) == with_noise
    assert isinstance(verifier, DeclaresExactness) == (not exact)
    assert vc.is_exact(verifier) == exact


def test_triton_verifies_with_noise() -> None:
    verifier = vc.load_verifier_or_skip("triton")
    assert isinstance(verifier, VerifiesWithNoise) and isinstance(verifier, LimitsTreeNodes)
    assert isinstance(verifier, LimitsChainTokens) and verifier.max_chain_tokens == 16
    assert not isinstance(vc.load_verifier("reference"), (LimitsTreeNodes, LimitsChainTokens))


def test_request_thompson_and_factored_are_the_request_aware_selectors() -> None:
    """request_thompson keeps per-request states; factored starts each request's own acceptance
    counts (request_rows) at begin_request."""
    aware = {name for name in sc.selector_names() if isinstance(sc.load_selector(name, 2), RequestAware)}
    assert aware == {"request_thompson", "factored"}


def test_factored_is_the_selector_that_narrows_its_arms() -> None:
    """The policy catches up only the providers of the arms such a selector may play."""
    narrows = {name for name in sc.selector_names() if isinstance(sc.load_selector(name, 2), NarrowsArms)}
    assert narrows == {"factored"}
