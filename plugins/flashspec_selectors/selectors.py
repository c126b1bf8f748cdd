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

Ties go to the lowest arm index, so UCB selectors are deterministic.
"""

from __future__ import annotations

import math
from collections import deque
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


# ------------------------------------------------------------------- configs


@attrs.frozen
class FixedConfig:
    """``arm``: the arm to play on every step."""

    arm: int = attrs.field(default=0, validator=_int_at_least(0))


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
