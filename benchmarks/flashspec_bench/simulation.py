"""Bandit simulator for the arm selectors (``flashspec bandit-sim``, ``benchmarks/bandit_sim.py``).

Each environment gives, for every step ``t`` and arm ``k``, the expected value
``mu_k(t)`` of the quantity we want to maximise, and draws the random outcomes a
selector sees. All arms' outcomes are drawn up front per seed, so every selector
faces the same random numbers (common random numbers: differences between
selectors are not sampling noise of the environment).

Regret is the (dynamic) pseudo-regret ``R(t) = sum_{s <= t} max_k mu_k(s) -
mu_{a_s}(s)``; in a stationary environment this is the usual pseudo-regret that
the UCB1 bound of Auer, Cesa-Bianchi & Fischer (2002) bounds in expectation.
Bands are 95% confidence intervals of the mean over seeds (Student t).

Environments:

* ``bernoulli``: stationary Bernoulli arms with means ``--means``.
* ``acceptance``: speculative-decoding steps. Arm ``k`` drafts ``gamma_k`` tokens,
  each accepted with probability ``a_k`` until the first rejection, so the
  accepted count is a truncated geometric ``N = min(Geom - 1, gamma_k)``; the
  reward is ``N / gamma_k``.
* ``piecewise``: Bernoulli arms whose means jump between ``--phases`` at
  ``--change-points`` (evenly spaced by default).
* ``drifting``: Bernoulli arms with ``mu_k(t) = clip(m_k + A sin(2 pi t / P + 2 pi k / K))``.
* ``costed``: as ``acceptance``, but a step with arm ``k`` takes ``cost_k`` time
  units and emits ``N + 1`` tokens; the objective is tokens per time unit
  ``E[N + 1] / cost_k``. The selector is fed either the acceptance fraction or
  :class:`~flashspec_core.rewards.ThroughputReward` (``--reward``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from flashspec_core.rewards import ThroughputReward
from flashspec_selectors.keys import COMPONENTS as SELECTOR_KEYS

if TYPE_CHECKING:  # the contracts import torch, which waits until the options are checked (main)
    from flashspec_core import ArmSelector, ComponentSpec

SelectorFactory = Callable[[int], "ArmSelector"]  # seed -> fresh selector
DEFAULT_SELECTORS = ("ucb1", "thompson", "sliding_window_ucb", "discounted_thompson")


@attrs.frozen
class Outcomes:
    """What every arm would give on every step of one seed's run."""

    reward: np.ndarray  # [T, K] float64 in [0, 1]: reward fed to the selector (acceptance kind)
    tokens: np.ndarray | None = None  # [T, K] int64: tokens emitted (costed envs)
    cost: np.ndarray | None = None  # [K] float64: time units per step (costed envs)
    widths: np.ndarray | None = None  # [K] int64: tokens each arm drafts (costed envs), for ObservesSteps


class Env(Protocol):
    @property
    def num_arms(self) -> int: ...

    @property
    def reward_kind(self) -> str:
        """``"reward"`` (feed ``Outcomes.reward``) or ``"throughput"`` (feed :class:`ThroughputReward`)."""
        ...

    def expected(self, horizon: int) -> np.ndarray:
        """``mu_k(t)``: ``[T, K] float64``."""
        ...

    def sample(self, rng: np.random.Generator, horizon: int) -> Outcomes: ...

    def describe(self) -> dict[str, Any]: ...


def _bernoulli(rng: np.random.Generator, means: np.ndarray) -> np.ndarray:
    return (rng.random(means.shape) < means).astype(np.float64)


@attrs.frozen
class PiecewiseBernoulli:
    """Bernoulli arms; phase ``i`` holds from ``change_points[i - 1]`` to ``change_points[i]``."""

    phases: np.ndarray = attrs.field(converter=lambda x: np.atleast_2d(np.asarray(x, np.float64)))  # [P, K]
    change_points: tuple[int, ...] = attrs.field(default=(), converter=lambda x: tuple(int(c) for c in x))
    reward_kind: str = "reward"

    def __attrs_post_init__(self) -> None:
        if not np.all((self.phases >= 0) & (self.phases <= 1)):
            raise ValueError(f"arm means must be in [0, 1], got {self.phases.tolist()}")
        if len(self.change_points) != len(self.phases) - 1:
            raise ValueError(f"{len(self.phases)} phases need {len(self.phases) - 1} change points")
        if list(self.change_points) != sorted(self.change_points) or any(c <= 0 for c in self.change_points):
            raise ValueError(f"change points must be increasing and > 0, got {list(self.change_points)}")

    @property
    def num_arms(self) -> int:
        return int(self.phases.shape[1])

    def expected(self, horizon: int) -> np.ndarray:
        phase = np.searchsorted(np.asarray(self.change_points, dtype=np.int64), np.arange(horizon), side="right")
        return self.phases[phase]

    def sample(self, rng: np.random.Generator, horizon: int) -> Outcomes:
        return Outcomes(_bernoulli(rng, self.expected(horizon)))

    def describe(self) -> dict[str, Any]:
        kind = "bernoulli" if len(self.phases) == 1 else "piecewise"
        return {"env": kind, "phases": self.phases.tolist(), "change_points": list(self.change_points)}


