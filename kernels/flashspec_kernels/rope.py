"""Rotary embedding and KV-cache store in one Triton kernel.

Each layer of the fast back-end's forward turns the fused QKV projection ``[B, T, H + 2 KV,
hd]`` into the rotated queries, and writes the rotated keys and the values of the step's
tokens into the layer's static cache at their slots. Inductor made that four kernels per
layer on the H200 (two rotations, two scatters; 4.2 us per layer of the 0.5B draft,
``docs/benchmarks/fast-profile-h200.json``), for a few kilobytes of data: launch latency.

``_rope_store_kernel``, grid ``(B * T, H + 2 KV)``: program ``(token, head)`` reads one head
vector; a query head is rotated into ``q_out``, a key head rotated into ``k_cache`` at the
token's slot, a value head copied into ``v_cache`` there. One launch per layer.

Numerics: the rotation of HF's Qwen2/Llama (``x * cos + rotate_half(x) * sin``, the two
halves of ``cos``/``sin`` as given), computed in float32 for 16-bit inputs (rounded once, as
Inductor's fused kernel does) and in the input's own precision for float32/float64: the same
bits as eager torch on CPU; on the GPU the compiler contracts the float32 products and sums
into FMAs (one rounding where eager has two), within an ulp or two of eager torch. Elementwise per token: a token's bits do not depend on the
other tokens of the forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@triton.jit
def _rope_store_kernel(
    qkv_ptr, cos_ptr, sin_ptr, slots_ptr, q_ptr, k_ptr, v_ptr,
    H: tl.constexpr, KV: tl.constexpr, HD: tl.constexpr, HALF_PAD: tl.constexpr, UPCAST: tl.constexpr,
):
    tok = tl.program_id(0)  # b * T + t
    head = tl.program_id(1)  # query heads, then key heads, then value heads
    half: tl.constexpr = HD // 2
    d = tl.arange(0, HALF_PAD)
    m = d < half
    src = qkv_ptr + (tok * (H + 2 * KV) + head) * HD
    x1 = tl.load(src + d, mask=m, other=0.0)
    x2 = tl.load(src + half + d, mask=m, other=0.0)
    slot = tl.load(slots_ptr + tok)
    if head < H + KV:
        c1 = tl.load(cos_ptr + tok * HD + d, mask=m, other=0.0)
        c2 = tl.load(cos_ptr + tok * HD + half + d, mask=m, other=0.0)
        s1 = tl.load(sin_ptr + tok * HD + d, mask=m, other=0.0)
        s2 = tl.load(sin_ptr + tok * HD + half + d, mask=m, other=0.0)
        # new names, not x1/x2: the compiler (unlike the interpreter) refuses a variable
        # whose type changes inside a branch on a runtime value such as `head`
        y1, y2 = x1, x2
        if UPCAST:
            y1, y2 = x1.to(tl.float32), x2.to(tl.float32)
            c1, c2, s1, s2 = c1.to(tl.float32), c2.to(tl.float32), s1.to(tl.float32), s2.to(tl.float32)
        o1 = y1 * c1 + (-y2) * s1  # rotate_half(x) = cat(-x2, x1)
        o2 = y2 * c2 + y1 * s2
        if head < H:
            dst = q_ptr + (tok * H + head) * HD
        else:
            dst = k_ptr + slot * (KV * HD) + (head - H) * HD
        tl.store(dst + d, o1.to(q_ptr.dtype.element_ty), mask=m)
        tl.store(dst + half + d, o2.to(q_ptr.dtype.element_ty), mask=m)
    else:
        dst = v_ptr + slot * (KV * HD) + (head - H - KV) * HD
        tl.store(dst + d, x1, mask=m)
        tl.store(dst + half + d, x2, mask=m)


def rope_store(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
               v_cache: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """The same contract as :func:`flashspec_fast.model.rope_store`: qkv ``[B, T, H + 2 KV,
    hd]``, cos/sin ``[B, T, 1, hd]``, caches ``[B * S, KV * hd]`` written in place at
    ``slots`` ``[B * T]``; returns the rotated queries ``[B, T, H, hd]``. No host sync."""
    batch, width, n, hd = qkv.shape
    if n != heads + 2 * kv_heads or hd % 2 or qkv.dtype not in DTYPES:
        raise ValueError(f"rope_store: qkv {tuple(qkv.shape)} {qkv.dtype} does not hold {heads} query and "
                         f"2 x {kv_heads} key/value heads of an even head dim")
    if tuple(cos.shape) != (batch, width, 1, hd) or cos.shape != sin.shape or cos.dtype != qkv.dtype:
        raise ValueError(f"rope_store: cos/sin {tuple(cos.shape)}/{tuple(sin.shape)} do not fit qkv {tuple(qkv.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.shape[-1] != kv_heads * hd or tuple(slots.shape) != (batch * width,):
        raise ValueError(f"rope_store: caches {tuple(k_cache.shape)} / slots {tuple(slots.shape)} do not fit")
    if k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype:
        raise ValueError(f"rope_store: caches in {k_cache.dtype}/{v_cache.dtype}, qkv in {qkv.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("rope_store: the caches must be contiguous [B * S, KV * hd] views")
    qkv, cos, sin, slots = qkv.contiguous(), cos.contiguous(), sin.contiguous(), slots.contiguous()
    q = torch.empty((batch, width, heads, hd), dtype=qkv.dtype, device=qkv.device)
    if batch * width:
        _rope_store_kernel[(batch * width, heads + 2 * kv_heads)](
            qkv, cos, sin, slots, q, k_cache, v_cache, H=heads, KV=kv_heads, HD=hd,
            HALF_PAD=triton.next_power_of_2(hd // 2), UPCAST=qkv.dtype in (torch.float16, torch.bfloat16),
        )
    return q


def rope_store_ref(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slots: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """The same in plain torch, for tests: HF's ``x * cos + rotate_half(x) * sin`` in the input's
    precision, then the writes at ``slots``. The fast back-end's torch path
    (:func:`flashspec_fast.model.rope_store`) is this computation."""
    batch, width, _, hd = qkv.shape
    half = hd // 2

    def rotate(x: torch.Tensor) -> torch.Tensor:
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    k_cache[slots] = rotate(qkv[:, :, heads : heads + kv_heads]).reshape(batch * width, -1)
    v_cache[slots] = qkv[:, :, heads + kv_heads :].reshape(batch * width, -1)
    return rotate(qkv[:, :, :heads])
