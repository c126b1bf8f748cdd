"""Derived figures behind docs/performance.md and docs/bandits.md, from the raw H200 rows.

Reads the raw file ``benchmarks/e2e_h200.py summarize`` leaves in the ignored
``benchmarks/.results/`` (every request and step row of every section) and writes
``docs/benchmarks/e2e-h200-analysis.json`` (``benchmarks/e2e_analysis.py``): the figures the
pages quote that are not already fields of ``e2e-h200.json`` (per-domain rates, per-request
pauses, medians over subsets of steps, the draft's catch-up, bf16 divergence counts, ...).
Each group carries a ``how`` string that says how its numbers are made; a group whose
sections are absent is left out.

A step row has no request id. At batch 1 the steps of a run follow its requests in order,
and a request ends at the first step whose emitted tokens reach its ``new_tokens`` (the
pipeline keeps tokens up to EOS or the cap, but records all it emitted); larger batches
are split the same way row by row, from each step's per-row ``accepted``
(``split_batches``). A run whose rows do not line up is an error, never guessed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashspec_bench.e2e import RAW, cold, floor_table, load_raw
from flashspec_bench.provenance import DOCS, provenance, write_json

Json = dict[str, Any]

PAUSE_MS = 100.0  # time outside a request's steps above this is a pause (a capture or compile), not prefill
SLOW_STEP_MS = 20.0  # a step this long is an outlier at these shapes (the slowest regular step is ~11 ms)
DRAFTED_MS = 1.0  # batch 1: longer than any lookup search (<= 0.7 ms), shorter than any draft (>= 3.9 ms)
B1_SECTIONS = ("b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b1_gated_small")
BATCHED_SECTIONS = ("b2_greedy", "b4_greedy", "b8_greedy", "b32_greedy")


@dataclass(frozen=True)
class Batch:
    """One ``generate()`` call of a run: its request rows and its step rows."""

    requests: list[Json]
    steps: list[Json]

    @property
    def outside_ms(self) -> float:
        """Wall time of the call not spent in its decode steps (prefill, setup, pauses)."""
        return self.requests[0]["wall_s"] * 1e3 - sum(s["step_ms"] for s in self.steps)


def split_batches(run: Json) -> list[Batch]:
    """The run's steps, cut into its batches (see the module docstring)."""
    calls: dict[int, list[Json]] = {}
    for r in run["requests"]:
        calls.setdefault(r["batch_id"], []).append(r)
    steps, out, i = run.get("steps") or [], [], 0
    for reqs in calls.values():
        got, start = [0] * len(reqs), i
        while active := [k for k, r in enumerate(reqs) if got[k] < r["new_tokens"]]:
            if i >= len(steps) or len(steps[i]["accepted"]) != len(active):
                raise ValueError(f"step {i} does not line up with batch {reqs[0]['batch_id']}")
            for k, a in zip(active, steps[i]["accepted"], strict=True):
                got[k] += a + 1
            i += 1
        out.append(Batch(reqs, steps[start:i]))
    if i != len(steps):
        raise ValueError(f"{len(steps) - i} step rows left over after the last batch")
    return out


def tokens_per_s(requests: Iterable[Json]) -> float:
    """New tokens over the wall time of the distinct batches (as ``summarize_run``)."""
    reqs = list(requests)
    walls = {r["batch_id"]: r["wall_s"] for r in reqs}
    return sum(r["new_tokens"] for r in reqs) / sum(walls.values())


def per_domain_tps(requests: Iterable[Json]) -> dict[str, float]:
    """tokens/s per domain at batch 1 (as :func:`flashspec_bench.runs.by_domain`)."""
    acc: dict[str, list[Json]] = {}
    for r in requests:
        acc.setdefault(r["domain"], []).append(r)
    return {d: tokens_per_s(rs) for d, rs in acc.items()}


def runs_draft(arm_name: str) -> bool:
    """The arm can run the 0.5B draft (a draft arm, or lookup falling back to the draft)."""
    return "draft" in arm_name


