"""Replay of recorded H200 decode steps through the step policy (``benchmarks/bandit_replay.py``).

The recorded steps (``benchmarks/workloads/h200-steps.json``, extracted from the bench
runs by ``--extract``) give, for each arm, steps at the batch sizes it was played at:
live rows, width, accepted tokens per row and step time. A replayed step of arm ``k``
over ``r`` live rows draws one of ``k``'s steps at the recorded batch size nearest ``r``
and takes its time and ``r`` of its rows' accepted counts (drawn with replacement where
it had fewer rows); rows finish at their request's recorded length, so a batch drifts
down through the batch sizes as in the engine. Steps slower than 5x their arm's median
are graph captures, not the arm's cost, and are left out of the pool. At each batch size only
the arms recorded at three quarters of it or more take part (``arms`` of each batch).

In the run's domain order (``replay_domains``, from each sweep's fixed-arm runs, ``sweeps`` in
the steps file): each batch size's requests in the batches and order of its bench run
(HumanEval, code edits, chat, code, prose), one policy carried across them; a replayed step
of arm ``k`` gives each live row the accepted count of ``k``'s recorded step that covered
the row's position in the same request, and the time of one of ``k``'s steps at the nearest
live-row count; an arm's first step in a batch takes one of its recorded first steps of a
batch (a draft model prefills the prompts there: 7-16 ms against 5.5 ms for the 0.5B at
batch 8), each batch the target-only run's time outside its steps (the prefill), and the
arms are in the bench config's order (a selector opens them in that order). Per domain:
tokens/s over target-only, beside what the bench measured for its own selector runs
(``measured``), so the replay can be read against them. An arm of the sweep with a fallback
(``SWEEP_FALLBACKS``: the suffix arm or lookup with the draft chain behind it) is replayed from
its two arms' recordings, whether or not the sweep timed it too: a step plays the leading arm's
recorded step where that proposed for a live row, else the draft's; every system of the domain
replay has it among its arms, and its leading arm is played only as a fixed system, never by a
selector (the sweep marks the lone arm ``select = false``: the version with the fallback proposes
the same where the lone arm proposes anything). Where the recording has every arm of the shipped
``gpu.toml`` design (``BANDIT_ARMS`` of ``flashspec_bench.arm_sections``), the selectors of the
domain replay choose among those only, as the sweep's bandit does, and the shipped selector is also
replayed over every arm the sweep timed but the lone leaders (``factored_per_request_all_arms``:
what the other arms, the self-speculative ones among them, cost or gain it) and over its four and
the self-speculative arms declaring their drafting cost, their layers of the target's 28
(``factored_per_request_self_priced``: :class:`~flashspec_core.contracts.PricesDrafts`); there
gpu.toml's arms come first in the opening order, as they would with arms added after them.

Systems, all through :class:`~flashspec_core.policy.StepPolicy` with the throughput
reward and draw-ahead as in the engine, each arm's gamma its widest recorded step (what
the policy tells a selector that sees widths): the per-bucket ``thompson`` (buckets
1, 2, 4, 8, 16, 32), ``factored`` (one selector for every batch), ``factored_per_request``
(the same with ``request_rows = 8``, each request's own acceptance counts, and
``plain_per_class = 2``: the shipped configs' selector), every arm fixed, and per batch size
the best fixed arm in hindsight. Each seed runs the recorded requests in batches of the batch
size, one policy for the whole run (about 100 steps at batch 8).
Regret: seconds beyond the best fixed arm's for the same tokens, per request.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import statistics
import tomllib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flashspec_bench.arm_sections import BANDIT_ARMS, SELF_GAMMA, SELF_LAYERS, SWEEP_FALLBACKS, fallback_name
from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_core.contracts import ArmSelector
from flashspec_core.policy import Arm, NoDraft, PolicySettings, StepPolicy
from flashspec_core.rewards import make_reward
from flashspec_selectors.selectors import Factored, FactoredConfig, FixedConfig, FixedSelector, Thompson, ThompsonConfig

STEPS = Path(__file__).resolve().parents[1] / "workloads" / "h200-steps.json"
OUT = DOCS / "bandit-replay.json"
BUCKETS = (1, 2, 4, 8, 16, 32)
CAPTURE = 5.0  # a step this many times its arm's median is a graph capture
REQUEST_ROWS = 8.0  # factored's request_rows in flashspec_core/configs/default.toml
PLAIN_PER_CLASS = 2  # and its plain_per_class
TARGET_LAYERS = 28  # Qwen2.5-Coder-1.5B's decoder layers, whose first SELF_LAYERS the self arms draft on

Pool = dict[int, list[tuple[int, float, tuple[int, ...]]]]  # batch size -> (width, step_s, accepted per row)


def extract(bench_paths: Sequence[Path]) -> dict[str, Any]:
    """Every step of every run in the bench JSONs, per arm, and the requests' lengths."""
    arms: dict[str, list[list[Any]]] = {}
    sweeps: dict[str, Any] = {}
    lengths: list[int] = []
    for path in bench_paths:
        data = json.loads(Path(path).read_text())
        for run in data["runs"].values():
            for s in run.get("steps", []):
                arms.setdefault(s["arm_name"], []).append(
                    [s["batch_size"], s["gamma"], round(s["step_ms"], 4), s["accepted"]])
        requests = [r["new_tokens"] for r in data["runs"]["target_only"]["requests"]]
        lengths = requests if len(requests) > len(lengths) else lengths  # the fullest list of requests
        sweeps[str(data["args"]["batch_size"])] = sweep(data["runs"], arm_order(data.get("config")))
    sources = [f"{Path(p).parent.name}/{Path(p).name}" for p in bench_paths]
    return {"sources": sources, "request_tokens": lengths, "arms": arms, "sweeps": sweeps}