@attrs.frozen
class DriftingBernoulli:
    """Bernoulli arms whose means follow phase-shifted sine waves."""

    base: np.ndarray = attrs.field(converter=lambda x: np.asarray(x, np.float64))  # [K]
    amplitude: float = 0.3
    period: int = 5000
    reward_kind: str = "reward"

    @property
    def num_arms(self) -> int:
        return int(self.base.shape[0])

    def expected(self, horizon: int) -> np.ndarray:
        t = np.arange(horizon)[:, None]
        shift = 2 * np.pi * np.arange(self.num_arms)[None, :] / self.num_arms
        return np.clip(self.base[None, :] + self.amplitude * np.sin(2 * np.pi * t / self.period + shift), 0.0, 1.0)

    def sample(self, rng: np.random.Generator, horizon: int) -> Outcomes:
        return Outcomes(_bernoulli(rng, self.expected(horizon)))

    def describe(self) -> dict[str, Any]:
        return {"env": "drifting", "base": self.base.tolist(), "amplitude": self.amplitude, "period": self.period}


def expected_accepted(rate: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """``E[N] = sum_{i=1..gamma} a^i`` for the truncated geometric accepted count."""
    return np.array([sum(float(a) ** i for i in range(1, int(g) + 1)) for a, g in zip(rate, gamma, strict=True)])


@attrs.frozen
class SpecDecodeArms:
    """Arms that draft ``gammas[k]`` tokens accepted one by one with probability
    ``rates[k]`` until the first rejection. Without ``costs`` the objective is the
    acceptance fraction; with ``costs`` it is tokens per time unit."""

    rates: np.ndarray = attrs.field(converter=lambda x: np.asarray(x, np.float64))  # [K]
    gammas: np.ndarray = attrs.field(converter=lambda x: np.asarray(x, np.int64))  # [K]
    costs: np.ndarray | None = attrs.field(
        default=None, converter=lambda x: None if x is None else np.asarray(x, np.float64)
    )  # [K]
    reward_kind: str = "reward"

    def __attrs_post_init__(self) -> None:
        k = len(self.rates)
        if len(self.gammas) != k or (self.costs is not None and len(self.costs) != k):
            raise ValueError("rates, gammas and costs need one value per arm")
        if not np.all((self.rates >= 0) & (self.rates <= 1)):
            raise ValueError(f"acceptance rates must be in [0, 1], got {self.rates.tolist()}")
        if np.any(self.gammas < 0) or (self.costs is None and np.any(self.gammas == 0)):
            raise ValueError(f"gammas must be >= 1 (>= 0 with costs), got {self.gammas.tolist()}")
        if self.costs is not None and not np.all(np.isfinite(self.costs) & (self.costs > 0)):
            raise ValueError(f"costs must be finite and > 0, got {self.costs.tolist()}")
        if self.reward_kind not in ("reward", "throughput"):
            raise ValueError(f"reward kind must be 'reward' or 'throughput', got {self.reward_kind!r}")

    @property
    def num_arms(self) -> int:
        return int(self.rates.shape[0])

    def expected(self, horizon: int) -> np.ndarray:
        n = expected_accepted(self.rates, self.gammas)
        if self.costs is None:
            mu = n / self.gammas
        else:
            mu = (n + 1.0) / self.costs
        return np.broadcast_to(mu, (horizon, self.num_arms))

    def sample(self, rng: np.random.Generator, horizon: int) -> Outcomes:
        gmax = max(1, int(self.gammas.max()))
        ok = rng.random((horizon, self.num_arms, gmax)) < self.rates[None, :, None]
        ok &= np.arange(gmax)[None, None, :] < self.gammas[None, :, None]
        accepted = np.cumprod(ok, axis=-1).sum(-1)  # [T, K] leading successes
        fraction = accepted / np.maximum(self.gammas, 1)[None, :]  # gamma == 0 -> 0, as acceptance_reward
        return Outcomes(fraction.astype(np.float64), accepted + 1, self.costs, self.gammas)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"env": "acceptance" if self.costs is None else "costed"}
        out |= {"rates": self.rates.tolist(), "gammas": self.gammas.tolist()}
        if self.costs is not None:
            out |= {
                "costs": self.costs.tolist(),
                "reward": "acceptance" if self.reward_kind == "reward" else "throughput",
            }
        return out