def ran(step: Json, draft_arm: str) -> bool:
    """The step ran ``draft_arm``'s provider: that arm, or an arm falling back to it that drafted.

    Whether a fallback step drafted is read from its draft time, which tells a draft from a
    lookup search only with one row (in a batch of 32 a search took up to 5.7 ms), so a
    fallback step with more rows never counts as drafting."""
    return step["arm_name"] == draft_arm or (step["arm_name"].endswith(f"-or-{draft_arm}")
                                             and step["batch_size"] == 1 and step["draft_ms"] > DRAFTED_MS)


def spec_names(section: Json) -> list[str]:
    return [n for n in section["runs"] if n.startswith(("fixed:", "bandit:"))]


def bandit_names(section: Json) -> list[str]:
    return [n for n in section["runs"] if n.startswith("bandit:")]


def draft_arms(section: Json) -> list[str]:
    """The draft-only arms that ran in the section, e.g. ``draft0.5b-g3``."""
    names = {s["arm_name"] for run in section["runs"].values() for s in run.get("steps") or []}
    return sorted(n for n in names if n.startswith("draft"))


# --- groups ------------------------------------------------------------------------------


def overview(sections: dict[str, Json]) -> Json:
    envs = [json.dumps(s["environment"], sort_keys=True) for s in sections.values()]
    per = {}
    for name, sec in sections.items():
        rows = max(sec["runs"].values(), key=lambda r: len(r["requests"]))["requests"]
        prompts = {r["prompt"]: r["domain"] for r in rows}
        per[name] = {"rows": len(rows), "prompts": len(prompts), "prompts_per_domain": dict(Counter(prompts.values()))}
    return {"how": "sections that ran; environments compared as whole records; rows and distinct prompts of the "
                   "section's largest run, prompts counted per domain",
            "sections": len(sections), "distinct_environments": len(set(envs)), "per_section": per}


def outside_steps(sections: dict[str, Json]) -> Json:
    out: Json = {"how": f"per batch: wall time minus the sum of its step times, ms; pauses are batches above "
                        f"{PAUSE_MS:g} ms (a capture or compile inside the timed run)", "sections": {}}
    for name, sec in sections.items():
        if sec["args"].get("batch_size", 1) != 1 or "target_only" not in sec["runs"]:
            continue
        plain = split_batches(sec["runs"]["target_only"])
        pauses = [{"system": n, "prompt": b.requests[0]["prompt"], "ms": b.outside_ms}
                  for n, run in sec["runs"].items() if run.get("steps")
                  for b in split_batches(run) if b.outside_ms > PAUSE_MS]
        out["sections"][name] = {"target_only_ms_per_request": span(b.outside_ms for b in plain), "pauses": pauses}
    return out


def vs_target_only(sections: dict[str, Json]) -> Json:
    out: Json = {"how": "tokens/s / target-only tokens/s per system (whole section, as summarize_run), and its min "
                        "and max over a section's fixed arms and over its bandits", "sections": {}}
    for name, sec in sections.items():
        if "target_only" not in sec["summaries"]:
            continue
        plain = sec["summaries"]["target_only"]["tokens_per_s"]
        r = {n: sec["summaries"][n]["tokens_per_s"] / plain for n in spec_names(sec)}
        out["sections"][name] = {"systems": r, "fixed": span(v for n, v in r.items() if n.startswith("fixed:")),
                                 "bandits": span(v for n, v in r.items() if n.startswith("bandit:"))}
    return out


def repeats(sections: dict[str, Json]) -> Json | None:
    """Sections timed more than once (request rows carry ``repeat``): tokens/s per repeat and
    per system, each repeat over target-only's in the same repeat, and per domain per repeat."""
    out: Json = {"how": "per section timed in repeats: per system, tokens/s of each repeat (as summarize_run) and "
                        "(max - min) / median over the repeats (spread); vs_target_only: each repeat over "
                        "target-only's same repeat; per_domain: tokens/s per domain per repeat", "sections": {}}
    for name, sec in sections.items():
        runs = {n: r["requests"] for n, r in sec["runs"].items() if r.get("requests") and r.get("steps")}
        reps = sorted({r["repeat"] for rs in runs.values() for r in rs if "repeat" in r})
        if len(reps) < 2:
            continue
        by: Json = {}
        for n, rs in runs.items():
            tps = [tokens_per_s(r for r in rs if r.get("repeat") == k) for k in reps]
            by[n] = {"tokens_per_s": tps, "spread": (max(tps) - min(tps)) / statistics.median(tps),
                     "per_domain": [per_domain_tps(r for r in rs if r.get("repeat") == k) for k in reps]}
        if "target_only" in by:
            plain = by["target_only"]["tokens_per_s"]
            for v in by.values():
                v["vs_target_only"] = [a / b for a, b in zip(v["tokens_per_s"], plain, strict=True)]
        out["sections"][name] = {"repeats": len(reps), "systems": by}
    return out if out["sections"] else None


