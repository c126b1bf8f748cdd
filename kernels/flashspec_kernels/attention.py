"""Decode attention in Triton: a few query tokens per row against a static KV cache.

The fast back-end's forwards during decoding score ``T <= 16`` tokens per row (one for a
draft step or plain decoding, ``gamma + 1`` for a verify step) against up to ``span``
cached slots. A prefill attention kernel (cuDNN's, through SDPA) tiles the queries by 64
and the keys by 128 and reads every slot it is given, masked or not: on the H200 that
cost 9 us per layer over 256 slots and 19 us over 768 (docs/benchmarks/fast-profile-h200.json),
for a few hundred kilobytes of keys and values. Here, split-KV ("flash-decoding"):

1. ``_decode_attn_split``, grid ``(B * KV, splits, row tiles)``: the ``G * T`` queries
   that share KV head ``h`` of row ``b`` (``G = heads / kv_heads``: grouped queries read
   each key and value once) go in tiles of ``BLOCK_M = 16`` rows; program ``(b, h, s, i)``
   folds the slots ``s * chunk .. (s + 1) * chunk - 1`` that tile ``i``'s queries may see
   (the loop stops at the tile's largest position) into an online softmax: running max
   ``m``, sum ``den`` and ``acc = sum p v``, in float32, in base 2, over blocks of
   ``BLOCK_N`` slots. A query at position ``p`` sees slots ``0..p``, as in
   :meth:`flashspec_fast.model.Transformer.forward`.
2. ``_decode_attn_combine``, grid ``(B * KV, G * T)``: rescales the splits' partial sums to
   their common max, adds them in split order, and writes ``acc / den`` into
   ``o[b, t, head]``, the ``[B, T, H, hd]`` layout the output projection reads, so no
   permute copy follows.

A *tree block* (:class:`~flashspec_core.tree.TreeBlock`: a draft tree scored or drafted in one forward, its
nodes at consecutive slots ``start .. start + nodes - 1`` of each row, positioned by depth)
changes only the mask: a block slot is seen iff its bit is set in the query's int64
ancestor bitmask, slots below the block follow the position rule, none above it is seen
(:func:`flashspec_core.tree.tree_causal_mask`), and the loop runs to the block's end.

With one split (``chunk >= span``) the first kernel normalises and writes the output
itself. ``chunk`` depends on ``B * KV`` alone (``BLOCK_N`` slots per split at batch 1,
more as the batch grows, so a large batch does not write partial sums it does not need).

**The same query gets the same bits whatever else the forward holds.** A token scored
alone (plain decoding, ``T = 1``) and the same token inside a verify step (``T = gamma +
1``), or under a larger ``span``, goes through identical arithmetic: every tile has 16
rows, so each query's products come from the same ``tl.dot`` shape; the slot blocks and
the splits start at fixed slots (multiples of ``BLOCK_N`` and ``chunk``), and a block or
split past a query's position adds exact zeros (its weight is ``exp2(-inf) = 0``); the
combine adds the splits one by one in order, and with a single non-empty split it
reproduces the direct path's ``acc / den`` exactly. So greedy speculative decoding keeps
target-only's tokens in bf16 as far as attention is concerned.

Bytes read per layer: the keys and values of the slots attended, ``2 * B * KV * hd *
(max position + 1) * s`` (``s`` bytes per element) per row tile, plus the queries; the
partial sums are ``4 * B * KV * splits * rows * (hd + 2)`` bytes written and read once.

Head dims are padded to a power of two of at least 16 (``tl.dot``'s least inner size) with
zeros, which changes no product. Numerics: ``q k^T`` and ``p v`` are ``tl.dot`` with
float32 accumulation (``p`` cast to the cache dtype, as flash attention does); float32
inputs use IEEE products (no TF32).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashspec_core.ragged import additive_mask, causal_mask
from flashspec_core.tree import TreeBlock, tree_causal_mask

MAX_WIDTH = 16  # query tokens per row up to which a forward uses this kernel (wider: prefill, SDPA)
BLOCK_M = 16  # query rows per tile, whatever T: the same dot shape for every query
BLOCK_N = 64  # slots per inner iteration
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float32 partial sums: no float64
_LOG2E = 1.4426950408889634


@triton.jit
def _decode_attn_split(
    q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, ml_ptr, acc_ptr, tstart_ptr, bits_ptr,
    slots, kv_heads, chunk, qk_scale, tree_n,
    T: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIRECT: tl.constexpr, IEEE: tl.constexpr, TREE: tl.constexpr,
):
    bkv = tl.program_id(0)
    split = tl.program_id(1)
    tile = tl.program_id(2)
    nsplit = tl.num_programs(1)
    b = bkv // kv_heads
    h = bkv % kv_heads
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows r = g * T + t of this KV head
    g = rows // T
    t = rows % T
    live = rows < G * T
    d = tl.arange(0, HD_PAD)
    dm = d < HD  # head dims padded to a power of two >= 16 (tl.dot's least K) read as zeros
    head = h * G + g
    q_off = ((b * T + t) * (kv_heads * G) + head) * HD  # [BLOCK_M]; q and o are [B, T, H, hd]
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=live[:, None] & dm[None, :], other=0.0)
    p_row = tl.load(pos_ptr + b * T + t, mask=live, other=-1)  # [BLOCK_M] positions; -1: padding rows
    last = tl.max(p_row, axis=0)
    if TREE:  # a tree block at slots ts .. ts + tree_n - 1; bits: each query's ancestors in it
        ts = tl.load(tstart_ptr + b)
        bits = tl.load(bits_ptr + b * T + t, mask=live, other=0)
        last = tl.maximum(last, ts + tree_n - 1)
    start = split * chunk
    stop = tl.minimum(start + chunk, last + 1)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    den = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HD_PAD], tl.float32)
    kv_base = b * slots * (kv_heads * HD) + h * HD  # cache [B, slots, KV, hd]
    for n0 in range(start, stop, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        in_range = n < stop
        kv_off = kv_base + n[:, None] * (kv_heads * HD) + d[None, :]
        k = tl.load(k_ptr + kv_off, mask=in_range[:, None] & dm[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s.to(tl.float32) * qk_scale  # log2 units
        seen = (n[None, :] <= p_row[:, None]) & in_range[None, :]
        if TREE:
            off = n - ts  # [BLOCK_N] offset into the tree block
            in_tree = (off >= 0) & (off < tree_n)
            bit = (bits[:, None] >> tl.where(in_tree, off, 0).to(tl.int64)[None, :]) & 1
            seen = tl.where(in_tree[None, :], bit != 0, seen & (off < 0)[None, :]) & in_range[None, :]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that saw nothing yet
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        den = den * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_off, mask=in_range[:, None] & dm[None, :], other=0.0)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv.to(tl.float32)
        m = m_new
    if DIRECT:
        out = acc / tl.where(den > 0, den, 1.0)[:, None]
        tl.store(o_ptr + q_off[:, None] + d[None, :], out.to(o_ptr.dtype.element_ty), mask=live[:, None] & dm[None, :])
    else:
        at = (bkv * nsplit + split) * ROWS + rows  # [BLOCK_M] partial-sum rows
        tl.store(ml_ptr + at * 2, m)
        tl.store(ml_ptr + at * 2 + 1, den)
        tl.store(acc_ptr + at[:, None] * HD_PAD + d[None, :], acc)


@triton.jit
def _decode_attn_combine(
    o_ptr, ml_ptr, acc_ptr, nsplit, kv_heads,
    T: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, HD_PAD: tl.constexpr, ROWS: tl.constexpr,
):
    bkv = tl.program_id(0)
    r = tl.program_id(1)  # one query row (< G * T) per program
    b = bkv // kv_heads
    h = bkv % kv_heads
    first = bkv * nsplit * ROWS + r  # split 0's partial-sum row; split s's is first + s * ROWS
    top = tl.load(ml_ptr + first * 2)
    for sp in range(1, nsplit):  # the common max (exact in any order)
        top = tl.maximum(top, tl.load(ml_ptr + (first + sp * ROWS) * 2))
    d = tl.arange(0, HD_PAD)
    part = tl.load(ml_ptr + first * 2 + 1)  # split 0 always holds slot 0, which every query sees
    w = tl.exp2(tl.load(ml_ptr + first * 2) - top)
    acc = tl.load(acc_ptr + first * HD_PAD + d) * w
    den = part * w
    for sp in range(1, nsplit):  # added in split order: empty splits (den = 0) add exact zeros
        at = first + sp * ROWS
        part = tl.load(ml_ptr + at * 2 + 1)
        w = tl.where(part > 0, tl.exp2(tl.load(ml_ptr + at * 2) - top), 0.0)
        acc += tl.load(acc_ptr + at * HD_PAD + d) * w
        den += part * w
    out = acc / den
    g = r // T
    t = r % T
    tl.store(o_ptr + ((b * T + t) * (kv_heads * G) + h * G + g) * HD + d, out.to(o_ptr.dtype.element_ty), mask=d < HD)


def supported(head_dim: int, dtype: torch.dtype) -> bool:
    """Head dims and dtypes the kernel takes (head dims up to 256; padded to a power of two >= 16)."""
    return dtype in DTYPES and 1 <= head_dim <= 256


def _chunk(batch: int, kv_heads: int) -> int:
    """Slots per split: ``BLOCK_N`` up to 8 (row, KV head) pairs, then doubling with them, so
    a batch-1 step spreads over many programs and a large batch writes few partial sums.
    A function of the batch alone (not of the span or the width), so that a query's
    arithmetic does not depend on which forward it is in."""
    return BLOCK_N * triton.next_power_of_2(max(1, batch * kv_heads // 8))


def decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, span: int,
    scale: float | None = None, tree: TreeBlock | None = None,
) -> torch.Tensor:
    """Causal attention of ``T`` new tokens per row over a static cache.

    q: ``[B, T, H, hd]``; k_cache, v_cache: ``[B, S, KV, hd]`` (contiguous; the new tokens'
    keys and values already written); pos: ``[B, T]`` integer positions (a query at ``p``
    sees slots ``0..p``; every position below ``span <= S``). Returns ``[B, T, H, hd]`` in
    q's dtype. No host sync: the positions are read on the device.

    ``tree``: a draft tree block in each row's cache (:class:`~flashspec_core.tree.TreeBlock`); the mask is then
    :func:`flashspec_core.tree.tree_causal_mask` (the block must end below ``span``).
    """
    batch, width, heads, hd = q.shape
    _, slots, kv_heads, hd_k = k_cache.shape
    if not (k_cache.shape == v_cache.shape and hd_k == hd and k_cache.shape[0] == batch and heads % kv_heads == 0):
        raise ValueError(f"decode_attention: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} "
                         f"/ {tuple(v_cache.shape)}")
    if tuple(pos.shape) != (batch, width) or width > MAX_WIDTH or not 1 <= span <= slots:
        raise ValueError(f"decode_attention: pos {tuple(pos.shape)}, width {width} (<= {MAX_WIDTH}), span {span} "
                         f"(1..{slots})")
    if not supported(hd, q.dtype) or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"decode_attention: head dim {hd} / dtypes {q.dtype}, {k_cache.dtype} not supported")
    q, pos = q.contiguous(), pos.contiguous()
    if tree is not None:
        tree.check(batch, width)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("decode_attention: the caches must be contiguous [B, S, KV, hd] views")
    group = heads // kv_heads
    tiles = triton.cdiv(group * width, BLOCK_M)
    chunk = _chunk(batch, kv_heads)
    splits = triton.cdiv(span, chunk)
    out = torch.empty_like(q)
    direct = splits == 1
    parts = batch * kv_heads * splits
    hd_pad = max(16, triton.next_power_of_2(hd))
    ml = torch.empty((1,) if direct else (parts, tiles * BLOCK_M, 2), dtype=torch.float32, device=q.device)
    acc = torch.empty((1,) if direct else (parts, tiles * BLOCK_M, hd_pad), dtype=torch.float32, device=q.device)
    qk_scale = (scale if scale is not None else 1.0 / math.sqrt(hd)) * _LOG2E
    tstart, bits = (tree.start, tree.bits) if tree is not None else (pos, pos)  # unread without a tree
    _decode_attn_split[(batch * kv_heads, splits, tiles)](
        q, k_cache, v_cache, pos, out, ml, acc, tstart, bits, slots, kv_heads, chunk, qk_scale,
        tree.nodes if tree is not None else 0,
        T=width, G=group, HD=hd, HD_PAD=hd_pad, ROWS=tiles * BLOCK_M, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        DIRECT=direct, IEEE=q.dtype == torch.float32, TREE=tree is not None, num_warps=4,
    )
    if not direct:
        _decode_attn_combine[(batch * kv_heads, group * width)](
            out, ml, acc, splits, kv_heads, T=width, G=group, HD=hd, HD_PAD=hd_pad, ROWS=tiles * BLOCK_M,
            num_warps=4,
        )
    return out


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, span: int,
    scale: float | None = None, tree: TreeBlock | None = None,
) -> torch.Tensor:
    """The same in plain torch (SDPA with an additive mask), for tests."""
    batch, width, heads, hd = q.shape
    kv_heads = k_cache.shape[2]
    group = heads // kv_heads
    allowed = causal_mask(pos, span) if tree is None else tree_causal_mask(pos, span, tree.start, tree.bits, tree.nodes)
    mask = additive_mask(allowed, q.dtype)  # [B, T, span]
    k = k_cache[:, :span].transpose(1, 2).repeat_interleave(group, dim=1)  # [B, H, span, hd]
    v = v_cache[:, :span].transpose(1, 2).repeat_interleave(group, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=scale)
    return o.transpose(1, 2)
