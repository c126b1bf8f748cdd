"""A real domain-shifting workload for the bandit selectors, replayed from exact traces
(``benchmarks/bandit_workload.py``).

:mod:`flashspec_bench.traces` records greedy traces of the real pair; :func:`replay` serves
them with one selector, step by step, through the engine's own
:class:`~flashspec_core.policy.StepPolicy` (arm choice, first arm, fallback, draw-ahead,
rewards) over draft providers that propose as many tokens as each arm proposes there;
each arm's acceptance is read off the traces by teacher forcing and each step's time
comes from a cost model per arm and proposal width (the H200 run's step rows,
:func:`h200_costs`). ``simulate`` replays fixed arms, the selectors (acceptance and
throughput rewards) and the per-domain oracle in both serving orders. Its tokens/s are
*modelled* (emitted tokens / modelled time), never measured end to end. An arm with a
fallback (``lookup-match>draft0.5b-g3``) runs the matched lookup's step where
``match_width[t] > 0``, else the draft's step plus the search that found nothing.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch

from flashspec_bench.arms import ADAPTIVE, ARMS, SMALL, Arm, load_costs, step_costs
from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_bench.traces import (
    DOMAINS,
    TRACES,
    WORKLOAD,
    add_match,
    round_robin,
    run_trace,
    say,
)
from flashspec_core.contracts import ArmSelector, Draft, SamplingParams
from flashspec_core.policy import Arm as PolicyArm
from flashspec_core.policy import Plan, PolicySettings, StepPolicy
from flashspec_core.rewards import make_reward
from flashspec_selectors import FixedConfig, FixedSelector

RESULT = DOCS / "bandit-workload.json"


@attrs.frozen
class Step:
    prompt: str
    domain: str
    arm: int
    width: int  # tokens proposed: the arm's gamma, or fewer for a "match" arm
    accepted: int
    emitted: int
    seconds: float


def order_prompts(traces: Mapping[str, Mapping[str, Any]], order: str) -> list[str]:
    """Prompt ids in serving order: ``interleaved`` (domains round-robin) or ``blocked``."""
    by = {d: sorted(k for k, v in traces.items() if v["domain"] == d) for d in DOMAINS}
    if order == "blocked":
        return [k for d in DOMAINS for k in by[d]]
    if order == "interleaved":
        return [p["id"] for p in round_robin([{"id": k, "domain": d} for d in DOMAINS for k in by[d]])]
    raise ValueError(f"unknown order {order!r}")


def own_width(arm: Arm, trace: Mapping[str, Any], t: int) -> int:
    """Tokens the arm itself (not its fallback) proposes at ``t``: a function of the context
    alone. It also keys the arm's step cost."""
    return int(trace["match_width"][t]) if arm.source == "match" else arm.gamma


class Traced:
    """A draft provider that proposes, at the position the :class:`Replay` has reached,
    as many tokens as ``arm`` proposes there (placeholders: acceptance is read off the trace)."""

    def __init__(self, arm: Arm, replay: Replay) -> None:
        self.arm, self.replay = arm, replay

    def reset(self) -> None:
        """The position lives in the replay."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        return Draft(tokens=self.replay.slots[:, : own_width(self.arm, self.replay.trace, self.replay.t)], probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to roll back: the replay moves the position."""


_GREEDY = SamplingParams(temperature=0.0)


