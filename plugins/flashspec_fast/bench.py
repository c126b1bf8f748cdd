"""``flashspec bench``: FlashSpec against Hugging Face baselines, same GPU, same prompts.

Systems (each is optional, see ``--systems``):

* ``flashspec``     (a) speculative decoding: every arm of the config as a fixed arm, then the
  config's selector (the bandit) over all arms;
* ``target_only``   (b) the same pipeline with only the gamma = 0 arm (same fast path);
* ``hf_eager``      (c) ``model.generate``, dynamic cache, eager;
* ``hf_compiled``   (d) ``model.generate`` with a static cache, which transformers compiles;
* ``hf_assisted``   (e) assisted generation with the config's first model draft;
* ``hf_lookup``     (f) prompt-lookup decoding.

Everything measured goes to ``<out>/bench.json``: device, versions, commit, the config,
per-request rows (tokens, wall time) and per-step rows (arm, accepted, draft/target/verify
device times, host time), then a ``summary``. Plots go next to it when matplotlib exists.
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import json
import math
import platform
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

_BATCH_IDS = itertools.count()
SYSTEMS = ("flashspec", "target_only", "hf_eager", "hf_compiled", "hf_assisted", "hf_lookup")


def _say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- workload, environment ---------------------------------------------------------------


def read_workload(path: Path) -> list[dict[str, str]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path}:{n}: each line needs a string 'prompt'")
            rows.append({"prompt": row["prompt"], "domain": str(row.get("domain", "unknown"))})
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def interleave(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """Round-robin over the domains, each keeping its own order (a domain-shifting stream)."""
    queues: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        queues.setdefault(r["domain"], []).append(r)
    out: list[dict[str, str]] = []
    while any(queues.values()):
        out += [q.pop(0) for q in queues.values() if q]
    return out


def environment() -> dict[str, Any]:
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu",
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        env["commit"] = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=False, cwd=Path(__file__).parent).stdout.strip()
        env["dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        env["commit"] = None
    return env


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def batches(n: int, size: int) -> list[list[int]]:
    """Prompt indices in groups of ``size``; the last group is topped up from the start."""
    groups = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    if groups and len(groups[-1]) < size:
        groups[-1] += [i % n for i in range(size - len(groups[-1]))]
    return groups


# --- FlashSpec runs -----------------------------------------------------------------------


class Always:
    """A selector that always picks one arm (the fixed-arm and target-only runs)."""

    def __init__(self, arm: int, num_arms: int) -> None:
        self.arm, self.num_arms = arm, num_arms

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        """Nothing to learn."""


class Tour:
    """The bandits' warm-up selector: every arm in turn, each for 1 step, then each for 2 in a
    row, 3, 4, and again. A bandit's timed run may pick any arm at any point, and a draft that
    sat out some steps catches up with a wider forward; the tour makes every arm meet every
    batch's attention spans and the draft meet both short and long catch-ups, so that their
    CUDA graphs are captured before the clock starts (the bandit's own warm-up choices covered
    only the shapes those choices met)."""

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


def step_rows(steps: Sequence[Any]) -> list[dict[str, Any]]:
    rows = []
    for r in steps:
        row = attrs.asdict(r)
        row["accepted"] = list(r.accepted)
        row["host_ms"] = max(r.step_ms - r.draft_ms - r.target_ms - r.verify_ms, 0.0)
        rows.append(row)
    return rows


def graph_captures(pipeline: Any) -> int:
    """CUDA graphs the pipeline's fast target and drafts have captured so far (a capture
    inside a timed batch is setup work timed as decoding: the bench records how many)."""
    caches = {id(g): g for x in (pipeline.target, *(a.provider for a in pipeline.arms))
              if (g := getattr(x, "graphs", None)) is not None}  # arms may share a provider: each cache once
    return sum(int(getattr(g, "captures", 0)) for g in caches.values())


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
        bid = next(_BATCH_IDS)
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
        out["arms"] = arms
    return out


def by_domain(run: dict[str, Any]) -> dict[str, float]:
    """tokens/s per domain (batch 1 runs: each request is its own batch)."""
    acc: dict[str, list[float]] = {}
    for r in run["requests"]:
        t = acc.setdefault(r["domain"], [0.0, 0.0])
        t[0] += r["new_tokens"]
        t[1] += r["wall_s"] / len(r["batch"])
    return {d: n / w for d, (n, w) in acc.items() if w}


def flashspec_runs(pipeline: Any, prompts: list[list[int]], groups: list[list[int]], args: argparse.Namespace,
                   domains: list[str], record: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    from flashspec_core.pipeline import Arm, NoDraft

    arms, selector = list(pipeline.arms), pipeline.selector
    plan: list[tuple[str, list[Any], Any]] = []
    if "target_only" in args.systems:
        plan.append(("target_only", [Arm(name="none", provider=NoDraft(), gamma=0)], Always(0, 1)))
    if "flashspec" in args.systems:
        if not args.no_fixed_arms:  # every arm, fallback-only ones (select = false) too
            every = [attrs.evolve(a, selectable=True) for a in arms]
            plan += [(f"fixed:{a.name}", every, Always(i, len(every))) for i, a in enumerate(every) if a.gamma > 0]
        plan.append((f"bandit:{type(selector).__name__}", arms, selector))
        plan += [(f"bandit:{name}", arms, make_selector(name, len(pipeline.choices))) for name in args.selectors]
    prewarm = prewarm_drafts(pipeline, groups, args)
    reward, limit, first = pipeline.reward, pipeline.speculate_max_batch, pipeline.first
    timed: list[tuple[str, list[Any], Any, int | None, int | None, list[dict[str, Any]]]] = []
    for name, use_arms, sel in plan:  # every system warms up before any is timed
        # A fixed arm runs at every batch size (what the arm itself costs); the bandits keep the
        # config's batch limit, which then shows as the arm "batch_limit" in their steps.
        pipeline.speculate_max_batch = own_limit = limit if name.startswith("bandit:") else None
        pipeline.first = own_first = None if name == "target_only" else first  # [selector] first: all but plain
        # Warm-up on copies of the reward's running state, and for the bandits a tour of their arms
        # instead of their selector: the timed run starts untrained, with every arm's shapes captured.
        pipeline.arms = use_arms
        warm = Tour(len(pipeline.choices)) if name.startswith("bandit:") else copy.deepcopy(sel)
        pipeline.selector, pipeline.reward = warm, copy.deepcopy(reward)
        _say(f"{name}: warm-up")
        run_pipeline(pipeline, prompts, warm_groups(groups, args.warmup), args, domains)
        timed.append((name, use_arms, sel, own_limit, own_first, []))
    for rep in range(args.repeats):
        # Systems take turns batch by batch, and the system that goes first rotates with the
        # batch and the repeat: a drift within the run (clocks, heat, allocator) then weighs on
        # every system alike. (Whole repeats in alternating order left it on whichever system
        # ran first in more repeats: at batch 8 the bandits, all of whose steps were plain,
        # ran 0.92x-0.94x of target-only, and 1.00x in the one repeat they went first.)
        # Every repeat starts from the untrained selector and reward: repeats are independent
        # runs; within a repeat each system keeps its own selector from batch to batch.
        state = {name: (copy.deepcopy(sel), copy.deepcopy(reward)) for name, _, sel, *_ in timed}
        parts: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in timed}
        for j, group in enumerate(groups):
            turn = (rep + j) % len(timed)
            for name, use_arms, _sel, own_limit, own_first, _runs in timed[turn:] + timed[:turn]:
                pipeline.arms, (pipeline.selector, pipeline.reward) = use_arms, state[name]
                pipeline.speculate_max_batch, pipeline.first = own_limit, own_first
                parts[name].append(run_pipeline(pipeline, prompts, [group], args, domains))
        for name, *_, runs in timed:
            run = {"requests": [r for p in parts[name] for r in p["requests"]],
                   "steps": [s for p in parts[name] for s in p["steps"]]}
            for row in (*run["requests"], *run["steps"]):
                row["repeat"] = rep
            runs.append(run)
            record(name, {"requests": [r for x in runs for r in x["requests"]],
                          "steps": [s for x in runs for s in x["steps"]]})
    pipeline.arms, pipeline.selector, pipeline.reward = arms, selector, reward
    pipeline.speculate_max_batch, pipeline.first = limit, first
    return prewarm


def prewarm_drafts(pipeline: Any, groups: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Every graph each draft arm can ask for at the run's batch sizes, captured before any
    system runs (``FastDraft.prewarm``; ``--no-prewarm`` leaves them to the warm-up): the
    warm-up tour alone left 16 captures inside timed batches at 57cf50c, each a draft step of
    48-581 ms after the draft sat out."""
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
        _say(f"draft graphs prewarmed: {keys} in {seconds:.1f} s")
    return {"ran": True, "keys": keys, "seconds": seconds}


