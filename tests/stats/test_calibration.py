"""The gate's chi-square p-values are calibrated: Uniform(0, 1) for the correct verifier.

If they were not (a wrong degrees-of-freedom count, bins merged from the data, a
dependence the tests ignore), GATE_ALPHA would not be the false-alarm rate it claims.
"""

from __future__ import annotations

import pytest

from flashspec_core.contracts import SamplingParams
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.chisq import holm, ks_uniform
from flashspec_core.testing.exactness import Case, run_case

pytestmark = pytest.mark.stats

CASE = Case("calibration_v8_g2_t1", 8, 2, SamplingParams(1.0), contexts=2)
SEEDS = range(1_000, 1_100)
KS_ALPHA = 1e-3  # Holm over the case's statistics


def test_pvalues_uniform_for_reference() -> None:
    verifier = vc.load_verifier("reference")
    runs = [run_case(verifier, CASE, seed).pvalues for seed in SEEDS]
    ks = {name: ks_uniform([r[name] for r in runs]) for name in runs[0]}
    assert not any(holm(list(ks.values()), KS_ALPHA)), f"KS p-values against Uniform(0, 1): {ks}"