class Replay:
    """The engine's :class:`StepPolicy` over traced arms (each fallback also listed, unselectable
    where ``arms`` lacks it), serving one request of one row at position ``t`` of ``trace``."""

    def __init__(self, selector: ArmSelector, reward: str, arms: Sequence[Arm], first: int | None = None,
                 draw_ahead: bool = False) -> None:
        listed = list(dict.fromkeys([*arms, *(a.fallback for a in arms if a.fallback is not None)]))
        self.arms = {a.name: a for a in listed}
        steps = [PolicyArm(a.name, Traced(a, self), a.gamma, None if a.fallback is None else listed.index(a.fallback),
                           selectable=i < len(arms)) for i, a in enumerate(listed)]
        self.policy = StepPolicy(steps, selector, make_reward(reward), PolicySettings(first=first, draw_ahead=draw_ahead))
        self.slots = torch.zeros((1, max(a.gamma for a in listed)), dtype=torch.long)  # [1, max gamma] placeholders
        self.trace: Mapping[str, Any] = {}
        self.t = 0
        self.gen = torch.Generator()

    def plan(self) -> Plan:
        """The policy's plan for the step at ``t`` (the first arm, if any, proposes first)."""
        return self.policy.plan((0,), self.slots[:, :0], [self.t], _GREEDY, self.gen)

    def propose(self, plan: Plan) -> tuple[Arm, int, int]:
        """The arm whose proposal the step verifies (``plan``'s, or its fallback), its width and accepted tokens."""
        draft, drafter = self.policy.propose(plan, self.slots[:, :0], [self.t], _GREEDY, self.gen)
        arm, width = self.arms[drafter.name], int(draft.tokens.shape[1])
        return arm, width, 0 if arm.source == "none" else min(width, int(self.trace[f"{arm.source}_run"][self.t]))

    def step_of(self, k: int, trace: Mapping[str, Any], t: int) -> tuple[Arm, int, int]:
        """:meth:`propose` of arm ``k``'s step at position ``t`` of ``trace``, whoever chose it."""
        self.trace, self.t = trace, t
        return self.propose(Plan((0,), k, k))


def replay(selector: ArmSelector, reward: str, traces: Mapping[str, Mapping[str, Any]], order: Sequence[str],
           costs: Sequence[Mapping[int, float]], arms: Sequence[Arm] = ARMS, first: int | None = None,
           draw_ahead: bool = False) -> list[Step]:
    """Serve every prompt in ``order`` (one request each) with one selector that keeps its
    state throughout, through the engine's :class:`StepPolicy`: ``first`` (an index into
    ``arms``) and ``draw_ahead`` as ``[selector] first`` and ``draw_ahead``. A first-arm step
    is recorded with arm ``-1``. The tables replay without draw-ahead (each reward before the
    next draw); ``sensitivity_draw_ahead`` compares. A step's cost is keyed by the planned
    arm's own width (0 where its fallback drafted)."""
    run = Replay(selector, reward, arms, first, draw_ahead)
    steps = []
    for pid in order:
        run.policy.begin(1)
        run.trace = tr = traces[pid]
        n = len(tr["tokens"])
        run.t = 0
        while run.t < n:
            plan = run.plan()
            drafter, width, acc = run.propose(plan)
            emitted = min(acc + 1, n - run.t)  # the last step may stop at max_new_tokens / EOS
            seconds = costs[plan.arm][width if drafter.name == arms[plan.arm].name else 0]
            run.policy.learn(plan, width, [acc], seconds, emitted)
            steps.append(Step(pid, tr["domain"], -1 if plan.by_first else plan.arm, width, acc, emitted, seconds))
            run.t += emitted
    return steps


def tally(steps: Sequence[Step], arms: Sequence[Arm] = ARMS) -> dict[str, Any]:
    """tokens/s (modelled), mean accepted length, acceptance and arm shares of some steps."""
    emitted = sum(s.emitted for s in steps)
    seconds = sum(s.seconds for s in steps)
    drafted = sum(s.width for s in steps)
    accepted = sum(s.accepted for s in steps)
    return {
        "tps": emitted / seconds if seconds else 0.0, "emitted": emitted, "seconds": seconds, "steps": len(steps),
        "mean_accepted": accepted / len(steps) if steps else 0.0,
        "tokens_per_step": emitted / len(steps) if steps else 0.0,
        "acceptance": accepted / drafted if drafted else None,
        "arm_share": {a.name: sum(s.arm == i for s in steps) / max(1, len(steps)) for i, a in enumerate(arms)}
        | ({"(first)": sum(s.arm == -1 for s in steps) / len(steps)} if any(s.arm == -1 for s in steps) else {}),
    }


def tally_domains(steps: Sequence[Step], arms: Sequence[Arm] = ARMS) -> dict[str, Any]:
    out = {"overall": tally(steps, arms)}
    for d in DOMAINS:
        out[d] = tally([s for s in steps if s.domain == d], arms)
    return out