def per_domain(section: Json) -> Json:
    tps = {n: per_domain_tps(run["requests"]) for n, run in section["runs"].items() if run.get("steps")}
    plain = tps["target_only"]
    return {"how": "tokens/s over each domain's requests (batch 1: each request its own batch), and over "
                   "target-only's in the same domain",
            "tokens_per_s": tps, "vs_target_only": {n: {d: v / plain[d] for d, v in t.items()} for n, t in tps.items()}}


def host_fraction(sections: dict[str, Json]) -> Json:
    rows = [(v["host_fraction"], name, n) for name, sec in sections.items() for n, v in sec["summaries"].items()
            if v.get("host_fraction") is not None]
    worst = max(rows)
    per = {name: max(f for f, s, _ in rows if s == name) for name in sections if any(s == name for _, s, _ in rows)}
    return {"how": "summaries[...].host_fraction (mean host ms / mean step ms): the largest per section and overall",
            "max": worst[0], "max_section": worst[1], "max_system": worst[2], "max_per_section": per}


def step_economics(section: Json) -> Json:
    """What a step of each fixed arm costs and emits, in target-only steps."""
    s = section["summaries"]
    plain, fwd = s["target_only"]["step_ms_p50"], s["target_only"]["breakdown_ms"]["target_ms"]
    arms: Json = {}
    for n in spec_names(section):
        if not n.startswith("fixed:"):
            continue
        v, gamma = s[n], next(iter(s[n]["arms"].values()))["gamma"]
        cost = v["step_ms_p50"] / plain
        arms[n] = {"step_p50_over_target_only_p50": cost, "tokens_per_step": v["mean_accepted_length"],
                   "tokens_per_target_only_step_time": v["mean_accepted_length"] / cost,
                   "target_ms_over_target_only": v["breakdown_ms"]["target_ms"] / fwd}
        if n.removeprefix("fixed:").startswith("draft"):
            arms[n]["draft_ms_per_token"] = v["breakdown_ms"]["draft_ms"] / gamma
            arms[n]["draft_token_over_target_forward"] = v["breakdown_ms"]["draft_ms"] / gamma / fwd
    rate = {n: sum(x["emitted"] for x in run["steps"]) / sum(x["step_ms"] for x in run["steps"])
            for n, run in section["runs"].items() if n == "target_only" or n.startswith("fixed:")}
    return {"how": "per fixed arm: step p50 / target-only step p50; mean accepted length (tokens per step) divided "
                   "by that; mean draft ms / gamma, and over target-only's mean target-forward ms; "
                   "tokens_per_step_ms: emitted tokens / summed step ms of the run",
            "target_only_step_p50_ms": plain, "target_only_target_ms": fwd, "arms": arms,
            "tokens_per_step_ms": rate}


def floor(section: Json) -> Json:
    fl = section["floor"]
    draft = next((a["draft_forward_bytes"] for a in fl["arms"].values() if a.get("draft_forward_bytes")), None)
    return {"how": "flashspec_bench.e2e.floor_table on this section: bytes a step reads / the copy bandwidth "
                   "measured in the same run; draft_over_target_bytes: one draft forward's bytes / one target "
                   "forward's", "bandwidth_bytes_per_s": section["bandwidth_bytes_per_s"],
            "rows": floor_table(section),
            "draft_over_target_bytes": draft / fl["target_forward_bytes"] if draft else None}


def slow_steps(section: Json, names: Sequence[str]) -> Json:
    out = {}
    for n in names:
        steps = section["runs"][n]["steps"]
        slow = [s for s in steps if s["step_ms"] > SLOW_STEP_MS]
        out[n] = {"count": len(slow), "ms": sum(s["step_ms"] for s in slow), "all_step_ms": sum(s["step_ms"] for s in steps),
                  "steps": [{"arm": s["arm_name"], "ms": s["step_ms"]} for s in slow]}
    return out


