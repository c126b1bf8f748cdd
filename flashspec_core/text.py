"""Prompt text <-> token ids, shared by every target back-end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def encode_prompt(tokenizer: Any, prompt: str, chat_template: bool) -> list[int]:
    """Token ids of ``prompt``, wrapped as one user turn when the tokenizer has a chat template."""
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
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))
