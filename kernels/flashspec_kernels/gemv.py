"""Skinny GEMMs (a few activation rows against a weight matrix) with fused prologue and epilogues.

A decoding forward of the fast back-end multiplies ``M = B * T`` rows (one to a few dozen)
by each layer's weights ``W [N, K]``: it reads the whole matrix to do ``2 M N K`` flops, so
it is bound by memory bandwidth, and what matters is that enough loads are in flight on
every SM, and that each launch's fixed cost is paid as few times as possible (the 1.5B
shape's GEMMs are 1.23 ms of a 1.94 ms forward in ``docs/benchmarks/fast-profile-h200.json``). Here:

``_gemv_kernel``, grid ``(row tiles, column blocks, splits)``: program ``(i, j, s)`` computes
``y[rows, cols] = x[rows, ks] @ W[cols, ks]^T`` for the ``BLOCK_M = 16`` rows of tile ``i``
(masked past ``M``), the ``BLOCK_N`` output columns of block ``j`` and the ``s``-th of
``SPLIT_K`` equal slices of ``K``, in steps of ``BLOCK_K``, with ``tl.dot`` and float32
accumulation. :func:`pick` chooses ``BLOCK_N`` and ``SPLIT_K`` from ``N`` and ``K`` alone
so that a launch has about ``PROGRAMS_PER_SM`` programs per SM (small ``N``: several
slices of ``K``), and as many pipeline stages (buffered steps of ``K``) as the device's shared
memory holds (:func:`fit`). With ``SPLIT_K > 1`` each program writes its float32 partial sums and
bumps a per-tile counter; the program that arrives last adds the slices in slice order
(so the result does not depend on which program finished first), applies the epilogue and
resets the counter for the next launch: one launch, deterministic.

Fused pieces (each a ``constexpr`` switch):

- prologue ``NORM``: RMSNorm of the input rows. Each program recomputes its rows' sum of
  squares over all of ``K`` (a few kilobytes per row, from L2), then feeds
  ``weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`` to the dot, which removes the norm
  kernel and its write;
- epilogue ``BIAS``: ``+ b``; ``RESID``: ``out = r + y`` where ``r`` is ``out`` itself
  (the residual stream, updated in place);
- epilogue ``GLU`` (a fused gate-up weight ``[2 F, K]``): ``out[:, f] = silu(g_f) * u_f``
  with ``g = x @ W[:F]^T`` and ``u = x @ W[F:]^T``, written once at width ``F``.

Numerics follow :mod:`flashspec_fast.model`: the norm in float32, cast to the model dtype
before the weight multiply (``rms_norm``); the GEMM's float32 sum plus bias or residual
rounded once to the model dtype (cuBLAS's epilogue does the same); gate and up rounded to
the model dtype, then ``silu(g) * u`` in float32, rounded once (as Inductor's fused
``silu_mul`` does). float32 inputs use IEEE products (no TF32); 16-bit ones the tensor cores'
exact products with float32 sums. Every row tile has 16 rows,
and the blocks and slices depend on ``N`` and ``K`` only, so **a row gets the same bits
whatever the other rows are**: a token scored alone and inside a wider verify forward, or in
a larger batch, goes through the same arithmetic.

:func:`gemv_ref` is the same contract in plain torch, the fast back-end's torch path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_M = 16  # rows per tile whatever M is: the same dot shape for every row
PROGRAMS_PER_SM = 2  # aimed-at programs per SM of a launch (SPLIT_K is raised until reached)
SMS = 132  # the H200's; a launch on another GPU reads its own count
SHARED = 232448  # bytes of shared memory a program may take on the H100 and H200 (sm_90); a launch reads its GPU's
MAX_SPLIT_K = 8
COUNTERS = 1 << 14  # per-device int32 counters of split-K launches (row tiles * column blocks)


@attrs.frozen
class Config:
    block_n: int  # output columns per program
    block_k: int  # K elements per inner step
    split_k: int  # slices of K, one program each
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _rstd(x_ptr, rows, rmask, stride_xm, K, eps, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """rsqrt(mean(x^2) + eps) of each row, float32 ``[BLOCK_M]``."""
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=rmask[:, None] & (ks < K)[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return tl.rsqrt(ss / K + eps)


@triton.jit
def _dot(x, w, acc, INTERPRET: tl.constexpr):
    """``acc + x @ w^T``: float32 operands with IEEE products, 16-bit ones on the tensor cores
    (exact products, float32 sums); in the interpreter, whose 16-bit dot is wrong (Triton
    3.9), 16-bit operands as float32 (the same exact products)."""
    if INTERPRET or x.dtype == tl.float32:
        return tl.dot(x.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(x, tl.trans(w), acc)


@triton.jit
def _round(x, dt: tl.constexpr, RNE: tl.constexpr):
    """float32 ``x`` rounded to ``dt`` and back to float32, to nearest even. ``RNE``: by hand,
    for the interpreter, whose casts to bfloat16 round toward zero (Triton 3.9)."""
    if RNE and dt == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    return x.to(dt).to(tl.float32)


@triton.jit
def _epilogue(acc, acc_u, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om,
              BIAS: tl.constexpr, RESID: tl.constexpr, GLU: tl.constexpr, INTERPRET: tl.constexpr):
    dt: tl.constexpr = out_ptr.dtype.element_ty
    ptrs = out_ptr + rows[:, None] * stride_om + cols[None, :]
    mask = rmask[:, None] & cmask[None, :]
    y = acc
    if GLU:
        g = _round(acc, dt, INTERPRET)
        y = g * tl.sigmoid(g) * _round(acc_u, dt, INTERPRET)
    if BIAS:
        y += tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if RESID:
        y += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, _round(y, dt, INTERPRET).to(dt), mask=mask)


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, nw_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
    M, N, K, stride_xm, stride_om, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    NORM: tl.constexpr, BIAS: tl.constexpr, RESID: tl.constexpr, GLU: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    rstd = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if NORM:
        rstd = _rstd(x_ptr, rows, rmask, stride_xm, K, eps, BLOCK_M, BLOCK_K)
    dt = w_ptr.dtype.element_ty
    per_split = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_lo = pid_k * per_split
    k_hi = tl.minimum(K, k_lo + per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # [BLOCK_M, BLOCK_N] x @ W^T (the gate, with GLU)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the up projection (GLU only)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_hi
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if NORM:
            h = _round(x.to(tl.float32) * rstd[:, None], dt, INTERPRET)
            nw = tl.load(nw_ptr + ks, mask=kmask, other=0.0).to(tl.float32)
            x = _round(nw[None, :] * h, dt, INTERPRET).to(dt)
        wmask = cmask[:, None] & kmask[None, :]
        w = tl.load(w_ptr + cols[:, None] * K + ks[None, :], mask=wmask, other=0.0)
        acc = _dot(x, w, acc, INTERPRET)
        if GLU:
            wu = tl.load(w_ptr + (cols + N)[:, None] * K + ks[None, :], mask=wmask, other=0.0)
            acc_u = _dot(x, wu, acc_u, INTERPRET)
    if SPLIT_K == 1:
        _epilogue(acc, acc_u, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om, BIAS, RESID, GLU, INTERPRET)
    else:
        # partials [SPLIT_K, 2 (GLU) or 1, row tiles * BLOCK_M, N] float32; every row of a tile is stored
        m_pad = tl.num_programs(0) * BLOCK_M
        planes: tl.constexpr = 2 if GLU else 1
        here = (rows[:, None] * N + cols[None, :])
        pmask = tl.broadcast_to(cmask[None, :], (BLOCK_M, BLOCK_N))
        tl.store(part_ptr + pid_k * planes * m_pad * N + here, acc, mask=pmask)
        if GLU:
            tl.store(part_ptr + (pid_k * planes + 1) * m_pad * N + here, acc_u, mask=pmask)
        tl.debug_barrier()  # every thread's partials are stored before the counter says so
        tile = pid_m * tl.num_programs(1) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last slice of this tile: add all slices in order
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT_K):
                acc += tl.load(part_ptr + s * planes * m_pad * N + here, mask=pmask, other=0.0, cache_modifier=".cg")
                if GLU:
                    acc_u += tl.load(part_ptr + (s * planes + 1) * m_pad * N + here, mask=pmask, other=0.0,
                                     cache_modifier=".cg")
            _epilogue(acc, acc_u, rows, cols, rmask, cmask, b_ptr, out_ptr, stride_om, BIAS, RESID, GLU, INTERPRET)
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next launch (and graph replay)


_counters: dict[torch.device, torch.Tensor] = {}


def prepare(device: torch.device) -> torch.Tensor:
    """The device's split-K counters (made once, zero; each launch leaves them zero). Call it
    before capturing a CUDA graph that launches :func:`gemv`: a graph must not allocate them."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _counters:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("gemv: call flashspec_kernels.gemv.prepare(device) before capturing a CUDA graph")
        _counters[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return _counters[device]


def _interpreting(device: torch.device) -> bool:
    """Whether the kernel runs in Triton's interpreter (see ``_dot`` and ``_round``)."""
    return device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return SMS


def _shared(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).shared_memory_per_block_optin)
    return SHARED