def arm_order(config: str | None) -> list[str]:
    """The arm names of a bench run's config (TOML text), in its order: the order a selector
    opens its arms in (empty where the config is not there)."""
    if not config:
        return []
    return [str(a.get("name", a.get("use", ""))) for a in tomllib.loads(config).get("arm", [])]


def sweep(runs: dict[str, Any], order: Sequence[str] = ()) -> dict[str, Any]:
    """One bench run in its order: its batches of requests ``[prompt, domain, new tokens]``, and
    for each fixed arm each request's row's steps ``[position, accepted, width]`` and the steps'
    ``[rows, width, ms]`` (rows are a step's live rows in prompt order, as the bench decodes them),
    each batch's first step apart (``firsts``: a draft model prefills the prompts in it); each
    batch's time outside its steps in the target-only run (``outside_ms``: the prefill, the same
    for every system); the config's arm order (``order``); each selector
    run's measured tokens/s over target-only per domain (``measured``), for the replay to be
    read against; and per fixed arm and domain, over its static batches, a row's mean accepted
    count a step, the least of a step's rows' on average, and the slowest row's
    (``static_rows``: what a static batch waits on, against what a selector can score it by)."""
    target = runs["target_only"]["requests"]
    out: dict[str, Any] = {"batches": [[[q["prompt"], q["domain"], q["new_tokens"]] for q in batch]
                                       for batch in _batches(target)], "arms": {}, "order": list(order)}
    walls: dict[str, list[tuple[str, int, float, float]]] = {}  # system -> per batch: domain, tokens, wall, steps ms
    for system, run in runs.items():
        if not run.get("requests"):
            continue
        fixed = system.startswith("fixed:") or system == "target_only"
        traces: dict[str, list[list[int]]] = {}
        times: list[list[float]] = []
        firsts: list[list[float]] = []
        slow: dict[str, list[list[float]]] = {}  # domain -> per batch: _slowest
        steps = iter(run["steps"])
        for batch in _batches(run["requests"]):
            left = {q["prompt"]: q["new_tokens"] for q in batch}
            pos = dict.fromkeys(left, 0)
            step_ms, first, count, full = 0.0, True, 0, []
            while any(n > 0 for n in left.values()):
                s = next(steps)
                live = [p for p in sorted(left) if left[p] > 0]
                count += 1
                if len(live) == len(batch):
                    full += s["accepted"]
                for p, a in zip(live, s["accepted"], strict=False):
                    traces.setdefault(str(p), []).append([pos[p], a, s["gamma"]])
                    got = min(a + 1, left[p])
                    left[p], pos[p] = left[p] - got, pos[p] + got
                (firsts if first else times).append([len(s["accepted"]), s["gamma"], round(s["step_ms"], 4)])
                first = False
                step_ms += s["step_ms"]
            if fixed and len(batch) > 1 and full:
                domains = {q["domain"] for q in batch}
                key = domains.pop() if len(domains) == 1 else "mixed"
                slow.setdefault(key, []).append(_slowest(full, len(batch), max(q["new_tokens"] for q in batch), count))
            if "wall_s" in batch[0]:
                walls.setdefault(system, []).extend(
                    (q["domain"], q["new_tokens"], 1e3 * q["wall_s"] / len(batch), step_ms / len(batch)) for q in batch)
        if fixed:
            name = "none" if system == "target_only" else system.removeprefix("fixed:")
            out["arms"][name] = {"traces": traces, "times": times, "firsts": firsts}
            if slow:
                out.setdefault("static_rows", {})[name] = {
                    d: dict(zip(("mean", "least_of_step", "slowest_row"), np.mean(v, axis=0).round(3).tolist(),
                                strict=True)) for d, v in slow.items()}
    if "target_only" in walls:
        rows = iter(walls["target_only"])
        out["outside_ms"] = [round(sum(w - s for _, _, w, s in (next(rows) for _ in batch)), 4)
                             for batch in out["batches"]]
        out["measured"] = {system: _domain_ratios(w, walls["target_only"]) for system, w in walls.items()
                           if not (system.startswith("fixed:") or system == "target_only")}
    return out


