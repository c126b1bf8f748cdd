"""Host time per decode step of the factored bandit beside target-only decoding, on the CPU.

    python benchmarks/bandit_host_cost.py [--batches 1,8,16,32] [--scenarios held,lost] [--tokens 48]
        [--requests 3]
        [--label after] [--commit SHA] [--out FILE]

Over the tiny random models (:mod:`flashspec_core.testing.tiny`: a four-layer fast target of
64 tokens, float32, one torch thread, EOS ignored), one pipeline carries the arms of the H200
batch sweep (suffix g8, self-drafts of one and two layers at g3, prompt lookups g6 and g12
with three branches, a perturbed copy of the target at g3, and ``none``) under the
``factored`` selector, and is timed against the same target with the ``none`` arm alone. At
each batch size both systems decode ``--requests`` batches in turn (A B, then B A), the bandit
carrying its selector from batch to batch as the bench does within a repeat, after one
untimed batch each. Scenarios, for the bandit's selector at the start of a batch size:
``held``: primed with plain steps only, timed as the H200 sweep's plain steps (2.0 ms and
0.01 ms per row), so that, as there at 16 and 32 rows, the opening gate holds every draft
back (one arm played, six held back; on this CPU an untrained one would open them, its
steps' cost barely growing with the rows); ``lost``: primed
(:func:`prime`) with steps of every arm in which no draft was accepted, so that the drafts
are played and lose the Thompson draw (seven arms played). ``host_ms`` of a step: the time from its start to the next step's start
less the target's forward and the verifier (the same work in both systems, at the same
width, in a step that drafts nothing); it is reported over the steps that played ``none``,
the only steps comparable with target-only's. ``policy_ms``: the CPU time of the step
policy's calls in the step (``plan``, ``propose``, ``draw_next``, ``commit``: the choice, the
rollbacks, the selector's update), which on a shared machine varies far less than the wall
clock. ``none_share`` says how many steps played ``none``; ``extra_*``: the bandit's none
steps less target-only's steps.

With ``--out`` and a file already there, the run is stored under ``runs[label]`` beside the
others (``before``: the same script run with an older checkout first on ``PYTHONPATH``;
``--commit`` names it). docs/benchmarks/bandit-host-cost-cpu.json is the committed result.
The numbers are this CPU's: they rank host costs, not a GPU's step.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

EXTRA = ("extra_host_ms_median", "extra_policy_ms_median", "extra_policy_ms_mean")
POLICY_CALLS = ("plan", "propose", "draw_next", "commit")  # the step policy's calls in a step
FAST = {"dtype": "float32", "device": "cpu", "max_len": 256, "compile": False}


def build(root: Path) -> Any:
    """The pipeline over the tiny models with the sweep's arms, EOS ignored."""
    import torch

    from flashspec_core.build import build_pipeline
    from flashspec_core.testing.tiny import perturbed_lm, tiny_lm

    target = tiny_lm(root / "target", vocab=64, seed=0, scale=8.0, layers=4, dtype=torch.float32)
    close = perturbed_lm(target, root / "close", noise=0.05, seed=1)
    pipeline = build_pipeline({
        "target": {"use": "fast", "model": str(target), "chat_template": False, **FAST},
        "arm": [
            {"use": "suffix", "gamma": 8, "name": "suffix-g8"},
            {"use": "self", "layers": 1, "gamma": 3, "name": "self-l1-g3"},
            {"use": "self", "layers": 2, "gamma": 3, "name": "self-l2-g3"},
            {"use": "prompt_lookup", "gamma": 6, "min_ngram": 2, "fill": False, "name": "lookup-match-g6"},
            {"use": "prompt_lookup", "gamma": 12, "min_ngram": 2, "fill": False, "branches": 3,
             "name": "lookup-match-g12-b3"},
            {"use": "fast", "model": str(close), "gamma": 3, "name": "draft-g3", **FAST},
            {"use": "none", "name": "none"},
        ],
        "verifier": {"use": "auto"},
        "selector": {"use": "factored", "reward": "throughput"},
    })
    target_ = pipeline.target  # this target only: a subclass whose EOS set is empty
    target_.__class__ = type(f"NoEos{type(target_).__name__}", (type(target_),), {"eos_token_ids": frozenset()})
    return pipeline


def prompts(batch: int) -> list[list[int]]:
    """``batch`` prompts of 24 tokens, each repeating a phrase (so lookups and the suffix tree match)."""
    return [[(5 * b + i) % 60 + 2 for i in range(8)] * 3 for b in range(batch)]


