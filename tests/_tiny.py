"""Tiny random-initialised causal LMs (and a word-level tokenizer) saved to disk."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


def tiny_tokenizer(vocab: int, prefix: str = "t") -> PreTrainedTokenizerFast:
    words = {f"{prefix}{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=f"{prefix}{vocab - 1}", unk_token=f"{prefix}0")


def tiny_lm(
    path: Path,
    vocab: int = 16,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float64,
    tokenizer_prefix: str = "t",
    embed_vocab: int | None = None,
) -> Path:
    """Save a random Qwen2-shaped model (logits scaled by ``scale``) under ``path``."""
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=embed_vocab or vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.to(dtype).save_pretrained(path)
    tiny_tokenizer(vocab, tokenizer_prefix).save_pretrained(path)
    return path