def warm_groups(groups: list[list[int]], warmup: int) -> list[list[int]]:
    """The batches run untimed before a system is timed: all of them for ``warmup < 0``, so
    that every shape the system meets (prefill widths, attention spans, draft widths) is
    captured and compiled before its clock starts; else the first ``warmup``."""
    return groups if warmup < 0 else groups[:warmup]


def make_selector(name: str, arms: int) -> Any:
    """A registered selector with its default config (``--selectors``: bandits besides the config's)."""
    from flashspec_core.registry import build_registry

    spec = build_registry().get("selector", name)
    return spec.factory(spec.default_config(), arms)


# --- Hugging Face baselines ---------------------------------------------------------------


def hf_load(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model.to(device)  # type: ignore[arg-type]  # transformers types .to oddly; moves in place
    return model.eval()


def hf_kwargs(model: Any, args: argparse.Namespace, eos: set[int]) -> dict[str, Any]:
    """The same stopping and sampling as FlashSpec (no repetition penalty, no top-k/top-p)."""
    kw: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "eos_token_id": sorted(eos),
                          "pad_token_id": model.config.pad_token_id or sorted(eos)[0],
                          "repetition_penalty": 1.0, "top_k": None, "top_p": None}
    if args.temperature > 0:
        kw.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False, temperature=None)
    return kw


