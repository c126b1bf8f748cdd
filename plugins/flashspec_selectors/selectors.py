"""Arm selectors: multi-armed bandits that pick the draft arm for the next step.

Every selector keeps only what past ``update`` calls told it, so a choice never
depends on a reward that has not been observed yet. Rewards must lie in
``[0, 1]``; anything else (NaN included) is a :class:`ValueError`.

Algorithms and the papers they follow:

* ``fixed``: always the configured arm (a baseline, and a way to pin a draft).
* ``ucb1``: Auer, Cesa-Bianchi & Fischer 2002, "Finite-time analysis of the
  multiarmed bandit problem": play every arm once, then
  ``argmax_k mean_k + sqrt(c * ln t / n_k)`` with ``c = 2``.
* ``thompson``: Beta-Bernoulli Thompson sampling with fractional rewards used
  directly, ``alpha_k += r`` and ``beta_k += 1 - r``.
* ``sliding_window_ucb``: Garivier & Moulines 2011, "On upper-confidence bound
  policies for switching bandit problems": UCB over the last ``W`` plays only.
* ``discounted_thompson``: Raj & Kalyani 2017, "Taming non-stationary bandits:
  a Bayesian approach": Beta posteriors whose pseudo-counts decay by ``gamma``
  each step, so the posterior returns to the prior for arms left unplayed.
* ``glr_thompson``: Thompson sampling restarted by a Bernoulli generalised
  likelihood-ratio change detector, with forced exploration (Besson, Kaufmann,
  Maillard & Seznec 2022, "Efficient change-point detection for tackling
  piecewise-stationary bandits", GLR-klUCB with global restarts, here with a
  Thompson index as in Ghatak 2021's change-detection Thompson sampling).
* ``request_thompson``: latent-state Thompson sampling (Hong, Kveton, Zaheer,
  Chow, Ahmed & Boutilier 2020, "Latent bandits revisited", mTS) whose latent
  states are the past requests, plus a Chinese-restaurant "new kind of request"
  state. It needs the pipeline's optional ``begin_request`` hook; without it every
  step belongs to one request and it is plain Thompson sampling with a Beta(1, 1)
  -smoothed prior of weight ``kappa``.
* ``factored``: Thompson sampling on a model of the step rather than on its reward
  (the factored view of speculative decoding's speed-up in Leviathan, Kalman & Matias
  2023, "Fast inference from transformers via speculative decoding", section 3.4:
  tokens per step over cost per step), so what one batch size teaches serves every
  other. Each arm's accepted tokens per row are pooled over all steps (acceptance does
  not depend on the batch); its step time is a Bayesian linear regression on
  ``(1, rows, rows * width)``, shrunk toward a fit over all arms whose slopes are shared
  (the target's forward costs the same whichever arm drafted). It plays the
  argmax of ``rows * (E[accepted] + 1) / step time`` at the live rows, both factors
  drawn from their posteriors; in a static batch (``static_batch``) the acceptance is
  scaled to the least of the live rows' counts, since the batch ends with its slowest row.
  It needs the policy's optional ``see_rows`` and
  ``observe`` calls (:class:`~flashspec_core.contracts.ObservesSteps`); fed rewards
  alone it is plain Thompson sampling. Told the arms' widths
  (:class:`~flashspec_core.contracts.SeesWidths`) it plays plain decoding first, so
  every draft is judged against a costed baseline.

Ties go to the lowest arm index, so UCB selectors are deterministic.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

# ---------------------------------------------------------------- validators


def _is_int(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _int_at_least(low: int) -> Any:
    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if not (_is_int(value) and int(value) >= low):  # type: ignore[call-overload]
            raise ValueError(f"{attr.name} must be an integer >= {low}, got {value!r}")

    return check


def _optional_int_at_least(low: int) -> Any:
    inner = _int_at_least(low)

    def check(inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if value is not None:
            inner(inst, attr, value)

    return check


def _positive_number(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not (_is_number(value) and math.isfinite(value) and value > 0):  # type: ignore[arg-type, operator]
        raise ValueError(f"{attr.name} must be a finite number > 0, got {value!r}")


def _non_negative_number(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not (_is_number(value) and math.isfinite(value) and value >= 0):  # type: ignore[arg-type, operator]
        raise ValueError(f"{attr.name} must be a finite number >= 0, got {value!r}")


def _unit_interval_open_closed(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not (_is_number(value) and 0.0 < value <= 1.0):  # type: ignore[operator]
        raise ValueError(f"{attr.name} must be a number in (0, 1], got {value!r}")


def check_reward(reward: float) -> float:
    """Return ``reward`` as a float, or raise if it is not a number in ``[0, 1]``."""
    try:
        r = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"reward must be a number in [0, 1], got {reward!r}") from None
    if not 0.0 <= r <= 1.0:  # False for NaN as well
        raise ValueError(f"reward must be a number in [0, 1], got {reward!r}")
    return r


def _check_arm(arm: int, num_arms: int) -> int:
    if not (_is_int(arm) and 0 <= arm < num_arms):
        raise ValueError(f"arm {arm!r} out of range for {num_arms} arms")
    return int(arm)


def _check_num_arms(num_arms: int) -> int:
    if not (_is_int(num_arms) and num_arms >= 1):
        raise ValueError(f"num_arms must be an integer >= 1, got {num_arms!r}")
    return int(num_arms)


def _argmax(values: list[float]) -> int:
    """Index of the largest value; the lowest index wins a tie."""
    best, best_value = 0, values[0]
    for k in range(1, len(values)):
        if values[k] > best_value:
            best, best_value = k, values[k]
    return best


# -------------------------------------------------------- default-rule maths


def sw_default_window(horizon: int, breakpoints: int) -> int:
    """Garivier & Moulines (2011) window for rewards bounded by ``B = 1``:
    ``W = ceil(2 * sqrt(horizon * ln(horizon) / breakpoints))``."""
    return max(1, math.ceil(2.0 * math.sqrt(horizon * math.log(horizon) / breakpoints)))


def default_discount(horizon: int, breakpoints: int) -> float:
    """Garivier & Moulines' (2011) D-UCB discount for ``B = 1``:
    ``gamma = 1 - sqrt(breakpoints / horizon) / 4`` (memory ``1 / (1 - gamma)`` steps)."""
    return 1.0 - math.sqrt(breakpoints / horizon) / 4.0


def glr_default_delta(horizon: int, breakpoints: int) -> float:
    """Besson et al. (2022) false-alarm level ``delta = 1 / sqrt(breakpoints * horizon)``."""
    return 1.0 / math.sqrt(breakpoints * horizon)


def glr_default_forced(horizon: int, breakpoints: int) -> float:
    """Besson et al. (2022) forced-exploration share ``alpha = sqrt(breakpoints * ln(horizon) / horizon)``."""
    return min(1.0, math.sqrt(breakpoints * math.log(horizon) / horizon))


def glr_threshold(n: int, delta: float) -> float:
    """Besson et al.'s (2022) practical GLR threshold ``beta(n, delta) = ln(3 n^(3/2) / delta)``."""
    return math.log(3.0 * n**1.5 / delta)


def _kl_bernoulli(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1.0 - 1e-12)
    q = np.clip(q, 1e-12, 1.0 - 1e-12)
    return p * np.log(p / q) + (1.0 - p) * np.log((1.0 - p) / (1.0 - q))


def glr_change(cumsum: np.ndarray, delta: float, split_every: int = 1) -> bool:
    """Bernoulli GLR test on ``n`` rewards given by their running sums ``cumsum [n]``:
    ``max_s s kl(mu_1..s, mu) + (n - s) kl(mu_s+1..n, mu) > beta(n, delta)``,
    over splits ``s`` that are multiples of ``split_every``."""
    n = len(cumsum)
    if n < 2:
        return False
    s = np.arange(split_every, n, split_every)
    if len(s) == 0:
        return False
    total = float(cumsum[-1])
    head = cumsum[s - 1]
    stat = s * _kl_bernoulli(head / s, np.asarray(total / n)) + (n - s) * _kl_bernoulli(
        (total - head) / (n - s), np.asarray(total / n)
    )
    return bool(stat.max() > glr_threshold(n, delta))


def row_class(rows: int) -> int:
    """The class of ``rows`` live rows: 0 for one, 1 for 2-3, 2 for 4-7, ... (as
    :meth:`flashspec_core.policy.FirstGate.row_class`)."""
    return max(int(rows), 1).bit_length() - 1


