"""A gpt-fast-style Qwen2 / Llama decoder over a static, per-row-positioned KV cache.

One forward takes ``tokens`` and ``pos`` (both ``[B, T]``, on the device) and writes
each token's key and value at slot ``write[b, t]`` of row ``b``'s cache before the
attention reads it. A query at position ``p`` attends to the slots ``0..p`` of its
row, so the cache needs no validity mask: slots below a row's current position
always hold that row's sequence, and whatever lies above it (a rejected draft
suffix, say) is never read and is overwritten by the next forward. Rolling back
rejected tokens is therefore moving the row's position back, with no copy.

Padding slots (a ragged catch-up) write to the cache's last slot, the *scratch*
slot, which no query can reach because positions stay below it.

A forward attends only the first ``span`` slots of each row (:meth:`Transformer.span_for`:
a power of two >= 128 that covers every position of the step): the attention kernel reads
every slot it is given, and on the H200 it cost 19 us per layer over 768 slots against
9 us over 256 (docs/benchmarks/fast-profile-h200.json). Each span is captured once.
Decoding forwards (up to 16 tokens per row) on CUDA use instead the split-KV Triton kernel
of :mod:`flashspec_kernels.attention`, which stops at each row's last position and writes
the ``[B, T, H, hd]`` layout the output projection reads (``attention`` option). With it,
every forward rotates q and k and stores k and v in one Triton launch per layer
(:mod:`flashspec_kernels.rope`) instead of Inductor's four.

Numerics follow transformers' Qwen2/Llama modules (RMSNorm in float32, rotary
tables computed in float32 and cast to the model dtype), so a float64 model here
and there produce the same greedy tokens.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import torch
import torch.nn.functional as F

from flashspec_core.ragged import additive_mask, causal_mask
from flashspec_core.tree import TreeBlock, tree_causal_mask
from flashspec_fast import fused
from flashspec_fast.keys import QWEN25_SHAPES as QWEN25_SHAPES  # a model key's "shape:" names, checked without torch

MIN_SPAN = 128  # fewest slots a forward attends (smaller spans would only add captured graphs)


@attrs.frozen
class ModelArgs:
    vocab: int
    dim: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    norm_eps: float
    rope_theta: float
    qkv_bias: bool
    tie_embeddings: bool

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelArgs:
        kind = cfg.get("model_type")
        if kind not in ("qwen2", "llama"):
            raise ValueError(f"the fast back-end runs qwen2 and llama checkpoints, not model_type {kind!r}")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
        if rope_type not in ("default", None):
            raise ValueError(f"rope_type {rope_type!r} is not supported by the fast back-end (only 'default')")
        heads = int(cfg["num_attention_heads"])
        return cls(
            vocab=int(cfg["vocab_size"]),
            dim=int(cfg["hidden_size"]),
            layers=int(cfg["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            ffn=int(cfg["intermediate_size"]),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    def weight_bytes(self, itemsize: int) -> int:
        """Bytes of weights one forward reads (embedding rows aside)."""
        qkv = self.dim * (self.heads + 2 * self.kv_heads) * self.head_dim
        per_layer = qkv + self.heads * self.head_dim * self.dim + 3 * self.dim * self.ffn + 2 * self.dim
        return (self.layers * per_layer + self.vocab * self.dim + self.dim) * itemsize

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


@attrs.define
class Layer:
    attn_norm: torch.Tensor  # [D]
    wqkv: Any  # [(H + 2 KV) * hd, D] tensor, or an NF4Linear
    bqkv: torch.Tensor | None  # [(H + 2 KV) * hd]
    wo: Any  # [D, H * hd]
    mlp_norm: torch.Tensor  # [D]
    w_gate_up: Any  # [2 F, D]
    w_down: Any  # [D, F]


@attrs.define
class Weights:
    embed: torch.Tensor  # [V, D]
    layers: list[Layer]
    norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D]; the embedding itself when tied


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, N, hd]; cos/sin: [B, T, 1, hd] (the two halves repeated, as in HF)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def linear(x: torch.Tensor, w: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear``, or a quantized weight's own matmul (see :mod:`flashspec_fast.nf4`)."""
    return F.linear(x, w, bias) if isinstance(w, torch.Tensor) else w(x, bias)


