"""When do windowed selectors beat plain ones? The non-stationary scenarios at growing horizons.

Writes ``docs/benchmarks/bandit-sim-horizons.json`` and ``bandit-sim-horizons.png``.

``bandit_sim.py`` runs its scenarios at T = 10,000 with every selector at its default
config (the rules evaluated for T = 10,000 and one breakpoint). This study runs the two
piecewise-stationary scenarios of that script (the best arm switches at T/2; four phases
of T/4 with the best arm 1, 0, 2, 1) at T in ``HORIZONS``, with the window, the discount
and the GLR level each given by its stated rule evaluated for the run's own horizon and
number of breakpoints (1 and 3), which is what the rules take as input (Garivier &
Moulines 2011 and Besson et al. 2022 assume both known). Nothing is tuned to a scenario:
every (scenario, horizon) pair uses the same rules. Regret is dynamic, as in bandit_sim.py.

Run: ``python benchmarks/bandit_horizons.py`` (about a quarter of an hour on one CPU core).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from flashspec_selectors.selectors import (
    DiscountedThompsonConfig,
    GLRThompsonConfig,
    SlidingWindowUCBConfig,
)
from flashspec_selectors.sim import Env, selector_factories, simulate, summarise

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bandit_sim import FORGETTING, OUT, PLAIN, provenance, scenario_envs, verdict  # noqa: E402

HORIZONS = (10_000, 30_000, 100_000)
SEEDS = 20
WINDOWED = FORGETTING
SELECTORS = (*PLAIN, *WINDOWED)


def scenarios(horizon: int) -> dict[str, tuple[Env, int]]:
    """The two switch scenarios of bandit_sim.py at this horizon, with their breakpoints."""
    envs = scenario_envs(horizon)
    return {"switch_at_half": (envs["switch_at_half"], 1), "four_phase": (envs["four_phase"], 3)}


def rule_configs(horizon: int, breakpoints: int) -> dict[str, dict[str, Any]]:
    """Config keys that evaluate each windowed selector's rule for this run."""
    keys = {"horizon": horizon, "breakpoints": breakpoints}
    return {name: dict(keys) for name in WINDOWED}


def rule_values(horizon: int, breakpoints: int) -> dict[str, float]:
    keys = {"horizon": horizon, "breakpoints": breakpoints}
    return {
        "sliding_window_ucb_window": SlidingWindowUCBConfig(**keys).effective_window,
        "discounted_thompson_discount": round(DiscountedThompsonConfig(**keys).effective_discount, 6),
        "glr_thompson_delta": round(GLRThompsonConfig(**keys).effective_delta, 6),
        "glr_thompson_forced": round(GLRThompsonConfig(**keys).effective_forced, 6),
    }


def plot(table: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(table), figsize=(6 * len(table), 4.2))
    for ax, (scenario, by_t) in zip(np.atleast_1d(axes), table.items(), strict=True):
        ts = sorted(int(t) for t in by_t)
        for name in SELECTORS:
            mean = np.array([by_t[str(t)][name]["mean"] for t in ts])
            lo = np.array([by_t[str(t)][name]["ci95"][0] for t in ts])
            hi = np.array([by_t[str(t)][name]["ci95"][1] for t in ts])
            style = "--" if name in PLAIN else "-"
            (line,) = ax.plot(ts, mean, style, marker="o", label=name)
            ax.fill_between(ts, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("horizon T (steps)")
        ax.set_ylabel("dynamic regret at T (mean, 95% CI)")
        ax.set_title(scenario.replace("_", " "))
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--horizons", type=lambda s: [int(x) for x in s.split(",")], default=list(HORIZONS))
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    seeds = list(range(args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs: dict[str, dict[str, Any]] = {}
    table: dict[str, dict[str, dict[str, Any]]] = {}
    verdicts: dict[str, dict[str, Any]] = {}
    for horizon in args.horizons:
        for name, (env, breakpoints) in scenarios(horizon).items():
            print(f"{name} T={horizon} ...", file=sys.stderr)
            t0 = time.perf_counter()
            factories = selector_factories(SELECTORS, rule_configs(horizon, breakpoints), env.num_arms)
            summary = summarise(simulate(env, factories, horizon, seeds, progress=not args.no_progress), points=51)
            summary["breakpoints"] = breakpoints
            summary["rules"] = rule_values(horizon, breakpoints)
            summary["elapsed_s"] = round(time.perf_counter() - t0, 2)
            runs[f"{name}@{horizon}"] = summary
            cell = {s: {"mean": e["mean"], "ci95": e["ci95"]} for s, e in summary["selectors"].items()}
            table.setdefault(name, {})[str(horizon)] = cell
            verdicts.setdefault(name, {})[str(horizon)] = verdict(cell)
    result = {
        **provenance("benchmarks/bandit_horizons.py"),
        "config": {
            "horizons": args.horizons,
            "seeds": seeds,
            "selectors": list(SELECTORS),
            "plain": list(PLAIN),
            "windowed": list(WINDOWED),
            "selector_configs": "each windowed selector's rule evaluated for the run's horizon and breakpoints",
            "regret": "cumulative dynamic pseudo-regret sum_t max_k mu_k(t) - mu_{a_t}(t)",
            "ci95": "[low, high]: 95% Student-t confidence interval of the mean over seeds",
        },
        "summary": {"by_horizon": table, "verdicts": verdicts},
        "runs": runs,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }
    (args.out / "bandit-sim-horizons.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(table, args.out / "bandit-sim-horizons.png")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
