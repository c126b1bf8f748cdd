"""The bandit-selector scenarios of docs/bandits.md (``benchmarks/bandit_sim.py``).

Writes ``docs/benchmarks/bandit-sim.json`` (config, versions, commit, per-seed
numbers, curves and a ``summary``) and ``docs/benchmarks/bandit-sim-*.png``.

Scenarios (T = 10,000 steps, 30 seeds, every selector at its default config, so
the sliding window, the discount and the GLR level and forced-exploration share
come from their stated default rules for ``horizon = 10000, breakpoints = 1`` and
are not tuned to any scenario; ``request_thompson`` is never told of a request
here, so it runs as one long request):

(a) ``stationary``: Bernoulli means [0.3, 0.7, 0.5], next to the UCB1 bound of
    Auer, Cesa-Bianchi & Fischer (2002).
(b) ``switch_at_half``: means [0.3, 0.7, 0.5] then [0.7, 0.3, 0.5] from T/2;
    ``four_phase``: four phases of T/4 with the best arm 1, 0, 2, 1;
    ``drifting``: sine-drifting means; ``best_arm_degrades``: means [0.3, 0.7, 0.5] then
    [0.3, 0.4, 0.5] from T/2, so the arm played most drops below one played little but
    not never (the case forgetting is for: in the switches above the arm that becomes best
    is one UCB1 has neglected, whose large bonus brings it back on its own);
    ``domain_shift``: four phases of T/4 alternating an easy domain [0.3, 0.7, 0.5] and a
    hard one [0.25, 0.35, 0.45], where every arm accepts less and the arm best on the easy
    domain loses most (best arm 1, 2, 1, 2: the serving case of docs/bandits.md, whose
    acceptance falls when requests move from code to prose). Regret is dynamic (against
    the best arm now). ``summary.nonstationary_goal`` says, per changing scenario, which
    forgetting selectors end below both plain ones.
(c) ``costed``: plain decoding (gamma 0, cost 1.0), a small draft (a 0.6, gamma 4,
    cost 1.2) and a big draft (a 0.8, gamma 4, cost 2.2), costs in target-forward
    units; Thompson and UCB1 fed the acceptance fraction vs the throughput reward.
    Regret is in tokens per time unit, summed over steps.

Run: ``python benchmarks/bandit_sim.py`` (about four minutes on one CPU core).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_bench.simulation import (
    DEFAULT_SELECTORS,
    DriftingBernoulli,
    Env,
    PiecewiseBernoulli,
    SpecDecodeArms,
    expected_accepted,
    plot,
    selector_factories,
    simulate,
    summarise,
    thompson_bound_leading,
    ucb1_bound,
)
from flashspec_selectors.selectors import DiscountedThompsonConfig, GLRThompsonConfig, SlidingWindowUCBConfig

HORIZON = 10_000
SEEDS = list(range(30))
MEANS = [0.3, 0.7, 0.5]
HARD = [0.25, 0.35, 0.45]  # domain_shift's hard domain: every arm accepts less, arm 2 least so
COSTED = {"rates": [0.0, 0.6, 0.8], "gammas": [0, 4, 4], "costs": [1.0, 1.2, 2.2]}
COSTED_ARMS = ["plain decoding", "small draft", "big draft"]
COSTED_SELECTORS = ("ucb1", "thompson")
ADDED = ("glr_thompson", "request_thompson")
PLAIN = ("ucb1", "thompson")
FORGETTING = ("sliding_window_ucb", "discounted_thompson", "glr_thompson")  # forget or restart
SELECTORS = (*DEFAULT_SELECTORS, *ADDED)


def scenario_envs(horizon: int) -> dict[str, Env]:
    """The reward-only scenarios (a) and (b) at this horizon, by name."""
    half, quarter = horizon // 2, horizon // 4
    quarters = [quarter, 2 * quarter, 3 * quarter]
    return {
        "stationary": PiecewiseBernoulli([MEANS]),
        "switch_at_half": PiecewiseBernoulli([MEANS, [0.7, 0.3, 0.5]], [half]),
        "four_phase": PiecewiseBernoulli([MEANS, [0.7, 0.3, 0.5], [0.5, 0.3, 0.7], MEANS], quarters),
        "drifting": DriftingBernoulli([0.5, 0.5, 0.5], amplitude=0.3, period=horizon // 2),
        "best_arm_degrades": PiecewiseBernoulli([MEANS, [0.3, 0.4, 0.5]], [half]),
        "domain_shift": PiecewiseBernoulli([MEANS, HARD, MEANS, HARD], quarters),
    }


def _run(env: Env, names: tuple[str, ...], horizon: int, seeds: list[int], progress: bool) -> dict[str, Any]:
    factories = selector_factories(names, {}, env.num_arms)
    return summarise(simulate(env, factories, horizon, seeds, progress=progress))


def _per_selector(summary: dict[str, Any], names: tuple[str, ...] = DEFAULT_SELECTORS) -> dict[str, dict[str, Any]]:
    return {name: {"mean": e["mean"], "ci95": e["ci95"]} for name, e in summary["selectors"].items() if name in names}


def verdict(per_selector: dict[str, dict[str, Any]], candidates: tuple[str, ...] = FORGETTING) -> dict[str, Any]:
    """Which candidates (the forgetting selectors, unless named) have a lower mean regret than
    both plain ones, and whether the 95% intervals separate them (the candidate interval's top
    below both plain bottoms)."""
    best_plain = min(per_selector[p]["mean"] for p in PLAIN)
    lowest_plain_ci = min(per_selector[p]["ci95"][0] for p in PLAIN)
    present = [name for name in candidates if name in per_selector]
    return {
        "best_plain_mean": best_plain,
        "below_both_plain": [c for c in present if per_selector[c]["mean"] < best_plain],
        "separated_from_both_plain": [c for c in present if per_selector[c]["ci95"][1] < lowest_plain_ci],
    }


def _costed(horizon: int, seeds: list[int], progress: bool) -> dict[str, Any]:
    """The same arms, selectors fed each reward; a merged summary keyed "selector/reward"."""
    merged: dict[str, Any] = {}
    for reward, kind in (("acceptance", "reward"), ("throughput", "throughput")):
        env = SpecDecodeArms(**COSTED, reward_kind=kind)  # type: ignore[arg-type]
        part = _run(env, COSTED_SELECTORS, horizon, seeds, progress)
        if not merged:
            merged = {k: v for k, v in part.items() if k != "selectors"} | {"selectors": {}}
            merged["env"] = {k: v for k, v in part["env"].items() if k != "reward"} | {"arm_names": COSTED_ARMS}
        for name, entry in part["selectors"].items():
            merged["selectors"][f"{name}/{reward}"] = entry
    rates, gammas, costs = (np.asarray(COSTED[k]) for k in ("rates", "gammas", "costs"))
    n = expected_accepted(rates, gammas)
    merged["arms"] = {
        "expected_accepted": n.round(4).tolist(),
        "acceptance_fraction": np.where(gammas > 0, n / np.maximum(gammas, 1), 0.0).round(4).tolist(),
        "tokens_per_time_unit": ((n + 1) / costs).round(4).tolist(),
    }
    return merged


def _costed_summary(costed: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, e in costed["selectors"].items():
        out[key] = {
            "mean": e["mean"],
            "ci95": e["ci95"],
            "best_arm_fraction": round(float(np.mean(e["best_arm_fraction"])), 4),
            "throughput_mean": e["throughput_mean"],
            "throughput_ci95": e["throughput_ci95"],
        }
    out["oracle_tokens_per_time_unit"] = max(costed["arms"]["tokens_per_time_unit"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--horizon", type=int, default=HORIZON)
    p.add_argument("--seeds", type=int, default=len(SEEDS))
    p.add_argument("--out", type=Path, default=DOCS, help="folder for bandit-sim.json and the plots")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    horizon, seeds, progress = args.horizon, list(range(args.seeds)), not args.no_progress
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    half = horizon // 2
    envs: dict[str, Env] = scenario_envs(horizon)
    scenarios: dict[str, Any] = {}
    for name, env in envs.items():
        t0 = time.perf_counter()
        print(f"{name} ...", file=sys.stderr)
        scenarios[name] = _run(env, SELECTORS, horizon, seeds, progress)
        scenarios[name]["elapsed_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    print("costed ...", file=sys.stderr)
    scenarios["costed"] = _costed(horizon, seeds, progress)
    scenarios["costed"]["elapsed_s"] = round(time.perf_counter() - t0, 2)

    bound = ucb1_bound(MEANS, horizon)
    result = {
        **provenance("benchmarks/bandit_sim.py"),
        "config": {
            "horizon": horizon,
            "seeds": seeds,
            "selectors": list(SELECTORS),
            "selector_configs": "defaults",
            "sliding_window_ucb_window": SlidingWindowUCBConfig().effective_window,
            "discounted_thompson_discount": round(DiscountedThompsonConfig().effective_discount, 6),
            "glr_thompson_delta": round(GLRThompsonConfig().effective_delta, 6),
            "glr_thompson_forced": round(GLRThompsonConfig().effective_forced, 6),
            "regret": "cumulative dynamic pseudo-regret sum_t max_k mu_k(t) - mu_{a_t}(t)",
            "ci95": "[low, high]: 95% Student-t confidence interval of the mean over seeds",
            "costed": COSTED | {"arm_names": COSTED_ARMS, "cost_unit": "one target forward pass"},
        },
        "summary": {
            "paper_table": _per_selector(scenarios["stationary"])
            | {
                "ucb1_bound": round(bound, 4),
                "thompson_bound_leading": round(thompson_bound_leading(MEANS, horizon), 4),
            },
            "nonstationary": _per_selector(scenarios["switch_at_half"]),
            "nonstationary_four_phase": _per_selector(scenarios["four_phase"]),
            "drifting": _per_selector(scenarios["drifting"]),
            "nonstationary_degrading": _per_selector(scenarios["best_arm_degrades"]),
            "nonstationary_domain_shift": _per_selector(scenarios["domain_shift"]),
            # Issue 6's goal per changing scenario: forgetting selectors below both plain ones.
            "nonstationary_goal": {
                name: verdict(_per_selector(scenarios[name], SELECTORS))
                for name in ("switch_at_half", "four_phase", "drifting", "best_arm_degrades", "domain_shift")
            },
            "costed": _costed_summary(scenarios["costed"]),
            # The tables hold its four selectors; the ones added since sit here, same shape.
            "added_selectors": {
                table: _per_selector(scenarios[name], ADDED)
                for table, name in (
                    ("paper_table", "stationary"),
                    ("nonstationary", "switch_at_half"),
                    ("nonstationary_four_phase", "four_phase"),
                    ("drifting", "drifting"),
                    ("nonstationary_degrading", "best_arm_degrades"),
                    ("nonstationary_domain_shift", "domain_shift"),
                )
            },
        },
        "scenarios": scenarios,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }
    write_json(args.out / "bandit-sim.json", result)
    titles = {
        "stationary": f"(a) stationary Bernoulli {MEANS}, T={horizon}, {len(seeds)} seeds",
        "switch_at_half": f"(b) best arm switches at T/2 = {half}",
        "four_phase": "(b) four phases: best arm 1, 0, 2, 1",
        "drifting": f"drifting means 0.5 + 0.3 sin(2 pi t / {horizon // 2} + 2 pi k / 3)",
        "costed": "(c) costed arms: regret in tokens per time unit",
        "best_arm_degrades": f"(b) the best arm degrades at T/2 = {half}: [0.3, 0.7, 0.5] -> [0.3, 0.4, 0.5]",
        "domain_shift": f"(b) domain shift every T/4: {MEANS} (easy) <-> {HARD} (hard)",
    }
    for name, summary in scenarios.items():
        plot(summary, str(args.out / f"bandit-sim-{name.replace('_', '-')}.png"), titles[name])
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
