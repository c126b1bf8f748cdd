"""The tree exactness gate catches planted bugs (flashspec_core.testing.tree_mutants).

The gate is the one tests/stats/test_tree_stats.py runs on the reference (Holm at
GATE_ALPHA per case). A u = 0 draw has probability ~2^-24, so the strict accept test
(zero_probability_accepted) is checked on a case built to have one.

The triton kernels carry two of the verifier-side bugs as a switch
(``flashspec_kernels.verify_tree``, ``bug=``); the gate must catch them there too, and
the draft-side bugs with the triton verifier behind the same gate.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _tree_verifiers import triton_tree_verify

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise
from flashspec_core.testing.tree_exactness import (
    TreeCase,
    draw_trees,
    impossible_emissions,
    make_tree_models,
    reference_verify,
    tree_gate,
)
from flashspec_core.testing.tree_mutants import (
    POWER_CASES,
    TREE_MUTANTS,
    TreeMutant,
    tree_mutant,
    verify_tree_mutant,
    zero_uniform_inputs,
)
from flashspec_core.tree import verify_tree_random

pytestmark = [
    pytest.mark.stats,
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),  # the interpreter's log(0)
]

SEED = 7
DISTINCT_CASES = sorted({c.name: c for c in POWER_CASES.values()}.values(), key=lambda c: c.name)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The tensors are [10,000, V <= 8]: threads only contend on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_mutant_is_tested() -> None:
    assert set(POWER_CASES) | {"zero_probability_accepted"} == set(TREE_MUTANTS)


@pytest.mark.parametrize("bug", sorted(POWER_CASES))
def test_gate_rejects_mutant(bug: str) -> None:
    verify, report = tree_mutant(bug)
    decision = tree_gate(verify, POWER_CASES[bug], SEED, report=report)
    assert decision.rejected, f"{bug} ({TREE_MUTANTS[bug]}) passed: {decision.result.pvalues}"


@pytest.mark.parametrize("case", DISTINCT_CASES, ids=lambda c: c.name)
def test_gate_passes_unmutated_copy(case: TreeCase) -> None:
    decision = tree_gate(TreeMutant(None), case, SEED)
    assert not decision.rejected, decision.result.pvalues


@pytest.mark.parametrize("case", DISTINCT_CASES, ids=lambda c: c.name)
def test_unmutated_copy_matches_reference(case: TreeCase) -> None:
    """With no bug the mutant copy is token-identical to tree.verify_tree_random."""
    models = make_tree_models(case)
    gen = torch.Generator().manual_seed(3)
    drawn = draw_trees(models, case, models.starts[torch.randint(0, case.starts, (2_000,), generator=gen)], gen)
    noise = Noise.draw(2_000, drawn.draft.num_nodes, case.vocab, gen, "cpu")
    want = verify_tree_random(drawn.p, drawn.draft, noise)
    got = verify_tree_mutant(drawn.p, drawn.draft, noise, bug=None)
    assert torch.equal(want.tokens, got.tokens) and torch.equal(want.path, got.path)
    assert torch.equal(
        TreeMutant(None)(drawn.p, drawn.draft, torch.Generator().manual_seed(9), False).tokens,
        reference_verify(drawn.p, drawn.draft, torch.Generator().manual_seed(9), False).tokens,
    )


def test_zero_probability_node_accepted_when_u_is_zero() -> None:
    p, draft, noise = zero_uniform_inputs()
    assert impossible_emissions(p, verify_tree_random(p, draft, noise)) == 0
    bad = verify_tree_mutant(p, draft, noise, bug="zero_probability_accepted")
    assert impossible_emissions(p, bad) > 0, "u * q <= p accepted no zero-probability node"


# The bugs the triton kernels can switch on, and those the drafter plants (verifier unchanged).
TRITON_KERNEL_BUGS = ["sibling_residual_not_updated"]
DRAFT_SIDE_BUGS = ["with_replacement_verified_without", "deterministic_with_real_q",
                   "sampled_children_with_replacement", "sampled_children_report_group_q"]


@pytest.mark.parametrize("bug", TRITON_KERNEL_BUGS + DRAFT_SIDE_BUGS)
def test_gate_rejects_triton_mutant(bug: str) -> None:
    in_kernel = bug in TRITON_KERNEL_BUGS
    verify = triton_tree_verify("triton-exact", bug if in_kernel else None)
    _, report = tree_mutant(bug)
    decision = tree_gate(verify, POWER_CASES[bug], SEED, report=report)
    assert decision.rejected, f"triton {bug} ({TREE_MUTANTS[bug]}) passed: {decision.result.pvalues}"


@pytest.mark.parametrize("bug", [None, "zero_probability_accepted"])
def test_triton_zero_probability_node_accepted_when_u_is_zero(bug: str | None) -> None:
    """The kernel's strict accept test, and its planted ``<=``, on the u = 0 case."""
    pytest.importorskip("triton")
    from flashspec_kernels.verify_tree import verify_tree_triton

    p, draft, noise = zero_uniform_inputs()
    verdict = verify_tree_triton(p.log(), draft.tokens, draft.parents, None, SamplingParams(1.0), noise=noise,
                                 bug=bug)  # type: ignore[arg-type]  # fmt: skip
    bad = impossible_emissions(p, verdict)
    assert bad > 0 if bug else bad == 0, f"bug={bug}: {bad} zero-probability emissions"
