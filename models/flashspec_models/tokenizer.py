"""A checkpoint's tokenizer, and prompt text <-> token ids, shared by every target back-end."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashspec_core.config import check_prompt

__all__ = ["decode_ids", "encode_prompt", "load_tokenizer"]

_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def load_tokenizer(path: str) -> Any:
    """The checkpoint's tokenizer, or None if it has none.

    A checkpoint that declares a generic fast tokenizer gets exactly that:
    transformers 5's AutoTokenizer would pick the model type's own class instead.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    cfg_path = Path(path) / "tokenizer_config.json"
    try:
        declared = json.loads(cfg_path.read_text()).get("tokenizer_class") if cfg_path.is_file() else None
        if declared in _GENERIC_TOKENIZERS:
            return PreTrainedTokenizerFast.from_pretrained(path)
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError, TypeError):
        return None


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Token ids of ``prompt``, wrapped as one user turn when the tokenizer has a chat template."""
    check_prompt(prompt, "prompt")  # the tokenizers library's own error for this names a type, not the text
    if tokenizer is None:
        raise ValueError("this target has no tokenizer: pass prompts as lists of token ids")
    if chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return list(tokenizer(prompt)["input_ids"])


def decode_ids(tokenizer: Any, ids: Sequence[int]) -> str:
    """Text of ``ids`` without special tokens (the ids themselves without a tokenizer)."""
    if tokenizer is None:
        return " ".join(str(i) for i in ids)
    backend = _plain_backend(tokenizer)
    if backend is not None:  # transformers' decode without its per-call Python: a server decodes every row every step
        return str(backend.decode(list(ids), skip_special_tokens=True))
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


def _plain_backend(tokenizer: Any) -> Any:
    """The tokenizers-library tokenizer whose ``decode`` is exactly what ``tokenizer.decode(ids,
    skip_special_tokens=True)`` returns, or None: a transformers fast tokenizer whose class
    keeps the library's ``decode`` and ``_decode`` and that cleans up no spaces after decoding."""
    if not _keeps_library_decode(type(tokenizer)) or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    return getattr(tokenizer, "_tokenizer", None)


@functools.cache
def _keeps_library_decode(cls: type) -> bool:
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    return (issubclass(cls, TokenizersBackend) and cls.decode is PreTrainedTokenizerBase.decode
            and cls._decode is TokenizersBackend._decode)