def linear_add_(x: torch.Tensor, inp: torch.Tensor, w: Any) -> torch.Tensor:
    """``x += inp @ w.T`` in place, the residual add in the GEMM's epilogue (x, inp: 2-D; x is
    the forward's own residual stream, never a caller's tensor). In place because out-of-place
    ``addmm`` first copies ``x`` into its output (a device-to-device copy per call: two per
    layer in the H200 profile); the arithmetic is the same."""
    return x.addmm_(inp, w.t()) if isinstance(w, torch.Tensor) else x.add_(w(inp, None))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_store(
    qkv: torch.Tensor,  # [B, T, H + 2 KV, hd]: the fused projection's output
    cos: torch.Tensor,  # [B, T, 1, hd]
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [B * S, KV * hd]: this layer's cache rows, written in place
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [B * T] flat cache slots of the step's tokens
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """Rotate q and k, write the rotated k and the v of every token at its cache slot,
    return the rotated q ``[B, T, H, hd]``. One function so that Inductor (``fuse``) makes
    it a kernel or two: unfused it is a rotation, two reshape copies and two index copies
    per layer, which the H200 profile counts among a forward's ~15 kernels per layer."""
    batch, width = qkv.shape[0], qkv.shape[1]
    q = rotate(qkv[:, :, :heads], cos, sin)
    k = rotate(qkv[:, :, heads : heads + kv_heads], cos, sin)
    k_cache[slots] = k.reshape(batch * width, -1)
    v_cache[slots] = qkv[:, :, heads + kv_heads :].reshape(batch * width, -1)
    return q


@functools.cache
def triton_kernels() -> tuple[ModuleType, ModuleType] | None:
    """:mod:`flashspec_kernels.attention` and :mod:`flashspec_kernels.rope`, or None where
    triton is not installed (it is an extra: ``pip install 'flashspec-engine[triton]'``), so that the
    model still loads and decodes through SDPA and torch's ops on such a machine."""
    try:
        from flashspec_kernels import attention, rope
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise
        return None
    return attention, rope


def decode_kernel(attention: str, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether decoding forwards (up to the kernel's ``MAX_WIDTH`` tokens per row) use the
    Triton decode-attention kernel: ``auto`` on CUDA where it supports the head dim and dtype
    and triton is installed, ``triton`` always (an error where it cannot), ``sdpa`` never."""
    if attention not in ("auto", "sdpa", "triton"):
        raise ValueError(f"attention must be 'auto', 'sdpa' or 'triton', got {attention!r}")
    kernels = triton_kernels()
    if kernels is None:
        if attention == "triton":
            raise ValueError("attention = 'triton' needs the triton package: pip install 'flashspec-engine[triton]'")
        return False
    ok = kernels[0].supported(head_dim, dtype)
    if attention == "sdpa" or (attention == "auto" and not (device.type == "cuda" and ok)):
        return False
    if not ok:
        raise ValueError(f"attention = 'triton': the decode kernel takes a head dim of at most 256 and "
                         f"float16/bfloat16/float32, not head dim {head_dim} in {dtype}")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("attention = 'triton' on a CPU model needs TRITON_INTERPRET=1 (Triton's interpreter)")
    return True


RECOMPILE_LIMIT = 64  # compiled variants allowed per fused op (dynamo's default is 8)


class Ops:
    """The non-GEMM pieces; ``fuse=True`` compiles each with dynamic shapes (one variant per
    input layout, up to ``RECOMPILE_LIMIT``)."""

    def __init__(self, fuse: bool) -> None:
        if fuse:
            # One variant per input layout (a width of 1, a batch equal to the width, a static
            # graph buffer's strides...): the drafts' prewarm meets them all within one call, past
            # dynamo's default of 8 per function, which fails a fullgraph compile outright.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        wrap: Callable[[Any], Any] = (lambda f: torch.compile(f, dynamic=True, fullgraph=True)) if fuse else (lambda f: f)
        self.rms_norm = wrap(rms_norm)
        self.rope_store = wrap(rope_store)
        self.silu_mul = wrap(silu_mul)


class Transformer:
    """Weights, rotary tables and a static KV cache ``[L, B, S, KV*hd]`` for one model."""

    def __init__(self, args: ModelArgs, weights: Weights, max_len: int, fuse: bool = False,
                 attention: str = "auto", kernels: str = "torch") -> None:
        self.args, self.w = args, weights
        self.device, self.dtype = weights.embed.device, weights.embed.dtype
        self.max_len = max_len  # slots per row; the last one is the scratch slot
        self.ops = Ops(fuse)
        self.decode_kernel = decode_kernel(attention, args.head_dim, self.dtype, self.device)
        gemv = fused.gemv_module(kernels, weights)  # the GEMMs of forwards up to fused.MAX_ROWS rows
        self.gemv = None if gemv is None else fused.GemvLayers(gemv, args.norm_eps)
        inv_freq = 1.0 / (
            args.rope_theta
            ** (torch.arange(0, args.head_dim, 2, dtype=torch.int64, device=self.device).float() / args.head_dim)
        )
        freqs = torch.arange(max_len, device=self.device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(self.dtype)  # [S, hd]
        self.sin = emb.sin().to(self.dtype)  # [S, hd]
        self.batch = 0
        self.k_cache = self.v_cache = torch.empty(0)
        # forwards of few rows in one persistent launch (flashspec_kernels.decoder)
        self.decoder: Any = fused.persistent_decoder(kernels, args, weights, self.cos, self.sin)

    @property
    def scratch(self) -> int:
        return self.max_len - 1

    def span_for(self, need: int) -> int:
        """Slots a forward must attend so that positions up to ``need - 1`` see their whole
        prefix: the next power of two (at least ``MIN_SPAN``), capped at ``max_len``."""
        return min(self.max_len, max(MIN_SPAN, 1 << max(need - 1, 0).bit_length()))

    def allocate(self, batch: int) -> bool:
        """Make the cache hold at least ``batch`` rows; True if it was reallocated
        (graphs captured over the old cache must then be dropped)."""
        if batch <= self.batch:
            return False
        a = self.args
        shape = (a.layers, batch, self.max_len, a.kv_heads * a.head_dim)
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)  # [L, B, S, KV*hd]
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.batch = batch
        return True

    def move_slots(self, moves: torch.Tensor) -> None:
        """Copy cache slots in every layer, K and V: ``moves`` ``[2, M]`` int64 on the device,
        sources then destinations as flat ``b * max_len + slot`` indices (distinct
        destinations; every source is read before any destination is written). One gather
        and one scatter per cache tensor: a tree step's accepted nodes compacted to a chain."""
        for cache in (self.k_cache, self.v_cache):
            flat = cache.view(cache.shape[0], -1, cache.shape[-1])  # [L, B * S, KV*hd]
            flat.index_copy_(1, moves[1], flat.index_select(1, moves[0]))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``tokens`` [B, T]: [B, T, D] (a tensor-parallel model, whose
        rows are split over ranks, overrides it: :mod:`flashspec_fast.tp`)."""
        return F.embedding(tokens, self.w.embed)

    def _mask(self, pos: torch.Tensor, group: int, span: int, tree: TreeBlock | None = None) -> torch.Tensor:
        """Additive mask [B, 1, G*T, span]: a query at position p sees slots 0..p (with a tree
        block: :func:`~flashspec_core.tree.tree_causal_mask`). The query group is folded into
        the length, so K/V are read once per KV head."""
        batch, width = pos.shape
        seen = causal_mask(pos, span) if tree is None else tree_causal_mask(pos, span, tree.start, tree.bits, tree.nodes)
        allowed = seen[:, None, None].expand(batch, 1, group, width, span)
        return additive_mask(allowed, self.dtype).view(batch, 1, group * width, span)

    def _decode_persistent(self, x: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, span: int,
                           depth: int | None, last_only: bool) -> torch.Tensor:
        """A decoding forward in one launch of :mod:`flashspec_kernels.decoder` (every layer,
        the final norm) and the LM head's GEMM."""
        batch, width = pos.shape
        slots = (torch.arange(batch, device=self.device)[:, None] * self.max_len + write).view(-1)
        h = self.decoder.forward(x, pos.reshape(-1), slots, self.k_cache, self.v_cache, width, span, depth)
        h = h.view(batch, width, -1)
        return F.linear(h[:, -1:] if last_only else h, self.w.lm_head)

    @torch.no_grad()
    def forward(
        self, tokens: torch.Tensor, pos: torch.Tensor, write: torch.Tensor, last_only: bool = False, span: int = 0,
        depth: int | None = None, tree: TreeBlock | None = None, rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens, pos, write: [B, T] int64 on the device -> logits [B, T or 1, V] (model dtype).

        ``span`` (0: all ``max_len`` slots) must exceed every position in ``pos``. ``depth``
        runs only the first ``depth`` layers (then the final norm and the LM head), writing
        the cache of those layers only: the self-speculative draft (:mod:`flashspec_fast.selfdraft`).
        ``tree``: the forward holds a draft tree block (see :class:`~flashspec_core.tree.TreeBlock`;
        its nodes written at their slots, positioned by depth), which must end below ``span``.
        ``rows`` ([B] int64 on the device): the cache row each batch entry reads and writes
        (default: entry ``b`` is row ``b``), so some rows can be prefilled alone while every
        other row's slots stay as they are (:meth:`~flashspec_fast.target.FastTarget.prefill_rows`)."""
        a, w, ops = self.args, self.w, self.ops
        batch, width = tokens.shape
        group, hd = a.heads // a.kv_heads, a.head_dim
        nq, nkv = a.heads * hd, a.kv_heads * hd
        span = span or self.max_len
        x = self.embed(tokens).view(batch * width, a.dim)  # [B*T, D]
        if self.decoder is not None and batch * width <= fused.DECODER_ROWS and tree is None and rows is None:
            return self._decode_persistent(x, pos, write, span, depth, last_only)
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # [B, T, 1, hd]
        kernels = triton_kernels() if self.decode_kernel else None  # (attention, rope) modules
        # decoding forwards: flashspec_kernels.attention, [B, T, H, hd] in and out
        decode = kernels[0].decode_attention if kernels is not None and width <= kernels[0].MAX_WIDTH else None
        held = batch if rows is None else self.batch  # cache rows the layer views span
        if rows is not None:  # the decode kernel reads cache row b for entry b; gathered rows go through SDPA
            decode = None
        mask = None if decode is not None else self._mask(pos, group, span, tree)
        index = torch.arange(batch, device=self.device) if rows is None else rows  # [B]: each entry's cache row
        slots = (index[:, None] * self.max_len + write).view(-1)  # [B*T]
        cache = (held, self.max_len, a.kv_heads, hd)  # a layer's cache rows as [rows, S, KV, hd]
        store = kernels[1].rope_store if kernels is not None else ops.rope_store  # one launch, not Inductor's four
        gemv = self.gemv if batch * width <= fused.MAX_ROWS else None  # norms and adds fused into the GEMMs
        for i, layer in enumerate(w.layers[:depth]):
            if gemv is None:
                qkv = linear(ops.rms_norm(x, layer.attn_norm, a.norm_eps), layer.wqkv, layer.bqkv)
            else:
                qkv = gemv.qkv(x, layer)
            qkv = qkv.view(batch, width, a.heads + 2 * a.kv_heads, hd)
            kc = self.k_cache[i, :held].view(held * self.max_len, nkv)
            vc = self.v_cache[i, :held].view(held * self.max_len, nkv)
            q = store(qkv, cos, sin, kc, vc, slots, a.heads, a.kv_heads)  # [B, T, H, hd]
            if decode is not None:
                o = decode(q, kc.view(cache), vc.view(cache), pos, span, tree=tree).view(batch * width, nq)
            else:
                q = q.reshape(batch, width, a.kv_heads, group, hd).permute(0, 2, 3, 1, 4)
                q = q.reshape(batch, a.kv_heads, group * width, hd)
                keys, values = kc.view(cache)[:, :span], vc.view(cache)[:, :span]
                if rows is not None:
                    keys, values = keys[rows], values[rows]
                keys, values = keys.transpose(1, 2), values.transpose(1, 2)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [B, KV, G*T, hd]
                o = o.view(batch, a.kv_heads, group, width, hd).permute(0, 3, 1, 2, 4).reshape(batch * width, nq)
            if gemv is not None:
                x = gemv.mlp_(gemv.out_(x, o, layer), layer)
                continue
            x = linear_add_(x, o, layer.wo)
            h = ops.rms_norm(x, layer.mlp_norm, a.norm_eps)
            x = linear_add_(x, ops.silu_mul(linear(h, layer.w_gate_up)), layer.w_down)
        x = x.view(batch, width, a.dim)
        if last_only:
            x = x[:, -1:]
        if gemv is not None:
            return gemv.head(x, w)
        return F.linear(ops.rms_norm(x, w.norm, a.norm_eps), w.lm_head)


# --- loading --------------------------------------------------------------------------


def read_config(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "config.json").read_text()))


def load_weights(path: Path, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> Weights:
    """Read an HF checkpoint's safetensors into fused matrices (QKV, gate-up), a tensor at a time.

    Each matrix is allocated once in ``dtype`` on ``device`` and its parts are read into
    their rows in chunks (:mod:`flashspec_models.streaming`), so a bfloat16 cache loaded in
    float32 holds the float32 weights plus one chunk, never the whole file beside them.
    """
    from flashspec_models.streaming import Checkpoint

    ckpt = Checkpoint(path)
    prefix = "model." if any(k.startswith("model.") for k in ckpt) else ""

    def take(*keys: str) -> torch.Tensor:
        """The tensors ``keys`` stacked along dim 0 into one new tensor."""
        entries = [ckpt.entry(prefix + k) for k in keys]
        rows = sum(e.shape[0] for e in entries)
        out = torch.empty((rows, *entries[0].shape[1:]), dtype=dtype, device=device)
        first = 0
        for key, e in zip(keys, entries, strict=True):
            ckpt.read_into(prefix + key, out[first:first + e.shape[0]])
            first += e.shape[0]
        return out

    layers = []
    for i in range(args.layers):
        p = f"layers.{i}."
        layers.append(
            Layer(
                attn_norm=take(p + "input_layernorm.weight"),
                wqkv=take(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                bqkv=take(*(p + f"self_attn.{n}_proj.bias" for n in "qkv")) if args.qkv_bias else None,
                wo=take(p + "self_attn.o_proj.weight"),
                mlp_norm=take(p + "post_attention_layernorm.weight"),
                w_gate_up=take(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                w_down=take(p + "mlp.down_proj.weight"),
            )
        )
    embed = take("embed_tokens.weight")
    untied = not args.tie_embeddings and "lm_head.weight" in ckpt
    lm_head = ckpt.read("lm_head.weight", dtype, device) if untied else embed
    return Weights(embed=embed, layers=layers, norm=take("norm.weight"), lm_head=lm_head)


def random_weights(args: ModelArgs, dtype: torch.dtype, device: torch.device, seed: int = 0) -> Weights:
    """Random weights of the given shapes (for labelled-synthetic timing only)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype, device=device)
        return t.normal_(0.0, 0.02, generator=gen)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    a = args
    nqkv = (a.heads + 2 * a.kv_heads) * a.head_dim
    layers = [
        Layer(
            attn_norm=ones(a.dim),
            wqkv=rnd(nqkv, a.dim),
            bqkv=rnd(nqkv) if a.qkv_bias else None,
            wo=rnd(a.dim, a.heads * a.head_dim),
            mlp_norm=ones(a.dim),
            w_gate_up=rnd(2 * a.ffn, a.dim),
            w_down=rnd(a.dim, a.ffn),
        )
        for _ in range(a.layers)
    ]
    embed = rnd(a.vocab, a.dim)
    return Weights(embed=embed, layers=layers, norm=ones(a.dim), lm_head=embed if a.tie_embeddings else rnd(a.vocab, a.dim))


def shape_config(name: str) -> dict[str, Any]:
    return {"model_type": "qwen2", "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6, **QWEN25_SHAPES[name]}