def blocks(n: int, k: int, glu: bool = False, sms: int = SMS) -> Config:
    """Blocks and slices for an ``[n, k]`` weight (``n`` output columns; with ``glu`` two
    matrices per column): the widest ``BLOCK_N`` that still gives ``PROGRAMS_PER_SM``
    programs per SM, else the narrowest with ``K`` split until it does. Depends on the
    matrix only, never on ``M`` (the bits of a row must not depend on the others)."""
    want = PROGRAMS_PER_SM * sms
    block_k = 128 if glu else 256
    for block_n in (64, 32):
        if triton.cdiv(n, block_n) >= want:
            return Config(block_n, block_k, 1)
    block_n = 16
    steps = triton.cdiv(k, block_k)
    split = max(1, min(MAX_SPLIT_K, steps // 2, triton.cdiv(want, triton.cdiv(n, block_n))))
    return Config(block_n, block_k, split)


def fit(cfg: Config, need: Callable[[Config], int], shared: int, min_block_k: int = 16) -> Config:
    """``cfg`` with fewer stages, then (one stage left) shorter steps of ``K`` down to
    ``min_block_k`` (tl.dot's smallest K; a kernel's own floor, such as NF4's 64-weight group),
    until the ``need(cfg)`` bytes of shared memory fit in ``shared``. Stages leave the arithmetic
    as it is; a shorter step adds the products in other groups, and only a GPU with less than the
    H100's shared memory needs one."""
    while need(cfg) > shared:
        if cfg.num_stages > 1:
            cfg = attrs.evolve(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_k // 2 >= min_block_k:
            cfg = attrs.evolve(cfg, block_k=cfg.block_k // 2)
        else:
            raise ValueError(f"{cfg} needs {need(cfg)} bytes of shared memory, more than the {shared} a program has "
                             f"(its step of K is at its floor, {min_block_k})")
    return cfg


def shared_bytes(cfg: Config, itemsize: int, glu: bool) -> int:
    """Shared memory of a ``_gemv_kernel`` program (with the norm), an upper bound of what Triton
    3.9 gives it (``tests/kernels/test_shared_memory.py``): with one stage, a step's x and W
    tiles in float32 (the dot's layout changes); with more, ``num_stages - 1`` buffers of a
    step's loads (x, W's one or two tiles, the norm's weights) and x's tile in float32."""
    if cfg.num_stages == 1:
        return cfg.block_k * (BLOCK_M + cfg.block_n) * 4
    step = cfg.block_k * (BLOCK_M + cfg.block_n * (2 if glu else 1) + 1) * itemsize
    return (cfg.num_stages - 1) * step + cfg.block_k * BLOCK_M * 4


def pick(n: int, k: int, glu: bool = False, sms: int = SMS, itemsize: int = 2, shared: int = SHARED) -> Config:
    """:func:`blocks` for the matrix, with as many stages as a GPU with ``sms`` SMs and
    ``shared`` bytes of shared memory per program holds for weights of ``itemsize`` bytes."""
    return fit(blocks(n, k, glu, sms), lambda cfg: shared_bytes(cfg, itemsize, glu), shared)


_stages: dict[tuple[Any, ...], int] = {}  # a launch's specialization -> the stages its GPU took, where fewer


def launch(kernel: Any, grid: tuple[int, ...], args: tuple[Any, ...], cfg: Config, **constexprs: Any) -> None:
    """``kernel[grid](*args, **constexprs)`` with ``cfg``'s warps and stages, or with fewer stages
    where the GPU refuses the shared memory the compiled kernel asks for (Triton raises
    OutOfResources before anything is launched). :func:`fit` keeps the picks inside its bound,
    so this catches only a compiler that allocates more than that; the stages found are
    remembered per specialization, so the retry happens once, at the first call (made before
    any graph capture). Stages do not change the bits of the result."""
    x = args[0]
    key = (kernel, x.device, x.dtype, cfg, tuple(constexprs.items()))
    stages = _stages.get(key, cfg.num_stages)
    while True:
        try:
            kernel[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=stages)
            return
        except OutOfResources as exc:
            if stages == 1 or exc.name != "shared memory":
                raise
            stages -= 1
            _stages[key] = stages


def _check(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, norm: torch.Tensor | None,
           residual: torch.Tensor | None, glu: bool) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or (glu and w.shape[0] % 2):
        raise ValueError(f"gemv: x {tuple(x.shape)} and w {tuple(w.shape)} are not [M, K] and [N, K]"
                         + (" with an even N (glu)" if glu else ""))
    if x.dtype not in DTYPES or w.dtype != x.dtype:
        raise ValueError(f"gemv: x in {x.dtype} and w in {w.dtype}: both must be one of {DTYPES}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError(f"gemv: x's rows (strides {x.stride()}) and w (strides {w.stride()}) must be contiguous")
    n = w.shape[0] // 2 if glu else w.shape[0]
    for name, t, shape in (("bias", bias, (n,)), ("norm", norm, (x.shape[1],)), ("residual", residual, (x.shape[0], n))):
        if t is not None and (tuple(t.shape) != shape or t.dtype != x.dtype or t.stride(-1) != 1):
            raise ValueError(f"gemv: {name} {tuple(t.shape)} {t.dtype} (strides {t.stride()}), wanted {shape} "
                             f"{x.dtype} with contiguous rows")
    if sum((glu, bias is not None, residual is not None)) > 1:
        raise ValueError("gemv: one epilogue at a time: bias, residual or glu")


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
         eps: float = 1e-6, residual: torch.Tensor | None = None, glu: bool = False,
         config: Config | None = None) -> torch.Tensor:
    """``x [M, K] @ w [N, K]^T`` with the fused pieces; returns ``[M, N]`` in x's dtype.

    ``norm`` (``[K]``): RMSNorm x's rows first (``eps``). ``bias`` (``[N]``): added.
    ``residual`` (``[M, N]``): ``residual += ...`` in place, and returned. ``glu``: ``w`` is
    ``[2 F, K]`` (gate rows, then up rows) and the result ``silu(gate) * up``, ``[M, F]``.
    ``config`` overrides :func:`pick` (benchmarks). No host sync; graph-capturable once
    :func:`prepare` has run for the device."""
    _check(x, w, bias, norm, residual, glu)
    m, k = x.shape
    n = w.shape[0] // 2 if glu else w.shape[0]
    out = residual if residual is not None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = config or pick(n, k, glu, _sms(x.device), x.element_size(), _shared(x.device))
    tiles = triton.cdiv(m, BLOCK_M)
    grid = (tiles, triton.cdiv(n, cfg.block_n), cfg.split_k)
    counters = part = out  # unused pointers where SPLIT_K == 1
    if cfg.split_k > 1:
        counters = prepare(x.device)
        if grid[0] * grid[1] > COUNTERS:
            raise ValueError(f"gemv: {grid[0] * grid[1]} tiles of split-K partials exceed {COUNTERS} counters")
        part = torch.empty((cfg.split_k * (2 if glu else 1) * tiles * BLOCK_M * n,), dtype=torch.float32,
                           device=x.device)
    dummy = x  # for absent bias / norm
    launch(
        _gemv_kernel, grid,
        (x, w, norm if norm is not None else dummy, bias if bias is not None else dummy, out, part, counters,
         m, n, k, x.stride(0), out.stride(0), eps), cfg,
        BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        NORM=norm is not None, BIAS=bias is not None, RESID=residual is not None, GLU=glu,
        INTERPRET=_interpreting(x.device),
    )
    return out


def gemv_ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, *, norm: torch.Tensor | None = None,
             eps: float = 1e-6, residual: torch.Tensor | None = None, glu: bool = False,
             config: Config | None = None) -> torch.Tensor:
    """The same in plain torch, as :mod:`flashspec_fast.model`'s torch path computes it
    (``rms_norm``, ``F.linear``, ``addmm_``, ``silu_mul``); ``config`` is ignored."""
    if norm is not None:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        x = norm * h.to(x.dtype)
    if glu:
        gate, up = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(gate) * up
    if residual is not None:
        return residual.addmm_(x, w.t())
    return F.linear(x, w, bias)