def hf_run(model: Any, prompts: list[list[int]], groups: list[list[int]], domains: list[str], kw: dict[str, Any],
           extra: Callable[[], dict[str, Any]] = dict) -> dict[str, Any]:
    requests = []
    device = next(model.parameters()).device
    for group in groups:
        width = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), width), kw["pad_token_id"], dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):  # left padding, as generate expects
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        sync()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw, **extra())
        sync()
        wall = time.perf_counter() - t0
        eos = set(kw["eos_token_id"])
        bid = next(_BATCH_IDS)
        for row, i in enumerate(group):
            new = out[row, width:].tolist()
            cut = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))
            requests.append({"prompt": i, "domain": domains[i], "new_tokens": cut, "wall_s": wall,
                             "batch": group, "batch_id": bid, "tokens": new[:cut]})
    return {"requests": requests, "steps": []}


def hf_runs(paths: dict[str, str | None], prompts: list[list[int]], domains: list[str], eos: set[int],
            args: argparse.Namespace, record: Callable[[str, dict[str, Any]], None], deadline: float) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" and args.dtype != "float32" else torch.float32
    model = hf_load(str(paths["target"]), dtype, device)
    kw = hf_kwargs(model, args, eos)
    n = min(args.hf_prompts or len(prompts), len(prompts))
    groups = batches(n, args.batch_size)
    single = batches(n, 1)
    warm = warm_groups(groups, args.warmup) or groups[:1]
    for system in ("hf_eager", "hf_compiled", "hf_assisted", "hf_lookup"):
        if system not in args.systems:
            continue
        if time.perf_counter() > deadline:
            _say(f"{system}: skipped (deadline)")
            continue
        try:
            use_groups, extra = _hf_setup(system, model, paths, args, dtype, device, groups, single, prompts)
            if use_groups is None:
                continue
            _say(f"{system}: warm-up")
            hf_run(model, prompts, warm if use_groups is groups else single[:1], domains, kw, extra)
            _say(f"{system}: {len(use_groups)} batches x {args.repeats}")
            runs = [hf_run(model, prompts, use_groups, domains, kw, extra) for _ in range(args.repeats)]
            record(system, {"requests": [r for x in runs for r in x["requests"]], "steps": []})
        except Exception as exc:  # one broken baseline must not lose the others' numbers
            _say(f"{system}: FAILED {type(exc).__name__}: {exc}")
            record(system, {"requests": [], "steps": [], "error": f"{type(exc).__name__}: {exc}"})
    del model
    gc.collect()


