"""Loading Hugging Face causal LMs from a config table's keys."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from flashspec_core.config import check_device
from flashspec_models.tokenizer import load_tokenizer
from flashspec_models.weights import KNOWN_MODELS, is_model_ref, resolve_model

DTYPES = {
    "auto": None,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
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
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(tuple(DTYPES)))
    device: str = attrs.field(default="auto")
    device_map: str | None = None
    quantization: str = attrs.field(default="none", validator=attrs.validators.in_(QUANTIZATIONS))
    attn_implementation: str = attrs.field(default="sdpa", validator=attrs.validators.in_(("sdpa", "eager")))
    chat_template: bool = True

    @device.validator
    def _device(self, attribute: attrs.Attribute[Any], value: str) -> None:
        check_device(value)

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


def _dtype(opts: ModelOptions, device: torch.device) -> torch.dtype:
    chosen = DTYPES[opts.dtype]
    if chosen is not None:
        return chosen
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(opts: ModelOptions) -> tuple[Any, Any]:
    """Return ``(model, tokenizer)``; tokenizer is None when the checkpoint has none."""
    from transformers import AutoModelForCausalLM

    path = resolve_model(opts.model)
    device = opts.torch_device()
    kwargs: dict[str, Any] = {"dtype": _dtype(opts, device), "attn_implementation": opts.attn_implementation}
    if opts.quantization == "nf4":
        kwargs["quantization_config"] = _nf4_config(_dtype(opts, device))
    if opts.device_map is not None:
        kwargs["device_map"] = opts.device_map
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if opts.device_map is None and opts.quantization == "none":
        model.to(device)  # type: ignore[arg-type]  # transformers types .to oddly; moves in place
    model.eval()
    return model, load_tokenizer(path)


def _nf4_config(compute_dtype: torch.dtype) -> Any:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError("quantization = 'nf4' needs bitsandbytes: pip install 'flashspec-engine[nf4]'") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
