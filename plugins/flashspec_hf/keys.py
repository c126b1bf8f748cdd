"""The hf components' names and config keys, without torch or transformers
(:class:`~flashspec_core.config.ComponentKeys`); torch work on them waits for the build."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from flashspec_core import keycheck
from flashspec_core.config import ComponentKeys
from flashspec_core.keycheck import SelfOptions as SelfOptions  # the self-speculative drafts share one key
from flashspec_models.weights import KNOWN_MODELS, is_model_ref, model_problem

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("auto", "float32", "float64", "bfloat16", "float16")  # flashspec_hf.loading.DTYPES' keys
QUANTIZATIONS = ("none", "nf4")


def _model_ref(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    if not value:
        raise ValueError(f"{attr.name} is required (a directory with a Hugging Face checkpoint, or a known name)")
    if not is_model_ref(value):
        raise ValueError(f"{attr.name} {value!r} is neither an existing directory nor a known model name "
                         f"(known: {', '.join(KNOWN_MODELS)})")
    if (problem := model_problem(value)) is not None:
        raise ValueError(f"{attr.name} {value!r}: {problem}")


@attrs.frozen
class ModelOptions:
    """Keys a model table accepts; they pass through to ``from_pretrained``."""

    model: str = attrs.field(validator=_model_ref)
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(DTYPE_NAMES))
    device: str = attrs.field(default="auto", validator=keycheck.device)
    device_map: str | None = None
    quantization: str = attrs.field(default="none", validator=attrs.validators.in_(QUANTIZATIONS))
    attn_implementation: str = attrs.field(default="sdpa", validator=attrs.validators.in_(("sdpa", "eager")))
    chat_template: bool = True

    def torch_device(self) -> torch.device:
        import torch  # at build time only

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


@attrs.frozen
class DraftOptions(ModelOptions):
    """A draft model's keys: those of :class:`ModelOptions`, ``tree_width`` (children per node at
    each depth; empty: a chain) and ``tree_children`` (how a sampling step picks them: ``"topk"`` or
    ``"sample"``, see :mod:`flashspec_hf.draft`);
    ``tree_depth`` and ``tree_expand`` instead give a dynamic tree, its shape chosen each step from
    the draft's own probabilities (:func:`flashspec_core.tree.grow_tree`)."""

    tree_width: tuple[int, ...] = attrs.field(default=(), converter=tuple, validator=keycheck.tree_width)
    tree_children: str = attrs.field(default="topk", validator=keycheck.tree_children)
    # A dynamic tree (tree_depth levels, tree_expand nodes expanded per level): see the draft module.
    tree_depth: int = attrs.field(default=0, validator=keycheck.tree_size)
    tree_expand: int = attrs.field(default=0, validator=keycheck.tree_size)

    def __attrs_post_init__(self) -> None:
        keycheck.check_tree(self.tree_width, self.tree_children, self.tree_depth, self.tree_expand)


COMPONENTS = (
    ComponentKeys("target", "hf", ModelOptions, "any transformers AutoModelForCausalLM"),
    ComponentKeys("draft", "hf", DraftOptions, "a smaller causal LM with the target's tokenizer, own KV cache"),
    ComponentKeys("draft", "hf-self", SelfOptions,
                  "self-speculative: the hf target's first `layers` layers draft, on its weights and KV cache"),
)
