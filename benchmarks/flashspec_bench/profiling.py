"""Where a forward of the fast back-end spends its GPU time (``benchmarks/profile_fast.py``).

Random weights with the Qwen2.5-1.5B (target) and 0.5B (draft) layer shapes, bf16,
CUDA graphs (timing only: the weights do not matter for it). For each forward that a
decode step replays (target width 1 and gamma + 1, the draft's gamma-token loop), it
records the replay time (CUDA events, median over many replays), the number of
kernels in one replay and their GPU time summed by kind (GEMM, attention, Inductor-
fused elementwise, copies, other) from ``torch.profiler``. Variants show what a change
would buy before it is built: ``fuse`` off, the attention span (slots each query
attends: the static cache's ``max_len``) at 768 against 256, and the attention itself:
SDPA (cuDNN) against the Triton decode kernel (``attention = "sdpa" | "triton"``), each
forward measured with both in the same run.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from flashspec_bench.provenance import logger, provenance, write_json

KINDS = [  # first match wins: cuDNN's attention kernel names contain "sm90" too
    ("nf4", re.compile(r"nf4", re.I)),  # flashspec_kernels.nf4's fused dequantize-GEMM (--nf4)
    ("attention", re.compile(r"sdpa|attention|fmha|flash|efficient|softmax|decode_attn", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|splitK|sm90", re.I)),
    ("rope_store", re.compile(r"rope_store", re.I)),  # flashspec_kernels.rope (before Inductor's triton_ names)
    ("fused_elementwise", re.compile(r"^triton_", re.I)),
    ("copy_index", re.compile(r"index|scatter|gather|copy|cat|elementwise|reduce|vectorized|unrolled", re.I)),
]


say = logger("profile")


def kind(name: str) -> str:
    return next((k for k, rx in KINDS if rx.search(name)), "other")


def replay_ms(fn: Any, n: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernels(fn: Any, reps: int = 5) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    by_kind: dict[str, float] = {}
    top = []
    count = 0
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if not dev_us:
            continue
        n = ev.count / reps
        count += n
        k = kind(ev.key)
        by_kind[k] = by_kind.get(k, 0.0) + dev_us / reps / 1e3
        top.append({"kernel": ev.key[:120], "kind": k, "per_replay": n, "ms_per_replay": dev_us / reps / 1e3})
    top.sort(key=lambda r: -r["ms_per_replay"])
    return {"kernels_per_replay": count, "ms_by_kind": by_kind, "top": top[:15]}


def build(shape: str, max_len: int, fuse: bool, attention: str, quantization: str = "none") -> Any:
    from flashspec_fast.options import FastOptions, build_model

    opts = FastOptions(model=f"shape:{shape}", dtype="bf16", max_len=max_len, fuse=fuse, attention=attention,
                       quantization=quantization)
    return build_model(opts)[0]


def graphed(model: Any, width: int, steps: int = 1, whole: bool = False, at: int = 200) -> Any:
    """A captured replay of ``steps`` chained forwards of ``width`` tokens (the draft loop
    feeds its argmax back), at positions from ``at`` of one row."""
    from flashspec_fast.graphs import GraphCache

    model.allocate(1)
    cache = GraphCache(model.device, True)
    ids = torch.full((1, width), 100, dtype=torch.long, device=model.device)
    pos = (at + torch.arange(width, device=model.device))[None]

    forward = torch.compile(model.forward, fullgraph=True, dynamic=False) if whole else model.forward

    def run(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = None
        for _ in range(steps):
            out = forward(ids, pos, pos, last_only=steps > 1)
            ids, pos = out[:, -1].argmax(-1)[:, None], pos[:, -1:] + 1
        return out

    return lambda: cache(("p", width, steps), run, ids, pos)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget", type=float, default=240.0)
    p.add_argument("--commit", default=None, help="the measured commit, where the checkout has no git")
    p.add_argument("--nf4", action="store_true",
                   help="first, the 1.5B target forward with NF4 weights and with bf16, side by side (kind 'nf4': "
                        "the fused dequantize-GEMM kernel)")
    args = p.parse_args(argv)
    t0 = time.time()
    res: dict[str, Any] = {**provenance("benchmarks/profile_fast.py", args.commit),
                           "label": "random weights of the Qwen2.5 shapes: timing only", "runs": []}
    nf4 = [("qwen2.5-1.5b", 256, True, 1, 1, "triton", q) for q in ("nf4", "none")] if args.nf4 else []
    plan: list[tuple[str, int, bool | str, int, int, str, str]] = [  # attention: "sdpa" and "triton" side by side
        *nf4,
        *[(shape, max_len, True, width, steps, attention, "none")
          for shape, max_len, width, steps in (("qwen2.5-1.5b", 256, 1, 1), ("qwen2.5-1.5b", 256, 4, 1),
                                               ("qwen2.5-0.5b", 256, 1, 3), ("qwen2.5-1.5b", 768, 1, 1),
                                               ("qwen2.5-0.5b", 768, 1, 3), ("qwen2.5-1.5b", 1024, 1, 1))
          for attention in ("sdpa", "triton")],
        ("qwen2.5-1.5b", 256, False, 1, 1, "triton", "none"), ("qwen2.5-0.5b", 256, False, 1, 3, "triton", "none"),
    ]
    at = {256: 200, 768: 200, 1024: 900}  # first position: max_len 256 is the engine's span there; 768 is not
    models: dict[tuple[str, int, bool | str, str, str], Any] = {}
    for shape, max_len, fuse, width, steps, attention, quantization in plan:
        if time.time() - t0 > args.budget:
            say(f"budget spent: skipped {shape} max_len={max_len} fuse={fuse} attention={attention} {quantization}")
            continue
        key = (shape, max_len, fuse, attention, quantization)
        if key not in models:
            models.clear()
            torch.cuda.empty_cache()
            models[key] = build(shape, max_len, fuse is True, attention, quantization)
        t1 = time.time()
        fn = graphed(models[key], width, steps, whole=fuse == "whole", at=at[max_len])
        fn()
        build_s = time.time() - t1
        row = {"shape": shape, "max_len": max_len, "position": at[max_len], "fuse": fuse, "attention": attention,
               "quantization": quantization, "width": width,
               "chained_forwards": steps, "capture_s": build_s, "replay_ms": replay_ms(fn), **kernels(fn)}
        row["ms_per_forward"] = row["replay_ms"] / steps
        res["runs"].append(row)
        say(f"{shape} max_len={max_len} fuse={fuse} attention={attention} {quantization} width={width} x{steps}: "
            f"{row['replay_ms']:.3f} ms, "
            f"{row['kernels_per_replay']:.0f} kernels, {({k: round(v, 3) for k, v in row['ms_by_kind'].items()})}")
        write_json(args.out / "fast-profile-h200.json", res)
    return 0

