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
    from flashspec_fast.model import Layer, Weights

MAX_ROWS = 32  # batch * width of the widest forward that runs the fused GEMMs: two row tiles


def gemv_module(kernels: str, weights: Weights) -> ModuleType | None:
    """:mod:`flashspec_kernels.gemv` for ``kernels = "gemv"`` (a clear error where it cannot
    run these weights), None for ``"torch"``. Makes the device's split-K counters now, so
    that a CUDA graph captured later does not allocate them."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if kernels == "torch":
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