def _hf_setup(system: str, model: Any, paths: dict[str, str | None], args: argparse.Namespace, dtype: torch.dtype,
              device: torch.device, groups: list[list[int]], single: list[list[int]], prompts: list[list[int]]) -> tuple[Any, Callable[[], dict[str, Any]]]:
    if system == "hf_eager":
        return groups, dict
    if system == "hf_compiled":
        from transformers import StaticCache

        longest = max(len(p) for p in prompts) + args.max_new_tokens + 16
        cache = StaticCache(config=model.config, max_cache_len=longest)

        def extra() -> dict[str, Any]:
            cache.reset()
            return {"past_key_values": cache}

        if args.batch_size != 1:
            _say("hf_compiled: batch 1 only (one static cache per batch shape); skipped")
            return None, extra  # type: ignore[return-value]
        return single, extra
    if system == "hf_assisted":
        if paths.get("draft") is None or args.batch_size != 1:
            _say("hf_assisted: needs batch 1 and a model draft; skipped")
            return None, dict
        assistant = hf_load(str(paths["draft"]), dtype, device)
        assistant.generation_config.num_assistant_tokens = args.assistant_tokens
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        return single, lambda: {"assistant_model": assistant}
    if args.batch_size != 1:
        _say("hf_lookup: batch 1 only; skipped")
        return None, dict
    return single, lambda: {"prompt_lookup_num_tokens": args.lookup_tokens}


# --- exactness ----------------------------------------------------------------------------


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


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
            logits = model.forward(seq, pos, pos, last_only=True)[0, -1].float()
            top = torch.topk(logits, 2).values
            row["top2_gap"] = float(top[0] - top[1])
            row["bf16_spacing"] = float(2.0 ** (math.floor(math.log2(abs(float(top[0])) or 1.0)) - 7))
        out.append(row)
    return out


# --- physical floor, synthetic scaling ----------------------------------------------------


def copy_bandwidth(device: torch.device) -> float | None:
    """Bytes moved (read + write) per second by a large device-to-device copy."""
    if device.type != "cuda":
        return None
    x = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        y.copy_(x)
    end.record()
    sync()
    return 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)


def forward_bytes(model: Any, batch: int) -> int:
    """Weights plus the KV cache one forward reads (it attends over all max_len slots)."""
    item = model.dtype.itemsize if hasattr(model.dtype, "itemsize") else 2
    return model.args.weight_bytes(item) + batch * model.max_len * model.args.kv_bytes_per_token(item)


def floor_ms(bytes_read: int, bandwidth: float | None) -> float | None:
    """Time to stream ``bytes_read`` at the copy's rate (its reads and writes both counted)."""
    return None if not bandwidth else bytes_read / bandwidth * 1e3


