"""A whole decoding forward of a Qwen2 / Llama decoder in one persistent Triton launch.

At batch 1 a small model's forward is bound by kernel count, not bytes: on the H200 the
0.5B draft's forward took 1.09 ms in 277 kernels against a 0.25 ms bandwidth floor
(``docs/benchmarks/fast-profile-h200.json``). Every launch pays a fixed cost (gap, ramp,
tail) that CUDA graphs do not remove, and a GEMV of a 2 MB matrix cannot fill 132 SMs
long enough to amortise it. So here the layers are walked by one grid of ``P`` programs
(one per SM) that stays resident: each *phase* of a layer splits its work into items
spread over the programs, and a grid-wide barrier (an atomic counter per phase) separates
a phase from the next, which reads what the others wrote. Per layer (``x``: the residual
stream ``[M, D]``, ``M = B * T`` rows, at most ``MAX_ROWS``):

A. ``qkv = rms_norm(x) @ Wqkv^T + b``, an item per 16 column pairs ``(j, j + hd / 2)`` of
   one head, so that it can rotate its query or key columns itself (``x * cos +
   rotate_half(x) * sin``) and write rotated queries to a buffer, rotated keys and the
   values into the KV cache at each token's slot;
B. attention, an item per (row, KV head, split of ``CHUNK`` slots): the grouped queries
   of the row fold the split's slots they may see (slot ``<= position``) into an online
   softmax in float32, base 2, and write the split's partial ``(max, sum, acc)``; the
   item that finishes last for its (row, KV head) (an atomic counter, as split-K GEMMs
   do) rescales the splits to their common max, adds them in split order and writes
   the attention output ``o`` in the model dtype;
C. ``x += o @ Wo^T``, an item per 16 output columns;
D. ``a = silu(g) * u`` with ``[g, u] = rms_norm(x) @ Wgu^T``, an item per 16 columns;
E. ``x += a @ Wdown^T``, an item per 16 output columns;

and after the last layer the final norm, written to ``out`` for the LM head (cuBLAS's
GEMM, a wide matrix it streams at bandwidth). Five barriers per layer replace about ten
launches.

**Barriers.** The grid has one program per SM and every program is resident, so
spinning cannot starve one that has yet to arrive (more programs per SM than fit at once
would hang: the grid is never larger). A program arrives with a release
atomic once all its threads' stores are done and spins on an acquire load; data written
by other programs in this launch is read with ``.cg`` loads (L2, not the SM's L1, which
is not coherent). The last program to leave zeroes the counters for the next launch (and
CUDA-graph replay). ``phased`` mode launches each phase alone instead (no spinning): the
interpreter on the CPU runs a grid's programs one after another, where a barrier would
never open, and on the GPU it isolates a suspected barrier fault.

**Numerics** follow :mod:`flashspec_fast.model`'s torch path: norms in float32, cast to
the model dtype before the weight multiply; GEMMs accumulate in float32 and round once
with their bias or residual; the rotation in float32 for 16-bit models, rounded once (as
:mod:`flashspec_kernels.rope`); gate and up rounded before ``silu(g) * u`` in float32.
float32 models use IEEE products. The split boundaries (multiples of ``CHUNK``) and every
tile shape depend on the model alone, never on ``M`` or the span, so a row gets the same
bits alone or in a batch, as in :mod:`flashspec_kernels.attention`.

:func:`decode_ref` is the same forward in plain torch, for tests.
"""

from __future__ import annotations

import math
import os

import attrs
import torch
import triton
import triton.language as tl

from flashspec_kernels.gemv import _dot, _round

MAX_ROWS = 16  # B * T of a forward this kernel runs (one 16-row tile)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_M = 16
BLOCK_N = 16  # output columns per GEMM item
CHUNK = 128  # cache slots per attention split
ATT_BLOCK = 64  # slots per inner attention step
PHASES = 5  # per layer: qkv, attention, out, gate-up, down
MODES = ("persistent", "phased")
_LOG2E = 1.4426950408889634