def cost_features(rows: int | float, width: int | float) -> np.ndarray:
    """Regressors of a step's time: ``[1, rows, rows * width]`` (``[3] float64``): a fixed
    cost per step, a cost per row, and one per token the target scores beyond the row's
    own (a drafted token widens every row's forward)."""
    return np.array([1.0, float(rows), float(rows) * float(width)])


def shared_slopes_fit(xtx: np.ndarray, xty: np.ndarray, token_cost: float = 0.0) -> np.ndarray:
    """Least squares over every arm's steps with an intercept per arm and the slopes in
    ``rows`` and ``rows * width`` shared (the target's forward is the same whichever arm
    drafted), from each arm's sums ``X^T X [K, 3, 3]`` and ``X^T y [K, 3]`` on
    :func:`cost_features`; returns each arm's coefficients ``[K, 3]``.

    An arm without steps gets the least intercept of the others: priced at the mean, an
    unseen prompt lookup (a host-side search) would pay for the draft models' forwards
    and never be opened. The slope in ``rows * width`` leans, by a hair, toward
    ``token_cost`` times a one-row step of the cheapest arm: where no step tells it (every
    width 0 so far, or each width seen at one row count only, so the arm's own intercept
    absorbs it) it is that prior, not 0, which would price an unseen draft's width as free."""
    k = xtx.shape[0]
    a = np.zeros((k + 2, k + 2))  # unknowns: K intercepts, then the two slopes
    b = np.zeros(k + 2)
    a[np.arange(k), np.arange(k)] = xtx[:, 0, 0]
    a[:k, k:] = xtx[:, 0, 1:]
    a[k:, :k] = xtx[:, 1:, 0].T
    a[k:, k:] = xtx[:, 1:, 1:].sum(0)
    b[:k], b[k:] = xty[:, 0], xty[:, 1:].sum(0)
    played = xtx[:, 0, 0] > 0
    unplayed = np.flatnonzero(~played)
    a[unplayed, unplayed] = 1.0  # an unplayed arm's intercept is free: pin it, then fill it in below
    # A slope no step identifies stays at its prior (0 for rows) rather than failing the solve.
    hair = 1e-9 * max(float(np.trace(a)), 1e-30)
    a[np.arange(k, k + 2), np.arange(k, k + 2)] += hair
    solution = np.linalg.solve(a, b)
    if played.any() and token_cost > 0:  # the prior's scale is the first fit's cheapest one-row step
        b[k + 1] += hair * token_cost * max(float(solution[:k][played].min() + solution[k]), 0.0)
        solution = np.linalg.solve(a, b)
    intercepts = solution[:k]
    if played.any():
        intercepts[~played] = intercepts[played].min()
    return np.column_stack([intercepts, np.broadcast_to(solution[k:], (k, 2))])


def width_slope_information(xtx: np.ndarray) -> float:
    """What the steps ``X^T X [K, 3, 3]`` (on :func:`cost_features`) tell of the shared slope in
    ``rows * width`` in :func:`shared_slopes_fit`'s model: its precision over the noise variance,
    once each arm's intercept and the shared slope in ``rows`` are solved for (a Schur
    complement). 0 where no step tells it: no draft played, or each arm's drafted steps at one
    row count and width only, so the arm's own intercept absorbs their cost."""
    x = xtx[xtx[:, 0, 0] > 0]  # the played arms
    if not len(x):
        return 0.0
    m = (x[:, 1:, 1:] - x[:, 1:, :1] * x[:, :1, 1:] / x[:, :1, :1]).sum(0)  # [2, 2] intercepts solved for
    if m[0, 0] <= 1e-12 * max(abs(m[1, 1]), 1e-300):  # no arm's rows vary: the width slope stands alone
        return float(max(m[1, 1], 0.0))
    return float(max(m[1, 1] - m[1, 0] * m[0, 1] / m[0, 0], 0.0))


def request_prior_rows(between: np.ndarray, cap: float) -> np.ndarray:
    """Rows' worth of an arm's pooled acceptance in a request's own posterior (``[K] float64``),
    from sums over finished requests ``between [6, K]``: requests that played the arm, their
    rows ``N``, ``sum n_i^2``, ``sum s_i^2 / n_i``, the squares within requests and ``sum s_i``
    (``n_i`` rows accepting ``s_i`` tokens in request ``i``). Empirical Bayes for a normal
    mean per request: ``sigma^2 / tau^2``, the variance of a row within a request over that of
    a request's mean, ``tau^2`` the one-way random-effects moment estimate for unequal sizes
    (DerSimonian & Laird 1986). Clipped to ``[1, cap]``, and ``cap`` until two requests played
    the arm or where requests differ no more than their rows do (``tau^2 <= 0``)."""
    m, n, n2, s2n, within, s = between
    sigma2 = within / np.maximum(n - m, 1.0)
    q = s2n - s * s / np.maximum(n, 1.0)  # rows-weighted squares of the request means about the mean
    tau2 = (q - (m - 1.0) * sigma2) / np.maximum(n - n2 / np.maximum(n, 1.0), 1e-12)
    known = (m >= 2) & (n > m) & (tau2 > 0)
    return np.where(known, np.clip(sigma2 / np.where(known, tau2, 1.0), min(1.0, cap), cap), cap)


def chain_acceptance_prior(width: Any, rows: int = 1) -> Any:
    """The mean accepted count of a chain of ``width`` drafted tokens before any is seen:
    ``sum_{i=1..width} 1 / (i + 1)``, the expected ``sum_i alpha^i`` (Leviathan, Kalman &
    Matias 2023, section 3.1) under a uniform prior on the acceptance rate ``alpha``;
    linear between whole widths (an arm's mean width need not be one). A count spread
    evenly over ``[0, width]`` instead expects ``width / 2``, which overrates wide drafts:
    the i-th token counts only if all before it were accepted.

    With ``rows`` above 1 it is the mean of the least of ``rows`` chains drafted at the same
    rate (a static batch waits on its slowest row): the least accepts ``i`` or more with
    probability ``alpha^(i rows)``, so ``sum_{i=1..width} 1 / (i rows + 1)``."""
    w = np.asarray(width, dtype=np.float64)
    top = int(np.ceil(w.max())) if w.size else 0
    terms = 1.0 / (max(int(rows), 1) * np.arange(1, top + 1) + 1.0)  # [top]
    sums = np.concatenate([[0.0], np.cumsum(terms)])  # [top + 1]: sums[n] for width n
    return np.interp(w, np.arange(top + 1), sums)


def expected_least(counts: np.ndarray, rows: int) -> np.ndarray:
    """The mean of the least of ``rows`` accepted counts drawn independently from each arm's
    histogram ``counts[k, j]`` (rows that accepted ``j`` tokens): ``sum_{j >= 1} P(X >= j)^rows``
    (``[K] float64``; the plain mean at one row, 0 for an arm without counts)."""
    n = counts.sum(1, keepdims=True)  # [K, 1]
    at_least = 1.0 - np.cumsum(counts, 1)[:, :-1] / np.maximum(n, 1.0)  # [K, M]: P(X >= j), j = 1..M
    return (np.clip(at_least, 0.0, 1.0) ** max(int(rows), 1)).sum(1) * (n[:, 0] > 0)


def predicted_throughput(rows: int, accepted: Any, step_s: Any) -> Any:
    """Tokens per second of a step over ``rows`` rows that accepts ``accepted`` draft
    tokens per row (each row also emits the target's own token) in ``step_s`` seconds
    (floats, or arrays of one value per arm)."""
    return rows * (accepted + 1.0) / step_s


# ------------------------------------------------------------------- configs


@attrs.frozen
class FixedConfig:
    """``arm``: the arm to play on every step."""

    arm: int = attrs.field(default=0, validator=_int_at_least(0))

    def arms_problem(self, arms: int) -> tuple[str, str] | None:
        """The key and message where ``arm`` is not one of the ``arms`` the selector chooses
        between: the config check calls it, so the mistake is named before torch is imported."""
        if self.arm >= arms:
            return "arm", (f"must be below the number of arms the selector chooses between ({arms}: "
                           f"the [[arm]] tables without select = false), got {self.arm}")
        return None


@attrs.frozen
class UCB1Config:
    """``c``: exploration constant in ``sqrt(c * ln t / n)``; Auer et al. use 2."""

    c: float = attrs.field(default=2.0, validator=_positive_number)


