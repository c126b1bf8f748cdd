"""``flashspec bench``: FlashSpec against Hugging Face baselines, same GPU, same prompts.

Systems (each is optional, see ``--systems``):

* ``flashspec``     (a) speculative decoding: every arm of the config as a fixed arm, then the
  config's selector (the bandit) over all arms;
* ``target_only``   (b) the same pipeline with only the gamma = 0 arm (same fast path);
* ``hf_eager``, ``hf_compiled``, ``hf_assisted``, ``hf_lookup``: :mod:`flashspec_bench.baselines`.

Everything measured goes to ``<out>/bench.json``: provenance, the config, per-request rows
(tokens, wall time) and per-step rows (arm, accepted, draft/target/verify device times, host
time), then a ``summary``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import torch

from flashspec_bench.baselines import hf_runs
from flashspec_bench.bench_cli import HF_SYSTEMS, load_config_dict, parse
from flashspec_bench.bench_cli import parser as parser  # the options, defined without torch
from flashspec_bench.bench_cli import read_workload as read_workload
from flashspec_bench.floors import copy_bandwidth, floors, synthetic_scaling
from flashspec_bench.provenance import logger, provenance
from flashspec_bench.runs import (
    CROSS_REQUEST_STATE,
    Always,
    batches,
    first_divergence,
    headline,
    run_pipeline,
    summarize_run,
)

Record = Callable[[str, dict[str, Any]], None]  # (system, run) -> None: stores a finished run
T = TypeVar("T")
say = logger("bench")


def interleave(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Round-robin over the domains, each keeping its own order (a domain-shifting stream)."""
    queues: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        queues.setdefault(r["domain"], []).append(r)
    out: list[dict[str, str]] = []
    while any(queues.values()):
        out += [q.pop(0) for q in queues.values() if q]
    return out


class Tour:
    """The bandits' warm-up selector: every arm in turn, each for 1 step, then each for 2 in a
    row, 3, 4, and again. A bandit's timed run may pick any arm at any point, and a draft that
    sat out some steps catches up with a wider forward; the tour makes every arm meet every
    batch's attention spans and the draft meet both short and long catch-ups, so that their
    CUDA graphs are captured before the clock starts."""

    def __init__(self, num_arms: int) -> None:
        self.num_arms, self.t, self.arm, self.run, self.left = num_arms, 0, 0, 1, 1

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        self.t += 1
        self.left -= 1
        if self.left == 0:
            self.arm = (self.arm + 1) % self.num_arms
            if self.arm == 0:
                self.run = self.run % 4 + 1
            self.left = self.run


def plan_systems(pipeline: Any, args: argparse.Namespace) -> list[tuple[str, list[Any], Any]]:
    """(name, arms, selector) of every FlashSpec system the bench times."""
    from flashspec_core.pipeline import Arm, NoDraft

    arms, plan = list(pipeline.arms), []
    if "target_only" in args.systems:
        plan.append(("target_only", [Arm(name="none", provider=NoDraft(), gamma=0)], Always(0, 1)))
    if "flashspec" in args.systems:
        if not args.no_fixed_arms:  # every arm, fallback-only ones (select = false) too
            every = [attrs.evolve(a, selectable=True) for a in arms]
            plan += [(f"fixed:{a.name}", every, Always(i, len(every))) for i, a in enumerate(every) if a.gamma > 0]
        plan.append((f"bandit:{type(pipeline.selector).__name__}", arms, pipeline.selector))
        plan += [(f"bandit:{name}", arms, make_selector(name, len(pipeline.choices))) for name in args.selectors]
    return plan


def by_priority(plan: list[tuple[str, list[Any], Any]], selector: Any) -> list[tuple[str, list[Any], Any]]:
    """The systems in the order a short budget keeps them: target-only, the config's bandit, the
    fixed arms, the other bandits (the sort is stable: each group keeps its order)."""

    def rank(system: tuple[str, list[Any], Any]) -> int:
        name, _, sel = system
        return 0 if name == "target_only" else 1 if sel is selector else 2 if name.startswith("fixed:") else 3

    return sorted(plan, key=rank)


def out_of_budget(name: str, why: str, record: Record) -> None:
    say(f"{name}: skipped, {why}")
    record(name, {"requests": [], "steps": [], "error": f"out of budget: {why}"})


