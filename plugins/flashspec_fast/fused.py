"""A decoding forward's GEMMs as four fused launches per layer (``kernels = "gemv"``).

Through :func:`flashspec_kernels.gemv.gemv`, a layer of a forward over few rows is

- ``qkv = rms_norm(x) @ Wqkv^T + b``: the attention norm is the GEMM's prologue;
- ``x += o @ Wo^T``: the residual add is the output projection's epilogue;
- ``a = silu(g) * u`` with ``[g, u] = rms_norm(x) @ Wgu^T``: the MLP norm, the gate-up GEMM
  and the SiLU gate in one launch, and only ``a`` is written;
- ``x += a @ Wdown^T``;

and the final norm is the LM head's prologue. The torch path launches a norm, a GEMM and
an elementwise kernel where these launch one. Forwards over more than ``MAX_ROWS`` rows
(prefills) keep the torch path: every 16-row tile of the kernel reads the whole weight
matrix, where cuBLAS's wider tiles read it once.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from flashspec_fast.keys import KERNELS as KERNELS  # the ``kernels`` option of a fast model

if TYPE_CHECKING:
    from flashspec_fast.model import Layer, ModelArgs, Weights

MAX_ROWS = 32  # batch * width of the widest forward that runs the fused GEMMs: two row tiles
DECODER_ROWS = 16  # batch * width of the widest forward the persistent decoder runs (its one row tile)


def gemv_module(kernels: str, weights: Weights) -> ModuleType | None:
    """:mod:`flashspec_kernels.gemv` for ``kernels = "gemv"`` (a clear error where it cannot
    run these weights), None for ``"torch"``. Makes the device's split-K counters now, so
    that a CUDA graph captured later does not allocate them."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels != "gemv":
        return None
    try:
        from flashspec_kernels import gemv
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise
        raise ValueError("kernels = 'gemv' needs the triton package: pip install 'flashspec-engine[triton]'") from None
    embed = weights.embed
    if embed.dtype not in gemv.DTYPES:
        raise ValueError(f"kernels = 'gemv' runs float16, bfloat16 and float32 models, not {embed.dtype}")
    if any(not isinstance(t, torch.Tensor) for layer in weights.layers for t in (layer.wqkv, layer.wo, layer.w_gate_up,
                                                                                  layer.w_down)):
        raise ValueError("kernels = 'gemv' multiplies unquantized weights (quantization = 'none')")
    if embed.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("kernels = 'gemv' on a CPU model needs TRITON_INTERPRET=1 (Triton's interpreter)")
    gemv.prepare(embed.device)
    return gemv


def persistent_decoder(kernels: str, args: ModelArgs, weights: Weights, cos: torch.Tensor,
                       sin: torch.Tensor) -> object | None:
    """A :class:`flashspec_kernels.decoder.Decoder` for ``kernels = "persistent"`` (a clear error
    where it cannot run these weights), None otherwise. Stacks the layer weights into one
    tensor per kind and re-points ``weights.layers`` at views of them, so they are held once;
    makes the kernel's buffers and barrier counters now, before any CUDA-graph capture."""
    if kernels != "persistent":
        return None
    try:
        from flashspec_kernels import decoder
    except ModuleNotFoundError as exc:
        if exc.name != "triton":
            raise
        raise ValueError("kernels = 'persistent' needs the triton package: pip install 'flashspec-engine[triton]'") from None
    embed = weights.embed
    if embed.dtype not in decoder.DTYPES:
        raise ValueError(f"kernels = 'persistent' runs float16, bfloat16 and float32 models, not {embed.dtype}")
    if any(not isinstance(t, torch.Tensor) for layer in weights.layers for t in (layer.wqkv, layer.wo, layer.w_gate_up,
                                                                                  layer.w_down)):
        raise ValueError("kernels = 'persistent' multiplies unquantized weights (quantization = 'none')")
    if embed.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("kernels = 'persistent' on a CPU model needs TRITON_INTERPRET=1 (Triton's interpreter)")
    stacked = decoder.stack(weights.layers, weights.norm)
    for i, layer in enumerate(weights.layers):
        layer.wqkv, layer.wo = stacked.wqkv[i], stacked.wo[i]
        layer.w_gate_up, layer.w_down = stacked.w_gate_up[i], stacked.w_down[i]
        layer.attn_norm, layer.mlp_norm = stacked.attn_norm[i], stacked.mlp_norm[i]
        layer.bqkv = None if stacked.bqkv is None else stacked.bqkv[i]
    shape = decoder.Shape(heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim, eps=args.norm_eps)
    mode = os.environ.get("FLASHSPEC_DECODER_MODE", "persistent")  # "phased": one launch per phase (diagnosis)
    return decoder.Decoder(stacked, shape, cos, sin, mode=mode)


class GemvLayers:
    """The fused GEMMs of one model (``eps``: its RMSNorm epsilon). Every ``x`` is the
    forward's own residual stream ``[M, D]``, updated in place where a method ends in ``_``."""

    def __init__(self, gemv: ModuleType, eps: float) -> None:
        self.gemv, self.eps = gemv, eps

    def qkv(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        """``[M, (H + 2 KV) hd]``: the attention norm, the QKV projection and its bias."""
        return self.gemv.gemv(x, layer.wqkv, layer.bqkv, norm=layer.attn_norm, eps=self.eps)

    def out_(self, x: torch.Tensor, o: torch.Tensor, layer: Layer) -> torch.Tensor:
        """``x += o @ Wo^T``; ``o`` ``[M, H hd]``."""
        return self.gemv.gemv(o, layer.wo, residual=x)

    def mlp_(self, x: torch.Tensor, layer: Layer) -> torch.Tensor:
        """``x += silu_mul(rms_norm(x) @ Wgu^T) @ Wdown^T``: two launches."""
        act = self.gemv.gemv(x, layer.w_gate_up, norm=layer.mlp_norm, eps=self.eps, glu=True)  # [M, F]
        return self.gemv.gemv(act, layer.w_down, residual=x)

    def head(self, x: torch.Tensor, w: Weights) -> torch.Tensor:
        """Logits ``[B, T, V]`` of ``x`` ``[B, T, D]`` (rows may be a strided view, as ``x[:, -1:]``)."""
        batch, width, dim = x.shape
        rows = x[:, 0] if width == 1 else x.reshape(batch * width, dim)
        return self.gemv.gemv(rows, w.lm_head, norm=w.norm, eps=self.eps).view(batch, width, -1)