@triton.jit
def _sync(bar_ptr, idx, nprog, PERSISTENT: tl.constexpr):
    """Grid barrier ``idx``: returns once all ``nprog`` programs have arrived."""
    if PERSISTENT:
        tl.debug_barrier()  # every thread's stores are issued before the arrival says so
        tl.atomic_add(bar_ptr + idx, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar_ptr + idx, 0, sem="acquire", scope="gpu")
        while seen < nprog:
            seen = tl.atomic_add(bar_ptr + idx, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _rstd(x_ptr, rows, rmask, D, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in tl.range(0, D, BLOCK_K, num_stages=2):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * D + ks[None, :], mask=rmask[:, None] & (ks < D)[None, :], other=0.0,
                    cache_modifier=".cg").to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return tl.rsqrt(ss / D + eps)


@triton.jit
def _normed(x_ptr, nw_ptr, rows, rmask, ks, kmask, rstd, D, dt: tl.constexpr, INTERPRET: tl.constexpr):
    """``weight * (x * rstd).to(dt)`` of a ``[BLOCK_M, BLOCK_K]`` slice, in ``dt``."""
    x = tl.load(x_ptr + rows[:, None] * D + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    h = _round(x * rstd[:, None], dt, INTERPRET)
    nw = tl.load(nw_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
    return _round(nw[None, :] * h, dt, INTERPRET).to(dt)


@triton.jit
def _phase_qkv(x_ptr, w_ptr, b_ptr, nw_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
               M, D, eps, pid, nprog,
               H: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, BIAS: tl.constexpr, UPCAST: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr, STAGES: tl.constexpr,
               INTERPRET: tl.constexpr):
    dt: tl.constexpr = x_ptr.dtype.element_ty
    half: tl.constexpr = HD // 2
    chunks: tl.constexpr = (half + 15) // 16
    n_items = (H + 2 * KV) * chunks
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    if pid < n_items:
        rstd = _rstd(x_ptr, rows, rmask, D, eps, BLOCK_M, NORM_K)
        pos = tl.load(pos_ptr + rows, mask=rmask, other=0)
        slot = tl.load(slot_ptr + rows, mask=rmask, other=0)
        for item in range(pid, n_items, nprog):
            hh = item // chunks
            j = (item % chunks) * 16 + tl.arange(0, 16)
            jm = j < half
            col = hh * HD + j  # the pair's first halves; + half: the second
            acc1 = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, 16), dtype=tl.float32)
            for k0 in tl.range(0, D, BLOCK_K, num_stages=STAGES):
                ks = k0 + tl.arange(0, BLOCK_K)
                km = ks < D
                h = _normed(x_ptr, nw_ptr, rows, rmask, ks, km, rstd, D, dt, INTERPRET)
                wm = jm[:, None] & km[None, :]
                w1 = tl.load(w_ptr + col[:, None] * D + ks[None, :], mask=wm, other=0.0)
                w2 = tl.load(w_ptr + (col + half)[:, None] * D + ks[None, :], mask=wm, other=0.0)
                acc1 = _dot(h, w1, acc1, INTERPRET)
                acc2 = _dot(h, w2, acc2, INTERPRET)
            if BIAS:
                acc1 += tl.load(b_ptr + col, mask=jm, other=0.0).to(tl.float32)[None, :]
                acc2 += tl.load(b_ptr + col + half, mask=jm, other=0.0).to(tl.float32)[None, :]
            y1 = _round(acc1, dt, INTERPRET)  # the projection's values in the model dtype
            y2 = _round(acc2, dt, INTERPRET)
            sm = rmask[:, None] & jm[None, :]
            if hh < H + KV:  # a query or key head: rotate
                tab = pos[:, None] * HD + j[None, :]
                c1 = tl.load(cos_ptr + tab, mask=sm, other=0.0)
                c2 = tl.load(cos_ptr + tab + half, mask=sm, other=0.0)
                s1 = tl.load(sin_ptr + tab, mask=sm, other=0.0)
                s2 = tl.load(sin_ptr + tab + half, mask=sm, other=0.0)
                if UPCAST:
                    c1, c2, s1, s2 = c1.to(tl.float32), c2.to(tl.float32), s1.to(tl.float32), s2.to(tl.float32)
                o1 = _round(y1 * c1 + (-y2) * s1, dt, INTERPRET).to(dt)
                o2 = _round(y2 * c2 + y1 * s2, dt, INTERPRET).to(dt)
                if hh < H:
                    dst = q_ptr + rows[:, None] * (H * HD) + col[None, :]
                else:
                    dst = kc_ptr + slot[:, None] * (KV * HD) + (col - H * HD)[None, :]
                tl.store(dst, o1, mask=sm)
                tl.store(dst + half, o2, mask=sm)
            else:
                dst = vc_ptr + slot[:, None] * (KV * HD) + (col - (H + KV) * HD)[None, :]
                tl.store(dst, y1.to(dt), mask=sm)
                tl.store(dst + half, y2.to(dt), mask=sm)


@triton.jit
def _phase_attention(q_ptr, kc_ptr, vc_ptr, pos_ptr, ml_ptr, acc_ptr, o_ptr, cnt_ptr, M, T, S, nsplit, qk_scale,
                     pid, nprog,
                     H: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, G: tl.constexpr,
                     BLOCK_M: tl.constexpr, CHUNK: tl.constexpr, ATT_BLOCK: tl.constexpr, STAGES: tl.constexpr,
                     INTERPRET: tl.constexpr):
    dt: tl.constexpr = q_ptr.dtype.element_ty
    n_items = (M // T) * KV * nsplit
    d = tl.arange(0, HD_PAD)
    dm = d < HD
    for item in range(pid, n_items, nprog):
        s = item % nsplit
        h = (item // nsplit) % KV
        b = item // (nsplit * KV)
        start = s * CHUNK
        kv_base = b * S * (KV * HD) + h * HD  # row b's slots of this layer's cache
        for r0 in range(0, G * T, BLOCK_M):
            r = r0 + tl.arange(0, BLOCK_M)  # query rows g * T + t of this KV head
            live = r < G * T
            g = r // T
            t = r % T
            row = b * T + t
            head = h * G + g
            q = tl.load(q_ptr + row[:, None] * (H * HD) + head[:, None] * HD + d[None, :],
                        mask=live[:, None] & dm[None, :], other=0.0, cache_modifier=".cg")
            p_row = tl.load(pos_ptr + row, mask=live, other=-1)
            stop = tl.minimum(start + CHUNK, tl.max(p_row, axis=0) + 1)
            m = tl.full([BLOCK_M], float("-inf"), tl.float32)
            den = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
            for n0 in tl.range(start, stop, ATT_BLOCK, num_stages=STAGES):
                n = n0 + tl.arange(0, ATT_BLOCK)
                in_range = n < stop
                kv_off = kv_base + n[:, None] * (KV * HD) + d[None, :]
                k = tl.load(kc_ptr + kv_off, mask=in_range[:, None] & dm[None, :], other=0.0, cache_modifier=".cg")
                v = tl.load(vc_ptr + kv_off, mask=in_range[:, None] & dm[None, :], other=0.0, cache_modifier=".cg")
                sc = _dot(q, k, tl.zeros((BLOCK_M, ATT_BLOCK), dtype=tl.float32), INTERPRET) * qk_scale
                seen = (n[None, :] <= p_row[:, None]) & in_range[None, :]
                sc = tl.where(seen, sc, float("-inf"))
                m_new = tl.maximum(m, tl.max(sc, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m - m_safe)
                p = tl.exp2(sc - m_safe[:, None])
                den = den * alpha + tl.sum(p, axis=1)
                pv = _dot(_round(p, dt, INTERPRET).to(dt), tl.trans(v), tl.zeros((BLOCK_M, HD_PAD), dtype=tl.float32),
                          INTERPRET)  # p in the cache dtype, as flash attention does
                acc = acc * alpha[:, None] + pv
                m = m_new
            at = (row * H + head) * nsplit + s  # [BLOCK_M] partial slots, [M, H, splits]
            tl.store(ml_ptr + at * 2, m, mask=live)
            tl.store(ml_ptr + at * 2 + 1, den, mask=live)
            tl.store(acc_ptr + at[:, None] * HD_PAD + d[None, :], acc, mask=live[:, None])
        # the split that finishes last for this (row, KV head) combines all of them into o
        tl.debug_barrier()  # every thread's partials are stored before the counter says so
        arrived = tl.atomic_add(cnt_ptr + b * KV + h, 1, sem="acq_rel", scope="gpu")
        if arrived == nsplit - 1:
            for r0 in range(0, G * T, BLOCK_M):
                r = r0 + tl.arange(0, BLOCK_M)
                live = r < G * T
                row = b * T + r % T
                head = h * G + r // T
                first = (row * H + head) * nsplit
                top = tl.full([BLOCK_M], float("-inf"), tl.float32)
                for sp in range(0, nsplit):
                    top = tl.maximum(top, tl.load(ml_ptr + (first + sp) * 2, mask=live, other=float("-inf"),
                                                  cache_modifier=".cg"))
                top = tl.where(top == float("-inf"), 0.0, top)
                o = tl.zeros((BLOCK_M, HD_PAD), dtype=tl.float32)
                total = tl.zeros((BLOCK_M,), dtype=tl.float32)
                for sp in range(0, nsplit):  # in split order; empty splits (sum 0) add exact zeros
                    part = tl.load(ml_ptr + (first + sp) * 2 + 1, mask=live, other=0.0, cache_modifier=".cg")
                    mx = tl.load(ml_ptr + (first + sp) * 2, mask=live, other=0.0, cache_modifier=".cg")
                    w = tl.where(part > 0, tl.exp2(mx - top), 0.0)
                    o += tl.load(acc_ptr + (first + sp)[:, None] * HD_PAD + d[None, :], mask=live[:, None], other=0.0,
                                 cache_modifier=".cg") * w[:, None]
                    total += part * w
                o = o / tl.where(total > 0, total, 1.0)[:, None]
                tl.store(o_ptr + row[:, None] * (H * HD) + head[:, None] * HD + d[None, :],
                         _round(o, dt, INTERPRET).to(dt), mask=live[:, None] & dm[None, :])
            tl.atomic_xchg(cnt_ptr + b * KV + h, 0)  # ready for the next layer and launch


@triton.jit
def _phase_residual_gemv(x_ptr, w_ptr, in_ptr, M, D, K, pid, nprog, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, STAGES: tl.constexpr, INTERPRET: tl.constexpr):
    """``x += in @ W^T`` (``in`` ``[M, K]``, written earlier in this launch; W ``[D, K]``), an
    item per ``BLOCK_N`` output columns: the output projection and the down projection."""
    dt: tl.constexpr = x_ptr.dtype.element_ty
    n_items = tl.cdiv(D, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    for item in range(pid, n_items, nprog):
        cols = item * BLOCK_N + tl.arange(0, BLOCK_N)
        cm = cols < D
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            ks = k0 + tl.arange(0, BLOCK_K)
            km = ks < K
            a = tl.load(in_ptr + rows[:, None] * K + ks[None, :], mask=rmask[:, None] & km[None, :], other=0.0,
                        cache_modifier=".cg")
            w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=cm[:, None] & km[None, :], other=0.0)
            acc = _dot(a, w, acc, INTERPRET)
        ptrs = x_ptr + rows[:, None] * D + cols[None, :]
        mask = rmask[:, None] & cm[None, :]
        y = acc + tl.load(ptrs, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(ptrs, _round(y, dt, INTERPRET).to(dt), mask=mask)


@triton.jit
def _phase_gate_up(x_ptr, w_ptr, nw_ptr, act_ptr, M, D, F, eps, pid, nprog,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr,
                   STAGES: tl.constexpr, INTERPRET: tl.constexpr):
    dt: tl.constexpr = x_ptr.dtype.element_ty
    n_items = tl.cdiv(F, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    if pid < n_items:
        rstd = _rstd(x_ptr, rows, rmask, D, eps, BLOCK_M, NORM_K)
        for item in range(pid, n_items, nprog):
            cols = item * BLOCK_N + tl.arange(0, BLOCK_N)
            cm = cols < F
            acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in tl.range(0, D, BLOCK_K, num_stages=STAGES):
                ks = k0 + tl.arange(0, BLOCK_K)
                km = ks < D
                h = _normed(x_ptr, nw_ptr, rows, rmask, ks, km, rstd, D, dt, INTERPRET)
                wm = cm[:, None] & km[None, :]
                wg = tl.load(w_ptr + cols[:, None] * D + ks[None, :], mask=wm, other=0.0)
                wu = tl.load(w_ptr + (cols + F)[:, None] * D + ks[None, :], mask=wm, other=0.0)
                acc_g = _dot(h, wg, acc_g, INTERPRET)
                acc_u = _dot(h, wu, acc_u, INTERPRET)
            g = _round(acc_g, dt, INTERPRET)
            y = g * tl.sigmoid(g) * _round(acc_u, dt, INTERPRET)
            tl.store(act_ptr + rows[:, None] * F + cols[None, :], _round(y, dt, INTERPRET).to(dt),
                     mask=rmask[:, None] & cm[None, :])


@triton.jit
def _phase_final_norm(x_ptr, nw_ptr, out_ptr, M, D, eps, pid, nprog,
                      BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr, INTERPRET: tl.constexpr):
    dt: tl.constexpr = x_ptr.dtype.element_ty
    n_items = tl.cdiv(D, BLOCK_K)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    if pid < n_items:
        rstd = _rstd(x_ptr, rows, rmask, D, eps, BLOCK_M, NORM_K)
        for item in range(pid, n_items, nprog):
            ks = item * BLOCK_K + tl.arange(0, BLOCK_K)
            km = ks < D
            h = _normed(x_ptr, nw_ptr, rows, rmask, ks, km, rstd, D, dt, INTERPRET)
            tl.store(out_ptr + rows[:, None] * D + ks[None, :], h, mask=rmask[:, None] & km[None, :])


@triton.jit
def _decoder_kernel(
    x_ptr, out_ptr, pos_ptr, slot_ptr, cos_ptr, sin_ptr,
    wqkv_ptr, bqkv_ptr, anorm_ptr, wo_ptr, mnorm_ptr, wgu_ptr, wd_ptr, fnorm_ptr,
    kc_ptr, vc_ptr, q_ptr, ml_ptr, acc_ptr, o_ptr, cnt_ptr, act_ptr, bar_ptr,
    M, T, S, layers, layer_cache, nsplit, D, F, eps, qk_scale, phase_lo, phase_hi,
    H: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, G: tl.constexpr,
    BIAS: tl.constexpr, UPCAST: tl.constexpr, PERSISTENT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NORM_K: tl.constexpr, STAGES: tl.constexpr,
    CHUNK: tl.constexpr, ATT_BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nqkv: tl.constexpr = (H + 2 * KV) * HD
    for li in range(0, layers):
        layer = tl.cast(li, tl.int64)
        idx = li * 5
        kc = kc_ptr + layer * layer_cache
        vc = vc_ptr + layer * layer_cache
        if phase_lo <= idx and idx < phase_hi:
            _phase_qkv(x_ptr, wqkv_ptr + layer * nqkv * D, bqkv_ptr + layer * nqkv, anorm_ptr + layer * D, q_ptr, kc, vc,
                       cos_ptr, sin_ptr, pos_ptr, slot_ptr, M, D, eps, pid, nprog,
                       H, KV, HD, BIAS, UPCAST, BLOCK_M, BLOCK_K, NORM_K, STAGES, INTERPRET)
            _sync(bar_ptr, idx, nprog, PERSISTENT)
        if phase_lo <= idx + 1 and idx + 1 < phase_hi:
            _phase_attention(q_ptr, kc, vc, pos_ptr, ml_ptr, acc_ptr, o_ptr, cnt_ptr, M, T, S, nsplit, qk_scale, pid,
                             nprog, H, KV, HD, HD_PAD, G, BLOCK_M, CHUNK, ATT_BLOCK, STAGES, INTERPRET)
            _sync(bar_ptr, idx + 1, nprog, PERSISTENT)
        if phase_lo <= idx + 2 and idx + 2 < phase_hi:
            _phase_residual_gemv(x_ptr, wo_ptr + layer * D * (H * HD), o_ptr, M, D, H * HD, pid, nprog,
                                 BLOCK_M, BLOCK_N, BLOCK_K, STAGES, INTERPRET)
            _sync(bar_ptr, idx + 2, nprog, PERSISTENT)
        if phase_lo <= idx + 3 and idx + 3 < phase_hi:
            _phase_gate_up(x_ptr, wgu_ptr + layer * 2 * F * D, mnorm_ptr + layer * D, act_ptr, M, D, F, eps, pid, nprog,
                           BLOCK_M, BLOCK_N, BLOCK_K, NORM_K, STAGES, INTERPRET)
            _sync(bar_ptr, idx + 3, nprog, PERSISTENT)
        if phase_lo <= idx + 4 and idx + 4 < phase_hi:
            _phase_residual_gemv(x_ptr, wd_ptr + layer * D * F, act_ptr, M, D, F, pid, nprog,
                                 BLOCK_M, BLOCK_N, BLOCK_K, STAGES, INTERPRET)
            _sync(bar_ptr, idx + 4, nprog, PERSISTENT)
    if phase_lo <= layers * 5 and layers * 5 < phase_hi:
        _phase_final_norm(x_ptr, fnorm_ptr, out_ptr, M, D, eps, pid, nprog, BLOCK_M, NORM_K, NORM_K, INTERPRET)
    if PERSISTENT:  # the last program out leaves the counters at zero for the next launch
        tl.debug_barrier()
        gone = tl.atomic_add(bar_ptr + layers * 5, 1, sem="acq_rel", scope="gpu")
        if gone == nprog - 1:
            for i in range(0, layers * 5 + 1):
                tl.atomic_xchg(bar_ptr + i, 0, sem="relaxed", scope="gpu")


@attrs.frozen
class Stacked:
    """A model's layer weights stacked ``[L, ...]`` (contiguous), as the kernel walks them."""

    wqkv: torch.Tensor  # [L, (H + 2 KV) hd, D]
    bqkv: torch.Tensor | None  # [L, (H + 2 KV) hd]
    attn_norm: torch.Tensor  # [L, D]
    wo: torch.Tensor  # [L, D, H hd]
    mlp_norm: torch.Tensor  # [L, D]
    w_gate_up: torch.Tensor  # [L, 2 F, D]
    w_down: torch.Tensor  # [L, D, F]
    norm: torch.Tensor  # [D]


@attrs.frozen
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float


def tuning(dim: int) -> dict[str, int]:
    """Block sizes and pipelining: ``block_k`` (K per GEMM step), ``norm_k`` (a norm's step:
    the whole row up to 1024), ``stages``, ``warps``; ``FLASHSPEC_DECODER_TUNE`` (``"block_k=256,
    warps=8"``) overrides them for measurement."""
    tune = {"block_k": 256, "norm_k": min(1024, max(16, triton.next_power_of_2(dim))), "stages": 3, "warps": 4}
    for part in filter(None, os.environ.get("FLASHSPEC_DECODER_TUNE", "").split(",")):
        key, _, value = part.partition("=")
        if key.strip() not in tune or not value.strip().isdigit():
            raise ValueError(f"FLASHSPEC_DECODER_TUNE: {part!r} is not one of {', '.join(tune)} = a number")
        tune[key.strip()] = int(value)
    return tune


def _interpreting(device: torch.device) -> bool:
    return device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


class Decoder:
    """Scratch buffers and barrier counters of one model on one device, made once (before any
    CUDA-graph capture), and the launcher. ``programs``: the grid (default: one per SM on a
    GPU, 3 in the interpreter, which then walks the work loops with several items per
    program); ``mode``: ``persistent`` (one launch) or ``phased`` (a launch per phase)."""

    def __init__(self, w: Stacked, shape: Shape, cos: torch.Tensor, sin: torch.Tensor, mode: str = "persistent",
                 programs: int | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"decoder mode must be one of {', '.join(MODES)}, got {mode!r}")
        dtype, device = w.wqkv.dtype, w.wqkv.device
        if dtype not in DTYPES:
            raise ValueError(f"the persistent decoder runs float16, bfloat16 and float32 models, not {dtype}")
        if shape.head_dim % 2 or shape.heads % shape.kv_heads:
            raise ValueError(f"the persistent decoder needs an even head dim and whole query groups, not head dim "
                             f"{shape.head_dim} with {shape.heads} heads over {shape.kv_heads} KV heads")
        if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != shape.head_dim or cos.dtype != dtype:
            raise ValueError(f"rotary tables cos {tuple(cos.shape)} / sin {tuple(sin.shape)} {cos.dtype} must be "
                             f"[S, {shape.head_dim}] in {dtype}")
        self.w, self.shape = w, shape
        self.cos, self.sin = cos.contiguous(), sin.contiguous()  # the model's own tables, so the bits match
        max_len = self.max_len = cos.shape[0]
        self.interpret = _interpreting(device)
        if self.interpret and mode == "persistent":
            mode = "phased"  # the interpreter runs programs one after another: a barrier would never open
        self.mode = mode
        self.tune = tuning(w.wqkv.shape[2])
        if programs is None:  # one per SM: all resident at once, whatever the kernel's registers and shared memory
            programs = 3 if self.interpret else int(torch.cuda.get_device_properties(device).multi_processor_count)
        self.programs = programs
        layers, nq = w.wqkv.shape[0], shape.heads * shape.head_dim
        self.hd_pad = max(16, triton.next_power_of_2(shape.head_dim))
        self.max_splits = triton.cdiv(max_len, CHUNK)
        self.q = torch.zeros((MAX_ROWS, nq), dtype=dtype, device=device)
        parts = MAX_ROWS * shape.heads * self.max_splits  # attention partial sums [rows, heads, splits]
        self.ml = torch.zeros((parts * 2,), dtype=torch.float32, device=device)
        self.acc = torch.zeros((parts * self.hd_pad,), dtype=torch.float32, device=device)
        self.o = torch.zeros((MAX_ROWS, nq), dtype=dtype, device=device)  # attention output
        self.counts = torch.zeros((MAX_ROWS * shape.kv_heads,), dtype=torch.int32, device=device)  # splits arrived
        self.act = torch.zeros((MAX_ROWS, w.w_down.shape[2]), dtype=dtype, device=device)
        self.bar = torch.zeros((layers * PHASES + 1,), dtype=torch.int32, device=device)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, width: int, span: int, layers: int | None = None) -> torch.Tensor:
        """Run ``layers`` (default all) over ``x`` ``[M, D]`` (the embedded tokens, updated in
        place: the residual stream) and return the final-normed rows ``[M, D]``.

        ``pos``: ``[M]`` positions (row-major over ``B`` rows of ``width`` tokens); ``slots``:
        ``[M]`` flat slots ``b * S + slot`` where each token's key and value go; caches
        ``[L, B', S, KV hd]`` contiguous, ``B' >= B``; ``span``: every position is below it."""
        w, sh = self.w, self.shape
        m, dim = x.shape
        n_layers = w.wqkv.shape[0] if layers is None else layers
        if not 1 <= m <= MAX_ROWS or m % width or width < 1:
            raise ValueError(f"the persistent decoder takes 1..{MAX_ROWS} rows in whole rows of width {width}, not {m}")
        if x.dtype != w.wqkv.dtype or not x.is_contiguous() or dim != w.wqkv.shape[2]:
            raise ValueError(f"x {tuple(x.shape)} {x.dtype} does not fit the weights {tuple(w.wqkv.shape)} "
                             f"{w.wqkv.dtype} (contiguous [M, D] wanted)")
        if tuple(pos.shape) != (m,) or tuple(slots.shape) != (m,):
            raise ValueError(f"pos {tuple(pos.shape)} and slots {tuple(slots.shape)} must be [{m}]")
        if not 1 <= span <= self.max_len or not 0 <= n_layers <= w.wqkv.shape[0]:
            raise ValueError(f"span {span} (1..{self.max_len}) or layers {n_layers} (0..{w.wqkv.shape[0]}) out of range")
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape[2] != self.max_len:
            raise ValueError(f"caches {tuple(k_cache.shape)} must be contiguous [L, B, {self.max_len}, KV hd]")
        out = torch.empty_like(x)
        nsplit = triton.cdiv(span, CHUNK)
        layer_cache = k_cache[0].numel()
        args = (
            x, out, pos.contiguous(), slots.contiguous(), self.cos, self.sin,
            w.wqkv, w.bqkv if w.bqkv is not None else w.attn_norm, w.attn_norm, w.wo, w.mlp_norm, w.w_gate_up,
            w.w_down, w.norm, k_cache, v_cache, self.q, self.ml, self.acc, self.o, self.counts, self.act, self.bar,
            m, width, self.max_len, n_layers, layer_cache, nsplit, dim, w.w_down.shape[2], sh.eps,
            _LOG2E / math.sqrt(sh.head_dim),
        )
        meta = dict(
            H=sh.heads, KV=sh.kv_heads, HD=sh.head_dim, HD_PAD=self.hd_pad, G=sh.heads // sh.kv_heads,
            BIAS=w.bqkv is not None, UPCAST=x.dtype != torch.float32,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=self.tune["block_k"], NORM_K=self.tune["norm_k"],
            STAGES=self.tune["stages"], CHUNK=CHUNK, ATT_BLOCK=ATT_BLOCK, INTERPRET=self.interpret,
            num_warps=self.tune["warps"],
        )
        grid = (self.programs,)
        if self.mode == "persistent":
            _decoder_kernel[grid](*args, 0, n_layers * PHASES + 1, PERSISTENT=True, **meta)
        else:
            for phase in range(n_layers * PHASES + 1):
                _decoder_kernel[grid](*args, phase, phase + 1, PERSISTENT=False, **meta)
        return out


def stack(layers: list, norm: torch.Tensor) -> Stacked:
    """Stack per-layer weights (objects with the fast model's ``Layer`` fields) into one
    contiguous tensor per kind. The caller re-points its layers at views of these, so the
    weights are held once."""
    def cat(name: str) -> torch.Tensor:
        return torch.stack([getattr(layer, name) for layer in layers]).contiguous()

    return Stacked(
        wqkv=cat("wqkv"), bqkv=cat("bqkv") if layers[0].bqkv is not None else None, attn_norm=cat("attn_norm"),
        wo=cat("wo"), mlp_norm=cat("mlp_norm"), w_gate_up=cat("w_gate_up"), w_down=cat("w_down"), norm=norm,
    )


def decode_ref(w: Stacked, shape: Shape, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor, pos: torch.Tensor,
               slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, width: int, span: int,
               layers: int | None = None) -> torch.Tensor:
    """:meth:`Decoder.forward` in plain torch, as :mod:`flashspec_fast.model`'s torch path
    computes it (``x`` updated in place, the caches written at ``slots``)."""
    import torch.nn.functional as F

    def norm(h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        f = h.float()
        return weight * (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + shape.eps)).to(h.dtype)

    def rotate(h: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        half = h.shape[-1] // 2
        return h * c + torch.cat((-h[..., half:], h[..., :half]), dim=-1) * s

    m = x.shape[0]
    batch, nh, kv, hd = m // width, shape.heads, shape.kv_heads, shape.head_dim
    c, s = cos[pos][:, None], sin[pos][:, None]  # [M, 1, hd]
    seen = torch.arange(span, device=x.device)[None, :] <= pos[:, None]  # [M, span]
    for i in range(w.wqkv.shape[0] if layers is None else layers):
        qkv = F.linear(norm(x, w.attn_norm[i]), w.wqkv[i], None if w.bqkv is None else w.bqkv[i]).view(m, -1, hd)
        q = rotate(qkv[:, :nh], c, s)
        kf, vf = k_cache[i].view(-1, kv * hd), v_cache[i].view(-1, kv * hd)
        kf[slots] = rotate(qkv[:, nh : nh + kv], c, s).reshape(m, -1)
        vf[slots] = qkv[:, nh + kv :].reshape(m, -1)
        keys = k_cache[i, :batch, :span].view(batch, span, kv, hd).repeat_interleave(nh // kv, dim=2)
        vals = v_cache[i, :batch, :span].view(batch, span, kv, hd).repeat_interleave(nh // kv, dim=2)
        keys = keys.repeat_interleave(width, dim=0).transpose(1, 2)  # [M, H, span, hd]
        vals = vals.repeat_interleave(width, dim=0).transpose(1, 2)
        mask = torch.zeros(seen.shape, dtype=x.dtype, device=x.device).masked_fill(~seen, float("-inf"))
        o = F.scaled_dot_product_attention(q[:, :, None], keys, vals, attn_mask=mask[:, None, None])  # [M, H, 1, hd]
        x.addmm_(o.reshape(m, nh * hd), w.wo[i].t())
        gate, up = F.linear(norm(x, w.mlp_norm[i]), w.w_gate_up[i]).chunk(2, dim=-1)
        x.addmm_(F.silu(gate) * up, w.w_down[i].t())
    return norm(x, w.norm)