def flashspec_runs(pipeline: Any, prompts: list[list[int]], groups: list[list[int]], args: argparse.Namespace,
                   domains: list[str], record: Record, deadline: float = math.inf) -> dict[str, Any]:
    """Warm every system up, then time ``args.repeats`` repeats; returns the draft prewarm's record.

    Within ``deadline`` (a ``time.perf_counter()`` value): the warm-ups get the share of the time
    left that one pass over the batches takes among ``1 + repeats``; a system whose warm-up would
    start later is skipped (recorded with an ``error``), lowest priority first (:func:`by_priority`).
    Timed batches stop at the deadline: every system then has the same batches, and each run
    records ``stopped`` (batches run of all)."""
    policy = pipeline.policy
    arms, selector, kept = list(policy.arms), policy.selector, buckets(policy)
    prewarm = prewarm_drafts(pipeline, groups, args, prompts)
    reward, settings = policy.reward, policy.settings
    limit, first = settings.speculate_max_batch, settings.first
    timed: list[tuple[str, list[Any], Buckets, int | None, int | None, list[dict[str, Any]]]] = []
    warm_by = time.perf_counter() + (deadline - time.perf_counter()) / (1 + args.repeats)
    for name, use_arms, sel in by_priority(plan_systems(pipeline, args), selector):  # all warm up before any is timed
        if timed and time.perf_counter() > warm_by:
            out_of_budget(name, "warm-ups past their share of the section's budget", record)
            continue
        # A fixed arm runs at every batch size (what the arm itself costs); the bandits keep the
        # config's batch limit, which then shows as the arm "batch_limit" in their steps.
        own_limit = limit if name.startswith("bandit:") else None
        own_first = None if name == "target_only" else first  # [selector] first: all but plain
        policy.settings = attrs.evolve(settings, speculate_max_batch=own_limit, first=own_first)
        # Warm-up on copies of the reward's running state, and for the bandits a tour of their arms
        # instead of their selector: the timed run starts untrained, with every arm's shapes captured.
        policy.arms = use_arms
        warm = Tour(len(policy.choices)) if name.startswith("bandit:") else copy.deepcopy(sel)
        policy.selector, policy.reward = warm, copy.deepcopy(reward)
        policy.first_rewards = [copy.deepcopy(r) for r in kept.first_rewards]
        policy.first_gates = policy.fresh_first_gates()  # the warm-up's steps teach the timed run's gates nothing
        say(f"{name}: warm-up")
        run_pipeline(pipeline, prompts, warm_groups(groups, args.warmup), args, domains)
        # the config's bandit starts from the policy's own buckets (a selector made per bucket), others from copies
        copies = [sel, *(copy.deepcopy(sel) for _ in kept.selectors[1:])]
        start = kept if sel is selector else attrs.evolve(kept, selectors=copies)
        timed.append((name, use_arms, start, own_limit, own_first, []))
    stopped: dict[str, Any] | None = None
    for rep in range(args.repeats if timed else 0):
        # Systems take turns batch by batch, and the system that goes first rotates with the
        # batch and the repeat: a drift within the run (clocks, heat, allocator) then weighs on
        # every system alike. Every repeat starts from untrained selectors and scorers and
        # emptied corpora: repeats are independent runs; within a repeat each system keeps its
        # own, every bucket's.
        state = {name: copy.deepcopy(start) for name, _, start, *_ in timed}
        arms_of = {name: own_learners(use_arms) for name, use_arms, *_ in timed}
        parts: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in timed}
        for j, group in enumerate(groups):
            if time.perf_counter() > deadline and (rep or j):  # at least one batch of each system
                stopped = {"repeat": rep, "batches_run": j, "batches": len(groups), "why": "out of budget"}
                say(f"timed runs stopped at the deadline: repeat {rep}, {j} of {len(groups)} batches")
                break
            turn = (rep + j) % len(timed)
            for name, _, _, own_limit, own_first, _ in timed[turn:] + timed[:turn]:
                policy.arms = arms_of[name]
                policy.settings = attrs.evolve(settings, speculate_max_batch=own_limit, first=own_first)
                state[name].restore(policy)
                parts[name].append(untimed_gc(run_pipeline, pipeline, prompts, [group], args, domains))
        for name, *_, runs in timed:
            run = {"requests": [r for p in parts[name] for r in p["requests"]],
                   "steps": [s for p in parts[name] for s in p["steps"]]}
            for row in (*run["requests"], *run["steps"]):
                row["repeat"] = rep
            if run["requests"]:
                runs.append(run)
            record(name, {"requests": [r for x in runs for r in x["requests"]],
                          "steps": [s for x in runs for s in x["steps"]], **({"stopped": stopped} if stopped else {})})
        if stopped:
            break
    policy.arms, policy.settings = arms, settings
    kept.restore(policy)
    return prewarm


