"""NF4 4-bit weights (:mod:`flashspec_kernels.nf4_format`): a fused dequantize-GEMM on CUDA.

Each linear layer's weight is stored as NF4 (a quarter of bf16's bytes plus a float32 scale
per 64 weights). On CUDA, with Triton installed, a forward of at most 64 rows (a decoding or
verify step) runs :func:`flashspec_kernels.nf4.nf4_gemv` once per 16 rows, which dequantizes
inside the kernel and so reads the 4-bit weights once a launch; wider forwards (prefills), the
CPU and installs without Triton multiply by the dequantized matrix. The values are
bitsandbytes' NF4 with blocks of 64, so checkpoints and numbers compare with it; bitsandbytes
itself is not needed.
"""

from __future__ import annotations

import importlib.util

import attrs
import torch

from flashspec_fast.model import Weights
from flashspec_kernels.nf4_format import dequantize, quantize


class NF4Linear:
    """A weight ``[out, in]`` stored as NF4; called like ``F.linear(x, w, b)``. ``kernel``:
    the fused kernel for forwards of few rows (default: on CUDA where Triton is installed)."""

    def __init__(self, weight: torch.Tensor, kernel: bool | None = None) -> None:
        self.shape = weight.shape
        self.dtype = weight.dtype
        self.packed, self.scales = quantize(weight)
        self.kernel = (weight.is_cuda and importlib.util.find_spec("triton") is not None) if kernel is None else kernel
        if self.kernel and weight.is_cuda:  # the split-K counters, made before any graph capture
            from flashspec_kernels.gemv import prepare

            prepare(weight.device)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.kernel:
            from flashspec_kernels.nf4 import nf4_linear

            return nf4_linear(x, self.packed, self.scales, bias)
        return torch.nn.functional.linear(x, dequantize(self.packed, self.scales, x.dtype, x.shape[-1]), bias)


def quantize_weights(w: Weights, kernel: bool | None = None) -> Weights:
    """Quantize every linear layer's weight (not the embedding, norms or LM head)."""
    layers = [
        attrs.evolve(layer, wqkv=NF4Linear(layer.wqkv, kernel), wo=NF4Linear(layer.wo, kernel),
                     w_gate_up=NF4Linear(layer.w_gate_up, kernel), w_down=NF4Linear(layer.w_down, kernel))
        for layer in w.layers
    ]
    return attrs.evolve(w, layers=layers)