def synthetic_scaling(args: argparse.Namespace, record: Callable[[str, dict[str, Any]], None], bandwidth: float | None,
                      deadline: float) -> list[dict[str, Any]]:
    """LABELLED SYNTHETIC: random weights with Qwen2.5 layer shapes, fixed acceptance."""
    from flashspec_core.pipeline import Arm, NoDraft, Pipeline
    from flashspec_core.rewards import make_reward
    from flashspec_fast.draft import FastDraft
    from flashspec_fast.options import FastOptions, build_model
    from flashspec_fast.synthetic import SyntheticVerifier
    from flashspec_fast.target import FastTarget

    table = []
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150000, (64,), generator=gen).tolist() for _ in range(2)]
    max_len = 64 + args.synthetic_tokens + 64
    dopts = FastOptions(model="shape:qwen2.5-0.5b", dtype="bf16", max_len=max_len, fuse=args.fuse)
    draft_model, _ = build_model(dopts)
    for shape in args.synthetic_shapes:
        if time.perf_counter() > deadline:
            _say(f"synthetic {shape}: skipped (deadline)")
            continue
        topts = FastOptions(model=f"shape:{shape}", dtype="bf16", max_len=max_len, fuse=args.fuse)
        tmodel, _ = build_model(topts)
        target = FastTarget(tmodel, None, None, topts)
        draft = FastDraft(draft_model, target.vocab, dopts)
        sargs = argparse.Namespace(**{**vars(args), "max_new_tokens": args.synthetic_tokens, "temperature": 0.0})
        groups = [[0], [1]]
        base_pipe = Pipeline(target, [Arm("none", NoDraft(), 0)], SyntheticVerifier(1.0), Always(0, 1), make_reward("acceptance"))
        run_pipeline(base_pipe, prompts, groups[:1], sargs, ["synthetic"] * 2)
        base = summarize_run(run_pipeline(base_pipe, prompts, groups, sargs, ["synthetic"] * 2))
        t_floor = floor_ms(forward_bytes(tmodel, 1), bandwidth)
        d_floor = floor_ms(forward_bytes(draft_model, 1), bandwidth)
        for acc in args.synthetic_acceptance:
            for gamma in args.synthetic_gammas:
                pipe = Pipeline(target, [Arm(f"draft-g{gamma}", draft, gamma)], SyntheticVerifier(acc), Always(0, 1),
                                make_reward("acceptance"))
                run_pipeline(pipe, prompts, groups[:1], sargs, ["synthetic"] * 2)
                run = run_pipeline(pipe, prompts, groups, sargs, ["synthetic"] * 2)
                s = summarize_run(run)
                record(f"synthetic:{shape}:a{acc}:g{gamma}", run)
                step_floor = None if t_floor is None or d_floor is None else gamma * d_floor + t_floor
                table.append({
                    "label": "synthetic (random weights, fixed acceptance)", "target_shape": shape,
                    "draft_shape": "qwen2.5-0.5b", "acceptance": acc, "gamma": gamma,
                    "target_only_tokens_per_s": base["tokens_per_s"], "spec_tokens_per_s": s["tokens_per_s"],
                    "speedup_vs_own_target_only": s["tokens_per_s"] / base["tokens_per_s"],
                    "mean_accepted_length": s["mean_accepted_length"],
                    "target_only_step_ms_p50": base["step_ms_p50"], "spec_step_ms_p50": s["step_ms_p50"],
                    "target_forward_floor_ms": t_floor, "spec_step_floor_ms": step_floor,
                })
                _say(f"synthetic {shape} a={acc} g={gamma}: {table[-1]['speedup_vs_own_target_only']:.2f}x")
        del target, tmodel, base_pipe
        gc.collect()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return table


