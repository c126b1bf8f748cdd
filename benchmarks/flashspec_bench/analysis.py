"""Derived figures behind docs/performance.md and docs/bandits.md, from the raw H200 rows.

Reads the raw file ``benchmarks/e2e_h200.py summarize`` leaves in the ignored
``benchmarks/.results/`` (every request and step row of every section) and writes
``docs/benchmarks/e2e-h200-analysis.json`` (``benchmarks/e2e_analysis.py``): the figures the
pages quote that are not already fields of ``e2e-h200.json``: per batch-1 section, what a
step of each fixed arm costs and gives, its bandwidth floor and each arm's rate per domain;
and the spread between repeats. Each group carries a ``how`` string that says how its numbers
are made; a group whose sections are absent is left out.

A step row has no request id. At batch 1 the steps of a run follow its requests in order,
and a request ends at the first step whose emitted tokens reach its ``new_tokens`` (the
pipeline keeps tokens up to EOS or the cap, but records all it emitted); larger batches
are split the same way row by row, from each step's per-row ``accepted``
(``split_batches``). A run whose rows do not line up is an error, never guessed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashspec_bench.e2e import RAW, floor_table, load_raw
from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_bench.runs import by_domain, summarize_run

Json = dict[str, Any]

B1_SECTIONS = ("b1_greedy", "b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b1_gated_small")


@dataclass(frozen=True)
class Batch:
    """One ``generate()`` call of a run: its request rows and its step rows."""

    requests: list[Json]
    steps: list[Json]


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
    return summarize_run({"requests": list(requests)})["tokens_per_s"]


def spec_names(section: Json) -> list[str]:
    return [n for n in section["runs"] if n.startswith(("fixed:", "bandit:"))]


# --- groups ------------------------------------------------------------------------------


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
                     "per_domain": [by_domain({"requests": [r for r in rs if r.get("repeat") == k]}) for k in reps]}
        if "target_only" in by:
            plain = by["target_only"]["tokens_per_s"]
            for v in by.values():
                v["vs_target_only"] = [a / b for a, b in zip(v["tokens_per_s"], plain, strict=True)]
        out["sections"][name] = {"repeats": len(reps), "systems": by}
    return out if out["sections"] else None


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


def batch_b1(section: Json, name: str) -> Json:
    return {"how": f"{name}'s step rows: what a fixed arm's step costs and gives, the bandwidth floor, and each "
                   "run's arms per request domain",
            "step_economics": step_economics(section), "floor": floor(section),
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
    sections = {k: v for k, v in raw["sections"].items() if v}
    groups: dict[str, Callable[[], Json | None]] = {
        **{n: (lambda n=n: batch_b1(sections[n], n) if n in sections else None) for n in B1_SECTIONS},
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