def arm_mix(section: Json) -> Json:
    """Steps and step time each bandit gave the arms that can run the draft, and `none`."""
    out = {}
    for n in bandit_names(section):
        steps = section["runs"][n]["steps"]
        total = sum(s["step_ms"] for s in steps)
        d = [s for s in steps if runs_draft(s["arm_name"])]
        only = [s for s in d if s["arm_name"].startswith("draft")]
        out[n] = {"steps": len(steps), "draft_arm_step_share": len(d) / len(steps),
                  "draft_arm_time_share": sum(s["step_ms"] for s in d) / total,
                  "draft_only_arm_steps": len(only), "draft_only_arm_step_share": len(only) / len(steps),
                  "draft_only_arm_time_share": sum(s["step_ms"] for s in only) / total,
                  "none_step_share": sum(s["arm_name"] == "none" for s in steps) / len(steps)}
    return out


def catch_up(section: Json, names: Sequence[str], arms: Sequence[str] | None = None) -> Json:
    """Draft steps of the ``names`` runs after a step that ran the same draft, and after one
    that did not, per draft arm (default: every draft-only arm of the section)."""
    base = median(s["step_ms"] for s in section["runs"]["target_only"]["steps"]) if "target_only" in section["runs"] else None
    out: Json = {}
    for arm in draft_arms(section) if arms is None else arms:
        cls: dict[str, list[Json]] = {"after_same_draft": [], "after_other": []}
        for n in names:
            for b in split_batches(section["runs"][n]):
                for prev, s in zip(b.steps, b.steps[1:], strict=False):
                    if ran(s, arm):
                        cls["after_same_draft" if ran(prev, arm) else "after_other"].append(s)
        rec: Json = {}
        for k, steps in cls.items():
            rows = sum(len(s["accepted"]) for s in steps)
            rec[k] = {"steps": len(steps), "draft_ms_median": median(s["draft_ms"] for s in steps),
                      "step_ms_median": median(s["step_ms"] for s in steps),
                      "tokens_per_row": sum(s["emitted"] for s in steps) / rows if rows else None}
            if base and steps:
                rec[k]["step_over_target_only_median"] = rec[k]["step_ms_median"] / base
        same = rec["after_same_draft"]["draft_ms_median"]
        rec["extra_draft_s"] = (sum(s["draft_ms"] - same for s in cls["after_other"]) / 1e3
                                if same is not None else None)
        fixed = section["runs"].get(f"fixed:{arm}")
        if fixed:
            rec["fixed_run"] = {"draft_ms_median": median(s["draft_ms"] for s in fixed["steps"]),
                                "step_ms_median": median(s["step_ms"] for s in fixed["steps"])}
        out[arm] = rec
    return out


CATCH_UP_HOW = (f"steps that ran a draft arm's provider (the arm itself, or, with one row, a lookup arm falling "
                f"back to it that spent over {DRAFTED_MS:g} ms drafting), split by whether the previous step of the same batch ran "
                "it too; the first step of a batch is in neither class. A draft that did not run on the previous "
                "step first catches up on the tokens emitted since (flashspec_fast.draft). extra_draft_s: the "
                "summed draft ms of the after_other steps above the after_same_draft median")


def pooled_arms(section: Json, names: Sequence[str]) -> Json:
    """Per arm, pooled over the given runs: medians and tokens per row, against target-only's median step."""
    plain = section["runs"]["target_only"]["steps"]
    base = statistics.median(s["step_ms"] for s in plain)
    out: Json = {"target_only": {"step_ms_median": base, "target_ms_median": median(s["target_ms"] for s in plain)}}
    pool: dict[str, list[Json]] = {}
    for n in names:
        for s in section["runs"][n]["steps"]:
            pool.setdefault(s["arm_name"], []).append(s)
    for arm, steps in sorted(pool.items()):
        step = statistics.median(s["step_ms"] for s in steps)
        out[arm] = {"steps": len(steps), "draft_ms_median": median(s["draft_ms"] for s in steps),
                    "target_ms_median": median(s["target_ms"] for s in steps), "step_ms_median": step,
                    "step_over_target_only_median": step / base,
                    "tokens_per_row": sum(s["emitted"] for s in steps) / sum(len(s["accepted"]) for s in steps)}
    return out