# ------------------------------------------------------------------ running


def ucb1_bound(means: Sequence[float], horizon: int) -> float:
    """Auer et al. (2002) Theorem 1: ``sum_{k: Delta_k > 0} 8 ln T / Delta_k + (1 + pi^2 / 3) Delta_k``."""
    best = max(means)
    gaps = [best - m for m in means if best - m > 0]
    return sum(8 * math.log(horizon) / d + (1 + math.pi**2 / 3) * d for d in gaps)


def thompson_bound_leading(means: Sequence[float], horizon: int) -> float:
    """The leading term of Thompson sampling's problem-dependent regret bounds for Bernoulli
    arms with Beta priors (Kaufmann, Korda & Munos 2012, Theorem 1; Agrawal & Goyal 2013,
    Theorem 1): ``sum_{k: Delta_k > 0} Delta_k ln T / kl(mu_k, mu*)``, ``kl`` the Bernoulli
    relative entropy. Each bound is ``(1 + eps)`` times this plus a nonnegative term that the
    theorems leave as ``O(.)`` or an unnamed constant, so a regret below this term is below the
    bound for every ``eps > 0`` whatever that term is. It is also Lai & Robbins' (1985)
    asymptotic lower-bound rate at ``T``: the bounds match it, Thompson sampling is
    asymptotically optimal."""
    from scipy.special import rel_entr

    best = max(means)
    worse = np.array([m for m in means if best - m > 0], dtype=np.float64)  # [k] suboptimal means
    kl = rel_entr(worse, best) + rel_entr(1 - worse, 1 - best)  # Bernoulli kl(mu_k, mu*)
    return float(np.sum((best - worse) * math.log(horizon) / kl))


def play(selector: ArmSelector, env: Env, outcomes: Outcomes) -> np.ndarray:
    """Run one selector through one seed's outcomes; returns the arms ``[T] int64``.

    In a costed env a selector that declares ``ObservesSteps`` also sees each step as
    the pipeline shows it: one row, the arm's width, its accepted count and its cost; one
    that declares ``SeesWidths`` is told the arms' widths first, as the policy tells it."""
    from flashspec_core.contracts import ObservesSteps, SeesWidths

    horizon = outcomes.reward.shape[0]
    arms = np.empty(horizon, dtype=np.int64)
    observes = isinstance(selector, ObservesSteps) and outcomes.widths is not None
    if isinstance(selector, SeesWidths) and outcomes.widths is not None:
        selector.see_widths(outcomes.widths.tolist())
    if env.reward_kind == "throughput":
        assert outcomes.tokens is not None and outcomes.cost is not None
        tokens, cost, to_reward = outcomes.tokens.tolist(), outcomes.cost.tolist(), ThroughputReward()
        rewards = None
    else:
        rewards = outcomes.reward.tolist()
    for t in range(horizon):
        if observes:
            selector.see_rows(1)  # type: ignore[attr-defined]
        a = selector.select()
        if observes:
            assert outcomes.tokens is not None and outcomes.cost is not None and outcomes.widths is not None
            n = int(outcomes.tokens[t, a]) - 1
            selector.observe(a, 1, int(outcomes.widths[a]), [n], float(outcomes.cost[a]))  # type: ignore[attr-defined]
        selector.update(a, rewards[t][a] if rewards is not None else to_reward(tokens[t][a], cost[a]))
        arms[t] = a
    return arms


@attrs.frozen
class SimResult:
    env: dict[str, Any]
    horizon: int
    seeds: tuple[int, ...]
    expected: np.ndarray  # [T, K] mu_k(t)
    arms: dict[str, np.ndarray]  # name -> [S, T] int64
    throughput: dict[str, np.ndarray]  # name -> [S] realised tokens per time unit (costed envs only)

    def regret(self, name: str) -> np.ndarray:
        """Cumulative dynamic pseudo-regret ``[S, T]``."""
        mu = self.expected
        t = np.arange(self.horizon)[None, :]
        return np.cumsum(mu.max(axis=1)[None, :] - mu[t, self.arms[name]], axis=1)

    def best_arm_fraction(self, name: str) -> np.ndarray:
        """Per seed, the fraction of steps that played a best arm: ``[S]``."""
        mu = self.expected
        t = np.arange(self.horizon)[None, :]
        return (mu[t, self.arms[name]] >= mu.max(axis=1)[None, :]).mean(axis=1)


