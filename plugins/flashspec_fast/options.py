"""Config keys of the ``fast`` target and draft, and building a model from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch

from flashspec_core.config import check_device
from flashspec_fast.fused import KERNELS
from flashspec_fast.model import ModelArgs, Transformer, load_weights, random_weights, read_config, shape_config
from flashspec_fast.nf4 import quantize_weights
from flashspec_models.weights import KNOWN_MODELS, is_model_ref, resolve_model

DTYPES = {"auto": None, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float32": torch.float32, "float64": torch.float64}
QUANTIZATIONS = ("none", "nf4")
ATTENTIONS = ("auto", "sdpa", "triton")  # decoding forwards' attention (flashspec_fast.model.decode_kernel)
SHAPE_PREFIX = "shape:"  # "shape:qwen2.5-7b": random weights of that shape (synthetic timing only)


def _model_ref(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    from flashspec_fast.model import QWEN25_SHAPES

    if value.startswith(SHAPE_PREFIX):
        if value.removeprefix(SHAPE_PREFIX) not in QWEN25_SHAPES:
            raise ValueError(f"{attr.name} {value!r}: known shapes are {', '.join(QWEN25_SHAPES)}")
        return
    if not is_model_ref(value):
        raise ValueError(f"{attr.name} {value!r} is neither an existing directory nor a known model name "
                         f"(known: {', '.join(KNOWN_MODELS)})")


def _device(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    check_device(value)


@attrs.frozen
class FastOptions:
    """Keys of a ``use = "fast"`` table.

    ``compile`` captures CUDA graphs of the draft loop and the verify forward (on
    CUDA; ignored on CPU); ``fuse`` additionally compiles the elementwise pieces
    (RMSNorm, rotary, SwiGLU) with Inductor, shape-generic, once each. ``kernels = "gemv"``
    runs a decoding forward's GEMMs, with the norms, residual adds and SiLU gate fused into
    them, through :mod:`flashspec_kernels.gemv` (:mod:`flashspec_fast.fused`).
    """

    model: str = attrs.field(validator=_model_ref)
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(tuple(DTYPES)))
    device: str = attrs.field(default="auto", validator=_device)
    max_len: int = attrs.field(default=2048, validator=attrs.validators.ge(8))
    compile: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    fuse: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    quantization: str = attrs.field(default="none", validator=attrs.validators.in_(QUANTIZATIONS))
    attention: str = attrs.field(default="auto", validator=attrs.validators.in_(ATTENTIONS))
    kernels: str = attrs.field(default="torch", validator=attrs.validators.in_(KERNELS))
    chat_template: bool = True
    seed: int = 0  # random weights of a "shape:" model

    def __attrs_post_init__(self) -> None:
        if self.kernels == "gemv" and self.quantization != "none":
            raise ValueError(f"kernels = 'gemv' multiplies unquantized weights, not quantization = {self.quantization!r}")

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        chosen = DTYPES[self.dtype]
        if chosen is not None:
            return chosen
        return torch.bfloat16 if device.type == "cuda" else torch.float32


@attrs.frozen
class FastTargetOptions(FastOptions):
    """Keys of a ``use = "fast"`` target: those of :class:`FastOptions` and ``tensor_parallel``,
    the processes (one GPU each) its weights are sharded over (:mod:`flashspec_fast.tp`; 1: one
    process, no ``torch.distributed``)."""

    tensor_parallel: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int),
                                                             attrs.validators.ge(1)])

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.tensor_parallel > 1 and (self.kernels != "torch" or self.quantization != "none"):
            raise ValueError(f"tensor_parallel = {self.tensor_parallel} shards unquantized weights through torch's "
                             f"GEMMs: set kernels = 'torch' and quantization = 'none' (got {self.kernels!r}, "
                             f"{self.quantization!r})")


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