def warm_b1(sections: dict[str, Json]) -> str | None:
    """The batch-1 greedy section timed warm: b1_greedy_warm (a re-run of a cold b1_greedy), or
    b1_greedy itself when it warmed up on every batch (``--warmup -1``)."""
    if "b1_greedy_warm" in sections:
        return "b1_greedy_warm"
    b1 = sections.get("b1_greedy")
    return "b1_greedy" if b1 and not cold(b1) else None


def batch_b1(section: Json, name: str) -> Json:
    return {"how": f"{name}'s step rows: per domain, per step, against the floor, the bandits' arms, and "
                   "per system the share of steps that proposed no token with their median times (plain_steps)",
            "per_domain": per_domain(section),
            "plain_steps": plain_steps(section),
            "step_economics": step_economics(section),
            "floor": floor(section),
            "bandits": {"how": f"per bandit run (arm_mix): share of steps and of step time on the arms that can run "
                               f"the draft (draft or fallback arms) and on the draft-only arms, share of `none` steps; "
                               f"steps over {SLOW_STEP_MS:g} ms (slow_steps)",
                        "arm_mix": arm_mix(section), "slow_steps": slow_steps(section, bandit_names(section))},
            "catch_up": {"how": CATCH_UP_HOW + "; pooled over the section's bandits", **catch_up(section, bandit_names(section))},
            "arm_rates_by_domain": arm_rates_by_domain(section)}


def arm_rates_by_domain(section: Json) -> Json:
    """Batch 1: per system, request domain and arm_name, what the arm's steps cost and gave: a
    domain where no arm's tokens per step ms beats a plain step's caps what any selector can earn there."""
    out: Json = {"how": "split_batches (batch 1: one request per batch): per run, request domain and step arm_name, "
                        "steps, mean step ms, mean draft ms (CUDA-event interval before the target forward: the "
                        "lookup search, the selector's draw and the draft), mean tokens per step, and tokens per "
                        "step ms (emitted tokens / summed step ms)", "runs": {}}
    for n, run in section["runs"].items():
        if not run.get("steps"):
            continue
        acc: dict[str, dict[str, list[Json]]] = {}
        for b in split_batches(run):
            for s in b.steps:
                acc.setdefault(b.requests[0]["domain"], {}).setdefault(s["arm_name"], []).append(s)
        out["runs"][n] = {
            d: {a: {"steps": len(ss), "step_ms_mean": sum(s["step_ms"] for s in ss) / len(ss),
                    "draft_ms_mean": sum(s["draft_ms"] for s in ss) / len(ss),
                    "tokens_per_step": sum(s["emitted"] for s in ss) / len(ss),
                    "tokens_per_step_ms": sum(s["emitted"] for s in ss) / sum(s["step_ms"] for s in ss)}
                for a, ss in sorted(arms.items())}
            for d, arms in sorted(acc.items())}
    return out


def batched(section: Json) -> Json:
    """b2/b4/b8/b32_greedy: bandits only, so pooled over them."""
    names = bandit_names(section)
    plain = section["runs"]["target_only"]["steps"]
    plain_ms = sum(s["step_ms"] for s in plain)
    slow = slow_steps(section, names)
    for v in slow.values():
        v["ms_over_target_only_step_ms_total"] = v["ms"] / plain_ms
    out = {"how": f"step rows pooled over the bandits, per arm (medians; tokens per row = emitted / rows stepped); "
                  f"target-only's median step as the unit; steps over {SLOW_STEP_MS:g} ms per bandit, and their ms "
                  f"over all of target-only's step ms; over_hf_batch: each system over the batches with the rows "
                  f"hf_eager ran, against hf_eager; plain_steps: per system (in the bench's order), the share of "
                  f"steps that proposed no token (target-only, the batch limit, a lookup without a match) and "
                  f"their median target-forward and step ms",
           "target_only_steps": len(plain), "target_only_step_ms_total": plain_ms,
           "plain_steps": plain_steps(section),
           "pooled_arms": pooled_arms(section, names), "arm_mix": arm_mix(section), "slow_steps": slow,
           "catch_up": {"how": CATCH_UP_HOW, **catch_up(section, names)}}
    hf = section["runs"].get("hf_eager")
    if hf and hf["requests"]:
        rows = {tuple(r["batch"]) for r in hf["requests"]}
        base = tokens_per_s(hf["requests"])
        out["over_hf_batch"] = {n: tokens_per_s(r for r in run["requests"] if tuple(r["batch"]) in rows) / base
                                for n, run in section["runs"].items() if run.get("steps")}
    return out


