"""How much forgetting pays: dynamic regret against the window and the discount, per scenario.

Writes ``docs/benchmarks/bandit-forgetting-sweep.json`` and ``bandit-forgetting-sweep.png``.

``bandit_sim.py`` runs sliding-window UCB and discounted Thompson at their rule values for
T = 10,000 and one breakpoint: a window of 607 plays and a discount of 0.9975 (a memory of
``1 / (1 - discount)`` = 400 steps). This study runs both at ``MULTIPLES`` of those
memories in every scenario of ``bandit_sim.py``, beside UCB1 and Thompson at their
defaults, to show how much each verdict of that script owes to the rule: for each scenario,
which windows and discounts would have ended below both plain selectors, and which none
would. It is a sweep, not a pick: the engine and ``bandit_sim.py`` keep the rule.

Run: ``python benchmarks/bandit_forgetting_sweep.py`` (about six minutes on one CPU core).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from flashspec_selectors.selectors import DiscountedThompsonConfig, SlidingWindowUCBConfig
from flashspec_selectors.sim import selector_factories, simulate, summarise

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bandit_sim import HORIZON, OUT, PLAIN, provenance, scenario_envs, verdict  # noqa: E402

SEEDS = 20
MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
FORGETTING = {"sliding_window_ucb": "window", "discounted_thompson": "discount"}


def settings(horizon: int) -> dict[str, tuple[str, dict[str, Any], float]]:
    """label -> (selector, config keys, multiple of the rule's memory), plain ones at 1."""
    window = SlidingWindowUCBConfig(horizon=horizon).effective_window
    memory = 1.0 / (1.0 - DiscountedThompsonConfig(horizon=horizon).effective_discount)
    out: dict[str, tuple[str, dict[str, Any], float]] = {name: (name, {}, 1.0) for name in PLAIN}
    for m in MULTIPLES:
        out[f"sliding_window_ucb@{m:g}"] = ("sliding_window_ucb", {"window": max(1, round(window * m))}, m)
        out[f"discounted_thompson@{m:g}"] = ("discounted_thompson", {"discount": 1.0 - 1.0 / (memory * m)}, m)
    return out


def run_scenario(env: Any, horizon: int, seeds: list[int], progress: bool) -> dict[str, Any]:
    """Every setting on the same seeds (common random numbers, as in bandit_sim.py)."""
    factories = {}
    for label, (name, keys, _) in settings(horizon).items():
        factories[label] = selector_factories([name], {name: keys}, env.num_arms)[name]
    return summarise(simulate(env, factories, horizon, seeds, progress=progress), points=21)


def table(summary: dict[str, Any], horizon: int) -> dict[str, Any]:
    """Per scenario: the plain selectors, each forgetting selector along the multiples,
    and which multiples end below both plain selectors (mean, and 95% intervals apart)."""
    sel = {label: {"mean": e["mean"], "ci95": e["ci95"]} for label, e in summary["selectors"].items()}
    runs = settings(horizon)
    rows: dict[str, list[dict[str, Any]]] = {}
    verdicts: dict[str, dict[str, Any]] = {}
    for name, key in FORGETTING.items():
        multiple = {label: m for label, (selector, _, m) in runs.items() if selector == name}
        rows[name] = [
            {"multiple": m, key: round(runs[label][1][key], 6), **sel[label]} for label, m in multiple.items()
        ]
        v = verdict(sel, tuple(multiple))
        best = min(rows[name], key=lambda r: r["mean"])
        verdicts[name] = {
            "below_both_plain": [multiple[label] for label in v["below_both_plain"]],
            "separated_from_both_plain": [multiple[label] for label in v["separated_from_both_plain"]],
            "best_multiple": best["multiple"],
            "best_mean": best["mean"],
            "rule_mean": next(r["mean"] for r in rows[name] if r["multiple"] == 1.0),
        }
    best_plain = verdict(sel, ())["best_plain_mean"]
    return {
        "plain": {n: sel[n] for n in PLAIN},
        "best_plain_mean": best_plain,
        "by_multiple": rows,
        "verdict": verdicts,
    }


def plot(tables: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 3
    rows = -(-len(tables) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, (scenario, t) in zip(axes.flat, tables.items(), strict=False):
        for name, entries in t["by_multiple"].items():
            m = np.array([r["multiple"] for r in entries])
            mean = np.array([r["mean"] for r in entries])
            lo = np.array([r["ci95"][0] for r in entries])
            hi = np.array([r["ci95"][1] for r in entries])
            (line,) = ax.plot(m, mean, marker="o", label=name)
            ax.fill_between(m, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
        for name, style in zip(PLAIN, ("--", ":"), strict=True):
            ax.axhline(t["plain"][name]["mean"], color="k", ls=style, lw=1, label=name)
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("memory / the rule's (W = 607, discount 0.9975)")
        ax.set_ylabel("dynamic regret at T")
        ax.set_title(scenario.replace("_", " "))
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(tables) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--horizon", type=int, default=HORIZON)
    p.add_argument("--seeds", type=int, default=SEEDS)
    p.add_argument("--scenarios", help="comma-separated subset of bandit_sim.py's (default: all)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON in --out; run nothing")
    args = p.parse_args(argv)
    if args.plot_only:
        data = json.loads((args.out / "bandit-forgetting-sweep.json").read_text())
        plot(data["summary"], args.out / "bandit-forgetting-sweep.png")
        return 0
    envs = scenario_envs(args.horizon)
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = sorted(set(wanted) - set(envs))
        if unknown:
            p.error(f"--scenarios: unknown {', '.join(unknown)}; known: {', '.join(envs)}")
        envs = {k: envs[k] for k in wanted}
    seeds = list(range(args.seeds))
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    runs: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    for name, env in envs.items():
        print(f"{name} ...", file=sys.stderr)
        t0 = time.perf_counter()
        runs[name] = run_scenario(env, args.horizon, seeds, not args.no_progress)
        runs[name]["elapsed_s"] = round(time.perf_counter() - t0, 2)
        tables[name] = table(runs[name], args.horizon)
    result = {
        **provenance("benchmarks/bandit_forgetting_sweep.py"),
        "config": {
            "horizon": args.horizon,
            "seeds": seeds,
            "multiples": list(MULTIPLES),
            "rule_window": SlidingWindowUCBConfig(horizon=args.horizon).effective_window,
            "rule_discount": round(DiscountedThompsonConfig(horizon=args.horizon).effective_discount, 6),
            "settings": {
                k: {"selector": s, "keys": keys, "multiple": m} for k, (s, keys, m) in settings(args.horizon).items()
            },
            "regret": "cumulative dynamic pseudo-regret sum_t max_k mu_k(t) - mu_{a_t}(t)",
            "ci95": "[low, high]: 95% Student-t confidence interval of the mean over seeds",
        },
        "summary": tables,
        "runs": runs,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }
    # Write to a temporary name first, so an interrupted run never leaves half a file.
    path = args.out / "bandit-forgetting-sweep.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)
    plot(tables, args.out / "bandit-forgetting-sweep.png")
    print(json.dumps({k: v["verdict"] for k, v in tables.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