def selector_makers(horizon: int | None = None, breakpoints: int | None = None, k: int = len(ARMS)
                    ) -> dict[str, tuple[Callable[[int], Any], bool]]:
    """name -> (make(seed), randomised): every selector with its default config, and, given
    ``horizon`` and ``breakpoints``, the three selectors with a stated default rule
    (window, discount, GLR level and forced exploration) fed those (``<name>[rule]``)."""
    from flashspec_selectors import (
        UCB1,
        DiscountedThompson,
        DiscountedThompsonConfig,
        GLRThompson,
        GLRThompsonConfig,
        RequestThompson,
        RequestThompsonConfig,
        SlidingWindowUCB,
        SlidingWindowUCBConfig,
        Thompson,
        ThompsonConfig,
        UCB1Config,
    )

    out: dict[str, tuple[Callable[[int], Any], bool]] = {
        "ucb1": (lambda seed: UCB1(UCB1Config(), k), False),
        "thompson": (lambda seed: Thompson(ThompsonConfig(seed=seed), k), True),
        "sliding_window_ucb": (lambda seed: SlidingWindowUCB(SlidingWindowUCBConfig(), k), False),
        "discounted_thompson": (lambda seed: DiscountedThompson(DiscountedThompsonConfig(seed=seed), k), True),
        "glr_thompson": (lambda seed: GLRThompson(GLRThompsonConfig(seed=seed), k), True),
        "request_thompson": (lambda seed: RequestThompson(RequestThompsonConfig(seed=seed), k), True),
    }
    if horizon is not None and breakpoints is not None:
        sw = SlidingWindowUCBConfig(horizon=horizon, breakpoints=breakpoints)
        out["sliding_window_ucb[rule]"] = (lambda seed: SlidingWindowUCB(sw, k), False)
        out["discounted_thompson[rule]"] = (lambda seed: DiscountedThompson(
            DiscountedThompsonConfig(horizon=horizon, breakpoints=breakpoints, seed=seed), k), True)
        out["glr_thompson[rule]"] = (lambda seed: GLRThompson(
            GLRThompsonConfig(horizon=horizon, breakpoints=breakpoints, seed=seed), k), True)
    return out


def rule_inputs(traces: Mapping[str, Mapping[str, Any]], order: Sequence[str]) -> dict[str, int]:
    """What a deployer knows before serving: at most one step per token (horizon) and how
    often the domain changes in the serving order (breakpoints)."""
    horizon = sum(len(traces[p]["tokens"]) for p in order)
    changes = sum(traces[a]["domain"] != traces[b]["domain"] for a, b in zip(order, order[1:], strict=False))
    return {"horizon": max(2, horizon), "breakpoints": max(1, changes)}


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    v = np.asarray(values, dtype=float)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return {"mean": float(v.mean()), "ci95": [float(v.mean() - half), float(v.mean() + half)], "n": len(v)}


def simulate(traces: Mapping[str, Mapping[str, Any]], costs: Sequence[Mapping[int, float]], seeds: int,
             arms: Sequence[Arm] = ARMS, first: int | None = None) -> dict[str, Any]:
    """Every policy over both orders: fixed arms, selectors x rewards (seed-averaged), oracle
    (``first``: see :func:`replay`; a fixed arm is then "the first arm, else this one")."""
    from flashspec_selectors import FixedConfig, FixedSelector

    policies: dict[str, Any] = {}
    examples: dict[str, list[int]] = {}
    fixed = {}
    for i, a in enumerate(arms):
        steps = replay(FixedSelector(FixedConfig(arm=i), len(arms)), "acceptance", traces,
                       order_prompts(traces, "blocked"), costs, arms, first)
        fixed[a.name] = tally_domains(steps, arms)
        policies[f"fixed:{a.name}"] = {"kind": "fixed", "order": "any", **_flat(fixed[a.name])}
    best = {d: max(fixed, key=lambda name: fixed[name][d]["tps"]) for d in DOMAINS}
    emitted = sum(fixed[best[d]][d]["emitted"] for d in DOMAINS)
    seconds = sum(fixed[best[d]][d]["seconds"] for d in DOMAINS)
    policies["oracle:per-domain"] = {
        "kind": "oracle", "order": "any", "arm_per_domain": best, "tps": emitted / seconds,
        "per_domain": {d: {**fixed[best[d]][d], "arm": best[d]} for d in DOMAINS},
    }
    rules = {}
    for order in ("interleaved", "blocked"):
        ids = order_prompts(traces, order)
        rules[order] = rule_inputs(traces, ids)
        for name, (make, randomised) in selector_makers(**rules[order], k=len(arms)).items():
            for reward in ("acceptance", "throughput"):
                runs = [tally_domains(replay(make(seed), reward, traces, ids, costs, arms, first), arms)
                        for seed in range(seeds if randomised else 1)]
                policies[f"{name}+{reward}@{order}"] = {
                    "kind": "selector", "selector": name, "reward": reward, "order": order,
                    "seeds": len(runs), "randomised": randomised, **_seed_mean(runs)}
                if order == "blocked":
                    examples[f"{name}+{reward}"] = [s.arm for s in replay(make(0), reward, traces, ids, costs, arms,
                                                                          first)]
    return {"policies": policies, "blocked_arm_choices_seed0": examples, "rule_inputs": rules}