def _slowest(full: list[int], rows: int, longest: int, steps: int) -> list[float]:
    """Of a static batch of ``rows`` rows that took ``steps`` steps for its longest request of
    ``longest`` tokens, from the accepted counts of its steps over every row (``full``): a row's
    mean accepted count a step, the least of a step's ``rows`` counts on average (what
    :func:`flashspec_selectors.selectors.expected_least` predicts from their histogram), and the
    slowest row's, ``longest / steps - 1``."""
    counts = np.bincount(np.asarray(full, dtype=np.int64))
    at_least = 1.0 - np.cumsum(counts)[:-1] / len(full)  # P(X >= j), j = 1..
    return [float(np.mean(full)), float((at_least**rows).sum()), longest / steps - 1.0]


def _domain_ratios(rows: list[tuple[str, int, float, float]], target: list[tuple[str, int, float, float]]) -> dict[str, float]:
    """Tokens/s over target-only per domain and overall (``all``), from each request's share of
    its batch's wall time."""
    def rates(entries: list[tuple[str, int, float, float]]) -> dict[str, float]:
        tokens: dict[str, float] = {}
        ms: dict[str, float] = {}
        for domain, n, wall, _ in entries:
            for key in (domain, "all"):
                tokens[key] = tokens.get(key, 0.0) + n
                ms[key] = ms.get(key, 0.0) + wall
        return {k: tokens[k] / ms[k] for k in tokens}
    mine, base = rates(rows), rates(target)
    return {k: round(v / base[k], 3) for k, v in mine.items() if k in base}


