"""The tree exactness gate catches planted bugs (flashspec_core.testing.tree_mutants).

The gate is the one tests/stats/test_tree_stats.py runs on the reference (Holm at
GATE_ALPHA per case). A u = 0 draw has probability ~2^-24, so the strict accept test
(zero_probability_accepted) is checked on a case built to have one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

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

pytestmark = pytest.mark.stats

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
