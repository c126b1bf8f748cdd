"""How the L2 flush before each timed call bears on the logits pass's bandwidth (H200).

    python benchmarks/verify_flush.py --out DIR [--commit SHA] [--reps N]

``verify_kernels.py`` times with ``triton.testing.do_bench``, which clears the L2 before
every call by *writing* 256 MB (``cache.zero_()``). The L2 (50 MB on the H200) is then full
of dirty lines, and a timed kernel that reads fresh data must first write those lines back
to DRAM as it evicts them: a read of ``n`` bytes below the L2's size moves up to ``2 n``
bytes. This script times the same kernels three ways, side by side in one run:

* ``do_bench``: as ``verify_kernels.py`` (write flush, median);
* ``write``: our own CUDA-event timer after the same write flush (checks the timer);
* ``read``: the same timer after a flush that *reads* 256 MB (a sum), which leaves only
  clean lines in the L2: the timed kernel still reads every input from DRAM, but evicts
  nothing dirty.

Kernels: the logits pass (``_lse_partial_kernel``, the verifier's default config) and the
read floor of ``verify_kernels.py`` (simplest streaming read, fastest of its block sizes),
for every shape of ``verify_kernels.py`` with at least 10M logits (issue 4's goal band),
bf16 and fp32; and a device-to-device copy of 1 GiB (the bandwidth reference) and of each
shape's bytes. Writes ``DIR/verify-flush-h200.json`` with the raw medians and a ``summary``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_kernels as vk  # noqa: E402

DEV = vk.DEV
FLUSH_BYTES = 256 << 20  # as triton.testing.do_bench
GOAL_LOGITS = 10_000_000  # issue 4: the bandwidth goal holds from B (gamma + 1) V >= 10M
GOAL_FRACTION = 0.8


class Timer:
    """Median CUDA-event time of ``fn`` after a flush that writes or reads FLUSH_BYTES."""

    def __init__(self) -> None:
        self.cache = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=DEV).fill_(1.0)
        self.sink = torch.empty((), dtype=torch.float32, device=DEV)

    def flush(self, how: str) -> None:
        if how == "write":
            self.cache.zero_()
        else:  # read: a sum over the buffer leaves only clean lines in the L2
            torch.sum(self.cache, dim=0, out=self.sink)

    def __call__(self, fn: Callable[[], Any], how: str, reps: int) -> float:
        fn()
        times = []
        for _ in range(reps):
            self.flush(how)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times)


def shapes() -> list[tuple[int, int, int, torch.dtype]]:
    g = vk.SHAPE_GRID
    return [(b, gamma, v, dtype) for dtype in g["dtypes"] for v in g["V"] for gamma in g["gamma"] for b in g["B"]
            if b * (gamma + 1) * v >= GOAL_LOGITS]


def floor_fn(logits: torch.Tensor) -> dict[str, Callable[[], Any]]:
    n = logits.numel()
    fns = {}
    for block, warps in vk.READ_FLOOR_CONFIGS:
        out = torch.empty(triton.cdiv(n, block), dtype=torch.float32, device=DEV)
        kernel = vk._read_floor_kernel[(triton.cdiv(n, block),)]
        fns[f"{block}x{warps}"] = (lambda k=kernel, o=out, bl=block, w=warps:
                                   k(logits, o, n, BLOCK=bl, num_warps=w))
    return fns


def measure(timer: Timer, fn: Callable[[], Any], reps: int) -> dict[str, float]:
    return {"do_bench": do_bench(fn, warmup=10, rep=25, return_mode="median"),
            "write": timer(fn, "write", reps), "read": timer(fn, "read", reps)}


def fit(rows: list[dict[str, Any]], key: str, dtype: str, copy_gbs: float) -> dict[str, Any]:
    """Least squares ``time = t0 + bytes / stream`` over the rows' read-flush medians: the
    fixed cost of one kernel and its streaming rate, and the fewest logits at which the
    line reaches GOAL_FRACTION of the copy (None if its streaming rate never does)."""
    rs = [r for r in rows if r["dtype"] == dtype]
    x = np.array([r["bytes"] for r in rs], dtype=float)
    y = np.array([r[key]["read"] for r in rs], dtype=float) * 1e-3  # s
    slope, t0 = np.polyfit(x, y, 1)
    stream = 1.0 / slope  # bytes/s
    want = GOAL_FRACTION * copy_gbs * 1e9
    need = want * t0 / (1.0 - want / stream) if stream > want else None
    size = rs[0]["bytes"] // rs[0]["logits"]
    return {"rows": len(rs), "t0_us": t0 * 1e6, "stream_gbs": stream / 1e9,
            "logits_for_goal": None if need is None else need / size}


def summarize(rows: list[dict[str, Any]], copy_gbs: dict[str, float]) -> dict[str, Any]:
    def band(key: str, how: str, dtype: str) -> dict[str, Any]:
        xs = [r[key][how] for r in rows if r["dtype"] == dtype]
        return {"shapes": len(xs), "at_goal": sum(x >= GOAL_FRACTION for x in xs), "min": min(xs), "max": max(xs)}

    dtypes = ("bfloat16", "float32")
    summary: dict[str, Any] = {
        "copy_bandwidth_gbs": copy_gbs,
        "goal": f"logits pass >= {GOAL_FRACTION:.0%} of the 1 GiB copy's bandwidth (same flush) for every shape "
                f"with >= {GOAL_LOGITS} logits",
        "pass": {how: {d: band("pass_fraction", how, d) for d in dtypes} for how in ("do_bench", "write", "read")},
        "floor": {how: {d: band("floor_fraction", how, d) for d in dtypes} for how in ("do_bench", "write", "read")},
        "fit_read_flush": {"how": "least squares time = t0 + bytes / stream over the goal-band rows of each dtype "
                                  "(read flush); logits_for_goal: where that line reaches the goal fraction of the "
                                  "read-flush 1 GiB copy",
                           **{k: {d: fit(rows, f"{k}_ms", d, copy_gbs["read"]) for d in dtypes}
                              for k in ("pass", "floor")}},
    }
    summary["met_with_read_flush"] = all(summary["pass"]["read"][d]["at_goal"] == summary["pass"]["read"][d]["shapes"]
                                         for d in dtypes)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--from", dest="src", type=Path, default=None,
                        help="recompute the summary of this verify-flush-h200.json from its raw rows (no GPU)")
    args = parser.parse_args(argv)
    if args.src is not None:
        data = json.loads(args.src.read_text())
        data["summary"] = summarize(data["rows"], data["summary"]["copy_bandwidth_gbs"])
        (args.out / "verify-flush-h200.json").write_text(json.dumps(data, indent=1))
        print(json.dumps(data["summary"]["fit_read_flush"], indent=1))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    timer = Timer()
    props = torch.cuda.get_device_properties(DEV)
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    y = torch.empty_like(x)
    big = measure(timer, lambda d=y, s=x: d.copy_(s), args.reps)
    copy_gbs = {k: 2 * n / ms / 1e6 for k, ms in big.items()}
    del x, y
    vk.log(f"copy 1 GiB: {copy_gbs}")
    rows = []
    for b, gamma, v, dtype in shapes():
        logits = (torch.randn((b, gamma + 1, v), device=DEV, dtype=torch.float32) * 4).to(dtype)
        nbytes = logits.numel() * logits.element_size()
        pass_ms = measure(timer, vk.logits_pass_fn(logits), args.reps)
        floors = {name: measure(timer, fn, args.reps) for name, fn in floor_fn(logits).items()}
        floor_ms = {how: min(f[how] for f in floors.values()) for how in ("do_bench", "write", "read")}
        dst = torch.empty_like(logits)
        same_copy = measure(timer, lambda d=dst, s=logits: d.copy_(s), args.reps)
        row = {"B": b, "gamma": gamma, "V": v, "dtype": str(dtype).removeprefix("torch."),
               "logits": logits.numel(), "bytes": nbytes, "pass_ms": pass_ms, "floor_ms": floor_ms,
               "floor_by_config": floors, "same_size_copy_ms": same_copy,
               "pass_fraction": {k: nbytes / (ms * 1e6) / copy_gbs[k] for k, ms in pass_ms.items()},
               "floor_fraction": {k: nbytes / (ms * 1e6) / copy_gbs[k] for k, ms in floor_ms.items()}}
        rows.append(row)
        vk.log(f"B={b} gamma={gamma} V={v} {row['dtype']}: pass "
               + ", ".join(f"{k} {x:.1%}" for k, x in row["pass_fraction"].items()))
        del logits, dst
        torch.cuda.empty_cache()

    summary = summarize(rows, copy_gbs)
    result = {"device": props.name, "sm_count": props.multi_processor_count,
              "l2_bytes": getattr(props, "L2_cache_size", None), "torch": torch.__version__,
              "triton": triton.__version__, "cuda": torch.version.cuda, "commit": args.commit,
              "config": {"reps": args.reps, "flush_bytes": FLUSH_BYTES, "pass_config": vk.ops.PASS_CONFIG,
                         "floor_configs": vk.READ_FLOOR_CONFIGS,
                         "timers": "do_bench: triton.testing.do_bench median (write flush), warmup 10 ms, rep 25 ms; "
                                   "write/read: median of reps CUDA-event intervals, each after a write or read "
                                   "flush of flush_bytes"},
              "copy_1gib_ms": big, "rows": rows, "summary": summary}
    path = args.out / "verify-flush-h200.json"
    path.write_text(json.dumps(result, indent=1))
    vk.log(f"wrote {path}")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
