"""Config keys of the ``fast`` target and draft, and building a model from them."""

from __future__ import annotations

from pathlib import Path

import torch

from flashspec_fast.keys import SHAPE_PREFIX as SHAPE_PREFIX
from flashspec_fast.keys import FastOptions as FastOptions  # defined without torch, for the config check
from flashspec_fast.keys import FastTargetOptions as FastTargetOptions
from flashspec_fast.model import ModelArgs, Transformer, load_weights, random_weights, read_config, shape_config
from flashspec_fast.nf4 import quantize_weights
from flashspec_models.weights import resolve_model

# FastOptions.dtype's names (flashspec_fast.keys.DTYPE_NAMES)
DTYPES = {"auto": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float32": torch.float32, "float64": torch.float64}
def build_model(opts: FastOptions) -> tuple[Transformer, str | None]:
    """Return the model and its checkpoint directory (None for a random ``shape:`` model)."""
    device = opts.torch_device()
    dtype = opts.torch_dtype(device)
    if opts.model.startswith(SHAPE_PREFIX):
        args = ModelArgs.from_hf(shape_config(opts.model.removeprefix(SHAPE_PREFIX)))
        weights = random_weights(args, dtype, device, opts.seed)
        path = None
    else:
        path = resolve_model(opts.model)
        args = ModelArgs.from_hf(read_config(Path(path)))
        weights = load_weights(Path(path), args, dtype, device)
    if opts.quantization == "nf4":
        weights = quantize_weights(weights)
    fuse = opts.fuse and device.type == "cuda"
    return Transformer(args, weights, opts.max_len, fuse=fuse, attention=opts.attention, kernels=opts.kernels), path
