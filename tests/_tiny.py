"""Tiny random-initialised causal LMs (and a word-level tokenizer) saved to disk."""

from __future__ import annotations

import json
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
    init: float = 0.02,
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
        initializer_range=init,  # ~0.3 makes the next token depend strongly on the context
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.to(dtype).save_pretrained(path)
    _save_tokenizer(tiny_tokenizer(vocab, tokenizer_prefix), path)
    return path


def _save_tokenizer(tok: PreTrainedTokenizerFast, path: Path) -> None:
    tok.save_pretrained(path)
    # AutoTokenizer would otherwise pick the model type's tokenizer class (Qwen2's BPE).
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg))


def perturbed_lm(src: Path, path: Path, noise: float, seed: int = 0, layers: int | None = None) -> Path:
    """A draft correlated with ``src``: its weights plus Gaussian noise of relative size ``noise``."""
    model = Qwen2ForCausalLM.from_pretrained(src, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * p.std().clamp_min(1e-3))
    model.save_pretrained(path)
    _save_tokenizer(PreTrainedTokenizerFast.from_pretrained(src), path)
    return path


def pipeline_dict(
    target: Path, drafts: list[Path], selector: str = "fixed", gamma: int = 3, dtype: str = "float64", **sel: object
) -> dict:
    """A build_pipeline() dict: one hf arm per draft plus lookup arms: one padded to gamma,
    one proposing only what a bigram match gives (0 to gamma tokens), and, with a draft,
    one that falls back to the first draft's proposal where it has no match; in ``dtype``."""
    arms: list[dict] = [
        {"use": "hf", "model": str(d), "gamma": gamma, "dtype": dtype, "name": f"d{i}"} for i, d in enumerate(drafts)
    ]
    arms.append({"use": "prompt_lookup", "gamma": gamma + 1, "name": "lookup"})
    arms.append({"use": "prompt_lookup", "gamma": gamma, "min_ngram": 2, "fill": False, "name": "lookup-match"})
    if drafts:
        arms.append({"use": "prompt_lookup", "gamma": gamma, "min_ngram": 2, "fill": False, "fallback": "d0",
                     "name": "lookup-or-d0"})
    return {
        "target": {"model": str(target), "dtype": dtype, "chat_template": False},
        "arm": arms,
        "verifier": {"use": "reference"},
        "selector": {"use": selector, **sel},
    }


def tiny_family(root: Path) -> dict[str, Path]:
    """A peaked V = 16 target, a close draft (its perturbed copy) and an unrelated one-layer draft."""
    target = tiny_lm(root / "target", vocab=16, seed=0, scale=8.0)
    return {
        "target": target,
        "close": perturbed_lm(target, root / "close", noise=0.05, seed=1),
        "far": tiny_lm(root / "far", vocab=16, seed=2, scale=8.0, layers=1),
    }
