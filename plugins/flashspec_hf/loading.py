"""Loading Hugging Face causal LMs from a config table's keys."""

from __future__ import annotations

from typing import Any

import torch

from flashspec_hf.keys import ModelOptions as ModelOptions  # defined without torch, for the config check
from flashspec_models.precision import auto_dtype
from flashspec_models.tokenizer import load_tokenizer
from flashspec_models.weights import resolve_model

DTYPES = {  # ModelOptions.dtype's names (flashspec_hf.keys.DTYPE_NAMES)
    "auto": None,
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
def _dtype(opts: ModelOptions, device: torch.device) -> torch.dtype:
    chosen = DTYPES[opts.dtype]
    if chosen is not None:
        return chosen
    chosen = DTYPES[auto_dtype(device.type)]  # a bfloat16 copy is upcast here on a CPU without bfloat16 matmul
    assert chosen is not None
    return chosen


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
