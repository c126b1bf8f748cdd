"""The hf components' names and config keys, without torch or transformers
(:class:`~flashspec_core.config.ComponentKeys`); torch work on them waits for the build."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from flashspec_core.config import TREE_CHILDREN, ComponentKeys, check_device
from flashspec_models.weights import KNOWN_MODELS, is_model_ref

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


@attrs.frozen
class ModelOptions:
    """Keys a model table accepts; they pass through to ``from_pretrained``."""

    model: str = attrs.field(validator=_model_ref)
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(DTYPE_NAMES))
    device: str = attrs.field(default="auto")
    device_map: str | None = None
    quantization: str = attrs.field(default="none", validator=attrs.validators.in_(QUANTIZATIONS))
    attn_implementation: str = attrs.field(default="sdpa", validator=attrs.validators.in_(("sdpa", "eager")))
    chat_template: bool = True

    @device.validator
    def _device(self, attribute: attrs.Attribute[Any], value: str) -> None:
        check_device(value)

    def torch_device(self) -> torch.device:
        import torch  # at build time only

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def _widths(_inst: object, attr: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    if not all(isinstance(w, int) and w >= 1 for w in value):
        raise ValueError(f"{attr.name} must be a list of integers >= 1 (children per node, per level), got {list(value)}")


def _children_rule(_inst: object, attr: attrs.Attribute[Any], value: str) -> None:
    if value not in TREE_CHILDREN:
        raise ValueError(f"{attr.name} must be one of {', '.join(map(repr, TREE_CHILDREN))}, got {value!r}")


@attrs.frozen
class DraftOptions(ModelOptions):
    """A draft model's keys: those of :class:`ModelOptions`, ``tree_width`` (children per node at
    each depth; empty: a chain) and ``tree_children`` (how a sampling step picks them: ``"topk"`` or
    ``"sample"``, see :mod:`flashspec_hf.draft`)."""

    tree_width: tuple[int, ...] = attrs.field(default=(), converter=tuple, validator=_widths)
    tree_children: str = attrs.field(default="topk", validator=_children_rule)


def _depth(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attr.name} must be an integer >= 1 (how many of the target's first layers draft), "
                         f"got {value!r}")


@attrs.frozen
class SelfOptions:
    """Keys of a ``use = "hf-self"`` arm: ``layers``, the depth that drafts (1 .. the target's layers)."""

    layers: int = attrs.field(validator=_depth)


COMPONENTS = (
    ComponentKeys("target", "hf", ModelOptions, "any transformers AutoModelForCausalLM"),
    ComponentKeys("draft", "hf", DraftOptions, "a smaller causal LM with the target's tokenizer, own KV cache"),
    ComponentKeys("draft", "hf-self", SelfOptions,
                  "self-speculative: the hf target's first `layers` layers draft, on its weights and KV cache"),
)
