"""NF4 weight-only 4-bit GEMMs for decoding: the weights are dequantized inside the kernel.

A weight is stored as NF4 (:mod:`flashspec_kernels.nf4_format`). A decoding forward reads
the weights once per forward, so 4-bit weights read a quarter of bf16's bytes; the cost is
dequantizing them, which a separate pass would pay in bf16 bytes written and read again.

``_nf4_kernel``, grid ``(column blocks, slices of K)`` as :func:`flashspec_kernels.gemv.blocks`
chooses them for the matrix (so narrow matrices split ``K`` to fill the GPU, and a row's bits
do not depend on the other rows): program ``(j, s)`` computes ``y[:, cols] = x @ W[cols]^T``
over slice ``s`` for every row of ``x`` (at most :data:`MAX_ROWS`, one 16-row tile), stepping
``BLOCK_K`` at a time: it loads the packed bytes of its columns, picks each weight's nibble,
reads its value from the 16-entry table and multiplies it by its group's scale (float32),
rounds it once to the model dtype (what :func:`dequantize` gives), and accumulates
``tl.dot`` in float32; the slices' float32 partials are added in slice order by the last to
arrive (gemv's counters), the bias joins the float32 sum, and the result is rounded once.
Triton buffers each step's code-book values and scales as float32 tiles in shared memory,
four times the bytes of gemv's bf16 weight tile, so :func:`pick` gives a launch as many
pipeline stages as the GPU's shared memory holds (the 1.5B's gate-up matrix: two on an H100,
where three would take 278528 bytes of its 232448).
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
from flashspec_kernels.nf4_format import GROUP, NF4_VALUES, code_book, dequantize, quantize

__all__ = ["GROUP", "MAX_ROWS", "NF4_VALUES", "dequantize", "nf4_gemv", "nf4_linear", "pick", "quantize"]
MAX_ROWS = 16  # rows the kernel takes (one tile); wider inputs dequantize the matrix


@triton.jit
def _nf4_kernel(
    x_ptr, p_ptr, s_ptr, t_ptr, b_ptr, out_ptr, part_ptr, count_ptr, M, N, K, stride_xm, stride_pn, stride_sn,
    stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    GROUP: tl.constexpr, BIAS: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    dt = out_ptr.dtype.element_ty
    per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * per_split
    k_hi = tl.minimum(K, k_lo + per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_hi
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        wmask = cmask[:, None] & kmask[None, :]
        byte = tl.load(p_ptr + cols[:, None] * stride_pn + (ks // 2)[None, :], mask=wmask, other=0).to(tl.int32)
        idx = (byte >> ((ks % 2) * 4)[None, :]) & 15
        value = tl.load(t_ptr + idx)  # the code book's 16 floats, read from cache
        scale = tl.load(s_ptr + cols[:, None] * stride_sn + (ks // GROUP)[None, :], mask=wmask, other=0.0)
        w = _round(value * scale, dt, INTERPRET).to(dt)
        acc = _dot(x, w, acc, INTERPRET)
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
    (``tests/kernels/test_shared_memory.py``): ``num_stages - 1`` buffers of a step's loads (x,
    and per weight its code-book value and its scale in float32), and a step's x and W tiles
    in float32 (the dot's layout changes)."""
    step = cfg.block_k * (MAX_ROWS * itemsize + cfg.block_n * 8)
    return (cfg.num_stages - 1) * step + cfg.block_k * (MAX_ROWS + cfg.block_n) * 4


def pick(n: int, k: int, sms: int = SMS, itemsize: int = 2, shared: int = SHARED) -> Config:
    """:func:`flashspec_kernels.gemv.blocks` for an ``[n, k]`` weight, with as many stages as a
    GPU with ``sms`` SMs and ``shared`` bytes of shared memory per program holds for inputs of
    ``itemsize`` bytes."""
    return fit(blocks(n, k, sms=sms), lambda cfg: shared_bytes(cfg, itemsize), shared)


def nf4_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
             config: Config | None = None) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)`` for ``M <= MAX_ROWS``, ``W [N, K]`` the NF4 weight
    ``(packed, scales)`` of :func:`quantize`; ``[M, N]`` in ``x``'s dtype. Column blocks,
    slices of ``K`` and stages as :func:`pick` chooses them for the matrix and the GPU (never
    for ``M``), or ``config``. No host sync; graph-capturable once
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
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = config or pick(n, k, _sms(x.device), x.element_size(), _shared(x.device))
    grid = (triton.cdiv(n, cfg.block_n), cfg.split_k)
    counters = part = out  # unused where SPLIT_K == 1
    if cfg.split_k > 1:
        counters = prepare(x.device)
        if grid[0] > COUNTERS:
            raise ValueError(f"nf4_gemv: {grid[0]} column blocks of split-K partials exceed {COUNTERS} counters")
        part = torch.empty((cfg.split_k * MAX_ROWS * n,), dtype=torch.float32, device=x.device)
    launch(
        _nf4_kernel, grid,
        (x, packed, scales, code_book(x.device), bias if bias is not None else out, out, part, counters, m, n, k,
         x.stride(0), packed.stride(0), scales.stride(0), out.stride(0)), cfg,
        BLOCK_M=MAX_ROWS, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, GROUP=GROUP,
        BIAS=bias is not None, INTERPRET=_interpreting(x.device),
    )
    return out


def nf4_linear(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
               kernel: bool = True) -> torch.Tensor:
    """``F.linear(x, W, bias)`` for an NF4 weight and ``x [..., K]``: the kernel for at most
    :data:`MAX_ROWS` rows where ``kernel``, else the dequantized matrix."""
    rows = x.reshape(-1, x.shape[-1])
    if kernel and rows.shape[0] <= MAX_ROWS:
        return nf4_gemv(rows, packed, scales, bias).reshape(*x.shape[:-1], packed.shape[0])
    return F.linear(x, dequantize(packed, scales, x.dtype, x.shape[-1]), bias)
