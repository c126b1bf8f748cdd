"""Tree verification samples from the target's law (statistical exactness suite for trees).

Each case runs :func:`flashspec_core.testing.tree_exactness.tree_gate` once with a fixed
seed on 10,000 independent trials of a toy second-order target (V = 4..8): the law of
the first k emitted tokens (over as many steps as it takes) against the target's
k-token law computed exactly by enumeration, and each token of the first step given the
two before it; Holm within the case at GATE_ALPHA = 5e-5. Greedy cases are checked
exactly. With 18 sampled cases, Bonferroni bounds the suite's false-alarm rate per
verifier by 18 * 5e-5 = 9e-4. Every case runs on the plain-torch reference and on the
triton verifier in both noise modes (Triton's interpreter on the CPU: ~2-9 s a case).
docs/exactness-tree.md has the proof and the design.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from _tree_verifiers import TRITON_CONFIGS, triton_tree_verify

from flashspec_core.contracts import SamplingParams
from flashspec_core.testing.chisq import holm, ks_uniform
from flashspec_core.testing.exactness import MIN_TRIALS
from flashspec_core.testing.tree_exactness import TreeCase, TreeVerifyFn, reference_verify, run_tree_case, tree_gate

pytestmark = [
    pytest.mark.stats,
    # the Triton interpreter evaluates log(0) (q = 0) with numpy, which warns; -inf is intended
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]
VERIFIERS = ["reference", *TRITON_CONFIGS]

SEED = 20_261_203
S = SamplingParams
W2_D2 = (-1, -1, 0, 0, 1, 1)
W3_D2 = (-1, -1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 2)
W2_D3 = (-1, -1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5)
# Widths 2, 3, 1 and 2 at the root, node 0, node 1 and node 2; leaves at depths 2 and 3.
RAGGED = (-1, -1, 0, 0, 0, 1, 2, 2)
CASES = [
    TreeCase("chain_v5_d3_t1", 5, (-1, 0, 1), S(1.0)),
    TreeCase("iid_w2_d2_v6_t0.8_topk4", 6, W2_D2, S(0.8, top_k=4)),
    TreeCase("iid_w3_d1_v8_peaked", 8, (-1, -1, -1), S(1.0), draft_scale=2.5),
    TreeCase("iid_w3_d2_v5_topp", 5, W3_D2, S(1.0, top_p=0.9)),
    TreeCase("iid_ragged_v6_t1.3", 6, RAGGED, S(1.3)),
    TreeCase("without_w3_d2_v5_t1", 5, W3_D2, S(1.0), mode="without"),
    TreeCase("without_w2_d3_v4_t1.3", 4, W2_D3, S(1.3), mode="without", draft_scale=2.0),
    TreeCase("without_w3_d1_v8_t0.7_topk5", 8, (-1, -1, -1), S(0.7, top_k=5), mode="without"),
    TreeCase("without_ragged_v6_t1", 6, RAGGED, S(1.0), mode="without"),
    TreeCase("det_w3_d2_v6_t1", 6, W3_D2, S(1.0), mode="deterministic", overlap=0.8),
    TreeCase("det_w2_d3_v4_t0.6_topp", 4, W2_D3, S(0.6, top_p=0.9), mode="deterministic"),
    TreeCase("mixed_w3_d2_v6_t1", 6, W3_D2, S(1.0), mode="mixed"),
    TreeCase("zeros_iid_w2_d2_v8_t1", 8, W2_D2, S(1.0), p_neg_inf=0.3, q_zeros=0.3),
    TreeCase("zeros_det_w2_d2_v6_t1", 6, W2_D2, S(1.0), mode="deterministic", p_neg_inf=0.4, overlap=0.0),
    # the model drafts' tree_children = "sample"; top_k = 2 and q zeros leave groups wider
    # than q's support (the surplus children repeat the eldest, one-hot)
    TreeCase("sample_w3_d2_v5_t1", 5, W3_D2, S(1.0), mode="sample"),
    TreeCase("sample_w2_d3_v4_t1.3_peaked", 4, W2_D3, S(1.3), mode="sample", draft_scale=2.0),
    TreeCase("sample_w3_d1_v8_t0.7_topk2", 8, (-1, -1, -1), S(0.7, top_k=2), mode="sample"),
    TreeCase("zeros_sample_ragged_v6_t1", 6, RAGGED, S(1.0), mode="sample", p_neg_inf=0.3, q_zeros=0.6),
]
GREEDY_CASES = [
    TreeCase("greedy_iid_w3_d2_v6", 6, W3_D2, S(0.0), overlap=0.8),
    TreeCase("greedy_det_w2_d3_v4_topk2", 4, W2_D3, S(0.0, top_k=2), mode="deterministic"),
]
# Calibration: the reference's p-values over seeds must look Uniform(0, 1).
CALIBRATION_CASES = [CASES[3], CASES[5]]
CALIBRATION_SEEDS = 16
CALIBRATION_ALPHA = 1e-3


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The tensors are [10,000, V <= 8]: threads only contend on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=VERIFIERS)
def verify(request: pytest.FixtureRequest) -> TreeVerifyFn:
    return reference_verify if request.param == "reference" else triton_tree_verify(request.param)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_tree_law(verify: TreeVerifyFn, case: TreeCase) -> None:
    assert case.trials >= MIN_TRIALS
    decision = tree_gate(verify, case, SEED)
    tests = decision.result.tests
    assert {f"first{k}" for k in range(1, case.tokens_tested + 1)} <= tests.keys()
    assert all(t.samples >= MIN_TRIALS for name, t in tests.items() if name.startswith("first"))
    assert not decision.rejected, f"{case.name}: {decision.failing} rejected; {decision.result.pvalues}"


@pytest.mark.parametrize("case", GREEDY_CASES, ids=lambda c: c.name)
def test_greedy_tree_is_the_argmax_path(verify: TreeVerifyFn, case: TreeCase) -> None:
    decision = tree_gate(verify, case, SEED)
    assert decision.result.mismatches == 0, f"{decision.result.mismatches} rows off the greedy path"


def test_reference_pvalues_are_calibrated() -> None:
    """A gate whose p-values were not Uniform(0, 1) under the null would not have the level it claims."""
    pvalues: dict[str, list[float]] = {}
    for case in CALIBRATION_CASES:
        for seed in range(CALIBRATION_SEEDS):
            for name, test in run_tree_case(reference_verify, case, 1_000 + seed).tests.items():
                if test.dof == 0:  # p = 1 by construction (e.g. a one-token law under top-p)
                    continue
                pvalues.setdefault(f"{case.name}/{name}", []).append(test.pvalue)
    ks = {name: ks_uniform(values) for name, values in pvalues.items()}
    assert not any(holm(list(ks.values()), CALIBRATION_ALPHA)), ks
