"""One system's timed run: its request and step rows, and what they sum to.

A run is ``{"requests": [...], "steps": [...]}``. A request row: prompt index, domain, new
tokens, the wall time of its batch (``batch``, ``batch_id``), the generated ``tokens``. A step
row: a pipeline ``StepRecord`` as a dict plus ``host_ms`` (step time outside the draft,
target and verify device times).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import attrs
import torch

# bench.json's record of how drafts that learn across requests were timed (harness.own_learners); a
# summary treats a run without it, whose suffix arms had seen the outputs they predicted, as invalid
CROSS_REQUEST_STATE = "reset per system and pass"


BATCH_IDS = itertools.count()  # one id per generate() call, unique across every system of a process


class Always:
    """A selector that always picks one arm (the fixed-arm and target-only runs)."""

    def __init__(self, arm: int, num_arms: int) -> None:
        self.arm, self.num_arms = arm, num_arms

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        """Nothing to learn."""


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def batches(n: int, size: int) -> list[list[int]]:
    """Prompt indices in groups of ``size``; the last group is topped up from the start."""
    groups = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    if groups and len(groups[-1]) < size:
        groups[-1] += [i % n for i in range(size - len(groups[-1]))]
    return groups


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def graph_captures(pipeline: Any) -> int:
    """CUDA graphs the pipeline's fast target, verifier and drafts have captured so far (a
    capture inside a timed batch is setup work timed as decoding: the bench records how many)."""
    caches = {id(g): g for x in (pipeline.target, pipeline.verifier, *(a.provider for a in pipeline.arms))
              if (g := getattr(x, "graphs", None)) is not None}  # arms may share a provider: each cache once
    return sum(int(getattr(g, "captures", 0)) for g in caches.values())


def step_rows(steps: Sequence[Any]) -> list[dict[str, Any]]:
    rows = []
    for r in steps:
        row = attrs.asdict(r)
        row["accepted"] = list(r.accepted)
        row["host_ms"] = max(r.step_ms - r.draft_ms - r.target_ms - r.verify_ms, 0.0)
        rows.append(row)
    return rows


def run_pipeline(pipeline: Any, prompts: list[list[int]], groups: list[list[int]], args: argparse.Namespace,
                 domains: list[str]) -> dict[str, Any]:
    requests, steps = [], []
    for group in groups:
        sync()
        captured = graph_captures(pipeline)
        t0 = time.perf_counter()
        res = pipeline.generate([prompts[i] for i in group], max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, seed=args.seed)
        sync()
        wall = time.perf_counter() - t0
        bid = next(BATCH_IDS)
        captures = graph_captures(pipeline) - captured
        for i, ids in zip(group, res.token_ids, strict=True):
            requests.append({"prompt": i, "domain": domains[i], "new_tokens": len(ids), "wall_s": wall,
                             "batch": group, "batch_id": bid, "tokens": ids, "graph_captures": captures})
        steps.extend(step_rows(res.steps))
    return {"requests": requests, "steps": steps}


def summarize_run(run: dict[str, Any]) -> dict[str, Any]:
    """tokens/s over distinct batches, acceptance per arm and position, step-time breakdown."""
    walls = {r["batch_id"]: r["wall_s"] for r in run["requests"]}
    tokens = sum(r["new_tokens"] for r in run["requests"])
    wall = sum(walls.values())
    out: dict[str, Any] = {"new_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall else None}
    if any("graph_captures" in r for r in run["requests"]):  # per batch, counted once
        out["graph_captures"] = sum({r["batch_id"]: r.get("graph_captures", 0) for r in run["requests"]}.values())
    repeats = sorted({r["repeat"] for r in run["requests"] if "repeat" in r})
    if len(repeats) > 1:  # each timed repeat on its own: the spread the pooled figure hides
        out["tokens_per_s_by_repeat"] = [
            summarize_run({"requests": [r for r in run["requests"] if r.get("repeat") == k]})["tokens_per_s"]
            for k in repeats
        ]
    steps = run.get("steps") or []
    if steps:
        step_ms = [s["step_ms"] for s in steps]
        row_steps = sum(len(s["accepted"]) for s in steps)
        out["steps"] = len(steps)
        out["mean_accepted_length"] = sum(s["emitted"] for s in steps) / max(row_steps, 1)
        out["step_ms_p50"], out["step_ms_p90"] = percentile(step_ms, 0.5), percentile(step_ms, 0.9)
        parts = {k: sum(s[k] for s in steps) / len(steps) for k in ("draft_ms", "target_ms", "verify_ms", "host_ms")}
        out["breakdown_ms"] = parts
        out["host_fraction"] = parts["host_ms"] / (sum(step_ms) / len(steps))
        # Wall time outside the decode steps: prefill, catching the draft up on a new prompt, setup.
        out["outside_steps_ms_per_batch"] = (wall - sum(step_ms) / 1e3) * 1e3 / max(len(walls), 1)
        out["arms"] = arm_stats(steps)
    return out


def arm_stats(steps: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: steps, rows stepped, acceptance rate and acceptance by draft position."""
    arms: dict[str, dict[str, Any]] = {}
    for s in steps:
        a = arms.setdefault(s["arm_name"], {"steps": 0, "gamma": s["gamma"], "row_steps": 0, "accepted": 0, "at": []})
        a["steps"] += 1
        a["row_steps"] += len(s["accepted"])
        a["accepted"] += sum(s["accepted"])
        a["at"].extend([0] * (s["gamma"] - len(a["at"])))
        for n in s["accepted"]:
            for i in range(n):
                a["at"][i] += 1
    for a in arms.values():
        a["acceptance_rate"] = a["accepted"] / (a["gamma"] * a["row_steps"]) if a["gamma"] else None
        a["acceptance_by_position"] = [c / a["row_steps"] for c in a.pop("at")]
        a["mean_accepted_length"] = 1 + a["accepted"] / a["row_steps"]
    return arms