# --- main -------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashspec bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", type=Path, required=True, help="JSONL: {'prompt': ..., 'domain': ...} per line")
    p.add_argument("--config", type=Path, required=True, help="FlashSpec pipeline TOML (its arms and selector)")
    p.add_argument("--out", type=Path, required=True, help="output folder (bench.json and plots)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--no-prewarm", action="store_true",
                   help="do not capture the drafts' graphs before the warm-up (FastDraft.prewarm)")
    p.add_argument("--warmup", type=int, default=-1,
                   help="batches run untimed before timing, per system (-1: all of them, so no capture or compile "
                        "of a new shape lands in a timed run; a bandit warms up on a tour of its arms, not its own "
                        "choices, and is timed untrained)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs per system, after every system has warmed up; within a repeat the systems "
                        "take turns batch by batch and who goes first rotates with the batch and the repeat, so a "
                        "drift over the run weighs on every system alike")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0 = all)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list from {','.join(SYSTEMS)}")
    p.add_argument("--hf-prompts", type=int, default=0, help="HF baselines on the first N prompts only (0 = all)")
    p.add_argument("--selectors", type=lambda v: [x for x in v.split(",") if x], default=[],
                   help="comma list of more registered selectors to run as bandits (default configs)")
    p.add_argument("--no-fixed-arms", action="store_true", help="skip the fixed-arm runs (bandit only)")
    p.add_argument("--assistant-tokens", type=int, default=5, help="num_assistant_tokens for (e)")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for (f)")
    p.add_argument("--dtype", default=None, help="override the dtype of every fast model (e.g. float32)")
    p.add_argument("--order", default="file", choices=["file", "interleaved"],
                   help="serve the prompts in file order, or round-robin over their domains")
    p.add_argument("--quantization", default=None, choices=["none", "nf4"],
                   help="override the quantization of every fast model (nf4 needs bitsandbytes)")
    p.add_argument("--fuse", action="store_true", help="Inductor-fuse elementwise ops in fast models")
    p.add_argument("--exactness", type=int, default=0, metavar="N",
                   help="also run (a) and (b) in float32 with TF32 off on N prompts and compare tokens")
    p.add_argument("--synthetic-shapes", type=lambda s: [x for x in s.split(",") if x], default=[],
                   help="LABELLED SYNTHETIC scaling: e.g. qwen2.5-7b,qwen2.5-14b,qwen2.5-32b")
    p.add_argument("--synthetic-acceptance", type=lambda s: [float(x) for x in s.split(",")], default=[0.6, 0.8])
    p.add_argument("--synthetic-gammas", type=lambda s: [int(x) for x in s.split(",")], default=[4])
    p.add_argument("--synthetic-tokens", type=int, default=96)
    p.add_argument("--deadline", type=float, default=0.0, help="seconds; later sections are skipped past it")
    return p


def load_config_dict(path: Path, dtype: str | None, fuse: bool, quantization: str | None = None) -> dict[str, Any]:
    data = tomllib.loads(path.read_text())
    for table in [data.get("target", {}), *data.get("arm", [])]:
        if table.get("use") == "fast":
            if dtype:
                table["dtype"] = dtype
            if quantization:
                table["quantization"] = quantization
            if fuse:
                table["fuse"] = True
            if isinstance(table.get("model"), str) and not Path(table["model"]).is_absolute():
                candidate = path.parent / table["model"]
                table["model"] = str(candidate) if candidate.is_dir() else table["model"]
    return data


