"""The fast model with ``kernels = "gemv"`` against the torch path (CPU, Triton's interpreter).

Tiny random models in float32: the logits of a prefill, of decoding steps over a batch and
of a shallow (self-draft) forward must match the torch path's to float32 rounding (the
norms sum in another order), with the same greedy tokens; forwards wider than
``MAX_ROWS`` rows keep the torch path, bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_fast import fused
from flashspec_fast.model import ModelArgs, Transformer, random_weights
from flashspec_fast.options import FastOptions

triton = pytest.importorskip("triton")


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def tiny(kind: str) -> tuple[Transformer, Transformer]:
    """The torch and the gemv model over the same random weights (larger than the default
    init, so the logits spread and a greedy tie is unlikely)."""
    args = ModelArgs.from_hf({"model_type": kind, "vocab_size": 97, "hidden_size": 64, "intermediate_size": 80,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "rms_norm_eps": 1e-6, "rope_theta": 1e4})
    weights = random_weights(args, torch.float32, torch.device("cpu"), seed=3)
    for layer in weights.layers:
        for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            t.mul_(5)
    models = tuple(Transformer(args, weights, max_len=64, attention="sdpa", kernels=k) for k in ("torch", "gemv"))
    for m in models:
        m.allocate(2)
    return models


def step(model: Transformer, tokens: torch.Tensor, start: int, **kw: object) -> torch.Tensor:
    pos = (start + torch.arange(tokens.shape[1]))[None].expand_as(tokens)
    return model.forward(tokens, pos, pos, **kw)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_decoding_matches_the_torch_path(kind: str) -> None:
    """A prefill of 5 tokens per row, then greedy steps of one token and a 3-token verify width."""
    ref, fast = tiny(kind)
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    want, got = (step(m, prompt, 0) for m in (ref, fast))
    same(got, want)
    tok, at = want[:, -1:].argmax(-1), 5
    for width in (1, 1, 3):
        tokens = torch.cat([tok] * width, dim=1)
        want, got = (step(m, tokens, at, last_only=width > 1) for m in (ref, fast))
        same(got, want)
        tok, at = want[:, -1:].argmax(-1), at + width


def test_a_shallow_forward_matches() -> None:
    ref, fast = tiny("qwen2")
    tokens = torch.tensor([[5, 9, 11], [1, 2, 3]])
    same(step(fast, tokens, 0, depth=1), step(ref, tokens, 0, depth=1))


def test_the_fused_gemms_run_up_to_max_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four launches per layer and the head for a narrow forward; none past ``MAX_ROWS``."""
    from flashspec_kernels import gemv

    ref, fast = tiny("qwen2")
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    step(fast, torch.ones((2, 3), dtype=torch.long), 0)
    assert len(calls) == 4 * fast.args.layers + 1
    calls.clear()
    wide = torch.ones((2, fused.MAX_ROWS // 2 + 1), dtype=torch.long)
    assert torch.equal(step(fast, wide, 0), step(ref, wide, 0)) and not calls


def test_the_option_refuses_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unquantized"):
        FastOptions(model="shape:qwen2.5-0.5b", kernels="gemv", quantization="nf4")
    with pytest.raises(ValueError, match="kernels"):
        FastOptions(model="shape:qwen2.5-0.5b", kernels="cublas")
    args = ModelArgs.from_hf({"model_type": "llama", "vocab_size": 16, "hidden_size": 16, "intermediate_size": 16,
                              "num_hidden_layers": 1, "num_attention_heads": 2})
    with pytest.raises(ValueError, match="float64"):
        Transformer(args, random_weights(args, torch.float64, torch.device("cpu")), 16, kernels="gemv")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        Transformer(args, random_weights(args, torch.float32, torch.device("cpu")), 16, kernels="gemv")