@attrs.frozen
class ThompsonConfig:
    """``alpha0``/``beta0``: Beta prior; ``seed``: seed of the selector's own
    ``numpy.random.Generator`` (``None``: fresh OS entropy)."""

    alpha0: float = attrs.field(default=1.0, validator=_positive_number)
    beta0: float = attrs.field(default=1.0, validator=_positive_number)
    seed: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))


@attrs.frozen
class SlidingWindowUCBConfig:
    """``window``: plays remembered (``None``: the default rule
    ``ceil(2 * sqrt(horizon * ln(horizon) / breakpoints))``, 607 for the defaults);
    ``horizon``/``breakpoints``: expected run length and number of changes, used
    only by that rule; ``xi``: exploration constant (theory needs ``xi > 1/2``)."""

    window: int | None = attrs.field(default=None, validator=_optional_int_at_least(1))
    horizon: int = attrs.field(default=10_000, validator=_int_at_least(2))
    breakpoints: int = attrs.field(default=1, validator=_int_at_least(1))
    xi: float = attrs.field(default=0.6, validator=_positive_number)

    @property
    def effective_window(self) -> int:
        return self.window if self.window is not None else sw_default_window(self.horizon, self.breakpoints)


@attrs.frozen
class DiscountedThompsonConfig:
    """``discount``: per-step decay of the pseudo-counts in ``(0, 1]`` (``None``:
    ``1 - sqrt(breakpoints / horizon) / 4``, 0.9975 for the defaults); prior and
    ``seed`` as for ``thompson``."""

    discount: float | None = attrs.field(default=None, validator=_unit_interval_open_closed)
    horizon: int = attrs.field(default=10_000, validator=_int_at_least(2))
    breakpoints: int = attrs.field(default=1, validator=_int_at_least(1))
    alpha0: float = attrs.field(default=1.0, validator=_positive_number)
    beta0: float = attrs.field(default=1.0, validator=_positive_number)
    seed: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))

    @property
    def effective_discount(self) -> float:
        return self.discount if self.discount is not None else default_discount(self.horizon, self.breakpoints)


@attrs.frozen
class GLRThompsonConfig:
    """``delta``: false-alarm level of the change test (``None``: ``1 /
    sqrt(breakpoints * horizon)``, 0.01 for the defaults); ``forced``: share of steps
    that play the arms in turn (``None``: ``sqrt(breakpoints * ln(horizon) /
    horizon)``, 0.0303 for the defaults; 0 turns it off); ``horizon``/``breakpoints``
    as for ``sliding_window_ucb``; ``check_every``/``split_every``: test after every
    that many plays of an arm, over split points that many apart (Besson et al.'s
    sub-sampling); prior and ``seed`` as for ``thompson``."""

    delta: float | None = attrs.field(default=None, validator=_unit_interval_open_closed)
    forced: float | None = attrs.field(default=None)
    horizon: int = attrs.field(default=10_000, validator=_int_at_least(2))
    breakpoints: int = attrs.field(default=1, validator=_int_at_least(1))
    check_every: int = attrs.field(default=10, validator=_int_at_least(1))
    split_every: int = attrs.field(default=5, validator=_int_at_least(1))
    alpha0: float = attrs.field(default=1.0, validator=_positive_number)
    beta0: float = attrs.field(default=1.0, validator=_positive_number)
    seed: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))

    @forced.validator
    def _check_forced(self, attr: attrs.Attribute[Any], value: object) -> None:
        if value is not None and not (_is_number(value) and 0.0 <= value <= 1.0):  # type: ignore[operator]
            raise ValueError(f"{attr.name} must be a number in [0, 1], got {value!r}")

    @property
    def effective_delta(self) -> float:
        return self.delta if self.delta is not None else glr_default_delta(self.horizon, self.breakpoints)

    @property
    def effective_forced(self) -> float:
        return self.forced if self.forced is not None else glr_default_forced(self.horizon, self.breakpoints)


@attrs.frozen
class RequestThompsonConfig:
    """``alpha``: concentration of the Chinese-restaurant prior over request kinds
    (prior odds ``alpha : 1`` that a request is new rather than like one given past
    request; 1 is the customary default); ``kappa``: pseudo-observations of the
    global arm mean that shrink each past request's arm means and each profile
    blended with the current request's own rewards; ``memory``: past requests
    remembered; ``temperature``: power ``eta`` of the likelihood (1: the plain
    posterior; ``eta < 1`` tempers a misspecified one); ``initial_round``: plays of
    every arm, in arm order, at the start of each request before the posterior
    chooses (default 0, off: the round's first play falls on the request's first
    token, the hardest to draft, so whichever arm comes first is judged on it: on
    the H200, with the draft listed first, the round left the draft off on code
    requests); ``skip_first``: rewards at the start of each request left out of its
    statistics (default 1: the first decode step is the hardest to draft in every
    domain, so its reward says little about the request's kind; with 0 the selector
    played no draft on about half the code steps of the lookup-first workload, in its
    replay as on the H200); ``seed`` as for ``thompson``."""

    alpha: float = attrs.field(default=1.0, validator=_positive_number)
    kappa: float = attrs.field(default=1.0, validator=_positive_number)
    memory: int = attrs.field(default=256, validator=_int_at_least(1))
    temperature: float = attrs.field(default=1.0, validator=_positive_number)
    initial_round: int = attrs.field(default=0, validator=_int_at_least(0))
    skip_first: int = attrs.field(default=1, validator=_int_at_least(0))
    seed: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))


