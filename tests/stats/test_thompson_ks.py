"""Thompson posteriors after fractional rewards match scipy's Beta (KS test)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from flashspec_selectors.selectors import DiscountedThompson, DiscountedThompsonConfig, Thompson, ThompsonConfig

pytestmark = pytest.mark.stats

HISTORY = [(0, 0.25), (1, 1.0), (0, 0.75), (2, 0.0), (0, 0.5), (1, 0.6), (1, 0.9), (0, 0.1), (2, 0.3)]
DRAWS = 20_000


def _draws(selector: Thompson | DiscountedThompson) -> np.ndarray:
    return np.stack([selector.sample_posterior() for _ in range(DRAWS)])  # [DRAWS, K]


def test_thompson_posterior_matches_beta() -> None:
    selector = Thompson(ThompsonConfig(alpha0=1.5, beta0=0.5, seed=2024), 3)
    for arm, r in HISTORY:
        selector.update(arm, r)
    draws = _draws(selector)
    for k in range(3):
        a = 1.5 + sum(r for arm, r in HISTORY if arm == k)
        b = 0.5 + sum(1 - r for arm, r in HISTORY if arm == k)
        result = stats.kstest(draws[:, k], stats.beta(a, b).cdf)
        assert result.pvalue > 1e-3, (k, a, b, result)


def test_discounted_thompson_posterior_matches_beta() -> None:
    g = 0.8
    selector = DiscountedThompson(DiscountedThompsonConfig(discount=g, seed=99), 3)
    for arm, r in HISTORY:
        selector.update(arm, r)
    draws = _draws(selector)
    n = len(HISTORY)
    for k in range(3):
        a = 1.0 + sum(g ** (n - 1 - i) * r for i, (arm, r) in enumerate(HISTORY) if arm == k)
        b = 1.0 + sum(g ** (n - 1 - i) * (1 - r) for i, (arm, r) in enumerate(HISTORY) if arm == k)
        result = stats.kstest(draws[:, k], stats.beta(a, b).cdf)
        assert result.pvalue > 1e-3, (k, a, b, result)


def test_ks_detects_a_wrong_update() -> None:
    """The test has power: Bernoulli-rounded rewards give a measurably different posterior."""
    selector = Thompson(ThompsonConfig(seed=5), 1)
    for r in [0.4] * 30:
        selector.update(0, r)
    draws = _draws(selector)[:, 0]
    wrong = stats.beta(1 + 0, 1 + 30)  # as if every 0.4 had been rounded to 0
    assert stats.kstest(draws, wrong.cdf).pvalue < 1e-6