def model_paths(pipeline: Any, data: dict[str, Any]) -> dict[str, str | None]:
    from flashspec_hf.weights import resolve_model

    draft = next((a.get("model") for a in data.get("arm", []) if a.get("use") in ("fast", "hf")), None)
    return {"target": resolve_model(data["target"]["model"]), "draft": resolve_model(draft) if draft else None}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `flashspec bench -- --workload ...`: the core CLI's REMAINDER delegation needs the "--".
    args = parser().parse_args(argv[1:] if argv[:1] == ["--"] else argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        raise ValueError(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    start = time.perf_counter()
    deadline = start + args.deadline if args.deadline > 0 else math.inf
    args.out.mkdir(parents=True, exist_ok=True)
    workload = read_workload(args.workload)
    workload = (interleave(workload) if args.order == "interleaved" else workload)[: args.prompts or None]
    result: dict[str, Any] = {"environment": environment(), "args": {k: (str(v) if isinstance(v, Path) else v)
                              for k, v in vars(args).items()}, "config": args.config.read_text(),
                              "workload": workload, "runs": {}, "summaries": {}}
    out_file = args.out / "bench.json"

    def record(name: str, run: dict[str, Any]) -> None:
        result["runs"][name] = run
        result["summaries"][name] = summarize_run(run) if run["requests"] else {"error": run.get("error")}
        s = result["summaries"][name]
        if s.get("tokens_per_s"):
            _say(f"{name}: {s['tokens_per_s']:.1f} tokens/s" + (f", mean accepted length {s['mean_accepted_length']:.2f}"
                                                                 if "mean_accepted_length" in s else ""))
        out_file.write_text(json.dumps(result))  # partial results survive a later failure

    if not args.systems and args.synthetic_shapes:  # random-weight shapes only: no real model is loaded
        result["bandwidth_bytes_per_s"] = bw = copy_bandwidth(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        result["synthetic_scaling"] = synthetic_scaling(args, record, bw, deadline)
        result["summary"] = {"synthetic_scaling": result["synthetic_scaling"]}
        result["wall_s"] = time.perf_counter() - start
        out_file.write_text(json.dumps(result, indent=1))
        _say(f"wrote {out_file}")
        return 0

    from flashspec_core.build import build_pipeline

    data = load_config_dict(args.config, args.dtype, args.fuse, args.quantization)
    _say(f"building pipeline from {args.config}")
    pipeline = build_pipeline(data, progress=_say)
    prompts = [pipeline._encode(w["prompt"]) for w in workload]
    domains = [w["domain"] for w in workload]
    groups = batches(len(prompts), args.batch_size)
    result["bandwidth_bytes_per_s"] = bw = copy_bandwidth(pipeline.target.device)
    result["draft_prewarm"] = flashspec_runs(pipeline, prompts, groups, args, domains, record)
    result["floor"] = floors(pipeline, args.batch_size, bw)
    if args.temperature == 0 and "target_only" in result["runs"]:
        plain = result["runs"]["target_only"]
        result["bf16_divergence"] = {name: divergences(pipeline, prompts, run, plain)
                                     for name, run in result["runs"].items() if name.startswith(("fixed", "bandit"))}
    paths = model_paths(pipeline, data)
    eos = pipeline.target.eos_token_ids
    if args.exactness and time.perf_counter() < deadline:
        result["exactness"] = exactness(args, data, prompts[: args.exactness], domains)
    del pipeline
    gc.collect()
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if any(s.startswith("hf_") for s in args.systems):
        hf_runs(paths, prompts, domains, eos, args, record, deadline)
    if args.synthetic_shapes:
        result["synthetic_scaling"] = synthetic_scaling(args, record, bw, deadline)
    result["summary"] = headline(result, args)
    result["wall_s"] = time.perf_counter() - start
    out_file.write_text(json.dumps(result, indent=1))
    _say(f"wrote {out_file}")
    plots(result, args.out)
    print(json.dumps(result["summary"], indent=2))
    return 0


def floors(pipeline: Any, batch: int, bandwidth: float | None) -> dict[str, Any]:
    target = pipeline.target.model
    out: dict[str, Any] = {"target_forward_bytes": forward_bytes(target, batch),
                           "target_forward_floor_ms": floor_ms(forward_bytes(target, batch), bandwidth), "arms": {}}
    for arm in pipeline.arms:
        model = getattr(arm.provider, "model", None)
        if model is not None and arm.gamma:
            d = floor_ms(forward_bytes(model, batch), bandwidth)
            out["arms"][arm.name] = {"draft_forward_bytes": forward_bytes(model, batch), "draft_forward_floor_ms": d,
                                     "step_floor_ms": None if d is None else arm.gamma * d + out["target_forward_floor_ms"]}
        elif arm.gamma:
            out["arms"][arm.name] = {"step_floor_ms": out["target_forward_floor_ms"]}
    return out


def exactness(args: argparse.Namespace, data: dict[str, Any], prompts: list[list[int]], domains: list[str]) -> dict[str, Any]:
    """float32, TF32 off: greedy speculative (bandit over every arm) vs target-only, token for token."""
    from flashspec_core.build import build_pipeline

    _say("exactness: float32, TF32 off")
    # The bf16 runs filled dynamo's per-function cache (the fused ops compile with fullgraph=True); float32 inputs
    # would recompile each of them past the limit, so start from an empty cache.
    torch._dynamo.reset()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        f32 = load_config_dict(args.config, "float32", False)
        pipe = build_pipeline(f32)
        eargs = argparse.Namespace(**{**vars(args), "temperature": 0.0, "systems": ["flashspec", "target_only"],
                                      "warmup": 0, "repeats": 1, "no_fixed_arms": True, "selectors": []})
        runs: dict[str, Any] = {}
        flashspec_runs(pipe, prompts, batches(len(prompts), 1), eargs, domains, lambda n, r: runs.__setitem__(n, r))
        plain = {r["prompt"]: r["tokens"] for r in runs.pop("target_only")["requests"]}
        (name, spec), = runs.items()
        rows = [{"prompt": r["prompt"], "identical": r["tokens"] == plain[r["prompt"]],
                 "first_divergence": first_divergence(r["tokens"], plain[r["prompt"]])} for r in spec["requests"]]
        del pipe
        gc.collect()
        return {"dtype": "float32", "tf32": False, "system": name, "prompts": rows,
                "greedy_identical": all(r["identical"] for r in rows)}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def headline(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Ratios over the prompts every compared system ran (the HF baselines may run fewer)."""
    s = result["summaries"]
    runs = result["runs"]
    spec = [n for n in s if n.startswith(("fixed:", "bandit:")) and s[n].get("tokens_per_s")]
    out: dict[str, Any] = {"batch_size": args.batch_size, "temperature": args.temperature,
                           "max_new_tokens": args.max_new_tokens}
    if not spec:
        return out
    best = max(spec, key=lambda n: s[n]["tokens_per_s"])
    out["best_flashspec"] = best
    out["best_flashspec_tokens_per_s"] = s[best]["tokens_per_s"]
    out["mean_accepted_length"] = s[best]["mean_accepted_length"]
    out["host_fraction"] = s[best]["host_fraction"]
    for key, base in (("speedup_vs_hf_generate", "hf_eager"), ("speedup_vs_hf_compiled", "hf_compiled"),
                      ("speedup_vs_hf_assisted", "hf_assisted"), ("speedup_vs_hf_lookup", "hf_lookup"),
                      ("speedup_vs_own_target_only", "target_only")):
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


def plots(result: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _say("matplotlib not installed: no plots")
        return
    s = {n: v for n, v in result["summaries"].items() if v.get("tokens_per_s") and not n.startswith("synthetic")}
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(s) + 1.5))
    ax.barh(list(s), [v["tokens_per_s"] for v in s.values()])
    ax.set_xlabel("tokens/s")
    ax.set_title(f"{result['environment']['device']}: tokens/s by system")
    fig.tight_layout()
    fig.savefig(out / "tokens_per_s.png", dpi=100)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, v in s.items():
        for arm, a in (v.get("arms") or {}).items():
            if a["acceptance_by_position"] and name.startswith("fixed"):
                ax.plot(range(1, len(a["acceptance_by_position"]) + 1), a["acceptance_by_position"], marker="o", label=arm)
    ax.set_xlabel("draft position")
    ax.set_ylabel("P(accepted at or beyond)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "acceptance_by_position.png", dpi=100)
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(s) + 1.5))
    left = [0.0] * len(s)
    names = [n for n in s if s[n].get("breakdown_ms")]
    for part in ("draft_ms", "target_ms", "verify_ms", "host_ms"):
        vals = [s[n]["breakdown_ms"][part] for n in names]
        ax.barh(names, vals, left=left[: len(names)], label=part.removesuffix("_ms"))
        left = [a + b for a, b in zip(left, vals, strict=False)]
    ax.set_xlabel("ms per step (mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "step_breakdown.png", dpi=100)
    plt.close("all")


if __name__ == "__main__":
    sys.exit(main())
