"""The bandwidth floor of a decode step, and the labelled-synthetic scaling runs.

A fast-model forward at batch ``B`` reads its weights and the KV slots it attends (every
``max_len`` slot of the static cache); streamed at the copy bandwidth measured in the same
run, those bytes give the step's floor.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from flashspec_bench.provenance import logger
from flashspec_bench.runs import Always, run_pipeline, summarize_run, sync

say = logger("bench")


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


def floors(pipeline: Any, batch: int, bandwidth: float | None) -> dict[str, Any]:
    target = pipeline.target.model
    if not hasattr(target, "args"):  # the hf back-end's models carry no layer shapes to count bytes from
        return {"not_measured": f"{type(target).__name__} is not a fast model"}
    out: dict[str, Any] = {"target_forward_bytes": forward_bytes(target, batch),
                           "target_forward_floor_ms": floor_ms(forward_bytes(target, batch), bandwidth), "arms": {}}
    for arm in pipeline.arms:
        model = getattr(arm.provider, "model", None)
        if hasattr(model, "args") and arm.gamma:
            d = floor_ms(forward_bytes(model, batch), bandwidth)
            out["arms"][arm.name] = {"draft_forward_bytes": forward_bytes(model, batch), "draft_forward_floor_ms": d,
                                     "step_floor_ms": None if d is None else arm.gamma * d + out["target_forward_floor_ms"]}
        elif arm.gamma:
            out["arms"][arm.name] = {"step_floor_ms": out["target_forward_floor_ms"]}
    return out


def synthetic_scaling(args: argparse.Namespace, record: Callable[[str, dict[str, Any]], None], bandwidth: float | None,
                      deadline: float) -> list[dict[str, Any]]:
    """LABELLED SYNTHETIC: random weights with Qwen2.5 layer shapes, fixed acceptance."""
    from flashspec_core.pipeline import Arm, NoDraft, Pipeline
    from flashspec_core.policy import StepPolicy
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
    sargs = argparse.Namespace(**{**vars(args), "max_new_tokens": args.synthetic_tokens, "temperature": 0.0})
    groups, domains = [[0], [1]], ["synthetic"] * 2

    def timed(pipe: Any) -> dict[str, Any]:
        run_pipeline(pipe, prompts, groups[:1], sargs, domains)  # warm-up
        return run_pipeline(pipe, prompts, groups, sargs, domains)

    for shape in args.synthetic_shapes:
        if time.perf_counter() > deadline:
            say(f"synthetic {shape}: skipped (deadline)")
            continue
        topts = FastOptions(model=f"shape:{shape}", dtype="bf16", max_len=max_len, fuse=args.fuse)
        tmodel, _ = build_model(topts)
        target = FastTarget(tmodel, None, None, topts)
        draft = FastDraft(draft_model, target.vocab, dopts)
        base = summarize_run(timed(Pipeline(target, SyntheticVerifier(1.0),
                                            StepPolicy([Arm("none", NoDraft(), 0)], Always(0, 1), make_reward("acceptance")))))
        t_floor, d_floor = floor_ms(forward_bytes(tmodel, 1), bandwidth), floor_ms(forward_bytes(draft_model, 1), bandwidth)
        for acc in args.synthetic_acceptance:
            for gamma in args.synthetic_gammas:
                run = timed(Pipeline(target, SyntheticVerifier(acc),
                                     StepPolicy([Arm(f"draft-g{gamma}", draft, gamma)], Always(0, 1), make_reward("acceptance"))))
                s = summarize_run(run)
                record(f"synthetic:{shape}:a{acc}:g{gamma}", run)
                table.append({
                    "label": "synthetic (random weights, fixed acceptance)", "target_shape": shape,
                    "draft_shape": "qwen2.5-0.5b", "acceptance": acc, "gamma": gamma,
                    "target_only_tokens_per_s": base["tokens_per_s"], "spec_tokens_per_s": s["tokens_per_s"],
                    "speedup_vs_own_target_only": s["tokens_per_s"] / base["tokens_per_s"],
                    "mean_accepted_length": s["mean_accepted_length"],
                    "target_only_step_ms_p50": base["step_ms_p50"], "spec_step_ms_p50": s["step_ms_p50"],
                    "target_forward_floor_ms": t_floor,
                    "spec_step_floor_ms": None if t_floor is None or d_floor is None else gamma * d_floor + t_floor,
                })
                say(f"synthetic {shape} a={acc} g={gamma}: {table[-1]['speedup_vs_own_target_only']:.2f}x")
        del target, tmodel
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return table
