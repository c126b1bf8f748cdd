"""Every registered verifier samples from the target's law (statistical exactness suite).

Each case runs :func:`flashspec_core.testing.exactness.gate` once with a fixed seed on
>= 10,000 independent trials: chi-square tests of the first token, of each position
given the accepted prefix, of the first two tokens jointly and of the number
accepted, Holm-corrected within the case at ``GATE_ALPHA = 5e-5``. Greedy cases are
checked exactly. With the 14 gate runs per verifier config below (13 cases and the
chain), Bonferroni bounds the suite's false-alarm rate per config by 14 * 5e-5 = 7e-4.
The triton verifier runs here on the CPU too (Triton's interpreter), in both noise modes.
docs/exactness.md has the design and the measured power.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Any

import pytest
import torch

from flashspec_core.contracts import SamplingParams, Verifier
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.chisq import holm
from flashspec_core.testing.exactness import GATE_ALPHA, MIN_TRIALS, Case, gate, run_chain, transition_test

pytestmark = [
    pytest.mark.stats,
    # the Triton interpreter evaluates log(0) (q = 0) with numpy, which warns; -inf is intended
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
]

DEVICE = os.environ.get("FLASHSPEC_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
SEED = 20_261_129
# A verifier slower than this per row at batch 1024 would need more than ~10 minutes for
# the suite's ~40 verify calls of up to 10,000 rows: it runs on a GPU instead. The
# triton verifier in the CPU interpreter takes ~0.15 ms (its kernels tile many rows per
# program there, see docs/kernels.md); one program per row took ~0.1 s.
MAX_SECONDS_PER_ROW = 2e-3

S = SamplingParams
CASES = [
    Case("v2_g1_t1", 2, 1, S(1.0)),
    Case("v7_g1_t0.6_topp", 7, 1, S(0.6, top_p=0.9), scale=1.0),
    Case("v16_g2_t0.6_topk", 16, 2, S(0.6, top_k=5)),
    Case("v32_g4_t1.7_topp", 32, 4, S(1.7, top_p=0.8)),
    Case("v12_g8_t1", 12, 8, S(1.0), overlap=0.9),
    Case("det_v20_g4_t1", 20, 4, S(1.0), deterministic=True, overlap=0.9, scale=3.0),
    Case("det_v50_g2_t0.6_topk_topp", 50, 2, S(0.6, top_k=10, top_p=0.9), deterministic=True, overlap=0.9),
    Case("qzeros_v24_g4_t1", 24, 4, S(1.0), q_zeros=0.3),
    Case("pinf_qzeros_v24_g4_t1.7", 24, 4, S(1.7), p_neg_inf=0.3, q_zeros=0.2),
    Case("v300_g8_t0.6_topk_topp", 300, 8, S(0.6, top_k=50, top_p=0.95), overlap=0.9),
    Case("v2048_g2_t1_topk", 2048, 2, S(1.0, top_k=1000), contexts=2),
    Case("greedy_v16_g4", 16, 4, S(0.0), overlap=0.9),
    Case("greedy_v64_g8_topk_topp", 64, 8, S(0.0, top_k=8, top_p=0.7), overlap=0.9),
]
CHAIN = Case("chain_v10_g3_t1_topp", 10, 3, S(1.0, top_p=0.9), contexts=10, overlap=0.6)
CHAIN_ROWS, CHAIN_STEPS = 1_000, 12
# Configs run besides each verifier's default one. triton's default noise is philox (drawn
# in-kernel), whose "auto" draw is the one-stage race at these small batches; "two_stage"
# forces the draw it takes at large batch and vocabulary; "exact" draws the reference's
# noise, so it also runs the reference's race.
EXTRA_CONFIGS: dict[str, list[dict[str, Any]]] = {"triton": [{"philox_draw": "two_stage"}, {"noise": "exact"}]}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``verifier`` x its configs; the ``verifier`` parameter stays the bare name, which
    tests/conftest.py filters on (FLASHSPEC_TEST_VERIFIERS)."""
    if "verifier" not in metafunc.fixturenames:
        return
    pairs = [(name, config) for name in vc.verifier_names() for config in [{}, *EXTRA_CONFIGS.get(name, [])]]
    ids = [name + "".join(f"-{k}={v}" for k, v in config.items()) for name, config in pairs]
    metafunc.parametrize(("verifier", "verifier_config"), pairs, indirect=True, ids=ids)


@functools.cache
def _seconds_per_row(name: str, config: tuple[tuple[str, Any], ...]) -> float:
    verifier = vc.load_verifier(name, DEVICE, dict(config))
    rows = 1024  # the suite's batches are large: per-call overhead is not what matters
    inputs = vc.random_inputs(rows, 2, 64, 0, S(1.0), device=DEVICE)
    inputs.run(verifier, 0)  # compile / warm up
    start = time.perf_counter()
    inputs.run(verifier, 1)
    return (time.perf_counter() - start) / rows


@pytest.fixture
def verifier_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(request.param)


@pytest.fixture
def verifier(request: pytest.FixtureRequest, verifier_config: dict[str, Any]) -> Verifier:
    v = vc.load_verifier_or_skip(request.param, DEVICE, exact=True, config=verifier_config)
    per_row = _seconds_per_row(request.param, tuple(sorted(verifier_config.items())))
    if per_row > MAX_SECONDS_PER_ROW:
        pytest.skip(f"{request.param} takes {per_row * 1e3:.1f} ms per row on {DEVICE}: run the stats suite on a GPU")
    return v


def _explain(result: object) -> str:
    return "\n".join(
        f"  {k}: p={t.pvalue:.3g} chi2={t.statistic:.1f} dof={t.dof} n={t.samples}" for k, t in result.tests.items()
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_target_law(verifier: Verifier, case: Case) -> None:
    assert case.trials >= MIN_TRIALS
    decision = gate(verifier, case, SEED, device=DEVICE)
    if case.sampling.greedy:
        assert decision.result.mismatches == 0, f"{decision.result.mismatches} rows left the argmax path"
    assert not decision.rejected, f"rejected by {decision.failing} (Holm at {GATE_ALPHA}):\n{_explain(decision.result)}"


def test_stationary_chain(verifier: Verifier) -> None:
    """Many consecutive steps on a first-order Markov target: transitions match the target's."""
    streams, models = run_chain(verifier, CHAIN, CHAIN_STEPS, CHAIN_ROWS, SEED, device=DEVICE)
    test = transition_test(streams, models.target.law(CHAIN.sampling), models.target.context)
    assert test.samples >= MIN_TRIALS
    assert not holm([test.pvalue], GATE_ALPHA)[0], f"transitions off: p={test.pvalue:.3g} dof={test.dof}"
