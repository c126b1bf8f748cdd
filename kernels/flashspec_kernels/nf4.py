"""NF4 weight-only 4-bit GEMMs for decoding: the weights are dequantized inside the kernel.

A weight is stored as NF4 (:mod:`flashspec_kernels.nf4_format`). A decoding forward reads
the weights once per forward, so 4-bit weights read a quarter of bf16's bytes; the cost is
dequantizing them, which a separate pass would pay in bf16 bytes written and read again.

``_nf4_kernel``, grid ``(column blocks, slices of K)`` as :func:`flashspec_kernels.gemv.blocks`
chooses them for the matrix (so narrow matrices split ``K`` to fill the GPU, and a row's bits
do not depend on the other rows): program ``(j, s)`` computes ``y[:, cols] = x @ W[cols]^T``
over slice ``s`` for every row of ``x`` (at most :data:`MAX_ROWS`, one 16-row tile), stepping
``BLOCK_K`` (a multiple of :data:`GROUP`) at a time and inside a step one group at a time: it
loads the group's packed bytes of its columns and the group's one scale per column, takes the
low nibbles (even ``k``) and the high nibbles (odd ``k``) as two tiles, turns each index into
its code-book value by a tree of selects on its bits (in registers: no table load), multiplies
it by the scale in float32, rounds it once to the model dtype (what :func:`dequantize` gives),
and accumulates ``tl.dot`` of each tile with the even or odd columns of ``x`` in float32; the
slices' float32 partials are added in slice order by the last to arrive (gemv's counters),
the bias joins the float32 sum, and the result is rounded once. :func:`pick` gives a launch as
many pipeline stages as the GPU's shared memory holds (:func:`shared_bytes`).
Wider inputs (a prefill) dequantize the whole matrix and call ``F.linear``
(:func:`nf4_linear`). In Triton's interpreter the dot runs in float32 and bfloat16 casts
round to nearest by hand, as in :mod:`flashspec_kernels.gemv`, so the CPU tests check the
GPU's arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from flashspec_kernels.gemv import (
    COUNTERS,
    SHARED,
    SMS,
    Config,
    _dot,
    _interpreting,
    _round,
    _shared,
    _sms,
    blocks,
    fit,
    launch,
    prepare,
)
from flashspec_kernels.nf4_format import GROUP, NF4_VALUES, dequantize, quantize

__all__ = ["GROUP", "KERNEL_ROWS", "MAX_ROWS", "NF4_VALUES", "dequantize", "nf4_gemv", "nf4_linear", "pick", "quantize"]
MAX_ROWS = 16  # rows one launch of the kernel takes (one tile)
# Rows nf4_linear sends through the kernel, a launch per tile: each re-reads the 4-bit weights,
# and past four tiles the dequantized matrix (prefills) reads fewer bytes (4.5 per weight).
KERNEL_ROWS = 4 * MAX_ROWS


# The code book as compile-time constants (NF4_VALUES are float32 values, so each literal is exact).
_C0: tl.constexpr = tl.constexpr(NF4_VALUES[0])
_C1: tl.constexpr = tl.constexpr(NF4_VALUES[1])
_C2: tl.constexpr = tl.constexpr(NF4_VALUES[2])
_C3: tl.constexpr = tl.constexpr(NF4_VALUES[3])
_C4: tl.constexpr = tl.constexpr(NF4_VALUES[4])
_C5: tl.constexpr = tl.constexpr(NF4_VALUES[5])
_C6: tl.constexpr = tl.constexpr(NF4_VALUES[6])
_C7: tl.constexpr = tl.constexpr(NF4_VALUES[7])
_C8: tl.constexpr = tl.constexpr(NF4_VALUES[8])
_C9: tl.constexpr = tl.constexpr(NF4_VALUES[9])
_C10: tl.constexpr = tl.constexpr(NF4_VALUES[10])
_C11: tl.constexpr = tl.constexpr(NF4_VALUES[11])
_C12: tl.constexpr = tl.constexpr(NF4_VALUES[12])
_C13: tl.constexpr = tl.constexpr(NF4_VALUES[13])
_C14: tl.constexpr = tl.constexpr(NF4_VALUES[14])
_C15: tl.constexpr = tl.constexpr(NF4_VALUES[15])


@triton.jit
def _code(idx):
    """The float32 code-book value of each 4-bit index: a tree of selects on its bits, in
    registers (a table load per weight, which the pipeliner stages through shared memory, made
    the first version of this kernel ten times slower than bf16)."""
    b0 = (idx & 1) != 0
    b1 = (idx & 2) != 0
    b2 = (idx & 4) != 0
    lo = tl.where(b2, tl.where(b1, tl.where(b0, _C7, _C6), tl.where(b0, _C5, _C4)),
                  tl.where(b1, tl.where(b0, _C3, _C2), tl.where(b0, _C1, _C0)))
    hi = tl.where(b2, tl.where(b1, tl.where(b0, _C15, _C14), tl.where(b0, _C13, _C12)),
                  tl.where(b1, tl.where(b0, _C11, _C10), tl.where(b0, _C9, _C8)))
    return tl.where((idx & 8) != 0, hi, lo)


@triton.jit
def _nf4_group(acc, x_ptr, p_ptr, s_ptr, k0, k_hi, rows, rmask, cols, cmask, stride_xm, stride_pn, stride_sn,
               GROUP: tl.constexpr, INTERPRET: tl.constexpr):
    """``acc + x[:, g] @ W[cols, g]^T`` for the group ``g`` that starts at ``k0``: its packed
    bytes ``[BLOCK_N, GROUP / 2]`` give the even ``k`` (low nibbles) and the odd ``k`` (high
    nibbles) as two tiles, each multiplied by the even or odd columns of ``x``, and the group's
    one scale per column."""
    dt = x_ptr.dtype.element_ty
    j = tl.arange(0, GROUP // 2)
    ke = k0 + 2 * j  # the even k of each byte
    emask, omask = ke < k_hi, ke + 1 < k_hi
    xs = x_ptr + rows[:, None] * stride_xm + ke[None, :]
    xe = tl.load(xs, mask=rmask[:, None] & emask[None, :], other=0.0)
    xo = tl.load(xs + 1, mask=rmask[:, None] & omask[None, :], other=0.0)
    byte = tl.load(p_ptr + cols[:, None] * stride_pn + (k0 // 2 + j)[None, :], mask=cmask[:, None] & emask[None, :],
                   other=0).to(tl.int32)
    # a step's last groups can start past the slice (K short of the step): their scales lie
    # past the row's, the last row's past the tensor
    scale = tl.load(s_ptr + cols * stride_sn + k0 // GROUP, mask=cmask & (cols * 0 + k0 < k_hi),
                    other=0.0)[:, None]
    we = _round(_code(byte & 15) * scale, dt, INTERPRET).to(dt)
    wo = _round(_code(byte >> 4) * scale, dt, INTERPRET).to(dt)
    return _dot(xo, wo, _dot(xe, we, acc, INTERPRET), INTERPRET)


@triton.jit
def _nf4_kernel(
    x_ptr, p_ptr, s_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_pn, stride_sn,
    stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUP: tl.constexpr, BIAS: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K  # BLOCK_K: a multiple of GROUP
    k_lo = pid_k * per_split
    k_hi = tl.minimum(K, k_lo + per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for g in tl.static_range(BLOCK_K // GROUP):  # a group at a time: one scale per column
            acc = _nf4_group(acc, x_ptr, p_ptr, s_ptr, k0 + g * GROUP, k_hi, rows, rmask, cols, cmask, stride_xm,
                             stride_pn, stride_sn, GROUP, INTERPRET)
    if SPLIT_K > 1:
        # partials [SPLIT_K, BLOCK_M, N] float32; the last slice of a column block to arrive adds
        # them in slice order (so the bits do not depend on which finished first) and resets
        # the block's counter for the next launch or graph replay (flashspec_kernels.gemv)
        here = rows[:, None] * N + cols[None, :]
        pmask = tl.broadcast_to(cmask[None, :], (BLOCK_M, BLOCK_N))
        tl.store(part_ptr + pid_k * BLOCK_M * N + here, acc, mask=pmask)
        tl.debug_barrier()  # every thread's partials are stored before the counter says so
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sl in range(SPLIT_K):
                acc += tl.load(part_ptr + sl * BLOCK_M * N + here, mask=pmask, other=0.0, cache_modifier=".cg")
            _nf4_store(acc, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om, BIAS, INTERPRET)
            tl.atomic_xchg(count_ptr + pid_n, 0)
    else:
        _nf4_store(acc, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om, BIAS, INTERPRET)


@triton.jit
def _nf4_store(acc, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om, BIAS: tl.constexpr, INTERPRET: tl.constexpr):
    dt = out_ptr.dtype.element_ty
    if BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(ptrs, _round(acc, dt, INTERPRET).to(dt), mask=rmask[:, None] & cmask[None, :])


def shared_bytes(cfg: Config, itemsize: int) -> int:
    """Shared memory of a ``_nf4_kernel`` program, an upper bound of what Triton 3.9 gives it
    (``tests/kernels/test_shared_memory.py``): ``num_stages - 1`` buffers of a step's loads (per
    group: x's even and odd columns, the packed bytes, a scale per column), and a group's x and
    W tiles in float32 for the dot's layout change."""
    groups, half = cfg.block_k // GROUP, GROUP // 2
    step = groups * (2 * MAX_ROWS * half * itemsize + cfg.block_n * half + cfg.block_n * 4)
    return (cfg.num_stages - 1) * step + 2 * (MAX_ROWS + cfg.block_n) * half * 4


