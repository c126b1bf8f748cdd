"""The fast components' names and config keys, without torch (:class:`~flashspec_core.config.ComponentKeys`);
torch work on them waits for the build."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import attrs

from flashspec_core import keycheck, machine
from flashspec_core.config import ComponentKeys
from flashspec_core.keycheck import SelfOptions as SelfOptions  # the self-speculative drafts share one key
from flashspec_models.weights import KNOWN_MODELS, is_model_ref, model_problem

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("auto", "bf16", "bfloat16", "float16", "float32", "float64")  # flashspec_fast.options.DTYPES' keys
KERNELS = ("torch", "gemv", "persistent")  # the ``kernels`` option (flashspec_fast.fused)
# Layer shapes of public Qwen2.5 checkpoints (config.json values), for synthetic scaling runs.
QWEN25_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
    "qwen2.5-14b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen2.5-32b": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, tie_word_embeddings=False),
}

QUANTIZATIONS = ("none", "nf4")
ATTENTIONS = ("auto", "sdpa", "triton")  # decoding forwards' attention (flashspec_fast.model.decode_kernel)
SHAPE_PREFIX = "shape:"  # "shape:qwen2.5-7b": random weights of that shape (synthetic timing only)


def _model_ref(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    if value.startswith(SHAPE_PREFIX):
        if value.removeprefix(SHAPE_PREFIX) not in QWEN25_SHAPES:
            raise ValueError(f"{attr.name} {value!r}: known shapes are {', '.join(QWEN25_SHAPES)}")
        return
    if not is_model_ref(value):
        raise ValueError(f"{attr.name} {value!r} is neither an existing directory nor a known model name "
                         f"(known: {', '.join(KNOWN_MODELS)})")
    if (problem := model_problem(value)) is not None:
        raise ValueError(f"{attr.name} {value!r}: {problem}")


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
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(DTYPE_NAMES))
    device: str = attrs.field(default="auto", validator=keycheck.device)
    max_len: int = attrs.field(default=2048, validator=attrs.validators.ge(8))
    compile: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    fuse: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    quantization: str = attrs.field(default="none", validator=attrs.validators.in_(QUANTIZATIONS))
    attention: str = attrs.field(default="auto", validator=attrs.validators.in_(ATTENTIONS))
    kernels: str = attrs.field(default="torch", validator=attrs.validators.in_(KERNELS))
    chat_template: bool = True
    seed: int = 0  # random weights of a "shape:" model

    def __attrs_post_init__(self) -> None:
        if self.kernels != "torch" and self.quantization != "none":
            raise ValueError(f"kernels = {self.kernels!r} multiplies unquantized weights, not quantization = "
                             f"{self.quantization!r}")
        triton_only = [f"{key} = {value!r}" for key, value, plain in (("kernels", self.kernels, "torch"),
                                                                      ("attention", self.attention, "sdpa"))
                       if value not in ("auto", plain)]
        if triton_only and os.environ.get("TRITON_INTERPRET") != "1":
            # before torch is imported: only where the model certainly lands on a CPU
            cpu = "device is 'cpu'" if self.device == "cpu" else machine.no_cuda() if self.device == "auto" else None
            if cpu is not None:
                raise ValueError(f"{' and '.join(triton_only)} run Triton kernels, and {cpu}: on a CPU that "
                                 f"needs TRITON_INTERPRET=1 (Triton's interpreter); or set kernels = 'torch' and "
                                 f"attention = 'auto'")

    def torch_device(self) -> torch.device:
        import torch  # at build time only

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, device: torch.device) -> torch.dtype:
        from flashspec_fast.options import DTYPES
        from flashspec_models.precision import auto_dtype

        chosen = DTYPES[self.dtype] or DTYPES[auto_dtype(device.type)]  # auto: upcast where bfloat16 runs slowly
        assert chosen is not None
        return chosen


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


@attrs.frozen
class FastDraftOptions(FastOptions):
    """Keys of a ``use = "fast"`` draft: those of :class:`FastOptions`, ``tree_width`` (children per
    node at each depth; empty: a chain) and ``tree_children`` (how a sampling step picks them:
    ``"topk"`` or ``"sample"``, see :mod:`flashspec_fast.draft`);
    ``tree_depth`` and ``tree_expand`` instead give a dynamic tree, its shape chosen each step from
    the draft's own probabilities (:func:`flashspec_core.tree.grow_tree`)."""

    tree_width: tuple[int, ...] = attrs.field(default=(), converter=tuple, validator=keycheck.tree_width)
    tree_children: str = attrs.field(default="topk", validator=keycheck.tree_children)
    # A dynamic tree (tree_depth levels, tree_expand nodes expanded per level): see the draft module.
    tree_depth: int = attrs.field(default=0, validator=keycheck.tree_size)
    tree_expand: int = attrs.field(default=0, validator=keycheck.tree_size)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        keycheck.check_tree(self.tree_width, self.tree_children, self.tree_depth, self.tree_expand)


@attrs.frozen
class SyntheticOptions:
    acceptance: float = attrs.field(default=0.8, converter=float, validator=[attrs.validators.ge(0.0), attrs.validators.le(1.0)])


COMPONENTS = (
    ComponentKeys("target", "fast", FastTargetOptions,
                  "own Qwen2/Llama decoder: static KV cache, CUDA-graph verify forward"),
    ComponentKeys("draft", "fast", FastDraftOptions,
                  "own Qwen2/Llama draft: static KV cache, the gamma-token loop (or a tree_width tree) as one CUDA graph"),
    ComponentKeys("draft", "self", SelfOptions,
                  "self-speculative: the fast target's first `layers` layers draft, on its weights and KV cache"),
    ComponentKeys("verifier", "synthetic", SyntheticOptions, "TIMING ONLY: accepts each draft token with a fixed probability"),
)
