"""Loading Hugging Face causal LMs from a config table's keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from flashspec_hf.keys import ModelOptions as ModelOptions  # defined without torch, for the config check
from flashspec_models import streaming
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
    dtype = _dtype(opts, device)
    model = None
    if opts.quantization == "none" and opts.device_map is None and widens(Path(path), dtype):
        model = load_upcast(Path(path), dtype, opts.attn_implementation)
    if model is None:
        kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": opts.attn_implementation}
        if opts.quantization == "nf4":
            _check_nf4_widths(Path(path), device)
            kwargs["quantization_config"] = _nf4_config(dtype)
        if opts.device_map is not None:
            kwargs["device_map"] = opts.device_map
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if opts.device_map is None and opts.quantization == "none":
        model.to(device)  # type: ignore[arg-type]  # transformers types .to oddly; moves in place
    model.eval()
    return model, load_tokenizer(path)


def widens(path: Path, dtype: torch.dtype) -> bool:
    """Whether ``path`` is a local safetensors checkpoint stored narrower than ``dtype`` (a
    bfloat16 cache computed in float32): the case :func:`load_upcast` is for."""
    if not path.is_dir() or not any(path.glob("*.safetensors")):
        return False
    stored = streaming.Checkpoint(path).float_dtypes()
    return bool(stored) and all(d.itemsize < dtype.itemsize for d in stored)


def load_upcast(path: Path, dtype: torch.dtype, attn_implementation: str = "sdpa") -> Any:
    """The model at ``path`` in ``dtype``, read a tensor at a time (:mod:`flashspec_models.streaming`);
    None when its tensor names are not the model class's own (``from_pretrained`` knows more namings).

    ``from_pretrained`` would hold the mapped narrow file beside the wide copy (10.4 GiB peak
    for the 1.5B's bfloat16 cache in float32, against 6.3 GiB from a float32 cache). Here the
    model is built with its weights allocated but never initialized (pages the kernel has not
    handed out yet), tied, with its rotary tables computed, and then each weight is read into place.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    checkpoint = streaming.Checkpoint(path)
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype,
                                                 attn_implementation=attn_implementation)
    model.tie_weights()  # post_init ties them in init_weights, which no_init_weights skips
    pairs = streaming.plan(model, checkpoint)
    if pairs is None:
        return None
    streaming.fill(pairs, checkpoint)
    if (path / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model.name_or_path = str(path)
    return model


NF4_CPU_BLOCK = 64  # bitsandbytes' 4-bit block on the CPU: each row of a weight is whole blocks


def _check_nf4_widths(path: Path, device: torch.device) -> None:
    """On the CPU, bitsandbytes packs each 4-bit weight row in blocks of 64 inputs and fails inside
    the first forward (``shape '[32, 0]' is invalid``) where a layer's input width is not a
    multiple: refuse such a checkpoint at load, naming the widths."""
    config = path / "config.json"
    if device.type != "cpu" or not config.is_file():
        return
    data = json.loads(config.read_text(encoding="utf-8"))
    widths = {k: data.get(k) for k in ("hidden_size", "intermediate_size") if isinstance(data.get(k), int)}
    odd = {k: v for k, v in widths.items() if v % NF4_CPU_BLOCK}
    if odd:
        found = ", ".join(f"{k} = {v}" for k, v in odd.items())
        raise RuntimeError(f"quantization = 'nf4' on the CPU needs every layer's input width to be a multiple of "
                           f"{NF4_CPU_BLOCK} (bitsandbytes' block), but {config} has {found}; use quantization = 'none'")


def _nf4_config(compute_dtype: torch.dtype) -> Any:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError("quantization = 'nf4' needs bitsandbytes: pip install 'flashspec-engine[nf4]'") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype)