def _flat(dom: Mapping[str, Any]) -> dict[str, Any]:
    return {"tps": dom["overall"]["tps"], "overall": dom["overall"], "per_domain": {d: dom[d] for d in DOMAINS}}


def _seed_mean(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    def avg(part: str) -> dict[str, Any]:
        keys = ("tps", "mean_accepted", "tokens_per_step", "steps", "emitted", "seconds")
        out: dict[str, Any] = {k: float(np.mean([r[part][k] for r in runs])) for k in keys}
        out["tps_ci95"] = mean_ci([r[part]["tps"] for r in runs])["ci95"]
        names = runs[0][part]["arm_share"]
        out["arm_share"] = {n: float(np.mean([r[part]["arm_share"][n] for r in runs])) for n in names}
        return out

    overall = avg("overall")
    return {"tps": overall["tps"], "tps_ci95": overall["tps_ci95"], "overall": overall,
            "per_domain": {d: avg(d) for d in DOMAINS}}


def headline(policies: Mapping[str, Any], order: str) -> dict[str, Any]:
    sel = {k: v for k, v in policies.items() if v["kind"] == "selector" and v["order"] == order}
    fixed = {k: v for k, v in policies.items() if v["kind"] == "fixed"}
    best_sel, best_fix = max(sel, key=lambda k: sel[k]["tps"]), max(fixed, key=lambda k: fixed[k]["tps"])
    oracle = policies["oracle:per-domain"]["tps"]
    return {
        "best_selector": best_sel, "best_selector_tps": sel[best_sel]["tps"],
        "best_fixed": best_fix, "best_fixed_tps": fixed[best_fix]["tps"], "oracle_tps": oracle,
        "selector_ge_fixed": sel[best_sel]["tps"] >= fixed[best_fix]["tps"],
        "selector_within_5pct_of_oracle": sel[best_sel]["tps"] >= 0.95 * oracle,
        "selector_vs_oracle": sel[best_sel]["tps"] / oracle,
        "selector_vs_best_fixed": sel[best_sel]["tps"] / fixed[best_fix]["tps"],
    }


def arm_stats(traces: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Acceptance per arm per domain, position by position (every t, independent of policy)."""
    out: dict[str, Any] = {}
    for a in ARMS:
        if a.source == "none":
            continue
        run = Replay(FixedSelector(FixedConfig(arm=0), 1), "acceptance", (a,))
        at = [(tr["domain"], t, *run.step_of(0, tr, t)) for tr in traces.values() for t in range(len(tr["tokens"]))]
        out[a.name] = {}
        for d in ("overall", *DOMAINS):
            pos = [p for p in at if d in ("overall", p[0])]
            acc, width = [p[4] for p in pos], [p[3] for p in pos]
            out[a.name][d] = {"acceptance": sum(acc) / max(1, sum(width)), "mean_accepted": float(np.mean(acc)),
                              "mean_width": float(np.mean(width)),
                              "proposes": float(np.mean([w > 0 for w in width])), "positions": len(acc)}
            if a.fallback is not None:
                out[a.name][d]["falls_back"] = float(np.mean([p[2].name != a.name for p in pos]))
            first = [p[4] for p in pos if p[1] == 0]  # each request's first decode step
            out[a.name][d]["mean_accepted_first_position"] = float(np.mean(first))
    return out


def tps_table(policies: Mapping[str, Any]) -> dict[str, Any]:
    """Each policy's tokens/s, overall and per domain (the summary's ``policies`` tables)."""
    return {k: {"tps": v["tps"], "per_domain": {d: v["per_domain"][d]["tps"] for d in DOMAINS}}
            for k, v in policies.items()}


DESIGNS = (  # summary key, arms, first arm, what the design is
    ("adaptive", ADAPTIVE, None, "the selectors choose between these two arms only"),
    ("gated", ADAPTIVE, 0, "[selector] first = the match-only lookup: where it proposes, its step runs and the "
                             "selector is neither asked nor fed; elsewhere it chooses between the search's plain "
                             "step and the draft's"),
    ("gated_small", SMALL, 0, "as gated, choosing between a plain step and the draft at gamma 1, 2 or 3"),
)


def run_simulate(args: argparse.Namespace) -> int:
    data = json.loads(args.traces.read_text())
    traces = data["traces"]
    derived = add_match(traces)
    costs = load_costs(args.costs)
    per_arm = step_costs(costs)
    step_cost_s = {a.name: (c[a.gamma] if len(c) == 1 else [c[w] for w in sorted(c)])
                   for a, c in zip(ARMS, per_arm, strict=True)}
    say(f"{len(traces)} traces; step costs (s): {step_cost_s}")
    sim = simulate(traces, per_arm, args.seeds)
    policies = sim["policies"]
    by_order = {o: headline(policies, o) for o in ("interleaved", "blocked")}
    workload: dict[str, Any] = {
        **by_order["interleaved"], "by_order": by_order, "cost_model": costs["label"],
        "note": "tokens/s are modelled (emitted tokens / modelled step time, replayed over exact greedy traces), not "
                "measured end-to-end throughput",
        "prompts_per_domain": {d: sum(tr["domain"] == d for tr in traces.values()) for d in DOMAINS},
        "policies": tps_table(policies)}
    for key, arms, first, note in DESIGNS:
        pol = simulate(traces, step_costs(costs, arms), args.seeds, arms, first=first)["policies"]
        workload[key] = {"arms": [a.name for a in arms], "first": None if first is None else arms[first].name,
                         "by_order": {o: headline(pol, o) for o in ("interleaved", "blocked")}, "note": note,
                         "policies": tps_table(pol)}
    result = {
        **provenance("benchmarks/bandit_workload.py"), "traces_commit": data.get("commit"),
        "summary": {"workload": workload},
        "config": {
            "arms": [attrs.asdict(a) for a in ARMS], "seeds": args.seeds,
            "selectors": "defaults ([rule]: horizon and breakpoints from rule_inputs)", "rewards": "make_reward",
            "step_cost_s": step_cost_s,  # a list: by the arm's own width; for `a>b` entry 0 is b's step + the search
            "match_derived": f"{derived} of {len(traces)} traces (traces.add_match)",
            "cost_model": costs, "trace_config": data["config"],
        },
        "arm_acceptance": arm_stats(traces),
        "policies": policies,
        "blocked_arm_choices_seed0": sim["blocked_arm_choices_seed0"],
        "rule_inputs": sim["rule_inputs"],
        "domain_boundaries_blocked": _boundaries(traces),
    }
    write_json(args.out, result)
    say(f"wrote {args.out}")
    if not args.no_plots:
        plot(result, traces, args.out.parent / args.out.stem)
    print(json.dumps(by_order, indent=1))
    return 0


def _boundaries(traces: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The blocked serving order; step indices of domain changes depend on the policy."""
    order = order_prompts(traces, "blocked")
    return {"order": order, "first_prompt_of": {d: next(p for p in order if traces[p]["domain"] == d)
                                                for d in DOMAINS if any(traces[p]["domain"] == d for p in order)}}


def plot(result: Mapping[str, Any], traces: Mapping[str, Any], stem: Path) -> None:
    """``<stem>-arms.png`` (arm per step, blocked order) and ``<stem>-tps.png`` (tokens/s by policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = result["summary"]["workload"]["cost_model"]
    names = [a.name for a in ARMS]
    choices = result["blocked_arm_choices_seed0"]
    pick = result["summary"]["workload"]["by_order"]["blocked"]["best_selector"].split("@")[0]  # best on blocked
    arms = choices[pick]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True, height_ratios=[1.3, 1])
    ax.scatter(range(len(arms)), arms, s=4, c=arms, cmap="tab10", vmin=0, vmax=9)
    window = 25
    for i, name in enumerate(names):
        hit = np.convolve(np.asarray(arms) == i, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(len(hit)) + window - 1, hit, color=plt.get_cmap("tab10")(i), lw=1.2, label=name)
    for x, d in _step_boundaries(result, traces, pick):
        for a in (ax, ax2):
            a.axvline(x, color="k", lw=0.8, ls="--")
        ax.text(x + 3, len(names) - 0.6, d, fontsize=9)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.5, len(names) - 0.2)
    ax2.set_ylabel(f"share, last {window} steps")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7, ncol=4, loc="upper left")
    ax2.set_xlabel("decode step (blocked order: code, then prose, then edit)")
    ax.set_title(f"arm chosen by {pick}, seed 0 (replay; {label})", fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{stem}-arms.png", dpi=120)
    plt.close(fig)

    pol = result["policies"]
    keys = [k for k in pol if pol[k]["order"] in ("any", "interleaved")]
    keys += [k for k in pol if pol[k]["order"] == "blocked"]
    tps = [pol[k]["tps"] for k in keys]
    err = [[0, 0] if "tps_ci95" not in pol[k] else [pol[k]["tps"] - pol[k]["tps_ci95"][0],
                                                     pol[k]["tps_ci95"][1] - pol[k]["tps"]] for k in keys]
    colours = {"fixed": "tab:gray", "oracle": "tab:green", "selector": "tab:blue"}
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(keys) + 1.2))
    ax.barh(range(len(keys)), tps, xerr=np.array(err).T, color=[colours[pol[k]["kind"]] for k in keys])
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    ax.axvline(pol["oracle:per-domain"]["tps"], color="tab:green", lw=0.8, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel(f"modelled tokens/s ({label}; not measured end to end)")
    ax.set_title("tokens/s by policy on the domain-shifting workload (95% CI over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{stem}-tps.png", dpi=120)
    plt.close(fig)


def _step_boundaries(result: Mapping[str, Any], traces: Mapping[str, Any], pick: str) -> list[tuple[int, str]]:
    """Re-derive the step index where each domain starts in the seed-0 blocked replay."""
    order = result["domain_boundaries_blocked"]["order"]
    arms = result["blocked_arm_choices_seed0"][pick]
    run = Replay(FixedSelector(FixedConfig(arm=0), len(ARMS)), "acceptance", ARMS)
    out, i, seen = [], 0, set()
    for pid in order:
        tr = traces[pid]
        if tr["domain"] not in seen:
            seen.add(tr["domain"])
            out.append((i, tr["domain"]))
        t = 0
        while t < len(tr["tokens"]):
            t += min(run.step_of(arms[i], tr, t)[2] + 1, len(tr["tokens"]) - t)
            i += 1
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("trace", help="greedy target traces + per-position match runs (CPU)")
    tr.add_argument("--workload", type=Path, default=WORKLOAD)
    tr.add_argument("--out", type=Path, default=TRACES)
    tr.add_argument("--max-new-tokens", type=int, default=64)
    tr.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    tr.add_argument("--threads", type=int, default=2)
    si = sub.add_parser("simulate", help="replay every policy over the traces")
    si.add_argument("--traces", type=Path, default=TRACES)
    si.add_argument("--out", type=Path, default=RESULT)
    si.add_argument("--costs", type=Path, default=None,
                    help="a step-cost table, or a replay result whose config.cost_model to reuse (default: from the "
                         "H200 run's raw rows in benchmarks/.results/)")
    si.add_argument("--seeds", type=int, default=10)
    si.add_argument("--no-plots", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return {"trace": run_trace, "simulate": run_simulate}[args.cmd](args)