def untimed_gc(run: Callable[..., T], *args: Any) -> T:
    """``run(*args)`` with the cyclic garbage collector collected before and paused during it,
    so that no collection, which walks every record of the runs so far, falls inside a timed
    batch (a suspect for the one verification of the H100's batch-32 bandit pass that stalled
    65 ms with no graph captured); refcounting still frees what dies meanwhile."""
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        return run(*args)
    finally:
        if was:
            gc.enable()


def own_learners(arms: list[Any]) -> list[Any]:
    """``arms`` with each provider that learns across requests (:class:`ForgetsRequests`)
    replaced by an emptied copy (arms sharing a provider share its copy). Systems take turns on
    the same prompts, so with one shared corpus a suffix arm would predict outputs another
    system, the warm-up or an earlier repeat had just produced; with its own emptied copy a
    system's timed pass learns only from its own earlier requests in that pass."""
    from flashspec_core.contracts import ForgetsRequests

    fresh: dict[int, Any] = {}

    def own(provider: Any) -> Any:
        if not isinstance(provider, ForgetsRequests):
            return provider
        if id(provider) not in fresh:
            provider.forget_requests()  # first, so that nothing learned is copied
            fresh[id(provider)] = copy.deepcopy(provider)
        return fresh[id(provider)]

    return [attrs.evolve(a, provider=own(a.provider)) for a in arms]


@attrs.frozen
class Buckets:
    """A policy's learning state, one entry per batch bucket: what a system keeps between its
    batches. The policy's ``selector`` and ``reward`` setters spread one object over every
    bucket, so saving only those would reset the other buckets at every swap."""

    selectors: list[Any]
    rewards: list[Any]
    first_rewards: list[Any]
    first_gates: list[Any]

    def restore(self, policy: Any) -> None:
        """Put these lists back into ``policy`` (the objects themselves: they go on learning)."""
        policy.selectors, policy.rewards, policy.first_rewards = self.selectors, self.rewards, self.first_rewards
        policy.first_gates = self.first_gates


def buckets(policy: Any) -> Buckets:
    """``policy``'s per-bucket selectors, scorers and first-arm gates as they are now (the lists
    copied, not the objects)."""
    return Buckets(list(policy.selectors), list(policy.rewards), list(policy.first_rewards), list(policy.first_gates))


def prewarm_drafts(pipeline: Any, groups: list[list[int]], args: argparse.Namespace,
                   prompts: list[list[int]] | None = None) -> dict[str, Any]:
    """Every graph each draft arm can ask for at the run's batch sizes, captured before any
    system runs (``FastDraft.prewarm``; ``--no-prewarm`` leaves them to the warm-up, which
    alone left captures inside timed batches); with ``prompts``, also every tree node count
    the tree arms may propose (:func:`warm_trees`)."""
    from flashspec_core import SamplingParams

    if args.no_prewarm:
        return {"ran": False}
    sampling = SamplingParams(temperature=args.temperature)  # as run_pipeline's generate()
    sizes = sorted({len(g) for g in groups}, reverse=True)  # the largest allocates the cache once
    t0, keys = time.perf_counter(), 0
    for arm in pipeline.arms:
        if hasattr(arm.provider, "prewarm") and arm.gamma > 0:
            for size in sizes:
                keys += arm.provider.prewarm(size, arm.gamma, sampling)
    seconds = time.perf_counter() - t0
    if keys:
        say(f"draft graphs prewarmed: {keys} in {seconds:.1f} s")
    out = {"ran": True, "keys": keys, "seconds": seconds}
    if prompts is not None:
        out["tree_steps"], out["tree_seconds"] = warm_trees(pipeline, sizes, prompts, args.max_new_tokens, sampling)
    return out


