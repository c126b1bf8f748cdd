"""Forms of the verifier's logits pass, side by side on one CUDA GPU (H200).

    python benchmarks/pass_variants.py --out DIR [--commit SHA] [--reps N]

The full pass (``_lse_partial_kernel``) streams every target logit once with an online
log-sum-exp. In fp32 it runs within a few per cent of the simplest read of the same bytes
(``verify_flush.py``'s floor); in bf16, with twice the logits per byte, it ran 12-20%
slower than that floor, so the bf16 pass spends time on arithmetic, not only on DRAM.
This script times forms of the pass (flags in ``FORMS``):

* ``prod``: the verifier's kernel in its per-block form (``TILE = 0``; its only form until
  0809441, which took the tile form for 2-byte logits from this script's run at 3af83a3):
  one max per row per block, which takes a reduction across the program's warps and a
  barrier per block. Triton already
  emits ``ex2.approx.ftz.f32`` for its ``exp2`` (the PTX counts are in the rows), so a
  flush-to-zero exp2 is nothing to gain;
* ``prod_tile``: the verifier's kernel as it runs now (``PASS_TILE``: the tile form below,
  without fma, for 2-byte logits; the per-block form for fp32);
* ``fma``: ``exp2(x * s - m * s)`` (one fused multiply-add) instead of ``exp2((x - m) * s)``;
* ``raw_max``: ``fma`` with the block max taken on the loaded dtype (bf16) before the upcast;
* ``tileC``: the block as ``[BLOCK_V / C, C]`` with a running max per tile row of ``C``
  logits, so the max needs no reduction across warps (C = 8: inside one thread); one more
  ``exp2`` per tile row and block, and a fold over the tile rows at the end;
* ``_rs``: each tile row's sum reduced every block (``[BLOCK_V / C]`` running sums instead
  of ``BLOCK_V``: fewer registers, so more programs per SM);
* ``_sK`` / ``s2``: the loop as ``tl.range(..., num_stages=K)`` (software-pipelined loads);
* ``pf``: the next block loaded into registers before this one is folded.

Every form first runs a sweep of (logits per block, warps, programs per SM) on five shapes
(``do_bench``); the config with the smallest sum of time / that shape's best time is then
timed on every shape of issue 4's goal band (``B (gamma + 1) V >= 10M``) with ``do_bench``
(write flush) and ``verify_flush.py``'s read-flush timer, beside the read floor. Each
form's log-sum-exp is checked against ``torch.logsumexp`` in float64. Writes
``DIR/pass-variants-h200{--tag}.json`` (raw times, the PTX's ``ex2`` instructions, registers,
``summary``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_flush as vf  # noqa: E402
import verify_kernels as vk  # noqa: E402

DEV = vk.DEV
ops = vk.ops
SWEEP_CONFIGS = [(2048, 4), (4096, 4), (4096, 8), (8192, 8)]
SWEEP_PER_SM = [8, 32]
# name -> flags: fma (exp2(x * s - m * s)), raw_max (block max on the loaded dtype), tile (C: a
# running max per C logits; 0: one per block), rs (sum each tile row per block: [R] sums
# instead of [R, C]), stages (tl.range num_stages; 0: plain range), pf (load the next block
# before folding this one)
FLAG_NAMES = ("fma", "raw_max", "tile", "rs", "stages", "pf")
FORMS = {
    "fma": (1, 0, 0, 0, 0, 0),
    "raw_max": (1, 1, 0, 0, 0, 0),
    "s2": (0, 0, 0, 0, 2, 0),
    "pf": (0, 0, 0, 0, 0, 1),
    "tile8": (1, 0, 8, 0, 0, 0),
    "tile32": (1, 0, 32, 0, 0, 0),
    "tile32_s3": (1, 0, 32, 0, 3, 0),
    "tile8_rs": (1, 0, 8, 1, 0, 0),
    "tile8_rs_pf": (1, 0, 8, 1, 0, 1),
    "tile16_rs_s3": (1, 0, 16, 1, 3, 0),
    "tile32_rs_s3": (1, 0, 32, 1, 3, 0),
}


@triton.jit
def _fold_block(raw, s, m, scale, FMA: tl.constexpr, RAW_MAX: tl.constexpr, RS: tl.constexpr):
    if RAW_MAX:
        bm = tl.max(raw, axis=1).to(tl.float32)
        x = raw.to(tl.float32)
    else:
        x = raw.to(tl.float32)
        bm = tl.max(x, axis=1)
    m_new = tl.maximum(m, bm)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    # exactly 1 when the max did not move (an fma here would compound its rounding every block)
    c = tl.math.exp2((m - m_safe) * scale)
    if FMA:
        e = tl.math.exp2(x * scale - (m_safe * scale)[:, None])
    else:
        e = tl.math.exp2((x - m_safe[:, None]) * scale)
    if RS:
        return s * c + tl.sum(e, axis=1), m_new
    else:
        return s * c[:, None] + e, m_new


@triton.jit(do_not_specialize=["blocks_per_split"])
def _pass_form(
    logits_ptr,
    part_ptr,
    inv_t,
    V,
    blocks_per_split,
    n_rows,
    BLOCK_V: tl.constexpr,
    R: tl.constexpr,
    FMA: tl.constexpr,
    RAW_MAX: tl.constexpr,
    RS: tl.constexpr,
    STAGES: tl.constexpr,
    PF: tl.constexpr,
):
    # the block is an [R, BLOCK_V // R] tile of consecutive logits; one running max per tile row
    C: tl.constexpr = BLOCK_V // R
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    base = logits_ptr + row * V
    lo = split * blocks_per_split * BLOCK_V
    offs0 = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    scale = inv_t * 1.4426950408889634
    if RS:
        s = tl.zeros((R,), tl.float32)
    else:
        s = tl.zeros((R, C), tl.float32)
    m = tl.full((R,), float("-inf"), tl.float32)
    if PF:
        nxt = tl.load(base + lo + offs0, mask=lo + offs0 < V, other=float("-inf"))
        for blk in range(blocks_per_split):
            cur = nxt
            offs = lo + (blk + 1) * BLOCK_V + offs0
            nxt = tl.load(base + offs, mask=(offs < V) & (blk + 1 < blocks_per_split), other=float("-inf"))
            s, m = _fold_block(cur, s, m, scale, FMA, RAW_MAX, RS)
    elif STAGES > 0:
        for blk in tl.range(blocks_per_split, num_stages=STAGES):
            offs = lo + blk * BLOCK_V + offs0
            raw = tl.load(base + offs, mask=offs < V, other=float("-inf"))
            s, m = _fold_block(raw, s, m, scale, FMA, RAW_MAX, RS)
    else:
        for blk in range(blocks_per_split):
            offs = lo + blk * BLOCK_V + offs0
            raw = tl.load(base + offs, mask=offs < V, other=float("-inf"))
            s, m = _fold_block(raw, s, m, scale, FMA, RAW_MAX, RS)
    m_row = tl.max(m, axis=0)
    m_row_safe = tl.where(m_row == float("-inf"), 0.0, m_row)
    w = tl.math.exp2((m - m_row_safe) * scale)
    if RS:
        s_row = tl.sum(s * w, axis=0)
    else:
        s_row = tl.sum(tl.sum(s, axis=1) * w, axis=0)
    out = row * nsplit + split
    tl.store(part_ptr + out, m_row * inv_t)
    tl.store(part_ptr + n_rows * nsplit + out, s_row)


def form_fn(name: str, logits: torch.Tensor, block: int, warps: int, per_sm: int):
    """A launcher of one form at one config, and the partials it fills."""
    v = logits.shape[-1]
    rows, nsplit, per, part = vk.pass_grid(logits, block, per_sm)
    if name in ("prod", "prod_tile"):
        tile = 0 if name == "prod" else ops.PASS_TILE[logits.element_size()]

        def run():
            return ops._lse_partial_kernel[(rows, nsplit)](
                logits, part, 1.0, v, per, BLOCK_V=block, TILE=tile, num_warps=warps
            )
    else:
        fma, raw_max, c, rs, stages, pf = FORMS[name]
        r = 1 if c == 0 else block // c

        def run():
            return _pass_form[(rows, nsplit)](
                logits,
                part,
                1.0,
                v,
                per,
                rows,
                BLOCK_V=block,
                R=r,
                FMA=fma,
                RAW_MAX=raw_max,
                RS=rs,
                STAGES=stages,
                PF=pf,
                num_warps=warps,
            )

    return run, part


def lse_error(logits: torch.Tensor, part: torch.Tensor) -> float:
    m, s = part[0].double(), part[1].double()
    top = m.max(dim=1, keepdim=True).values
    lse = top.squeeze(1) + torch.log((s * torch.exp(m - top)).sum(dim=1))
    want = torch.logsumexp(logits.reshape(-1, logits.shape[-1]).double(), dim=-1)
    return float((lse - want).abs().max())


def kernel_facts(compiled: Any) -> dict[str, Any]:
    ptx = compiled.asm.get("ptx", "")
    return {
        "n_regs": getattr(compiled, "n_regs", None),
        "n_spills": getattr(compiled, "n_spills", None),
        "ex2_ftz": ptx.count("ex2.approx.ftz.f32"),
        "ex2_plain": ptx.count("ex2.approx.f32"),
        "bar_sync": ptx.count("bar.sync"),
        "cp_async": ptx.count("cp.async"),
    }


def inputs(b: int, gamma: int, v: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn((b, gamma + 1, v), device=DEV, dtype=torch.float32) * 4).to(dtype)


def sweep(names: list[str]) -> tuple[list[dict], dict]:
    out, chosen = [], {}
    for dtype in (torch.bfloat16, torch.float32):
        for b, gamma, v in vk.SWEEP_SHAPES:
            logits = inputs(b, gamma, v, dtype)
            for name in names:
                for block, warps in SWEEP_CONFIGS:
                    for per_sm in SWEEP_PER_SM:
                        row = dict(
                            form=name,
                            dtype=str(dtype).removeprefix("torch."),
                            B=b,
                            gamma=gamma,
                            V=v,
                            BLOCK_V=block,
                            num_warps=warps,
                            programs_per_sm=per_sm,
                        )
                        try:
                            run, part = form_fn(name, logits, block, warps, per_sm)
                            compiled = run()
                            torch.cuda.synchronize()
                            row["lse_abs_err"] = lse_error(logits, part)
                            row.update(kernel_facts(compiled))
                            row["ms"] = do_bench(run, warmup=10, rep=40, return_mode="median")
                        except Exception as exc:  # a form that does not compile at one config
                            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                        out.append(row)
            vk.log(f"sweep {dtype} {b}x{gamma}x{v} done")
            del logits
    for dtype in ("bfloat16", "float32"):
        rows = [r for r in out if r["dtype"] == dtype and "ms" in r]
        # each shape's best over every form and setting
        ratios = vk.sweep_scores(rows, lambda r: (r["form"], r["BLOCK_V"], r["num_warps"], r["programs_per_sm"]))
        for name in names:
            full = {k[1:]: sum(v) for k, v in ratios.items() if k[0] == name and len(v) == len(vk.SWEEP_SHAPES)}
            if full:
                k = min(full, key=full.get)
                chosen[f"{name}/{dtype}"] = {
                    "BLOCK_V": k[0],
                    "num_warps": k[1],
                    "programs_per_sm": k[2],
                    "score": full[k] / len(vk.SWEEP_SHAPES),
                }
    return out, chosen


def band(names: list[str], chosen: dict, timer: vf.Timer, reps: int, copy_gbs: dict) -> list[dict]:
    rows = []
    for b, gamma, v, dtype in vf.shapes():
        logits = inputs(b, gamma, v, dtype)
        dname = str(dtype).removeprefix("torch.")
        nbytes = logits.numel() * logits.element_size()
        row: dict[str, Any] = {
            "B": b,
            "gamma": gamma,
            "V": v,
            "dtype": dname,
            "logits": logits.numel(),
            "bytes": nbytes,
            "forms": {},
        }
        floors = {k: vf.measure(timer, fn, reps) for k, fn in vf.floor_fn(logits).items()}
        row["floor_ms"] = {h: min(f[h] for f in floors.values()) for h in ("do_bench", "write", "read")}
        for name in names:
            cfg = chosen.get(f"{name}/{dname}")
            if cfg is None:
                continue
            run, part = form_fn(name, logits, cfg["BLOCK_V"], cfg["num_warps"], cfg["programs_per_sm"])
            run()
            ms = vf.measure(timer, run, reps)
            row["forms"][name] = {
                "ms": ms,
                "lse_abs_err": lse_error(logits, part),
                "fraction": {h: nbytes / (t * 1e6) / copy_gbs[h] for h, t in ms.items()},
            }
        row["floor_fraction"] = {h: nbytes / (t * 1e6) / copy_gbs[h] for h, t in row["floor_ms"].items()}
        rows.append(row)
        vk.log(
            f"B={b} gamma={gamma} V={v} {dname}: read-flush fraction "
            + ", ".join(f"{n} {f['fraction']['read']:.1%}" for n, f in row["forms"].items())
            + f", floor {row['floor_fraction']['read']:.1%}"
        )
        del logits
        torch.cuda.empty_cache()
    return rows


def summarize(rows: list[dict], names: list[str], copy_gbs: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dtype in ("bfloat16", "float32"):
        rs = [r for r in rows if r["dtype"] == dtype]
        per: dict[str, Any] = {}
        for name in names:
            have = [r for r in rs if name in r["forms"]]
            if not have:
                continue
            fr = {h: [r["forms"][name]["fraction"][h] for r in have] for h in ("do_bench", "read")}
            x = np.array([r["bytes"] for r in have], dtype=float)
            y = np.array([r["forms"][name]["ms"]["read"] for r in have]) * 1e-3
            slope, t0 = np.polyfit(x, y, 1)
            per[name] = {
                "shapes": len(have),
                "at_goal": {h: sum(f >= vf.GOAL_FRACTION for f in v) for h, v in fr.items()},
                "median_fraction": {h: float(np.median(v)) for h, v in fr.items()},
                "time_vs_prod_read": float(
                    np.median(
                        [
                            r["forms"][name]["ms"]["read"] / r["forms"]["prod"]["ms"]["read"]
                            for r in have
                            if "prod" in r["forms"]
                        ]
                    )
                ),
                "fit_read": {"t0_us": t0 * 1e6, "stream_gbs": 1.0 / slope / 1e9},
                "max_lse_abs_err": max(r["forms"][name]["lse_abs_err"] for r in have),
            }
        fl = {h: [r["floor_fraction"][h] for r in rs] for h in ("do_bench", "read")}
        per["floor"] = {
            "shapes": len(rs),
            "at_goal": {h: sum(f >= vf.GOAL_FRACTION for f in v) for h, v in fl.items()},
            "median_fraction": {h: float(np.median(v)) for h, v in fl.items()},
        }
        out[dtype] = per
    return {"copy_bandwidth_gbs": copy_gbs, "by_dtype": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default=None)
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--forms", default=",".join(["prod", "prod_tile", *FORMS]))
    parser.add_argument("--per-sm", default=",".join(map(str, SWEEP_PER_SM)),
                        help="programs per SM the sweep tries (a large value: one block per program)")
    parser.add_argument("--tag", default="", help="suffix of the output file's name")  # fmt: skip
    args = parser.parse_args(argv)
    names = args.forms.split(",")
    SWEEP_PER_SM[:] = [int(x) for x in args.per_sm.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    sweep_rows, chosen = sweep(names)
    vk.log("chosen:", json.dumps(chosen))
    (args.out / "pass-variants-sweep.json").write_text(json.dumps({"sweep": sweep_rows, "chosen": chosen}))
    timer = vf.Timer()
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    y = torch.empty_like(x)
    big = vf.measure(timer, lambda d=y, s=x: d.copy_(s), args.reps)
    copy_gbs = {k: 2 * n / ms / 1e6 for k, ms in big.items()}
    del x, y
    rows = band(names, chosen, timer, args.reps, copy_gbs)
    props = torch.cuda.get_device_properties(DEV)
    result = {
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "commit": args.commit,
        "config": {
            "reps": args.reps,
            "forms": {k: dict(zip(FLAG_NAMES, f, strict=True)) for k, f in FORMS.items()},
            "sweep_shapes": vk.SWEEP_SHAPES,
            "sweep_configs": SWEEP_CONFIGS,
            "sweep_per_sm": SWEEP_PER_SM,
            "prod_pass_config": ops.PASS_CONFIG,
        },
        "seconds": time.time() - t,
        "sweep": sweep_rows,
        "chosen": chosen,
        "copy_1gib_ms": big,
        "rows": rows,
        "summary": summarize(rows, names, copy_gbs),
    }
    path = args.out / f"pass-variants-h200{args.tag}.json"
    path.write_text(json.dumps(result, indent=1))
    vk.log(f"wrote {path}")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
