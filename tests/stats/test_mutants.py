"""The exactness gate catches planted bugs (flashspec_core.testing.mutants).

The gate is the one the stats suite runs on every verifier (Holm at GATE_ALPHA per
case); benchmarks/exactness_power.py measures its power over 100 seeds per mutant.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise, verify_random
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.exactness import GATE_ALPHA, Case, gate, run_chain, transition_test
from flashspec_core.testing.mutants import MUTANTS, POWER_CASE, MutantVerifier, mutant, verify_random_mutant

pytestmark = pytest.mark.stats

SEED = 7


@pytest.mark.parametrize("bug", sorted(MUTANTS))
def test_gate_rejects_mutant(bug: str) -> None:
    verifier, report = mutant(bug)
    decision = gate(verifier, POWER_CASE, SEED, report=report)
    assert decision.rejected, f"{bug} ({MUTANTS[bug]}) passed: {decision.result.pvalues}"


def test_gate_passes_unmutated_copy() -> None:
    decision = gate(MutantVerifier(None), POWER_CASE, SEED)
    assert not decision.rejected, decision.result.pvalues


@pytest.mark.parametrize(
    "sampling", [SamplingParams(1.0), SamplingParams(0.6, top_k=5), SamplingParams(1.7, top_p=0.8)], ids=str
)
@pytest.mark.parametrize("deterministic", [False, True])
def test_unmutated_copy_matches_reference(sampling: SamplingParams, deterministic: bool) -> None:
    """With no bug the mutant copy is token-identical to sampling.verify_random."""
    inputs = vc.random_inputs(500, 4, 33, seed=3, sampling=sampling, deterministic=deterministic)
    noise = Noise.draw(500, 4, 33, torch.Generator().manual_seed(4), "cpu")
    args = (inputs.target_logits, inputs.draft_tokens, inputs.draft_probs, sampling, noise)
    want, got = verify_random(*args), verify_random_mutant(*args, bug=None)
    assert torch.equal(want.tokens, got.tokens) and torch.equal(want.num_accepted, got.num_accepted)


@pytest.mark.parametrize("bug", ["bonus_wrong_position", "draft_probs_wrong_position"])
def test_transition_test_rejects_mutant(bug: str) -> None:
    """The stationary-chain check (what pipeline-level tests reuse) has power of its own."""
    case = Case("chain_v10_g3_t1", 10, 3, SamplingParams(1.0), contexts=10, overlap=0.6)
    streams, models = run_chain(MutantVerifier(bug), case, steps=12, rows=1_000, seed=SEED)
    test = transition_test(streams, models.target.law(case.sampling), models.target.context)
    assert test.pvalue < GATE_ALPHA, f"{bug}: transitions p={test.pvalue:.3g}"
