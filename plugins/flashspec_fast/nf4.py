"""NF4 4-bit weights through bitsandbytes (its CPU back-end serves the tests)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from flashspec_fast.model import Weights


class NF4Linear:
    """A weight ``[out, in]`` stored as NF4; called like ``F.linear(x, w, b)``."""

    def __init__(self, weight: torch.Tensor) -> None:
        import bitsandbytes.functional as bf

        self.shape = weight.shape
        self.dtype = weight.dtype
        self.packed, self.state = bf.quantize_4bit(weight, quant_type="nf4")

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        import bitsandbytes as bnb

        return bnb.matmul_4bit(x, self.packed.t(), quant_state=self.state, bias=bias)


def quantize_weights(w: Weights) -> Weights:
    """Quantize every linear layer's weight (not the embedding, norms or LM head)."""
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError("quantization = 'nf4' needs bitsandbytes: pip install 'flashspec-engine[nf4]'") from None
    layers: list[Any] = []
    for layer in w.layers:
        layers.append(
            attrs.evolve(
                layer,
                wqkv=NF4Linear(layer.wqkv),
                wo=NF4Linear(layer.wo),
                w_gate_up=NF4Linear(layer.w_gate_up),
                w_down=NF4Linear(layer.w_down),
            )
        )
    return attrs.evolve(w, layers=layers)