def timed(pipeline: Any, ids: list[list[int]], tokens: int) -> list[tuple[str, float, float]]:
    """Decode ``ids``; per step but the last: its arm, its ``host_ms`` and its ``policy_ms``
    (module docstring)."""
    starts: list[float] = []
    spent: list[float] = [0.0]
    policy, inner = pipeline.policy, pipeline.step

    def step(*args: Any, **kwargs: Any) -> Any:
        starts.append(time.perf_counter())
        spent.append(0.0)
        return inner(*args, **kwargs)

    def clocked(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()  # CPU time: another process's load does not count
            try:
                return method(*args, **kwargs)
            finally:
                spent[-1] += time.thread_time() - t0
        return call

    pipeline.step = step
    for name in POLICY_CALLS:
        setattr(policy, name, clocked(getattr(policy, name)))
    try:
        steps = pipeline.generate(ids, max_new_tokens=tokens).steps
    finally:
        del pipeline.step
        for name in POLICY_CALLS:
            delattr(policy, name)
    return [(r.arm_name, (starts[i + 1] - starts[i]) * 1e3 - r.target_ms - r.verify_ms, spent[i + 1] * 1e3)
            for i, r in enumerate(steps[:-1])]


def prime(selector: Any, gammas: list[int], rows: int, plays: int = 8, step_s: float = 2e-3) -> Any:
    """``selector`` after ``plays`` steps of each arm at ``rows`` rows in which no draft was
    accepted, a draft's step 1.5 times the plain one's: the regime of the H200 sweep at 16 rows,
    where plain decoding wins, so that the bandit's steps play ``none`` and compare with
    target-only's (the tiny models' drafts would win on this CPU)."""
    selector.see_widths(gammas)
    selector.see_rows(rows)
    for _ in range(plays):
        for arm, gamma in enumerate(gammas):
            selector.observe(arm, rows, gamma, [0] * rows, step_s * (1.5 if gamma else 1.0))
            selector.update(arm, 0.5)
    return selector


def hold(selector: Any, gammas: list[int], rows: int, plays: int = 64) -> Any:
    """``selector`` after ``plays`` plain steps at ``rows`` rows and as many at one row, each
    timed as the H200 sweep's plain steps (2.0 ms, and 0.01 ms per row): drafts not played."""
    selector.see_widths(gammas)
    plain = gammas.index(0)
    for _ in range(plays):
        for n in (1, rows):
            selector.see_rows(n)
            selector.observe(plain, n, 0, [0] * n, 2.0e-3 + 1.0e-5 * n)
            selector.update(plain, 0.5)
    selector.see_rows(rows)
    return selector


def one_batch_size(pipeline: Any, batch: int, tokens: int, requests: int, scenario: str) -> dict[str, Any]:
    """Both systems at ``batch`` rows, taking turns; their none steps' host times."""
    from flashspec_bench.harness import Always
    from flashspec_core.policy import Arm, NoDraft

    arms, fresh = list(pipeline.arms), copy.deepcopy(pipeline.selector)
    plain = [Arm(name="none", provider=NoDraft(), gamma=0)]
    selector = copy.deepcopy(fresh)  # carried from batch to batch
    gammas = [a.gamma for a in arms]
    if scenario == "held":
        hold(selector, gammas, batch)
    elif scenario == "lost":
        prime(selector, gammas, batch)
    ids = prompts(batch)
    primed = getattr(selector, "refits", 0)

    def run(system: str, n: int) -> list[tuple[str, float, float]]:
        pipeline.arms, pipeline.selector = (plain, Always(0, 1)) if system == "target_only" else (arms, selector)
        return timed(pipeline, ids, n)

    for system in ("target_only", "bandit"):  # untimed: allocations, first calls
        run(system, 2)
    rows: dict[str, list[tuple[str, float, float]]] = {"target_only": [], "bandit": []}
    for r in range(requests):
        for system in ("target_only", "bandit") if r % 2 == 0 else ("bandit", "target_only"):
            rows[system] += run(system, tokens)
    pipeline.arms, pipeline.selector = arms, fresh
    out: dict[str, Any] = {}
    for system, steps in rows.items():
        none = [(host, pol) for arm, host, pol in steps if arm == "none"]
        out[system] = {"steps": len(steps), "none_share": len(none) / max(len(steps), 1),
                       **{f"{what}_ms_{stat}": fn([x[i] for x in none]) if none else None
                          for i, what in enumerate(("host", "policy"))
                          for stat, fn in (("mean", statistics.mean), ("median", statistics.median))}}
    out["bandit"]["refits"] = getattr(selector, "refits", primed) - primed  # in the timed and untimed batches
    for key in ("host_ms_median", "policy_ms_median", "policy_ms_mean"):
        base, bandit = out["target_only"][key], out["bandit"][key]
        out[f"extra_{key}"] = None if bandit is None else bandit - base
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="1,8,16,32")
    parser.add_argument("--scenarios", default="held,lost")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--label", default="after")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    import flashspec_selectors
    from flashspec_bench.provenance import provenance, write_json

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        pipeline = build(Path(tmp))
        by_batch = {b: {sc: one_batch_size(pipeline, b, args.tokens, args.requests, sc)
                        for sc in args.scenarios.split(",")}
                    for b in (int(x) for x in args.batches.split(","))}
    run = {**provenance("benchmarks/bandit_host_cost.py", args.commit),
           "selectors_from": str(Path(flashspec_selectors.__file__).parent),
           "setup": f"tiny random models, float32, 1 torch thread, {args.tokens} new tokens, "
                    f"{args.requests} batches per system and batch size",
           "batches": by_batch}
    result: dict[str, Any] = {"runs": {}}
    if args.out is not None and args.out.exists():
        result = json.loads(args.out.read_text())
    result["runs"][args.label] = run
    result["summary"] = {label: {str(b): {sc: {k: r[k] for k in EXTRA} for sc, r in by.items()}
                                 for b, by in each["batches"].items()}
                         for label, each in result["runs"].items()}
    print(json.dumps(result, indent=1))
    if args.out is not None:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