def by_domain(run: dict[str, Any]) -> dict[str, float]:
    """tokens/s per domain (batch 1 runs: each request is its own batch)."""
    acc: dict[str, list[float]] = {}
    for r in run["requests"]:
        t = acc.setdefault(r["domain"], [0.0, 0.0])
        t[0] += r["new_tokens"]
        t[1] += r["wall_s"] / len(r["batch"])
    return {d: n / w for d, (n, w) in acc.items() if w}


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


BASELINES = (("speedup_vs_hf_generate", "hf_eager"), ("speedup_vs_hf_compiled", "hf_compiled"),
             ("speedup_vs_hf_assisted", "hf_assisted"), ("speedup_vs_hf_lookup", "hf_lookup"),
             ("speedup_vs_own_target_only", "target_only"))


def headline(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Ratios over the prompts every compared system ran (the HF baselines may run fewer)."""
    s, runs = result["summaries"], result["runs"]
    spec = [n for n in s if n.startswith(("fixed:", "bandit:")) and s[n].get("tokens_per_s")]
    out: dict[str, Any] = {"batch_size": args.batch_size, "temperature": args.temperature,
                           "max_new_tokens": args.max_new_tokens}
    if not spec:
        return out
    best = max(spec, key=lambda n: s[n]["tokens_per_s"])
    out |= {"best_flashspec": best, "best_flashspec_tokens_per_s": s[best]["tokens_per_s"],
            "mean_accepted_length": s[best]["mean_accepted_length"], "host_fraction": s[best]["host_fraction"]}
    for key, base in BASELINES:
        if s.get(base, {}).get("tokens_per_s"):
            common = {r["prompt"] for r in runs[base]["requests"]}
            mine = summarize_run({"requests": [r for r in runs[best]["requests"] if set(r["batch"]) <= common]})
            theirs = s[base]["tokens_per_s"]
            out[key] = mine["tokens_per_s"] / theirs if mine.get("tokens_per_s") else None
            out[f"{base}_tokens_per_s"] = theirs
    if "exactness" in result:
        out["greedy_identical"] = result["exactness"]["greedy_identical"]
    bandits = [n for n in spec if n.startswith("bandit:")]
    if bandits and s.get("target_only", {}).get("tokens_per_s"):
        # the bandits' own ratios: the goal is about the bandit, whichever config is best
        out["bandit_speedup_vs_own_target_only"] = {
            n: s[n]["tokens_per_s"] / s["target_only"]["tokens_per_s"] for n in bandits}
        if args.batch_size == 1:
            plain = by_domain(runs["target_only"])
            every = {n: {d: v / plain[d] for d, v in by_domain(runs[n]).items() if d in plain} for n in bandits}
            out["bandit_speedup_by_domain"] = every[bandits[0]]  # the config's own selector
            out["bandit_speedup_by_domain_all"] = every
    if result.get("synthetic_scaling"):
        out["synthetic_scaling"] = [{k: r[k] for k in ("label", "target_shape", "acceptance", "gamma",
                                                       "speedup_vs_own_target_only", "spec_step_ms_p50",
                                                       "spec_step_floor_ms")} for r in result["synthetic_scaling"]]
    return out
