"""Pearson chi-square goodness of fit with small bins merged, and Holm's correction.

Cells are grouped (one group per conditioning context, e.g. the previous token):
within a group the counts are multinomial given the group's size, so the statistic
is the sum over groups and each group contributes ``bins - 1`` degrees of freedom
(Anderson & Goodman 1957 for transition counts of a Markov chain).

Bins are merged from the *expected* counts only, never from the data, so the
chi-square approximation holds without biasing the test: every cell whose
expected count is below ``min_expected`` goes into one pooled bin per group, and
if that bin is still too small the smallest remaining cells join it. A count in a
cell whose expected count is exactly zero (an impossible token) is not merged
away: it makes the p-value 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs
import numpy as np
import torch
from scipy import stats

MIN_EXPECTED = 5.0


@attrs.frozen
class ChiSquare:
    """One goodness-of-fit test."""

    statistic: float
    dof: int
    pvalue: float
    samples: int
    impossible: int  # observations in cells of expected count 0


def _merge_group(obs: torch.Tensor, exp: torch.Tensor, min_expected: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge the bins of one group: obs, exp [K] float64 -> [K'] float64 each."""
    keep = exp >= min_expected
    rest_o, rest_e = obs[~keep].sum(), exp[~keep].sum()
    kept_o, kept_e = obs[keep], exp[keep]
    if 0 < rest_e < min_expected and kept_e.numel() > 0:
        order = torch.argsort(kept_e)
        moved = 0
        while rest_e < min_expected and moved < order.numel():
            rest_o, rest_e = rest_o + kept_o[order[moved]], rest_e + kept_e[order[moved]]
            moved += 1
        stay = order[moved:]
        kept_o, kept_e = kept_o[stay], kept_e[stay]
    if rest_e > 0:
        kept_o = torch.cat([kept_o, rest_o[None]])
        kept_e = torch.cat([kept_e, rest_e[None]])
    return kept_o, kept_e


def chisquare(
    observed: torch.Tensor,  # [G, K] counts per group and cell
    expected: torch.Tensor,  # [G, K] expected counts; each row sums to that row's observed total
    min_expected: float = MIN_EXPECTED,
    statistic: Literal["pearson", "g"] = "pearson",
) -> ChiSquare:
    """Grouped chi-square test; ``observed``/``expected`` may also be [K].

    ``statistic="g"`` is the likelihood-ratio statistic ``2 sum(O log(O/E) - (O - E))``,
    whose chi-square tail stays close to exact far out (p ~ 1e-6) where Pearson's
    ``sum((O - E)^2 / E)`` over-rejects when a bin's expected count is small.
    """
    obs = observed.double().reshape(-1, observed.shape[-1])
    exp = expected.double().reshape(-1, expected.shape[-1])
    impossible = int(obs[exp <= 0].sum().item())
    stat, dof = 0.0, 0
    for g in range(obs.shape[0]):
        if obs[g].sum() == 0:
            continue
        o, e = _merge_group(obs[g], exp[g], min_expected)
        stat += float(_g(o, e) if statistic == "g" else ((o - e) ** 2 / e).sum())
        dof += o.numel() - 1
    samples = int(obs.sum().item())
    if impossible:
        pvalue = 0.0
    elif dof == 0:
        pvalue = 1.0
    else:
        pvalue = float(stats.chi2.sf(stat, dof))
    return ChiSquare(statistic=stat, dof=dof, pvalue=pvalue, samples=samples, impossible=impossible)


def _g(o: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return 2 * (torch.xlogy(o, o / e) - (o - e)).sum()


def grouped_counts(groups: torch.Tensor, cells: torch.Tensor, num_groups: int, num_cells: int) -> torch.Tensor:
    """Count pairs: groups, cells [N] int64 -> [num_groups, num_cells] float64."""
    flat = groups.long() * num_cells + cells.long()
    return torch.bincount(flat, minlength=num_groups * num_cells).double().reshape(num_groups, num_cells)


def expected_counts(counts: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
    """Expected counts given the observed group sizes: [G, K] counts, [G, K] law -> [G, K]."""
    return counts.sum(-1, keepdim=True) * law.double()


def holm(pvalues: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down procedure: which hypotheses are rejected at family-wise level ``alpha``."""
    m = len(pvalues)
    rejected = [False] * m
    for rank, i in enumerate(np.argsort(pvalues, kind="stable")):
        if pvalues[i] > alpha / (m - rank):
            break
        rejected[int(i)] = True
    return rejected


def ks_uniform(pvalues: Sequence[float]) -> float:
    """Kolmogorov-Smirnov p-value of ``pvalues`` against Uniform(0, 1)."""
    return float(stats.kstest(np.asarray(pvalues, dtype=float), "uniform").pvalue)