def plain_steps(section: Json) -> Json:
    out = {}
    for n, run in section["runs"].items():
        if not run.get("steps"):
            continue
        plain = [s for s in run["steps"] if s["gamma"] == 0]
        out[n] = {"steps": len(run["steps"]), "plain_share": len(plain) / len(run["steps"]),
                  "plain_target_ms_median": median(s["target_ms"] for s in plain),
                  "plain_step_ms_median": median(s["step_ms"] for s in plain)}
    return out


def synthetic(summary: Json) -> Json | None:
    rows = summary.get("scaling_synthetic")
    if not rows:
        return None
    extra = [r["spec_step_ms_p50"] - r["target_only_step_ms_p50"] for r in rows]
    shapes = {r["target_shape"]: r["target_only_step_ms_p50"] / r["target_forward_floor_ms"] for r in rows}
    return {"how": "summary.scaling_synthetic: speculative step p50 minus target-only step p50 per row; target-only "
                   "step p50 / target forward floor per shape", "spec_minus_target_only_step_ms": span(extra),
            "target_only_over_floor": shapes}


def oracle(policies: dict[str, Json], tokens: dict[str, int], names: Sequence[str]) -> Json:
    """The best of ``names`` per domain, chosen after the fact (as e2e_h200.workload_summary)."""
    arm = {d: max(names, key=lambda n: policies[n]["per_domain"][d]) for d in tokens}
    time = sum(t / policies[arm[d]]["per_domain"][d] for d, t in tokens.items())
    return {"arms": arm, "tps": sum(tokens.values()) / time}


def workload(summary: Json, sections: dict[str, Json]) -> Json:
    out: Json = {"how": "summary.workload_gpu(_adaptive, _gated).policies: ranges of the bandits' tokens/s per order and as "
                        "fractions of the best fixed arm; every policy over target-only; the oracle over the "
                        "selectable arms only (best per domain, after the fact)"}
    g = summary.get("workload_gpu")
    if g:
        pol = g["policies"]
        by_order = {o: [v["tps"] for k, v in pol.items() if k.endswith(f"@{o}")] for o in ("interleaved", "blocked")}
        out["all_arms"] = {o: {"tps": span(v), "vs_best_fixed": span(x / g["best_fixed_tps"] for x in v)}
                           for o, v in by_order.items() if v}
    a, sec = summary.get("workload_gpu_adaptive"), sections.get("workload_adaptive")
    if a and sec:  # the selector's arms: the config's selectable ones (the draft is only a fallback)
        selectable = [f"fixed:{arm['name']}" for arm in tomllib.loads(sec["config"])["arm"] if arm.get("select", True)]
        out["two_arms"] = two_policies(a, sec, selectable)
    g, sec = summary.get("workload_gpu_gated"), sections.get("workload_gated")
    if g and sec:  # [selector] first: each fixed system is "lookup, else that arm" (target-only aside)
        out["gated"] = two_policies(g, sec, [k for k in g["policies"] if k.startswith("fixed:")])
    return out


def two_policies(summary: Json, sec: Json, selectable: Sequence[str]) -> Json:
    """The bandits' spread per order against the best fixed system, every policy over
    target-only, and the oracle over the policies the selector chooses between."""
    pol = summary["policies"]
    plain = pol["target_only"]["tps"]
    tokens: Counter[str] = Counter()
    for r in sec["runs"]["target_only"]["requests"]:
        tokens[r["domain"]] += r["new_tokens"]
    two = oracle(pol, dict(tokens), selectable)
    best = max(v["tps"] for k, v in pol.items() if k.startswith("fixed:"))
    orders = {o: [v["tps"] for k, v in pol.items() if k.endswith(f"@{o}")] for o in ("interleaved", "blocked")}
    return {"by_order": {o: {"tps": span(v), "vs_best_fixed": span(x / best for x in v)} for o, v in orders.items() if v},
            "vs_target_only": {k: v["tps"] / plain for k, v in pol.items()},
            "bandits_vs_target_only": span(v["tps"] / plain for k, v in pol.items() if k.startswith("bandit")),
            "oracle_vs_target_only": summary["oracle_tps"] / plain,
            "selectable_arms": list(selectable), "selectable_oracle": two,
            "best_selector_vs_selectable_oracle": summary["best_selector_tps"] / two["tps"]}