def simulate(
    env: Env,
    selectors: Mapping[str, SelectorFactory],
    horizon: int,
    seeds: Sequence[int],
    progress: bool = False,
) -> SimResult:
    """Run every selector on every seed; seed ``s`` draws outcomes from
    ``default_rng([s, 0])`` and seeds the selector with ``s``."""
    from tqdm import tqdm

    arms = {name: np.empty((len(seeds), horizon), dtype=np.int64) for name in selectors}
    thr: dict[str, np.ndarray] = {name: np.full(len(seeds), np.nan) for name in selectors}
    bar = tqdm(total=len(seeds) * len(selectors), desc="bandit-sim", unit="run", disable=not progress, file=sys.stderr)
    for i, seed in enumerate(seeds):
        outcomes = env.sample(np.random.default_rng([seed, 0]), horizon)
        for name, make in selectors.items():
            played = play(make(seed), env, outcomes)
            arms[name][i] = played
            if outcomes.tokens is not None and outcomes.cost is not None:
                tok = outcomes.tokens[np.arange(horizon), played].sum()
                thr[name][i] = tok / outcomes.cost[played].sum()
            bar.update()
    bar.close()
    return SimResult(env.describe(), horizon, tuple(seeds), env.expected(horizon), arms, thr)


def selector_configs(names: Sequence[str], overrides: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each named selector's config made from its ``overrides`` (None for a selector that takes
    no keys), checked against the bundled selectors' keys module, which imports no torch: a
    misspelt name, key or value is refused before the selectors themselves are imported.

    :raises ValueError: naming the selector.
    """
    known = {c.name: c.config_cls for c in SELECTOR_KEYS}
    if stray := [name for name in overrides if name not in names]:  # its settings would be dropped unread
        raise ValueError(f"--set {stray[0]}.{next(iter(overrides[stray[0]]))}: selector {stray[0]!r} is not among "
                         f"--selectors ({', '.join(names)})")
    configs: dict[str, Any] = {}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown selector {name!r}; known: {', '.join(sorted(known))}")
        cls, keys = known[name], dict(overrides.get(name, {}))
        if cls is None:
            if keys:
                raise ValueError(f"selector {name!r} takes no config keys, got {sorted(keys)}")
            configs[name] = None
            continue
        fields = attrs.fields_dict(cls)
        if unknown := sorted(set(keys) - set(fields)):
            raise ValueError(f"--set {name}.{unknown[0]}: selector {name!r} has no key {unknown[0]!r}; "
                             f"its keys: {', '.join(fields)}")
        try:
            configs[name] = cls(**keys)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"selector {name!r}: {exc}") from None
    return configs


def selector_factories(
    names: Sequence[str], overrides: Mapping[str, Mapping[str, Any]], num_arms: int
) -> dict[str, SelectorFactory]:
    """Factories for the named selectors with their config keys; a selector whose
    config has a ``seed`` key gets the run's seed unless ``overrides`` fix it."""
    from flashspec_selectors.plugin import selector_specs  # imports torch

    specs = {s.name: s for s in selector_specs()}
    return {name: _factory(specs[name], config, "seed" not in overrides.get(name, {}), num_arms)
            for name, config in selector_configs(names, overrides).items()}


def _factory(spec: ComponentSpec[ArmSelector], config: Any, seeded: bool, num_arms: int) -> SelectorFactory:
    seeded = seeded and config is not None and "seed" in attrs.fields_dict(type(config))
    spec.factory(config, num_arms)  # fail now, not inside the first run

    def make(seed: int) -> ArmSelector:
        return spec.factory(attrs.evolve(config, seed=seed) if seeded else config, num_arms)

    return make


# ------------------------------------------------------------------ summary