def warm_trees(pipeline: Any, sizes: list[int], prompts: list[list[int]], new_tokens: int, sampling: Any
               ) -> tuple[int, float]:
    """A step of a one-hot tree of every node count ``1..g`` (``g`` the largest tree arm's gamma)
    at every batch size and at one length per attention span the run's sequences reach
    (``2^k + 1``: spans double), before any system runs. A lookup tree's node count varies with
    its matches, and the target's tree forward and the verifier capture a graph per node count
    and span: a bandit's warm-up over a few batches met only some, and the captures it missed
    fell inside its timed batches (58 ms at batch 4, 110 ms at 8 on an H100). Returns the steps
    run and their seconds."""
    from flashspec_serve.warmup import tree_widths, warm_widths

    widths = tree_widths(pipeline.arms)
    if not widths or not prompts:
        return 0, 0.0
    low, high = min(map(len, prompts)), max(map(len, prompts)) + new_tokens + len(widths)
    lengths = [(1 << k) + 1 for k in range(high.bit_length() + 1) if (1 << k) < high and (2 << k) >= low]
    t0 = time.perf_counter()
    steps = warm_widths(pipeline, widths, sizes, lengths, sampling)
    seconds = time.perf_counter() - t0
    say(f"tree node counts 1..{len(widths)} warmed: {steps} steps at {len(lengths)} lengths in {seconds:.1f} s")
    return steps, seconds


def warm_groups(groups: list[list[int]], warmup: int) -> list[list[int]]:
    """The batches run untimed before a system is timed: all of them for ``warmup < 0``, so
    that every shape the system meets is captured and compiled before its clock starts."""
    return groups if warmup < 0 else groups[:warmup]


def make_selector(name: str, arms: int) -> Any:
    """A registered selector with its default config (``--selectors``: bandits besides the config's)."""
    from flashspec_core.registry import build_registry

    spec = build_registry().get("selector", name)
    return spec.factory(spec.default_config(), arms)


def divergences(pipeline: Any, prompts: list[list[int]], spec: dict[str, Any], plain: dict[str, Any]) -> list[dict[str, Any]]:
    """Per prompt: where speculative and target-only greedy tokens first differ, and the
    target's top-2 logit gap there (on the target-only prefix), next to bf16's spacing."""
    model = pipeline.target.model
    out = []
    plain_by = {r["prompt"]: r["tokens"] for r in plain["requests"]}
    for r in spec["requests"]:
        want = plain_by.get(r["prompt"])
        if want is None or len(r["batch"]) != 1:
            continue
        at = first_divergence(r["tokens"], want)
        row: dict[str, Any] = {"prompt": r["prompt"], "first_divergence": at}
        if at is not None and at < min(len(want), len(r["tokens"])):
            seq = torch.tensor(prompts[r["prompt"]] + want[:at])[None].to(model.device)
            model.allocate(1)
            pos = torch.arange(seq.shape[1], device=model.device)[None]
            top = torch.topk(model.forward(seq, pos, pos, last_only=True)[0, -1].float(), 2).values
            row["top2_gap"] = float(top[0] - top[1])
            row["bf16_spacing"] = float(2.0 ** (math.floor(math.log2(abs(float(top[0])) or 1.0)) - 7))
        out.append(row)
    return out


