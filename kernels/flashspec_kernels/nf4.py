"""NF4 weight-only 4-bit GEMMs for decoding: the weights are dequantized inside the kernel.

A weight is stored as NF4 (:mod:`flashspec_kernels.nf4_format`). A decoding forward reads
the weights once per forward, so 4-bit weights read a quarter of bf16's bytes; the cost is
dequantizing them, which a separate pass would pay in bf16 bytes written and read again.

``_nf4_kernel``, grid ``(column blocks,)``: program ``j`` computes ``y[:, cols] = x @ W[cols]^T``
for every row of ``x`` (at most :data:`MAX_ROWS`, one 16-row tile), stepping through ``K``
``BLOCK_K`` at a time: it loads the packed bytes of its columns, picks each weight's nibble,
reads its value from the 16-entry table and multiplies it by its group's scale (float32),
rounds it once to the model dtype (what :func:`dequantize` gives), and accumulates
``tl.dot`` in float32; the bias is added to the float32 sum and the result rounded once.
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

from flashspec_kernels.gemv import _dot, _interpreting, _round
from flashspec_kernels.nf4_format import GROUP, NF4_VALUES, code_book, dequantize, quantize

__all__ = ["GROUP", "MAX_ROWS", "NF4_VALUES", "dequantize", "nf4_gemv", "nf4_linear", "quantize"]
MAX_ROWS = 16  # rows the kernel takes; wider inputs dequantize the matrix
BLOCK_N = 32
BLOCK_K = 128


@triton.jit
def _nf4_kernel(
    x_ptr, p_ptr, s_ptr, t_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_pn, stride_sn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    BIAS: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_M)
    rmask = rows < M
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    dt = out_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        wmask = cmask[:, None] & kmask[None, :]
        byte = tl.load(p_ptr + cols[:, None] * stride_pn + (ks // 2)[None, :], mask=wmask, other=0).to(tl.int32)
        idx = (byte >> ((ks % 2) * 4)[None, :]) & 15
        value = tl.load(t_ptr + idx)  # the code book's 16 floats, read from cache
        scale = tl.load(s_ptr + cols[:, None] * stride_sn + (ks // GROUP)[None, :], mask=wmask, other=0.0)
        w = _round(value * scale, dt, INTERPRET).to(dt)
        acc = _dot(x, w, acc, INTERPRET)
    if BIAS:
        acc += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    tl.store(ptrs, _round(acc, dt, INTERPRET).to(dt), mask=rmask[:, None] & cmask[None, :])


def nf4_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)`` for ``M <= MAX_ROWS``, ``W [N, K]`` the NF4 weight
    ``(packed, scales)`` of :func:`quantize`; ``[M, N]`` in ``x``'s dtype."""
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
    _nf4_kernel[(triton.cdiv(n, BLOCK_N),)](
        x, packed, scales, code_book(x.device), bias if bias is not None else out, out, m, n, k,
        x.stride(0), packed.stride(0), scales.stride(0), out.stride(0), BLOCK_M=16, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        GROUP=GROUP,
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