def mean_ci95(values: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Mean over axis 0 and the 95% Student-t confidence interval of that mean."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    mean = float(values.mean())
    if len(values) < 2:
        return mean, (mean, mean)
    half = float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean, (mean - half, mean + half)


def curve(regret: np.ndarray, points: int = 101) -> dict[str, list[float]]:
    """Mean and 95% band of ``regret [S, T]`` at ``points`` steps."""
    from scipy import stats

    horizon = regret.shape[1]
    idx = np.unique(np.linspace(0, horizon - 1, points).round().astype(np.int64))
    sub = regret[:, idx]
    mean = sub.mean(axis=0)
    s = max(regret.shape[0], 2)
    half = stats.t.ppf(0.975, s - 1) * sub.std(axis=0, ddof=1 if regret.shape[0] > 1 else 0) / math.sqrt(s)
    return {
        "t": (idx + 1).tolist(),
        "mean": mean.round(4).tolist(),
        "lo": (mean - half).round(4).tolist(),
        "hi": (mean + half).round(4).tolist(),
    }


def summarise(result: SimResult, points: int = 101) -> dict[str, Any]:
    """JSON-ready summary: per selector per-seed final regret, mean, CI, curve."""
    out: dict[str, Any] = {"env": result.env, "horizon": result.horizon, "seeds": list(result.seeds), "selectors": {}}
    for name in result.arms:
        regret = result.regret(name)
        final = regret[:, -1]
        mean, ci = mean_ci95(final)
        entry: dict[str, Any] = {
            "final_regret": final.round(4).tolist(),
            "mean": round(mean, 4),
            "ci95": [round(ci[0], 4), round(ci[1], 4)],
            "best_arm_fraction": result.best_arm_fraction(name).round(4).tolist(),
            "curve": curve(regret, points),
        }
        if not np.all(np.isnan(result.throughput[name])):
            tmean, tci = mean_ci95(result.throughput[name])
            entry["throughput"] = result.throughput[name].round(4).tolist()
            entry["throughput_mean"] = round(tmean, 4)
            entry["throughput_ci95"] = [round(tci[0], 4), round(tci[1], 4)]
        out["selectors"][name] = entry
    mu = result.expected
    if np.all(mu == mu[0]) and result.env.get("env") in ("bernoulli", "acceptance"):
        out["ucb1_bound"] = round(ucb1_bound(mu[0].tolist(), result.horizon), 4)
        if result.env.get("env") == "bernoulli" and 0.0 < float(mu[0].max()) < 1.0:
            out["thompson_bound_leading"] = round(thompson_bound_leading(mu[0].tolist(), result.horizon), 4)
    return out


def plot(summary: Mapping[str, Any], path: str, title: str | None = None) -> None:
    """Regret curves with 95% bands (and the UCB1 bound when there is one) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, entry in summary["selectors"].items():
        c = entry["curve"]
        (line,) = ax.plot(c["t"], c["mean"], label=f"{name} ({entry['mean']:.1f})")
        ax.fill_between(c["t"], c["lo"], c["hi"], color=line.get_color(), alpha=0.2, linewidth=0)
    if "ucb1_bound" in summary:
        t = np.arange(1, summary["horizon"] + 1)
        mu = summary["env"].get("phases", [[]])[0] or None
        if mu is not None:
            ax.plot(
                t, [ucb1_bound(mu, int(x)) for x in t], "k--", lw=1, label=f"UCB1 bound ({summary['ucb1_bound']:.0f})"
            )
    for cp in summary["env"].get("change_points", []):
        ax.axvline(cp, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("step t")
    ax.set_ylabel("cumulative (dynamic) pseudo-regret")
    ax.set_title(title or json.dumps(summary["env"])[:90], fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- CLI


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _phases(text: str) -> list[list[float]]:
    return [_floats(p) for p in text.split(";") if p.strip()]


def _setting(text: str) -> tuple[str, str, Any]:
    """``selector.key=value`` with a TOML value, e.g. ``sliding_window_ucb.window=500``."""
    head, sep, value = text.partition("=")
    name, dot, key = head.strip().partition(".")
    if not (sep and dot and name and key):
        raise argparse.ArgumentTypeError(f"expected SELECTOR.KEY=VALUE, got {text!r}")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        raise argparse.ArgumentTypeError(f"value of {head!r} is not a TOML value: {value!r}") from None
    return name, key.strip(), parsed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flashspec bandit-sim",
        description="Simulate arm selectors on synthetic bandits; write regret curves (JSON, PNG).",
    )
    p.add_argument("--env", choices=["bernoulli", "acceptance", "piecewise", "drifting", "costed"], default="bernoulli")
    p.add_argument("-T", "--horizon", type=int, default=10_000, help="steps per run (default 10000)")
    p.add_argument("-K", "--arms", type=int, default=None, help="number of arms (default: from the arm parameters)")
    p.add_argument("--seeds", type=int, default=20, help="number of seeds (default 20)")
    p.add_argument("--seed", type=int, default=0, help="first seed; runs use seed, seed+1, ...")
    p.add_argument("--means", type=_floats, help="bernoulli/drifting: arm means (default 0.3,0.7,0.5)")
    p.add_argument("--phases", type=_phases, help="piecewise: means per phase, e.g. '0.3,0.7;0.7,0.3'")
    p.add_argument("--change-points", type=_ints, help="piecewise: steps where a new phase starts (default: even)")
    p.add_argument("--amplitude", type=float, default=0.3, help="drifting: sine amplitude (default 0.3)")
    p.add_argument("--period", type=int, default=5000, help="drifting: sine period in steps (default 5000)")
    p.add_argument("--rates", type=_floats, help="acceptance/costed: per-token acceptance rate per arm")
    p.add_argument("--gammas", type=_ints, help="acceptance/costed: draft length per arm")
    p.add_argument("--costs", type=_floats, help="costed: time units per step per arm")
    p.add_argument("--reward", choices=["acceptance", "throughput"], default="throughput", help="costed: reward fed")
    p.add_argument("--selectors", default=",".join(DEFAULT_SELECTORS), help="comma-separated selector names")
    p.add_argument("--set", dest="settings", type=_setting, action="append", default=[], metavar="SEL.KEY=VALUE")
    p.add_argument("--json", dest="json_path", help="write the summary JSON here")
    p.add_argument("--png", dest="png_path", help="write the regret plot here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def env_from_args(args: argparse.Namespace) -> Env:
    """Build the environment named by ``--env`` from the arm options."""
    k = args.arms
    if args.env in ("bernoulli", "drifting"):
        means = args.means or ([0.3, 0.7, 0.5] if k in (None, 3) else np.linspace(0.2, 0.8, k).tolist())
        _same_k(k, len(means))
        if args.env == "drifting":
            return DriftingBernoulli(means, args.amplitude, args.period)
        return PiecewiseBernoulli([means])
    if args.env == "piecewise":
        phases = args.phases or [[0.3, 0.7, 0.5], [0.7, 0.3, 0.5]]
        _same_k(k, len(phases[0]))
        cps = args.change_points or [round(i * args.horizon / len(phases)) for i in range(1, len(phases))]
        return PiecewiseBernoulli(phases, cps)
    rates = args.rates or [0.6, 0.8]
    gammas = args.gammas or [4] * len(rates)
    _same_k(k, len(rates))
    if args.env == "acceptance":
        return SpecDecodeArms(rates, gammas)
    costs = args.costs or [1.0 + 0.05 * g for g in gammas]
    return SpecDecodeArms(rates, gammas, costs, "throughput" if args.reward == "throughput" else "reward")


def _same_k(k: int | None, n: int) -> None:
    if k is not None and k != n:
        raise ValueError(f"--arms {k} does not match the {n} arm parameters given")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``flashspec bandit-sim``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        if args.horizon < 1 or args.seeds < 1:
            raise ValueError("--horizon and --seeds must be >= 1")
        env = env_from_args(args)
        overrides: dict[str, dict[str, Any]] = {}
        for name, key, value in args.settings:
            overrides.setdefault(name, {})[key] = value
        names = [n.strip() for n in args.selectors.split(",") if n.strip()]
        selector_configs(names, overrides)  # before torch, which selector_factories imports
        factories = selector_factories(names, overrides, env.num_arms)
    except ValueError as exc:
        print(f"flashspec bandit-sim: error: {exc}", file=sys.stderr)
        return 2
    seeds = list(range(args.seed, args.seed + args.seeds))
    result = simulate(env, factories, args.horizon, seeds, progress=not args.no_progress)
    summary = summarise(result)
    summary["selector_config"] = overrides
    for name, entry in summary["selectors"].items():
        print(f"{name:>22}: regret {entry['mean']:10.2f}  95% CI [{entry['ci95'][0]:.2f}, {entry['ci95'][1]:.2f}]")
    if "ucb1_bound" in summary:
        print(f"{'UCB1 bound':>22}: {summary['ucb1_bound']:10.2f}")
    if "thompson_bound_leading" in summary:
        print(f"{'Thompson bound, lead':>22}: {summary['thompson_bound_leading']:10.2f}")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(summary, fh, indent=1)
    if args.png_path:
        plot(summary, args.png_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