@attrs.frozen
class FactoredConfig:
    """``initial``: plays of every arm, in arm order, before the model chooses (a cost
    fit needs a step of each arm), counted after its warm-up; ``warmup``: each arm's first
    steps whose times are left out of the cost fit (they hold one-off work, such as a draft
    model's prefill of the prompt, not what a step of the arm costs; their accepted counts
    still count); ``prior_rows``: pseudo-rows of the acceptance prior
    (:func:`chain_acceptance_prior` accepted, its square as the spread, so a few equal
    counts never read as certain);
    ``ridge``: steps' worth of the fit over all arms (shared slopes) in each arm's own
    fit (so an arm seen at a few batch sizes borrows the slopes from the others); ``outlier``: a step
    slower than this many times its arm's predicted time is left out of the cost fit
    (a CUDA graph capture, not the arm's cost; 0: keep every step); ``static_batch``:
    rows that finish are not replaced until the whole batch is done (``generate`` and the
    bench; turn off where new requests join the running batch), so a step brings the
    batch's end closer only by what its slowest row gains, and each arm's acceptance is
    scaled by the least of the live rows' counts over their mean
    (:func:`expected_least`): rows that accept many tokens finish early and leave the
    batch waiting on a row that accepted none, each step paying for the wider forward
    (on the H200 replay, plain decoding beat every draft from batch 8 up though the
    drafts emitted more tokens per second of full-batch step); ``token_cost``: the
    prior cost of one drafted token of a row, as a share of a one-row step of the
    cheapest arm, used while no step has drafted (:func:`shared_slopes_fit`): with the
    plain arm played first, it is what keeps an unseen draft from looking free at 32
    rows; ``request_rows``: rows' worth, at most, of an arm's pooled acceptance as the prior of
    the live request's own counts, fewer where finished requests show that the arm's acceptance
    differs between requests more than between a request's rows (:func:`request_prior_rows`)
    (0: pooled only; a request is what
    :meth:`~flashspec_core.contracts.RequestAware.begin_request` starts, in a static batch the
    batch's rows together): acceptance differs more between requests than between steps of one
    request, and a pooled mean dominated by earlier domains keeps a lookup arm played on prompts
    where it matches nothing (docs/benchmarks/bandit-replay.json, ``domains``); ``refit``: how
    much an arm's observed steps grow, as a share of their count at the last refit, before the
    selector refits what it reads (every step while an arm has fewer than ``1 / refit`` steps;
    0: after every step; the :class:`Factored` docstring); ``plain_per_class``: costed steps of
    plain decoding (the first arm of width 0) the selector plays in each class of live rows (1,
    2-3, 4-7, ...) before its model prices plain there (0: only the first step, before any
    draft): the model prices plain at a row count it has not played from its few steps elsewhere
    and the slopes of the drafts, whose own forwards make their steps dearer per row (on the
    H100's serving trace it put plain at 7.0 ms at 32 rows against the 2.6 ms it took, and never
    played it there; the shipped configs set 2); ``seed`` as for ``thompson``."""

    initial: int = attrs.field(default=1, validator=_int_at_least(0))
    warmup: int = attrs.field(default=1, validator=_int_at_least(0))
    prior_rows: float = attrs.field(default=1.0, validator=_positive_number)
    ridge: float = attrs.field(default=2.0, validator=_positive_number)
    outlier: float = attrs.field(default=5.0)
    static_batch: bool = attrs.field(default=True)
    token_cost: float = attrs.field(default=0.01, validator=_non_negative_number)
    request_rows: float = attrs.field(default=0.0, validator=_non_negative_number)
    refit: float = attrs.field(default=0.25, validator=_non_negative_number)
    plain_per_class: int = attrs.field(default=0, validator=_int_at_least(0))
    seed: int | None = attrs.field(default=None, validator=_optional_int_at_least(0))

    @static_batch.validator
    def _check_static_batch(self, attr: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{attr.name} must be true or false, got {value!r}")

    @outlier.validator
    def _check_outlier(self, attr: attrs.Attribute[Any], value: object) -> None:
        if not (_is_number(value) and (value == 0 or value > 1)):  # type: ignore[operator]
            raise ValueError(f"{attr.name} must be 0 (off) or a number > 1, got {value!r}")


# ----------------------------------------------------------------- selectors


class FixedSelector:
    """Always plays one arm; updates are checked and otherwise ignored."""

    def __init__(self, config: FixedConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        if config.arm >= self.num_arms:
            raise ValueError(f"fixed selector: arm = {config.arm} is out of range for {self.num_arms} arms")
        self.arm = config.arm

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        _check_arm(arm, self.num_arms)
        check_reward(reward)


class UCB1:
    """UCB1 (Auer et al. 2002): each arm once, then ``mean + sqrt(c ln t / n)``."""

    def __init__(self, config: UCB1Config, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.c = float(config.c)
        self.counts = [0] * self.num_arms
        self.sums = [0.0] * self.num_arms
        self.t = 0

    def select(self) -> int:
        for k, n in enumerate(self.counts):
            if n == 0:
                return k
        log_t = math.log(self.t)  # t >= num_arms >= 1 here
        index = [s / n + math.sqrt(self.c * log_t / n) for s, n in zip(self.sums, self.counts, strict=True)]
        return _argmax(index)

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        self.sums[arm] += check_reward(reward)
        self.counts[arm] += 1
        self.t += 1


class Thompson:
    """Beta-Bernoulli Thompson sampling; a reward ``r`` in ``[0, 1]`` adds ``r``
    to ``alpha`` and ``1 - r`` to ``beta``, so both stay >= their prior."""

    def __init__(self, config: ThompsonConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.rng = np.random.default_rng(config.seed)
        self.alpha = np.full(self.num_arms, float(config.alpha0))  # [K] float64
        self.beta = np.full(self.num_arms, float(config.beta0))  # [K] float64

    def sample_posterior(self) -> np.ndarray:
        """One draw per arm from its Beta posterior: ``[K] float64``."""
        return self.rng.beta(self.alpha, self.beta)

    def select(self) -> int:
        return int(np.argmax(self.sample_posterior()))

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        r = check_reward(reward)
        self.alpha[arm] += r
        self.beta[arm] += 1.0 - r


class SlidingWindowUCB:
    """SW-UCB (Garivier & Moulines 2011): over the last ``W`` plays,
    ``mean_k + sqrt(xi * ln(min(t, W)) / n_k)``; an arm absent from the window is
    played first."""

    def __init__(self, config: SlidingWindowUCBConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.window = config.effective_window
        self.xi = float(config.xi)
        self.history: deque[tuple[int, float]] = deque()
        self.counts = [0] * self.num_arms  # plays of each arm inside the window
        self.sums = [0.0] * self.num_arms
        self.t = 0

    def select(self) -> int:
        for k, n in enumerate(self.counts):
            if n == 0:
                return k
        log_t = math.log(min(self.t, self.window))
        index = [
            min(1.0, max(0.0, s / n)) + math.sqrt(self.xi * log_t / n)
            for s, n in zip(self.sums, self.counts, strict=True)
        ]
        return _argmax(index)

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        r = check_reward(reward)
        self.history.append((arm, r))
        self.counts[arm] += 1
        self.sums[arm] += r
        self.t += 1
        if len(self.history) > self.window:
            old_arm, old_r = self.history.popleft()
            self.counts[old_arm] -= 1
            # Recompute instead of subtracting once an arm empties, so rounding never leaves residue.
            self.sums[old_arm] = self.sums[old_arm] - old_r if self.counts[old_arm] else 0.0


class DiscountedThompson:
    """Discounted Thompson sampling (Raj & Kalyani 2017): every step all
    pseudo-counts ``S_k, F_k`` shrink by ``gamma`` and the played arm gains
    ``r, 1 - r``; draws come from ``Beta(alpha0 + S_k, beta0 + F_k)``."""

    def __init__(self, config: DiscountedThompsonConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.discount = config.effective_discount
        self.rng = np.random.default_rng(config.seed)
        self.alpha0 = float(config.alpha0)
        self.beta0 = float(config.beta0)
        self.successes = np.zeros(self.num_arms)  # [K] float64, discounted sum of r
        self.failures = np.zeros(self.num_arms)  # [K] float64, discounted sum of 1 - r

    def sample_posterior(self) -> np.ndarray:
        """One draw per arm from its discounted Beta posterior: ``[K] float64``."""
        return self.rng.beta(self.alpha0 + self.successes, self.beta0 + self.failures)

    def select(self) -> int:
        return int(np.argmax(self.sample_posterior()))

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        r = check_reward(reward)
        self.successes *= self.discount
        self.failures *= self.discount
        self.successes[arm] += r
        self.failures[arm] += 1.0 - r


class GLRThompson:
    """Thompson sampling with change detection and global restarts.

    Between restarts it is Beta-Bernoulli Thompson sampling, except that in every
    block of ``floor(K / forced)`` steps the first ``K`` play arms ``0..K-1`` in
    turn (forced exploration, so a change on an arm that is rarely played is seen
    too). After every ``check_every``-th play of an arm since the last restart,
    the Bernoulli GLR test runs on that arm's rewards since the restart; when it
    fires, every arm's statistics are dropped (a global restart).
    """

    def __init__(self, config: GLRThompsonConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.rng = np.random.default_rng(config.seed)
        self.delta = config.effective_delta
        forced = config.effective_forced
        self.period = int(self.num_arms / forced) if forced > 0 else 0
        self.check_every, self.split_every = config.check_every, config.split_every
        self.alpha0, self.beta0 = float(config.alpha0), float(config.beta0)
        self.restarts = 0
        self._restart()

    def _restart(self) -> None:
        self.t = 0  # steps since the last restart
        self.sums: list[list[float]] = [[] for _ in range(self.num_arms)]  # running sums of each arm's rewards
        self.alpha = np.full(self.num_arms, self.alpha0)  # [K] float64
        self.beta = np.full(self.num_arms, self.beta0)  # [K] float64

    def select(self) -> int:
        if self.period and self.t % self.period < self.num_arms:
            return self.t % self.period
        return int(np.argmax(self.rng.beta(self.alpha, self.beta)))

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        r = check_reward(reward)
        self.t += 1
        self.alpha[arm] += r
        self.beta[arm] += 1.0 - r
        sums = self.sums[arm]
        sums.append((sums[-1] if sums else 0.0) + r)
        if len(sums) % self.check_every == 0 and glr_change(np.asarray(sums), self.delta, self.split_every):
            self.restarts += 1
            self._restart()


class RequestThompson:
    """Latent-state Thompson sampling over past requests (mTS of Hong et al. 2020).

    Each finished request ``j`` leaves a profile ``m_jk = (S_jk + kappa g_k) /
    (N_jk + kappa)``: its mean reward per arm, shrunk toward the global mean
    ``g_k = (sum of rewards + 1) / (plays + 2)`` so that arms it never played read
    as average. Inside a request, with rewards ``r_1..r_n`` from arms
    ``a_1..a_n`` so far (each request first plays every arm ``initial_round`` times),
    request ``j`` has Gaussian log-likelihood
    ``-eta sum_i (r_i - m_{j a_i})^2 / (2 sigma^2)``, ``sigma^2`` the pooled
    within-request reward variance (0.25, the most a reward in ``[0, 1]`` can have,
    until there is one). ``select`` draws ``j`` from the posterior (uniform prior
    over remembered requests, weight ``alpha`` for a new kind of request whose
    profile is ``g``) and plays the argmax of a draw from ``Normal((kappa m_jk +
    S_k) / (kappa + N_k), sigma^2 / (kappa + N_k))`` with this request's own sums
    ``S_k, N_k`` (a draw rather than the mean, so an arm with a few low rewards in
    this request is still retried while another arm's rewards say nothing about the
    request's kind); the new kind plays Thompson
    sampling on ``Beta(kappa g_k + S_k, kappa (1 - g_k) + F_k)``. So a request
    settles on the arm that paid off in past requests that rewarded like it, and
    within a few steps, since the first rewards already tell request kinds apart.
    """

    def __init__(self, config: RequestThompsonConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.alpha, self.kappa, self.eta = float(config.alpha), float(config.kappa), float(config.temperature)
        self.initial_round = int(config.initial_round)
        self.skip_first = int(config.skip_first)
        self.rng = np.random.default_rng(config.seed)
        self.past: deque[np.ndarray] = deque(maxlen=config.memory)  # each [3, K]: plays, sums, sums of squares
        self.totals = np.zeros((3, self.num_arms))  # [3, K] over remembered and current requests
        self._new_request()
        self._refit()

    def _new_request(self) -> None:
        self.now = np.zeros((3, self.num_arms))  # [3, K] this request: plays, sums, sums of squares
        self.skipped = 0  # rewards of this request left out so far (``skip_first``)

    def _refit(self) -> None:
        """Profiles, global mean and noise from the finished requests; the log-likelihoods restart."""
        n, s = self.totals[0], self.totals[1]
        self.global_mean = (s + 1.0) / (n + 2.0)  # [K] in (0, 1)
        if self.past:
            stack = np.stack(list(self.past))  # [J, 3, K]
            plays, sums, squares = stack[:, 0], stack[:, 1], stack[:, 2]
            self.profiles = (sums + self.kappa * self.global_mean) / (plays + self.kappa)  # [J, K]
            within = float((squares - sums**2 / np.maximum(plays, 1.0)).sum())
            dof = float(np.maximum(plays - 1.0, 0.0).sum())
            self.sigma2 = max(within / dof, 1e-4) if dof > 0 else 0.25
        else:
            self.profiles = np.zeros((0, self.num_arms))
            self.sigma2 = 0.25
        self.loglik = np.zeros(len(self.profiles) + 1)  # [J + 1]; the last entry is the new kind

    def begin_request(self, rows: int) -> None:
        """Fold the request that just ended into the memory and start a fresh one."""
        if self.now[0].sum() > 0:
            if len(self.past) == self.past.maxlen:
                self.totals -= self.past[0]
            self.past.append(self.now)
        self._new_request()
        self._refit()

    def select(self) -> int:
        plays, sums = self.now[0], self.now[1]
        if self.initial_round:  # this request's opening round: each arm its plays, in order
            short = np.flatnonzero(plays < self.initial_round)
            if short.size:
                return int(short[0])
        logw = self.loglik.copy()
        logw[-1] += math.log(self.alpha)
        w = np.exp(logw - logw.max())
        j = int(self.rng.choice(len(w), p=w / w.sum()))
        if j == len(self.profiles):
            g = self.global_mean
            draw = self.rng.beta(self.kappa * g + sums, self.kappa * (1.0 - g) + plays - sums)
            return int(np.argmax(draw))
        # A draw, not the mean: an arm whose few plays in this request came out low (the
        # first token of an answer is the hardest to draft) keeps a chance to be retried
        # while the other arm teaches nothing about the request.
        estimate = (self.kappa * self.profiles[j] + sums) / (self.kappa + plays)
        return int(np.argmax(self.rng.normal(estimate, np.sqrt(self.sigma2 / (self.kappa + plays)))))

    def update(self, arm: int, reward: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        r = check_reward(reward)
        if self.skipped < self.skip_first:
            self.skipped += 1
            return
        step = np.zeros((3, self.num_arms))
        step[:, arm] = (1.0, r, r * r)
        self.now += step
        self.totals += step
        means = np.append(self.profiles[:, arm], self.global_mean[arm])  # [J + 1]
        self.loglik -= self.eta * (r - means) ** 2 / (2.0 * self.sigma2)


@attrs.frozen(eq=False)
class _View:
    """What :meth:`Factored.select` reads at one live-row count (each ``[K] float64``; ``opens``
    and ``costed`` ``[K]`` bool, ``priced`` one bool)."""

    step_mean: np.ndarray  # predicted step seconds, posterior mean
    spread: np.ndarray  # the predicted step seconds' standard deviation
    acc_mean: np.ndarray  # accepted tokens per row, posterior mean
    acc_var: np.ndarray  # its spread over rows (the draw's scale is sqrt(acc_var / df))
    df: np.ndarray  # the draw's degrees of freedom
    width: np.ndarray  # mean drafted tokens per row: a draw's ceiling
    least: np.ndarray  # accepted per row -> the least live row's (static batch; else 1)
    opens: np.ndarray  # whether an arm without steps may open here (Factored._openings)
    gate: np.ndarray  # an arm the gate prices: its prior value (tokens/s) to beat; else nan
    costed: np.ndarray  # bool: the arms whose values the gate compares with
    priced: bool  # the gate prices some arm (a per-request gate has something to decide)


class Factored:
    """Thompson sampling on tokens per second predicted from acceptance and step cost.

    State per arm ``k``: accepted tokens per row (count, sum, sum of squares over rows),
    the mean width it proposed, and the sums ``X^T X``, ``X^T y``, ``y^T y`` of its
    steps' times on :func:`cost_features`. ``select`` draws for each arm an acceptance
    ``a_k ~ posterior mean + sqrt(variance / (rows seen + prior_rows)) t_nu``, ``t_nu`` a
    Student-t draw with ``nu = rows seen + prior_rows`` degrees of freedom (mean and
    variance both carry ``prior_rows`` rows at :func:`chain_acceptance_prior`) clipped to
    ``[0, width_k]`` and cost coefficients ``beta_k ~ Normal(mean_k, sigma^2
    precision_k^-1)``, whose prior is the fit over all arms with the arm's own intercept
    and slopes shared by every arm (:func:`shared_slopes_fit`), worth ``ridge`` steps (so
    the slopes carry over to batch sizes the arm has not played at), and plays ``argmax_k rows (a_k + 1) / (x(rows, width_k) .
    beta_k)``. An arm that never drafts (``none``) has width 0 and ``a_k = 0`` exactly.
    With ``static_batch`` the draw ``a_k`` is scaled by :func:`expected_least` at the live
    rows over its value at one row, from a histogram of the arm's accepted counts per row.
    Each arm's first ``warmup`` steps count toward its acceptance but not its cost: the
    first step of a draft model pays for its prefill of the prompt, and one step priced
    at that would rule the arm out for the rest of a short request. The opening is cost-aware
    (:meth:`_openings`): an arm not yet seen is opened only where the prior's value of a
    chain at the live rows, at the cost the fit over the other arms predicts, beats the best
    costed arm, so a static batch of 32 rows does not pay several plain steps per arm to learn
    what the least row's prior already says; the arm opens once rows finish and it may pay.
    Told each arm's width (:meth:`see_widths`), it plays the first arm of width 0 (plain
    decoding) until that arm has a costed step, so the gate has a baseline before any draft
    is tried, and it prices an unseen arm at widths up to that arm's own; with
    ``plain_per_class`` it also plays plain decoding in each class of live rows (1, 2-3, 4-7,
    ...) until plain has that many costed steps there (:meth:`_plain_here`), so plain is
    priced at many rows by its own steps, not by the drafts' per-row slope.
    Told each arm's drafting cost (:meth:`see_costs`), the opening gate prices an unseen arm
    with it, so an arm whose cost already rules it out is not opened to find that out.
    Until the first :meth:`observe` it is Beta-Bernoulli Thompson sampling on rewards.

    Refits on a schedule (``refit``): what ``select`` reads at a live-row count (each arm's
    predicted step time and its spread, the acceptance posterior's mean, scale and degrees
    of freedom, the static-batch scale, the opening gate) is computed once from the state at
    the last refit (:meth:`_view`), and the state is refit when an arm's observed steps reach
    ``1 + refit`` times their count at the last refit (every step while an arm has fewer than
    ``1 / refit``), or an arm's first step is costed: O(log steps) refits per arm, as
    rarely-switching OFUL (Abbasi-Yadkori, Pal & Szepesvari 2011) refits when its design grows
    by a constant factor. A step then costs two draws and a few vector operations, and none
    where one arm is played and every other is held back by the gate. ``refit = 0`` refits
    after every step. :meth:`cost_coefficients` always answers from every step observed.
    """

    def __init__(self, config: FactoredConfig, num_arms: int) -> None:
        self.num_arms = _check_num_arms(num_arms)
        self.initial, self.warmup = int(config.initial), int(config.warmup)
        self.prior_rows = float(config.prior_rows)
        self.ridge, self.outlier = float(config.ridge), float(config.outlier)
        self.static_batch = self._static = bool(config.static_batch)
        self.token_cost = float(config.token_cost)
        self.request_rows = float(config.request_rows)
        self.request = np.zeros((3, self.num_arms))  # [3, K] as acc, over the current request's steps
        self.by_row = np.zeros((3, 1, self.num_arms))  # [3, B, K] as acc, per row of the request (see_row_ids)
        # [6, K] over finished requests that played each arm (request_prior_rows): requests, rows,
        # sum of rows^2, sum of (accepted sum)^2 / rows, squares within requests, accepted sum
        self.between = np.zeros((6, self.num_arms))
        self.request_weight = np.full(self.num_arms, self.request_rows)  # [K] request_prior_rows of them
        self.ids: tuple[int, ...] | None = None  # the rows of the step to choose for or observe; None: not told
        self.refit = float(config.refit)
        self.gammas: np.ndarray | None = None  # [K] each arm's widest proposal (see_widths); None: not told
        self._plain: int | None = None  # the first arm of width 0 (see_widths)
        self.costs = np.zeros(self.num_arms)  # [K] each arm's drafting cost per token and row, target forwards (see_costs)
        self.rng = np.random.default_rng(config.seed)
        self.rows = 1  # live rows of the step to choose for
        self.steps = np.zeros(self.num_arms)  # [K] steps observed (outliers included)
        self.acc = np.zeros((3, self.num_arms))  # [3, K] rows, sum, sum of squares of accepted per row
        self.width = np.zeros(self.num_arms)  # [K] sum of widths over observed steps
        self.counts = np.zeros((self.num_arms, 1))  # [K, M + 1] rows that accepted 0..M tokens
        # Cost fit sums weighted by 1 / time^2: a step's noise grows with its time (a batch of
        # 32 varies by milliseconds, a batch of 1 by tens of microseconds), so errors are relative.
        self.xtx = np.zeros((self.num_arms, 3, 3))  # [K, 3, 3] sum of w x x^T
        self.xty = np.zeros((self.num_arms, 3))  # [K, 3] sum of w x y (y in seconds)
        self.yty = np.zeros(self.num_arms)  # [K] sum of w y^2 (= steps fitted)
        self.fastest = math.inf  # the fastest step seen: no prediction goes far below it
        self.fitted = np.zeros(self.num_arms)  # [K] steps in the cost fit
        self._fitted = 0  # their sum
        self.skipped = [False] * self.num_arms  # whether each arm's last step was left out as an outlier
        # Opening plays chosen but not observed yet: under draw-ahead the next step is chosen
        # before this one is observed, and without these an opening play would be repeated.
        # A draw the policy drops (at a request's end) stays counted: one opening play fewer.
        self.outstanding = np.zeros(self.num_arms)  # [K]
        self._cache: tuple[np.ndarray, np.ndarray] | None = None  # the cost posterior of every step (_posterior)
        self._noise = 0.05**2  # its relative noise variance (sigma^2 of _posterior)
        self._fit: tuple[np.ndarray, np.ndarray] | None = None  # the cost posterior at the last refit
        self._views: dict[tuple[int, bool], _View] = {}  # (rows, static batch) -> what select reads there
        self._stale = True  # a refit is due before the next view
        self._due = np.ones(self.num_arms)  # [K] observed steps at which each arm calls for a refit
        self.refits = 0  # refits so far
        # plain decoding per class of live rows (row_class): costed steps, and plays drawn
        # and not yet observed (or dropped), each capped so that a class's plays end (_plain_here)
        self.plain_per_class = int(config.plain_per_class)
        self.plain_costed: dict[int, int] = {}
        self.plain_drawn: dict[int, int] = {}
        self.beta = Thompson(ThompsonConfig(), self.num_arms)  # rewards-only fallback
        self.beta.rng = self.rng

    def rows_refilled(self, refilled: bool) -> None:
        """Where finished rows are replaced (a server) the mean row is the score, not the
        least-accepting one (:class:`~flashspec_core.contracts.SeesRefills`)."""
        self.static_batch = self._static and not refilled

    def see_rows(self, rows: int) -> None:
        self.rows = max(1, int(rows))

    def begin_request(self, rows: int) -> None:
        """A new request (:class:`~flashspec_core.contracts.RequestAware`): its own acceptance
        counts start empty, and the one before it, finished, joins the spread between requests."""
        n, s, ss = self.request
        if n.any():
            per = np.maximum(n, 1.0)  # [K] rows, at least 1 where an arm was not played
            self.between += np.stack([n > 0, n, n * n, s * s / per, np.maximum(ss - s * s / per, 0.0), s])
            self.request_weight = request_prior_rows(self.between, self.request_rows)
        self.request[:] = 0.0
        self.by_row = np.zeros((3, max(int(rows), 1), self.num_arms))
        self.ids = None

    def see_row_ids(self, rows: Sequence[int]) -> None:
        """Which of the request's rows the next choice or observation concerns
        (:class:`~flashspec_core.contracts.SeesRowIds`)."""
        ids = tuple(int(r) for r in rows)
        if ids and (min(ids) < 0 or list(ids) != sorted(set(ids))):
            raise ValueError(f"row ids must be distinct integers >= 0 in ascending order, got {list(rows)!r}")
        if ids and ids[-1] >= self.by_row.shape[1]:
            self.by_row = np.pad(self.by_row, ((0, 0), (0, ids[-1] + 1 - self.by_row.shape[1]), (0, 0)))
        self.ids = ids or None

    def _own(self) -> np.ndarray:
        """The live request's own counts ``[3, K]`` (rows, sum, sum of squares of accepted per row):
        in a static batch told its rows, those of the live rows only, since the rows that accept
        most finish first and the request's counts then overrate the rows still decoding."""
        if self.static_batch and self.ids is not None and len(self.ids) == self.rows:
            return self.by_row[:, list(self.ids), :].sum(1)
        return self.request

    def see_widths(self, widths: Sequence[int]) -> None:
        """Each arm's most tokens proposed per row, 0 for an arm that never drafts
        (:class:`~flashspec_core.contracts.SeesWidths`)."""
        values = [int(w) for w in widths]
        if len(values) != self.num_arms or any(w < 0 for w in values):
            raise ValueError(f"widths must be {self.num_arms} integers >= 0, one per arm, got {list(widths)!r}")
        if self.gammas is not None and self.gammas.tolist() == values:
            return  # told again at every request: keep the views
        self.gammas = np.asarray(values, dtype=np.float64)
        self._plain = values.index(0) if 0 in values else None
        self._views = {}

    def see_costs(self, costs: Sequence[float]) -> None:
        """Each arm's prior cost of drafting one token of one row, as a share of a target forward
        (:class:`~flashspec_core.contracts.SeesCosts`): the opening gate adds it to an unseen arm's
        width slope (:meth:`_openings`)."""
        values = [float(c) for c in costs]
        if len(values) != self.num_arms or not all(math.isfinite(c) and c >= 0 for c in values):
            raise ValueError(f"costs must be {self.num_arms} finite numbers >= 0, one per arm, got {list(costs)!r}")
        if self.costs.tolist() == values:
            return  # told again at every request: keep the views
        self.costs = np.asarray(values, dtype=np.float64)
        self._views = {}

    def _plain_first(self, opening: int) -> int | None:
        """The plain arm (the first of width 0) while it has no costed step: a cost gate with
        no baseline opens every arm blind, and at 32 rows each draft's opening costs several
        plain steps. At most ``opening`` plays and one more, drawn ahead of the observation
        that costs it; ``None`` once it is costed, or where no arm is known to be plain."""
        plain = self._plain
        if plain is None or self.fitted[plain] > 0 or self.steps[plain] + self.outstanding[plain] > opening:
            return None
        return plain

    def _plain_here(self) -> int | None:
        """The live rows' class (:func:`row_class`) while plain decoding has fewer than
        ``plain_per_class`` costed steps there (:class:`FactoredConfig`); at most twice that many
        plays drawn there, so outliers left out of the fit do not hold the class on plain.
        ``None`` otherwise, and where no arm is known to be plain."""
        if self._plain is None or self.plain_per_class == 0:
            return None
        c = row_class(self.rows)
        if self.plain_costed.get(c, 0) >= self.plain_per_class or self.plain_drawn.get(c, 0) >= 2 * self.plain_per_class:
            return None
        return c

    def _posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Each arm's cost coefficients: posterior means ``[K, 3]`` and covariances ``[K, 3, 3]``
        (seconds), their prior the fit over all arms (:func:`shared_slopes_fit`) worth
        ``ridge`` steps of the mean design. Cached until the next costed :meth:`observe`."""
        if self._cache is None:
            n = max(float(self.fitted.sum()), 1.0)
            xtx = self.xtx.sum(0)
            design = xtx / n + 1e-9 * max(float(np.trace(xtx)) / n, 1e-30) * np.eye(3)
            prior = shared_slopes_fit(self.xtx, self.xty, self.token_cost)  # [K, 3]
            fit = np.einsum("ki,kij,kj->k", prior, self.xtx, prior)
            resid = np.maximum(self.yty - 2.0 * np.einsum("ki,ki->k", prior, self.xty) + fit, 0.0)
            # relative noise, at least 5%, so an exact fit on few steps keeps some doubt
            sigma2 = max(float(resid.sum()) / max(n - self.num_arms - 2.0, 1.0), 0.05**2)
            precision = self.ridge * design + self.xtx  # [K, 3, 3]
            rhs = self.ridge * prior @ design.T + self.xty  # [K, 3]
            mean = np.linalg.solve(precision, rhs[..., None])[..., 0]
            self._cache = mean, sigma2 * np.linalg.inv(precision)
            self._noise = sigma2
        return self._cache

    def cost_coefficients(self, arm: int) -> np.ndarray:
        """Posterior mean of ``arm``'s step time in seconds on :func:`cost_features` (``[3]``),
        from every step observed (not only those of the last refit)."""
        return self._posterior()[0][_check_arm(arm, self.num_arms)]

    def _refit(self) -> tuple[np.ndarray, np.ndarray]:
        """The cost posterior select reads, refit where a refit is due (class docstring)."""
        if self._stale or self._fit is None:
            self._fit, self._views, self._stale = self._posterior(), {}, False
            self._due = np.maximum(self.steps + 1.0, np.ceil(self.steps * (1.0 + self.refit)))
            self.refits += 1
        return self._fit

    def _view(self) -> _View:
        """What select reads at the live rows, from the state at the last refit."""
        mean, cov = self._refit()
        key = (self.rows, self.static_batch)
        view = self._views.get(key)
        if view is not None:
            return view
        rows = float(self.rows)
        x = self._features()  # [K, 3]
        width = x[:, 2] / rows  # [K] mean drafted tokens per row
        n, s, ss = self.acc
        prior = chain_acceptance_prior(width)
        # The prior's rows carry the widest spread too, so a few equal counts never read as certain.
        squares = np.maximum(ss - s * s / np.maximum(n, 1.0), 0.0)
        var = (squares + self.prior_rows * prior * prior) / (n + self.prior_rows)
        least = self._least_scale()
        step_mean = np.einsum("ki,ki->k", x, mean)
        view = self._views[key] = _View(
            step_mean=step_mean,
            spread=np.sqrt(np.maximum(np.einsum("ki,kij,kj->k", x, cov, x), 0.0)),
            acc_mean=(s + self.prior_rows * prior) / (n + self.prior_rows),
            acc_var=var,
            df=n + self.prior_rows,
            width=width,
            least=least,
            **self._openings(x, mean, step_mean, least),
        )
        return view

    def select(self) -> int:
        opening = self.warmup + max(self.initial, 1)
        plain = self._plain_first(opening)
        if plain is not None:
            self.outstanding[plain] += 1
            return plain
        c = self._plain_here() if self.fitted.any() else None
        if c is not None and self._plain is not None:
            self.plain_drawn[c] = self.plain_drawn.get(c, 0) + 1
            self.outstanding[self._plain] += 1
            return self._plain
        if not self.steps.any():
            first = self.beta.select()
            # capped: fed rewards alone for a while, no arm may look opened before it was observed
            self.outstanding[first] = min(self.outstanding[first] + 1, opening - 1)
            return first
        view = self._view()
        opens, drawn = view.opens, None
        if self.request_rows > 0 and self.rows == 1 and view.priced:
            drawn = self._acceptance(view)
            opens = self._gated(view, drawn[0])
        steps = self.steps.tolist()
        for k, (n, out) in enumerate(zip(steps, self.outstanding.tolist(), strict=True)):
            if n + out < opening and (n > 0 or opens[k]):  # an opening play, where it may pay
                self.outstanding[k] += 1
                return k
        played = [k for k, n in enumerate(steps) if n > 0]
        if len(played) == 1:  # every other arm is held back by the gate: the draw cannot pick them
            return played[0]
        # Student-t, not normal: the spread is itself estimated, and a few unlucky equal counts
        # read as a tight normal would keep a good arm unplayed for the rest of the run.
        step_s = view.step_mean + view.spread * self.rng.standard_normal(self.num_arms)
        step_s = np.maximum(step_s, self._step_floor())
        mean, var, rows = drawn or self._acceptance(view)
        accepted = np.clip(mean + np.sqrt(var / rows) * self.rng.standard_t(rows), 0.0, view.width)
        scores = predicted_throughput(self.rows, accepted * view.least, step_s)
        # An arm with no step observed (the gate kept it from opening) has no width or acceptance
        # yet: scored here it would read as plain decoding at another cost and win a lucky draw.
        return _argmax(np.where(self.steps > 0, scores, -np.inf).tolist())

    def _acceptance(self, view: _View) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The acceptance posterior :meth:`select` draws from (``[K]`` mean, spread over rows,
        degrees of freedom): the view's pooled one, and with ``request_rows`` this request's own
        counts over it (current: they change every step, where the view changes at a refit)."""
        mean, var, rows = view.acc_mean, view.acc_var, view.df
        if self.request_rows > 0:
            # The pooled posterior is the prior of this request's own counts, worth at most
            # request_rows rows, fewer where finished requests differ (request_prior_rows): an
            # arm that matches nothing in this request is priced by that after a try or two.
            rn, rs, rss = self._own()
            weight = np.minimum(self.request_weight, rows)
            spread = np.maximum(rss - rs * rs / np.maximum(rn, 1.0), 0.0)
            mean = (rs + weight * mean) / (rn + weight)
            var = (spread + weight * var) / (rn + weight)
            rows = rn + weight
        return mean, var, rows

    def likely_arms(self, rows: int) -> list[int]:
        """The arms :meth:`select` may play over ``rows`` live rows as the state stands
        (:class:`~flashspec_core.contracts.NarrowsArms`): every arm until each arm of width 0
        that leads (:meth:`_plain_first`) has a costed step and some arm was observed; then
        the arms already played and those whose opening may start at ``rows``
        (:meth:`_openings`). Reads the last refit's view, draws nothing."""
        if self.gammas is None or (self._plain is not None and self.fitted[self._plain] == 0) or not self.steps.any():
            return list(range(self.num_arms))
        kept = self.rows
        self.rows = max(1, int(rows))
        try:
            opens = self._view().opens
        finally:
            self.rows = kept
        return [k for k in range(self.num_arms) if self.steps[k] > 0 or opens[k]]

    def _features(self) -> np.ndarray:
        """Each arm's :func:`cost_features` at the live rows and its mean width (``[K, 3]``; width 0
        for an arm whose first play is in flight)."""
        width = self.width / np.maximum(self.steps, 1)  # [K]
        return np.stack([np.ones(self.num_arms), np.full(self.num_arms, float(self.rows)), self.rows * width], 1)

    def _least_scale(self) -> np.ndarray:
        """Each arm's factor ``[K]`` from accepted tokens per row to, in a static batch, the least
        of the live rows' (1 elsewhere, and for an arm without counts)."""
        if not (self.static_batch and self.rows > 1):
            return np.ones(self.num_arms)
        one = expected_least(self.counts, 1)
        return np.where(one > 0, expected_least(self.counts, self.rows) / np.maximum(one, 1e-12), 1.0)

    def _openings(self, x: np.ndarray, mean: np.ndarray, step_mean: np.ndarray,
                  least: np.ndarray) -> dict[str, Any]:
        """Whether each arm's opening may start at the live rows (``[K]`` bool). Once a step is
        costed and the arm's width is known (:meth:`see_widths`) or a draft seen, an arm with
        no step observed (an opening play drawn ahead and dropped at a request's end does not
        count) opens only if its prior value can beat the best costed arm's value (both at
        posterior means): the most, over whole widths up to the arm's own (untold: the widest
        mean width seen), of the tokens per second of a chain with a uniform prior on its
        acceptance rate (in a static batch the least of the live rows' chains,
        :func:`chain_acceptance_prior`) at the arm's prior cost (the fit over every arm,
        :meth:`_posterior`: the least intercept of the played arms, and ``token_cost`` per
        drafted token until a draft is costed; plus the arm's own drafting cost where told,
        :meth:`see_costs`). At 32 rows the least row of a chain expects a
        few hundredths of a token, and an opening play there costs several plain steps; as
        rows finish the live rows fall and a held-back arm opens where it may pay.

        Returns the view's ``opens``, and for :meth:`select` with ``request_rows`` the priced
        arms' prior values (``gate``, nan elsewhere) and the ``costed`` arms: at one live row the
        best costed arm is valued at this request's own acceptance, as its draw is (:meth:`_gated`)."""
        opens = np.ones(self.num_arms, dtype=bool)
        costed = self.fitted > 0
        gate = np.full(self.num_arms, np.nan)
        out: dict[str, Any] = {"opens": opens, "gate": gate, "costed": costed, "priced": False}
        if not costed.any():
            return out
        if self.gammas is not None:  # the arms' own widths, costed before any draft is seen
            tops = self.gammas
        elif self.width.any():
            tops = np.full(self.num_arms, float(math.ceil(float((self.width / np.maximum(self.steps, 1)).max()))))
        else:
            return out
        closed = (self.steps == 0) & (tops >= 1)  # [K] the arms the gate prices (another plain arm opens)
        if not closed.any():
            return out
        rows = float(self.rows)
        n, s, _ = self.acc
        accepted = (s + self.prior_rows * chain_acceptance_prior(x[:, 2] / rows)) / (n + self.prior_rows)
        floor = self._step_floor()
        widths = np.arange(1.0, float(tops[closed].max()) + 1.0)  # [W]
        wx = np.stack([np.ones_like(widths), np.full_like(widths, rows), rows * widths], 1)  # [W, 3]
        prior = chain_acceptance_prior(widths, self.rows if self.static_batch else 1)  # [W]
        # Optimism about acceptance, none about cost: a drafted token costs an unseen arm at least
        # token_cost of the fastest step seen while no step tells the width slope. Fitted on steps
        # at one batch size (or on plain steps only) it can come out 0 or below, and every unseen
        # arm would open at 32 rows.
        # Where the steps pin the slope down to within the floor (its standard error below it),
        # the fit is the better price: a floor above the measured slope holds back wide drafts that
        # pay (docs/benchmarks/bandit-replay.json, batch 8).
        mean = mean.copy()
        least_cost = self.token_cost * self.fastest
        information = width_slope_information(self.xtx)
        if information <= 0 or self._noise > information * least_cost * least_cost:
            mean[:, 2] = np.maximum(mean[:, 2], least_cost)
        # An arm's own drafting cost (see_costs: the target's first layers, a draft model) comes on
        # top of the slope the target's wider forward pays: the shared fit cannot know it before
        # the arm plays, and an arm that drafts on 8 of the target's 28 layers priced like a
        # lookup opened at every batch size and cost its opening plays (docs/bandits.md).
        mean[:, 2] += self.costs * self.fastest
        value = predicted_throughput(self.rows, prior, np.maximum(mean @ wx.T, floor))  # [K, W]
        value = np.where(widths <= tops[:, None], value, -np.inf).max(1)  # [K] each arm's best width
        opens[closed] = value[closed] > self._best_costed(accepted, least, step_mean, costed)
        gate[closed] = value[closed]
        out["priced"] = True
        return out

    def _gated(self, view: _View, mean: np.ndarray) -> np.ndarray:
        """``view.opens`` with the best costed arm valued at acceptance ``mean`` (``[K]``, this
        request's own counts over the pooled posterior, as :meth:`select` draws from): an arm
        the gate held back opens in a request where the arms played so far match little, though
        they pay on the requests the pooled counts come from (a suffix arm on copied code, say,
        priced in a request of new code). :meth:`select` asks it at one live row only: there the
        request's counts are the sequence being decoded, while over several rows they mix rows and
        an opening play costs a step over all of them (asked at every row count, it opened the 0.5B
        draft where it lost: ``benchmarks/bandit_replay.py`` over the recorded H200 steps gave 1.22x
        target-only at batch 4 in the run's order, against 1.24x with the pooled gate there)."""
        if not view.priced:
            return view.opens
        priced = ~np.isnan(view.gate)
        opens = view.opens.copy()
        opens[priced] = view.gate[priced] > self._best_costed(mean, view.least, view.step_mean, view.costed)
        return opens

    def _step_floor(self) -> float:
        """The least step time a prediction takes: half the fastest step seen (no step is near-free)."""
        return max(0.5 * self.fastest, 1e-9)

    def _best_costed(self, accepted: np.ndarray, least: np.ndarray, step_mean: np.ndarray,
                     costed: np.ndarray) -> float:
        """The opening gate's bar: the best expected tokens per second of the ``costed`` arms at
        acceptance ``accepted`` (``[K]``, scaled by ``least``) and predicted step time ``step_mean``."""
        known = predicted_throughput(self.rows, accepted * least, np.maximum(step_mean, self._step_floor()))
        return float(known[costed].max())

    def observe(self, arm: int, rows: int, width: int, accepted: Sequence[int], step_s: float) -> None:
        arm = _check_arm(arm, self.num_arms)
        if not (math.isfinite(step_s) and step_s > 0):
            raise ValueError(f"step_s must be a finite number > 0, got {step_s!r}")
        counts = [int(a) for a in accepted]
        x = cost_features(rows, width)
        skip = bool(self.steps[arm] < self.warmup)
        # A second slow step in a row is the arm's real cost, not a one-off capture.
        if not skip and self.outlier and self._fitted >= 2 and not self.skipped[arm]:
            skip = step_s > self.outlier * max(float(x @ self._refit()[0][arm]), 1e-9)
        self.skipped[arm] = skip
        self.steps[arm] += 1
        self.outstanding[arm] = max(self.outstanding[arm] - 1, 0)
        self.width[arm] += width
        self.acc[0, arm] += len(counts)
        self.acc[1, arm] += sum(counts)
        self.acc[2, arm] += sum(c * c for c in counts)
        if self.request_rows > 0:
            self.request[0, arm] += len(counts)
            self.request[1, arm] += sum(counts)
            self.request[2, arm] += sum(c * c for c in counts)
            if self.ids is not None and len(self.ids) == len(counts):
                own = np.asarray(counts, dtype=np.float64)
                self.by_row[:, list(self.ids), arm] += np.stack([np.ones_like(own), own, own * own])
        top = max(counts, default=0)
        if top == 0:  # every row accepted nothing (plain decoding's every step): no histogram to build
            self.counts[arm, 0] += len(counts)
        else:
            if top >= self.counts.shape[1]:
                self.counts = np.pad(self.counts, ((0, 0), (0, top + 1 - self.counts.shape[1])))
            self.counts[arm, : top + 1] += np.bincount(counts)
        if not skip:
            if arm == self._plain:
                c = row_class(rows)
                self.plain_costed[c] = self.plain_costed.get(c, 0) + 1
            self._cache = None
            self.fitted[arm] += 1
            self._fitted += 1
            w = 1.0 / (step_s * step_s)
            self.xtx[arm] += w * np.outer(x, x)
            self.xty[arm] += w * x * step_s
            self.yty[arm] += 1.0
            self.fastest = min(self.fastest, step_s)
        if self.steps[arm] >= self._due[arm] or (not skip and self.fitted[arm] == 1):
            self._stale = True

    def update(self, arm: int, reward: float) -> None:
        self.beta.update(arm, reward)