def pick(n: int, k: int, sms: int = SMS, itemsize: int = 2, shared: int = SHARED) -> Config:
    """:func:`flashspec_kernels.gemv.blocks` for an ``[n, k]`` weight, with as many stages as a
    GPU with ``sms`` SMs and ``shared`` bytes of shared memory per program holds for inputs of
    ``itemsize`` bytes."""
    return fit(blocks(n, k, sms=sms), lambda cfg: shared_bytes(cfg, itemsize), shared, min_block_k=GROUP)


def nf4_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
             config: Config | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)`` for ``M <= MAX_ROWS``, ``W [N, K]`` the NF4 weight
    ``(packed, scales)`` of :func:`quantize`; ``[M, N]`` in ``x``'s dtype. Column blocks,
    slices of ``K`` and stages as :func:`pick` chooses them for the matrix and the GPU (never
    for ``M``), or ``config``; written to ``out`` where given (``[M, N]``, rows may be strided: a
    slice of a wider output). No host sync; graph-capturable once
    :func:`flashspec_kernels.gemv.prepare` has run for the device."""
    m, k = x.shape
    n = packed.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"nf4_gemv takes at most {MAX_ROWS} rows, got {m}: use nf4_linear")
    groups = -(-k // GROUP)
    if packed.shape != (n, groups * GROUP // 2) or scales.shape != (n, groups):
        raise ValueError(f"x [{m}, {k}] does not fit the NF4 weight: packed {tuple(packed.shape)}, "
                         f"scales {tuple(scales.shape)} (want [N, {groups * GROUP // 2}] and [N, {groups}])")
    x, packed, scales = x.contiguous(), packed.contiguous(), scales.contiguous()
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"nf4_gemv: out must be [{m}, {n}] {x.dtype} with unit column stride, got "
                         f"{list(out.shape)} {out.dtype} strides {out.stride()}")
    if m == 0 or n == 0:
        return out
    cfg = config or pick(n, k, _sms(x.device), x.element_size(), _shared(x.device))
    if cfg.block_k % GROUP:
        raise ValueError(f"nf4_gemv: {cfg} steps K by {cfg.block_k}, not a multiple of the {GROUP}-weight group")
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    counters = part = out  # unused where SPLIT_K == 1
    if cfg.split_k > 1:
        counters = prepare(x.device)
        if grid[0] > COUNTERS:
            raise ValueError(f"nf4_gemv: {grid[0]} column blocks of split-K partials exceed {COUNTERS} counters")
        part = torch.empty((cfg.split_k * MAX_ROWS * n,), dtype=torch.float32, device=x.device)
    launch(
        _nf4_kernel, grid,
        (x, packed, scales, bias if bias is not None else out, out, part, counters, m, n, k,
         x.stride(0), packed.stride(0), scales.stride(0), out.stride(0)), cfg,
        BLOCK_M=MAX_ROWS, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, GROUP=GROUP,
        BIAS=bias is not None, INTERPRET=_interpreting(x.device),
    )
    return out


def nf4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
               kernel: bool = True) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for an NF4 weight and ``x [..., K]``: where ``kernel``, the
    kernel for at most :data:`KERNEL_ROWS` rows (one launch per :data:`MAX_ROWS` of them: a verify
    forward of a few rows of a batch, each launch reading the 4-bit weights once, and a row's
    bits the same in any batch), else the dequantized matrix (prefills)."""
    rows = x.reshape(-1, x.shape[-1])
    if not kernel or rows.shape[0] > KERNEL_ROWS:
        return F.linear(x, dequantize(packed, scales, x.dtype, x.shape[-1]), bias)
    out = torch.empty((rows.shape[0], packed.shape[0]), dtype=x.dtype, device=x.device)
    for i in range(0, rows.shape[0], MAX_ROWS):
        nf4_gemv(rows[i : i + MAX_ROWS], packed, scales, bias, out=out[i : i + MAX_ROWS])
    return out.reshape(*x.shape[:-1], packed.shape[0])