def _batches(requests: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A run's requests grouped by the batch they were decoded in, in the run's order."""
    ids = sorted({q["batch_id"] for q in requests})
    return [sorted((q for q in requests if q["batch_id"] == b), key=lambda q: q["prompt"]) for b in ids]


def pools(recorded: dict[str, Any]) -> tuple[list[str], list[Pool], int]:
    """Arm names (``none`` first), each arm's steps by batch size without captures, captures dropped."""
    names = sorted(recorded["arms"], key=lambda n: (n != "none", n))
    out, dropped = [], 0
    for name in names:
        steps = recorded["arms"][name]
        median = statistics.median(s[2] for s in steps)
        pool: Pool = {}
        for rows, width, ms, acc in steps:
            if ms > CAPTURE * median:
                dropped += 1
                continue
            pool.setdefault(rows, []).append((width, ms / 1e3, tuple(acc)))
        out.append(pool)
    return names, out, dropped


def widths(recorded: dict[str, Any], names: Sequence[str]) -> list[int]:
    """Each arm's widest recorded step: its gamma as the policy tells a selector (0 for ``none``)."""
    return [max(s[1] for s in recorded["arms"][name]) for name in names]


def draw_step(pool: Pool, rows: int, rng: np.random.Generator) -> tuple[int, float, list[int]]:
    """A recorded step at the batch size nearest ``rows`` (the larger on a tie): width, seconds,
    ``rows`` accepted counts."""
    size = min(pool, key=lambda b: (abs(b - rows), -b))
    width, step_s, acc = pool[size][int(rng.integers(len(pool[size])))]
    picked = acc[:rows] if len(acc) >= rows else [acc[int(i)] for i in rng.integers(len(acc), size=rows)]
    return width, step_s, list(picked)


def run(make_policy: Callable[[], StepPolicy], pool: list[Pool], lengths: Sequence[int], batch: int,
        rng: np.random.Generator) -> tuple[float, int, list[int]]:
    """Seconds, tokens and plays per arm of the requests decoded in batches of ``batch``."""
    policy, seconds, tokens, plays = make_policy(), 0.0, 0, [0] * len(pool)
    for start in range(0, len(lengths), batch):
        left = list(lengths[start:start + batch])
        policy.begin(len(left))
        while any(n > 0 for n in left):
            rows = [b for b, n in enumerate(left) if n > 0]
            plan = policy.choose(rows)
            width, step_s, acc = draw_step(pool[plan.arm], len(rows), rng)
            emitted = 0
            for b, n in zip(rows, acc, strict=True):
                got = min(n + 1, left[b])
                left[b] -= got
                emitted += got
            policy.learn(plan, width, acc, step_s, emitted)
            seconds, tokens = seconds + step_s, tokens + emitted
            plays[plan.arm] += 1
    return seconds, tokens, plays


class PricedNoDraft(NoDraft):
    """A replayed arm that declares its drafting cost (:class:`~flashspec_core.contracts.PricesDrafts`)."""

    def __init__(self, draft_cost: float) -> None:
        self.draft_cost = draft_cost


def self_cost(name: str) -> float | None:
    """The drafting cost a sweep's self-speculative arm declares (its layers of the 1.5B target's
    28, as the ``self`` draft does), or None for any other arm."""
    layers = {f"self-l{n}-g{SELF_GAMMA}": n for n in SELF_LAYERS}.get(name)
    return None if layers is None else layers / TARGET_LAYERS


def _policy(names: list[str], gammas: Sequence[int], make: Callable[[int], ArmSelector],
            buckets: tuple[int, ...], alone: Collection[str] = (),
            costs: dict[str, float] | None = None) -> Callable[[], StepPolicy]:
    """A policy over ``names``; those in ``alone`` are not the selector's (``select = false``);
    those in ``costs`` declare that drafting cost."""
    costs = costs or {}
    arms = [Arm(name=n, provider=PricedNoDraft(costs[n]) if n in costs else NoDraft(), gamma=g,
                selectable=n not in alone)
            for n, g in zip(names, gammas, strict=True)]
    choosable = sum(a.selectable for a in arms)

    def build() -> StepPolicy:
        return StepPolicy(arms, make(choosable), make_reward("throughput"),
                          PolicySettings(batch_buckets=buckets), make_selector=lambda: make(choosable))

    return build


def systems(names: list[str], gammas: Sequence[int], seed: int, alone: Collection[str] = (),
            all_arms: Collection[str] | None = None) -> dict[str, Callable[[], StepPolicy]]:
    """The replayed systems of one seed (a fresh selector stream per bucket); ``gammas``: each
    arm's width, as the policy tells a selector that sees widths; ``alone``: arms played only as
    fixed systems, never by a selector (the sweep's ``select = false`` arms); ``all_arms``: where
    given and not ``alone``, the shipped selector is also replayed with only these kept from it
    (``factored_per_request_all_arms``)."""
    counter = iter(range(10**6))

    def shipped(k: int, static_batch: bool = True) -> ArmSelector:  # the shipped configs' selector
        return Factored(FactoredConfig(seed=seed, request_rows=REQUEST_ROWS, plain_per_class=PLAIN_PER_CLASS,
                                       static_batch=static_batch), k)

    out = {
        "thompson_per_bucket": _policy(
            names, gammas, lambda k: Thompson(ThompsonConfig(seed=seed * 1000 + next(counter)), k), BUCKETS, alone),
        "factored": _policy(names, gammas, lambda k: Factored(FactoredConfig(seed=seed), k), (1,), alone),
        "factored_per_request": _policy(names, gammas, shipped, (1,), alone),
        # the shipped selector scoring a static batch by its rows' mean
        "factored_mean": _policy(names, gammas, lambda k: shipped(k, static_batch=False), (1,), alone),
    }
    if all_arms is not None and set(all_arms) != set(alone):  # what the arms left out cost or gain it
        out["factored_per_request_all_arms"] = _policy(names, gammas, shipped, (1,), all_arms)
        selfs = {n: c for n in names if (c := self_cost(n)) is not None}
        if selfs:  # the shipped arms and the self-speculative ones, which declare their cost
            out["factored_per_request_self_priced"] = _policy(names, gammas, shipped, (1,),
                                                              set(alone) - set(selfs), selfs)
    for i, name in enumerate(names):
        out[f"fixed:{name}"] = _policy(names, gammas, _fixed(i), (1,))
    return out


def _fixed(arm: int) -> Callable[[int], ArmSelector]:
    return lambda k: FixedSelector(FixedConfig(arm=arm), k)


def _ci(values: list[float]) -> list[float]:
    mean = float(np.mean(values))
    half = 1.96 * float(np.std(values, ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return [round(mean, 3), round(mean - half, 3), round(mean + half, 3)]


def replay(recorded: dict[str, Any], batches: Sequence[int], seeds: int) -> dict[str, Any]:
    all_names, all_pool, dropped = pools(recorded)
    all_gammas = widths(recorded, all_names)
    lengths = recorded["request_tokens"]
    results: dict[str, Any] = {}
    for batch in batches:
        # The arms recorded at this batch size or near it (from 3/4 of it up): an arm's steps at 8
        # rows priced as steps at 32 would make it look four times cheaper than it is.
        kept = [k for k, p in enumerate(all_pool) if max(p) * 4 >= batch * 3]
        names, pool, gammas = [all_names[k] for k in kept], [all_pool[k] for k in kept], [all_gammas[k] for k in kept]
        per: dict[str, dict[str, list[float]]] = {}
        for seed in range(seeds):
            for name, make in systems(names, gammas, seed).items():
                rng = np.random.default_rng([seed, batch])  # same draws for every system's first steps
                seconds, tokens, plays = run(make, pool, lengths, batch, rng)
                entry = per.setdefault(name, {"tokens_per_s": [], "seconds": [], "plays": []})
                entry["tokens_per_s"].append(tokens / seconds)
                entry["seconds"].append(seconds)
                entry["plays"].append(plays)  # type: ignore[arg-type]
        fixed = {n: float(np.mean(e["tokens_per_s"])) for n, e in per.items() if n.startswith("fixed:")}
        best = max(fixed, key=lambda n: fixed[n])
        target = per["fixed:none"]["tokens_per_s"]
        row: dict[str, Any] = {"best_fixed_arm": best.removeprefix("fixed:"), "arms": names, "systems": {}}
        for name, e in per.items():
            tps = e["tokens_per_s"]
            regret = [(s - b) / len(lengths) for s, b in zip(e["seconds"], per[best]["seconds"], strict=True)]
            row["systems"][name] = {
                "tokens_per_s": _ci(tps),
                "vs_target_only": round(float(np.mean(tps)) / float(np.mean(target)), 3),
                "vs_best_fixed": round(float(np.mean(tps)) / fixed[best], 3),
                "regret_ms_per_request": _ci([1e3 * r for r in regret]),
                "plays": dict(zip(names, np.mean(e["plays"], axis=0).round(1).tolist(), strict=True)),
            }
        results[str(batch)] = row
    return {"arms": all_names, "arm_widths": all_gammas, "captures_dropped": dropped, "requests": len(lengths),
            "seeds": seeds, "batches": results}


def _relative(path: Path, root: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bandit_replay", description=__doc__.splitlines()[0])
    p.add_argument("--extract", nargs="+", type=Path, help="bench.json files to extract steps from (writes --steps)")
    p.add_argument("--steps", type=Path, default=STEPS, help=f"recorded steps (default {STEPS})")
    p.add_argument("--batches", default="1,2,4,8,16,32")
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--domain-seeds", type=int, default=5, help="seeds of the replay in each run's domain order")
    p.add_argument("--out", type=Path, default=None,
                   help=f"default {OUT.name} in docs/benchmarks, for the default --steps only")
    args = p.parse_args(argv)
    if args.out is None:
        if args.steps.resolve() != STEPS.resolve():  # the committed file replays the committed steps only
            p.error(f"--steps {args.steps} is not the committed recording: give --out (the default, "
                    f"{_relative(OUT, Path(__file__).resolve().parents[2])}, is the committed replay)")
        args.out = OUT
    if args.extract:
        write_json(args.steps, extract(args.extract), indent=None)
    recorded = json.loads(args.steps.read_text())
    result = replay(recorded, [int(b) for b in args.batches.split(",")], args.seeds)
    out = {**provenance("benchmarks/bandit_replay.py"), "config": vars(args),
           "sources": recorded["sources"], **result, "domains": replay_domains(recorded, args.domain_seeds)}
    root = Path(__file__).resolve().parents[2]
    out["config"] = {k: (_relative(v, root) if isinstance(v, Path) else v)
                     for k, v in out["config"].items() if k != "extract"}
    write_json(args.out, out)
    for batch, row in result["batches"].items():
        line = ", ".join(f"{n} {row['systems'][n]['vs_target_only']:.2f}x" for n in ("thompson_per_bucket", "factored"))
        print(f"batch {batch:>2}: best fixed {row['best_fixed_arm']} "
              f"{row['systems']['fixed:' + row['best_fixed_arm']]['vs_target_only']:.2f}x; {line} (vs target only)")
    for batch, row in out["domains"].items():
        for name in ("factored", "factored_per_request"):
            domains = ", ".join(f"{d} {v:.2f}x" for d, v in row["systems"][name]["by_domain"].items())
            print(f"batch {batch:>2} in run order, {name}: {domains}")
    return 0


# ------------------------------------------------------------------ replay in the run's domain order


class Trace:
    """One bench run's fixed-arm recordings: a replayed step of arm ``k`` gives each live row the
    accepted count of ``k``'s recorded step that covered the row's position in the same request
    (greedy decoding writes the same tokens under every arm, so positions line up), and the step
    the time of one of ``k``'s recorded steps at the nearest live-row count, drafting or not as
    the replayed step is (the arm's first step in a batch: one of its recorded first steps of a
    batch, where recorded); each batch also takes the target-only run's time outside its steps."""

    def __init__(self, recorded: dict[str, Any], names: Sequence[str],
                 fallbacks: dict[str, tuple[str, str]] | None = None) -> None:
        self.names = list(names)
        # arm -> (its own recorded arm, the recorded fallback): replayed from the two (:meth:`drafter`)
        self.fallbacks = {self.names.index(n): (self.names.index(a), self.names.index(b))
                          for n, (a, b) in (fallbacks or {}).items()}
        self.batches = recorded["batches"]
        self.outside_s = [ms / 1e3 for ms in recorded.get("outside_ms", [0.0] * len(self.batches))]
        self.steps: list[dict[int, tuple[list[int], list[int], list[int]]]] = []  # per arm: prompt -> starts, acc, widths
        self.times: list[dict[tuple[int, bool], list[float]]] = []  # per arm: (rows, drafts) -> seconds
        self.firsts: list[dict[tuple[int, bool], list[float]]] = []  # the same, of the batches' first steps
        for index, name in enumerate(self.names):
            if index in self.fallbacks:  # nothing of its own: its steps are its two arms'
                self.steps.append({})
                self.times.append({})
                self.firsts.append({})
                continue
            arm = recorded["arms"][name]
            steps = {}
            for prompt, trace in arm["traces"].items():
                steps[int(prompt)] = ([t[0] for t in trace], [t[1] for t in trace], [t[2] for t in trace])
            self.steps.append(steps)
            median = statistics.median(t[2] for t in arm["times"] or arm.get("firsts", []))
            pools: tuple[dict[tuple[int, bool], list[float]], ...] = ({}, {})
            for pool, recorded_steps in zip(pools, (arm["times"], arm.get("firsts", [])), strict=True):
                for rows, width, ms in recorded_steps:
                    if ms <= CAPTURE * median:
                        pool.setdefault((rows, width > 0), []).append(ms / 1e3)
            self.times.append(pools[0])
            self.firsts.append(pools[1])

    def drafter(self, arm: int, prompts: Sequence[int], positions: Sequence[int]) -> int:
        """The recorded arm whose steps a step of ``arm`` over rows at ``positions`` of ``prompts``
        replays: ``arm`` itself, or for an arm with a fallback, its own arm where that proposed for
        any of the rows (its recorded step there had a width), else the fallback (the engine's
        rule: an empty proposal over the whole batch hands the step over)."""
        if arm not in self.fallbacks:
            return arm
        own, fallback = self.fallbacks[arm]
        proposes = any(self.row(own, p, q)[1] > 0 for p, q in zip(prompts, positions, strict=True))
        return own if proposes else fallback

    def row(self, arm: int, prompt: int, position: int) -> tuple[int, int]:
        """Accepted count and width of ``arm``'s recorded step over ``position`` of ``prompt``."""
        starts, acc, width = self.steps[arm][prompt]
        i = max(bisect.bisect_right(starts, position) - 1, 0)
        return acc[i], width[i]

    def step_s(self, arm: int, rows: int, drafts: bool, rng: np.random.Generator, first: bool = False) -> float:
        """One of ``arm``'s recorded step times at the nearest live-row count, drafting or not;
        with ``first``, of its first steps of a batch where those were recorded."""
        times = self.firsts[arm] if first and self.firsts[arm] else self.times[arm]
        key = min(times, key=lambda k: (k[1] != drafts, abs(k[0] - rows), -k[0]))
        pool = times[key]
        return pool[int(rng.integers(len(pool)))]


def run_in_order(make_policy: Callable[[], StepPolicy], trace: Trace,
                 rng: np.random.Generator) -> tuple[dict[str, list[float]], list[int]]:
    """Seconds and tokens per domain, and plays per arm, of the run's batches in its order with
    one policy throughout (its state carried across domains, as in the bench)."""
    policy, plays = make_policy(), [0] * len(trace.names)
    per: dict[str, list[float]] = {}
    for index, batch in enumerate(trace.batches):
        prompts = [q[0] for q in batch]
        domains = [q[1] for q in batch]
        left = [q[2] for q in batch]
        pos = [0] * len(batch)
        for domain in domains:  # the batch's prefill, shared by its rows
            entry = per.setdefault(domain, [0.0, 0.0])
            entry[0] += trace.outside_s[index] / len(batch)
        played: set[int] = set()
        policy.begin(len(batch))
        while any(n > 0 for n in left):
            rows = [b for b, n in enumerate(left) if n > 0]
            plan = policy.choose(rows)
            drafter = trace.drafter(plan.arm, [prompts[b] for b in rows], [pos[b] for b in rows])
            got = [trace.row(drafter, prompts[b], pos[b]) for b in rows]
            width = max(w for _, w in got)
            acc = [min(a, width) for a, _ in got]
            step_s = trace.step_s(drafter, len(rows), width > 0, rng, first=drafter not in played)
            played.add(drafter)
            emitted = 0
            for b, n in zip(rows, acc, strict=True):
                out = min(n + 1, left[b])
                left[b], pos[b] = left[b] - out, pos[b] + out
                emitted += out
                entry = per.setdefault(domains[b], [0.0, 0.0])
                entry[0] += step_s / len(rows)  # a step's time shared by its live rows
                entry[1] += out
            policy.learn(plan, width, acc, step_s, emitted)
            plays[plan.arm] += 1
    return per, plays


def replayed_fallbacks(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """The sweep's arms with a fallback (:data:`~flashspec_bench.arm_sections.SWEEP_FALLBACKS`)
    whose two arms a recording has: replayed from those (:meth:`Trace.drafter`), also where the
    sweep timed the arm itself, whose recorded steps do not say which of the two drafted (a
    step's time would be drawn from both kinds: 2.9 ms for a suffix step, 5.9 ms for a draft
    step at batch 1 on the H100)."""
    return {fallback_name(a, b): (a, b) for a, b in SWEEP_FALLBACKS if a in names and b in names}


def replay_domains(recorded: dict[str, Any], seeds: int) -> dict[str, Any]:
    """Per recorded batch size and domain, each system's tokens/s over target-only, replayed in
    the run's order (domains one after another, selector state carried across them)."""
    out: dict[str, Any] = {}
    for batch, sweep_data in recorded.get("sweeps", {}).items():
        order = [n for n in sweep_data.get("order", []) if n in sweep_data["arms"]]  # the config's: the opening order
        names = order + sorted((n for n in sweep_data["arms"] if n not in order), key=lambda n: (n != "none", n))
        fallbacks = replayed_fallbacks(names)
        names += [n for n in fallbacks if n not in names]
        leads = {lead for lead, _ in fallbacks.values()}  # the sweep times them alone, the bandit never plays them
        shipped = set(BANDIT_ARMS) <= set(names)  # the sweep's bandit chooses among gpu.toml's arms only
        alone = set(names) - set(BANDIT_ARMS) if shipped else leads
        if shipped:  # gpu.toml's arms open first, as they would with more arms added after them
            names = [n for n in names if n in BANDIT_ARMS] + [n for n in names if n not in BANDIT_ARMS]
        trace = Trace(sweep_data, names, fallbacks)
        widest = {n: max(t[1] for t in arm["times"] + arm.get("firsts", [])) for n, arm in sweep_data["arms"].items()}
        gammas = [max(widest[f] for f in fallbacks[n]) if n in fallbacks else widest[n] for n in names]
        per: dict[str, dict[str, list[list[float]]]] = {}
        plays: dict[str, list[list[int]]] = {}
        for seed in range(seeds):
            for name, make in systems(names, gammas, seed, alone, leads).items():
                rng = np.random.default_rng([seed, int(batch)])
                domains, played = run_in_order(make, trace, rng)
                for domain, (seconds, tokens) in domains.items():
                    per.setdefault(name, {}).setdefault(domain, []).append([seconds, tokens])
                plays.setdefault(name, []).append(played)
        tps = {n: {d: float(np.sum([t for _, t in v]) / np.sum([s for s, _ in v])) for d, v in doms.items()}
               for n, doms in per.items()}
        row: dict[str, Any] = {"arms": names, "systems": {}}
        for name, doms in tps.items():
            total = sum(sum(t for _, t in v) for v in per[name].values()) / sum(
                sum(s for s, _ in v) for v in per[name].values())
            none_total = sum(sum(t for _, t in v) for v in per["fixed:none"].values()) / sum(
                sum(s for s, _ in v) for v in per["fixed:none"].values())
            row["systems"][name] = {
                "vs_target_only": round(total / none_total, 3),
                "by_domain": {d: round(v / tps["fixed:none"][d], 3) for d, v in doms.items()},
                "plays": dict(zip(names, np.mean(plays[name], axis=0).round(1).tolist(), strict=True)),
            }
        best = {d: max((n for n in tps if n.startswith("fixed:")), key=lambda n: tps[n][d]) for d in tps["fixed:none"]}
        row["best_fixed_by_domain"] = {d: [n.removeprefix("fixed:"), round(tps[n][d] / tps["fixed:none"][d], 3)]
                                       for d, n in best.items()}
        row["measured"] = sweep_data.get("measured", {})  # the bench's own selector runs, for comparison
        row["static_rows"] = sweep_data.get("static_rows", {})  # what its static batches waited on (sweep)
        out[batch] = row
    return out