def exactness(args: argparse.Namespace, data: dict[str, Any], prompts: list[list[int]], domains: list[str]) -> dict[str, Any]:
    """float32, TF32 off: greedy speculative (bandit over every arm; with ``--exactness-fixed``
    every fixed arm too, draft trees included) vs target-only, token for token."""
    from flashspec_core.build import build_pipeline
    from flashspec_core.policy import proposes_trees

    say("exactness: float32, TF32 off")
    # The bf16 runs filled dynamo's per-function cache (the fused ops compile with fullgraph=True); float32 inputs
    # would recompile each of them past the limit, so start from an empty cache.
    torch._dynamo.reset()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        pipe = build_pipeline(load_config_dict(args.config, "float32", False))
        pipe_arms = list(pipe.arms)
        fixed = getattr(args, "exactness_fixed", False)
        # No prewarm: capturing every draft shape up front took longer than the check itself (168 graphs,
        # 35 s in float32 on the H200); the check captures only the shapes its few prompts reach.
        eargs = argparse.Namespace(**{**vars(args), "temperature": 0.0, "systems": ["flashspec", "target_only"],
                                      "warmup": 0, "repeats": 1, "no_fixed_arms": not fixed, "selectors": [],
                                      "no_prewarm": True})
        runs: dict[str, Any] = {}
        flashspec_runs(pipe, prompts, batches(len(prompts), 1), eargs, domains, runs.__setitem__)
        plain = {r["prompt"]: r["tokens"] for r in runs.pop("target_only")["requests"]}
        rows = {name: [{"prompt": r["prompt"], "identical": r["tokens"] == plain[r["prompt"]],
                        "first_divergence": first_divergence(r["tokens"], plain[r["prompt"]])}
                       for r in spec["requests"]] for name, spec in runs.items()}
        del pipe
        gc.collect()
        name = next(n for n in rows if n.startswith("bandit:"))
        out = {"dtype": "float32", "tf32": False, "system": name, "prompts": rows[name],
               "greedy_identical": all(r["identical"] for each in rows.values() for r in each)}
        if fixed:  # every system's verdict, and the arms that proposed trees
            out["systems"] = {n: all(r["identical"] for r in each) for n, each in rows.items()}
            out["tree_arms"] = [a.name for a in pipe_arms if proposes_trees(a.provider)]
        return out
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def model_paths(data: dict[str, Any]) -> dict[str, str | None]:
    from flashspec_models.weights import resolve_model

    draft = next((a.get("model") for a in data.get("arm", []) if a.get("use") in ("fast", "hf")), None)
    return {"target": resolve_model(data["target"]["model"]), "draft": resolve_model(draft) if draft else None}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flashspec_bench.harness``: ``flashspec bench`` (:mod:`flashspec_bench.bench_cli`)."""
    return run(*parse(sys.argv[1:] if argv is None else argv))


def run(args: argparse.Namespace, workload: list[dict[str, str]]) -> int:
    """Measure what ``args`` asks (:func:`flashspec_bench.bench_cli.parse` checked them) and write ``bench.json``."""
    start = time.perf_counter()
    deadline = start + args.deadline if args.deadline > 0 else math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    workload = (interleave(workload) if args.order == "interleaved" else workload)[: args.prompts or None]
    result: dict[str, Any] = {"environment": provenance("flashspec bench", args.commit),
                              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "config": args.config.read_text(), "workload": workload, "runs": {}, "summaries": {},
                              "cross_request_state": CROSS_REQUEST_STATE}
    out_file = args.out / "bench.json"

    def record(name: str, run: dict[str, Any]) -> None:
        result["runs"][name] = run
        result["summaries"][name] = s = summarize_run(run) if run["requests"] else {"error": run.get("error")}
        if s.get("tokens_per_s"):
            say(f"{name}: {s['tokens_per_s']:.1f} tokens/s" + (f", mean accepted length {s['mean_accepted_length']:.2f}"
                                                                if "mean_accepted_length" in s else ""))
        out_file.write_text(json.dumps(result))  # partial results survive a later failure

    only_synthetic = not args.systems and args.synthetic_shapes  # random-weight shapes: no real model is loaded
    if only_synthetic:
        result["bandwidth_bytes_per_s"] = copy_bandwidth(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    else:
        measure(args, result, workload, record, deadline)
    if args.synthetic_shapes:
        result["synthetic_scaling"] = synthetic_scaling(args, record, result["bandwidth_bytes_per_s"], deadline)
    result["summary"] = {"synthetic_scaling": result["synthetic_scaling"]} if only_synthetic else headline(result, args)
    result["wall_s"] = time.perf_counter() - start
    out_file.write_text(json.dumps(result, indent=1))
    say(f"wrote {out_file}")
    print(json.dumps(result["summary"], indent=2))
    return 0


def measure(args: argparse.Namespace, result: dict[str, Any], workload: list[dict[str, str]], record: Record,
            deadline: float) -> None:
    """The FlashSpec systems, the bf16 divergences, the float32 exactness check, the HF baselines."""
    from flashspec_core.build import build_pipeline

    data = load_config_dict(args.config, args.dtype, args.fuse, args.quantization)
    say(f"building pipeline from {args.config}")
    pipeline = build_pipeline(data, progress=say)
    prompts = [pipeline.target.encode(w["prompt"]) for w in workload]
    domains = [w["domain"] for w in workload]
    result["bandwidth_bytes_per_s"] = bw = copy_bandwidth(pipeline.target.device)
    result["draft_prewarm"] = flashspec_runs(pipeline, prompts, batches(len(prompts), args.batch_size), args, domains,
                                             record, deadline)
    result["floor"] = floors(pipeline, args.batch_size, bw)
    if args.temperature == 0 and "target_only" in result["runs"] and time.perf_counter() < deadline:
        plain = result["runs"]["target_only"]
        result["bf16_divergence"] = {name: divergences(pipeline, prompts, run, plain)
                                     for name, run in result["runs"].items() if name.startswith(("fixed", "bandit"))}
    paths, eos = model_paths(data), pipeline.target.eos_token_ids
    if args.exactness and time.perf_counter() < deadline:
        result["exactness"] = exactness(args, data, prompts[: args.exactness], domains)
    del pipeline
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if any(s in HF_SYSTEMS for s in args.systems):
        hf_runs(paths, prompts, domains, eos, args, record, deadline)


if __name__ == "__main__":
    sys.exit(main())