def bf16(sections: dict[str, Json]) -> Json:
    out: Json = {"how": "sections.*.bf16_divergence (greedy bf16 speculative tokens against target-only's, per "
                        "system and prompt): runs that diverged, prompts diverged in at least one system, and the "
                        "target's top-2 logit gap at each first divergence in bf16 spacings of the top logit "
                        "(rounded); target_only_token_differences: prompts whose greedy target-only tokens differ "
                        "between two sections that ran the same prompts with the same target", "sections": {}}
    for name, sec in sections.items():
        div = sec.get("bf16_divergence")
        if not div:
            continue
        rows = [r for rs in div.values() for r in rs]
        if not rows:  # batch > 1: the bench compares batch-1 rows only
            continue
        hit = [r for r in rows if r["first_divergence"] is not None]
        gaps = Counter(round(r["top2_gap"] / r["bf16_spacing"]) for r in hit if r.get("top2_gap") is not None)
        out["sections"][name] = {"prompt_runs": len(rows), "diverged": len(hit),
                                 "prompts": len({r["prompt"] for r in rows}),
                                 "prompts_diverged": len({r["prompt"] for r in hit}),
                                 "gap_in_spacings": {str(k): v for k, v in sorted(gaps.items())}}
    pairs = {}
    for a, b in (("b1_greedy", "b1_greedy_warm"), ("workload_interleaved", "workload_adaptive")):
        if a in sections and b in sections and "target_only" in sections[a]["runs"] and "target_only" in sections[b]["runs"]:
            ta = {r["prompt"]: r["tokens"] for r in sections[a]["runs"]["target_only"]["requests"]}
            tb = {r["prompt"]: r["tokens"] for r in sections[b]["runs"]["target_only"]["requests"]}
            common = sorted(set(ta) & set(tb))
            pairs[f"{a} vs {b}"] = {"prompts": len(common), "differ": sum(ta[p] != tb[p] for p in common)}
    out["target_only_token_differences"] = pairs
    return out


# --- driver ------------------------------------------------------------------------------


def median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def span(xs: Iterable[float]) -> dict[str, float] | None:
    xs = list(xs)
    return {"min": min(xs), "max": max(xs)} if xs else None


def rounded(x: Any, digits: int = 6) -> Any:
    if isinstance(x, float):
        return round(x, digits)
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x


def analyse(raw: Json) -> Json:
    summary = raw["summary"]
    sections = {k: v for k, v in raw["sections"].items() if v}
    b1 = warm_b1(sections)
    groups: dict[str, Callable[[], Json | None]] = {
        "overview": lambda: overview(sections),
        "outside_steps": lambda: outside_steps(sections),
        "vs_target_only": lambda: vs_target_only(sections),
        "host_fraction": lambda: host_fraction(sections),
        "b1_greedy": lambda: batch_b1(sections[b1], b1) if b1 else None,
        **{n: (lambda n=n: batch_b1(sections[n], n) if n in sections else None) for n in B1_SECTIONS},
        **{n: (lambda n=n: batched(sections[n]) if n in sections else None) for n in BATCHED_SECTIONS},
        "synthetic": lambda: synthetic(summary),
        "workload": lambda: workload(summary, sections),
        "bf16_divergence": lambda: bf16(sections),
        "repeats": lambda: repeats(sections),
    }
    return {k: v for k, f in groups.items() if (v := f()) is not None}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--raw", type=Path, default=RAW, help="the raw rows e2e_h200.py summarize wrote (git-ignored)")
    p.add_argument("--out", type=Path, default=DOCS / "e2e-h200-analysis.json")
    args = p.parse_args(argv)
    raw = load_raw(args.raw)
    result = {**provenance("benchmarks/e2e_analysis.py"),
              "source": {"raw": args.raw.name, "measured_at_commit": raw["summary"].get("measured_at_commit")},
              **analyse(raw)}
    write_json(args.out, rounded(result))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
