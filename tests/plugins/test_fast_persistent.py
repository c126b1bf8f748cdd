"""The fast model with ``kernels = "persistent"`` against the torch path (CPU, Triton's interpreter).

Tiny random models in float32: decoding steps over a batch, a verify width and a shallow
(self-draft) forward must give the torch path's logits to float32 rounding and its greedy
tokens; prefills, tree blocks and forwards past 16 rows keep the torch path, bit for bit.
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
    """The torch and the persistent model over equal random weights (scaled up, so the logits
    spread and a greedy tie is unlikely). The persistent model stacks its own copy."""
    args = ModelArgs.from_hf({"model_type": kind, "vocab_size": 97, "hidden_size": 64, "intermediate_size": 80,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "rms_norm_eps": 1e-6, "rope_theta": 1e4})
    models = []
    for kernels in ("torch", "persistent"):
        weights = random_weights(args, torch.float32, torch.device("cpu"), seed=3)
        for layer in weights.layers:
            for t in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
                t.mul_(5)
        model = Transformer(args, weights, max_len=160, attention="sdpa", kernels=kernels)
        model.allocate(2)
        models.append(model)
    return models[0], models[1]


def step(model: Transformer, tokens: torch.Tensor, start: int, **kw: object) -> torch.Tensor:
    pos = (start + torch.arange(tokens.shape[1], device=tokens.device))[None].expand_as(tokens)
    return model.forward(tokens, pos, pos, **kw)


def same(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_decoding_matches_the_torch_path(kind: str) -> None:
    """A prefill of 130 tokens per row (two attention splits after it), then greedy steps of
    one token and a 3-token verify width."""
    ref, fast = tiny(kind)
    prompt = torch.randint(0, 97, (2, 130), generator=torch.Generator().manual_seed(0))
    want, got = (step(m, prompt, 0) for m in (ref, fast))
    assert torch.equal(got, want)  # a prefill takes the torch path on both
    tok, at = want[:, -1:].argmax(-1), 130
    for width in (1, 1, 3):
        tokens = torch.cat([tok] * width, dim=1)
        want, got = (step(m, tokens, at, last_only=width > 1) for m in (ref, fast))
        same(got, want)
        tok, at = want[:, -1:].argmax(-1), at + width


def test_a_shallow_forward_matches() -> None:
    ref, fast = tiny("qwen2")
    prompt = torch.tensor([[5, 9, 11], [1, 2, 3]])
    for m in (ref, fast):
        step(m, prompt, 0)
    tokens = torch.tensor([[4], [7]])
    same(step(fast, tokens, 3, depth=1), step(ref, tokens, 3, depth=1))


def test_the_kernel_runs_decoding_forwards_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """One launch per decoding forward up to 16 rows; none for a wider one."""
    ref, fast = tiny("qwen2")
    calls = []
    real = fast.decoder.forward
    monkeypatch.setattr(fast.decoder, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    step(fast, torch.ones((2, 3), dtype=torch.long), 0)
    assert len(calls) == 1
    calls.clear()
    wide = torch.ones((2, fused.DECODER_ROWS // 2 + 1), dtype=torch.long)
    assert torch.equal(step(fast, wide, 0), step(ref, wide, 0)) and not calls


def test_the_option_refuses_what_it_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unquantized"):
        FastOptions(model="shape:qwen2.5-0.5b", kernels="persistent", quantization="nf4")
    args = ModelArgs.from_hf({"model_type": "llama", "vocab_size": 16, "hidden_size": 16, "intermediate_size": 16,
                              "num_hidden_layers": 1, "num_attention_heads": 2})
    with pytest.raises(ValueError, match="float64"):
        Transformer(args, random_weights(args, torch.float64, torch.device("cpu")), 16, kernels="persistent")
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        Transformer(args, random_weights(args, torch.float32, torch.device("cpu")), 16, kernels="persistent")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_gpu_one_launch_matches_the_torch_path(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 0.5B shape (random weights) on CUDA, persistent (one launch, spinning barriers)
    against the torch path: float32 logits to rounding with the same greedy tokens, bf16
    logits close; graph replays give the same logits again (the barrier counters were left
    at zero)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    monkeypatch.delenv("TRITON_INTERPRET")
    from flashspec_core.cudagraph import capture
    from flashspec_fast.model import shape_config

    args = ModelArgs.from_hf(shape_config("qwen2.5-0.5b"))
    dev = torch.device("cuda")
    models = []
    for kernels in ("torch", "persistent"):
        model = Transformer(args, random_weights(args, dtype, dev, seed=1), max_len=512, kernels=kernels)
        model.allocate(4)
        models.append(model)
    prompt = torch.randint(0, args.vocab, (4, 150), device=dev, generator=torch.Generator(dev).manual_seed(0))
    for m in models:
        step(m, prompt, 0)
    for width in (1, 4):
        tokens = torch.randint(0, args.vocab, (4, width), device=dev, generator=torch.Generator(dev).manual_seed(width))
        want, got = (step(m, tokens, 150, last_only=True) for m in models)
        if dtype == torch.float32:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
        else:
            torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.15)
    fast = models[1]
    pos = torch.full((4, 1), 160, device=dev)
    ids = torch.full((4, 1), 7, device=dev)
    eager = fast.forward(ids, pos, pos, span=256).clone()
    graph, out = capture(lambda i, p: fast.forward(i, p, p, span=256), [ids, pos], None, warmups=2)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_triton_options_on_a_certain_cpu_are_refused_before_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kernels``/``attention`` that need Triton on a model that certainly lands on a CPU:
    refused when the keys are read (no torch), unless the interpreter is on; ``auto`` on a
    machine that may have CUDA is left to the build."""
    from flashspec_core import machine

    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match=r"kernels = 'persistent' run Triton kernels, and device is 'cpu': on a CPU that needs TRITON_INTERPRET=1"):
        FastOptions(model="shape:qwen2.5-0.5b", kernels="persistent", device="cpu")
    with pytest.raises(ValueError, match=r"kernels = 'gemv' and attention = 'triton'"):
        FastOptions(model="shape:qwen2.5-0.5b", kernels="gemv", attention="triton", device="cpu")
    monkeypatch.setattr(machine, "no_cuda", lambda: "there is no NVIDIA or ROCm driver")
    with pytest.raises(ValueError, match="no NVIDIA or ROCm driver"):
        FastOptions(model="shape:qwen2.5-0.5b", attention="triton")
    FastOptions(model="shape:qwen2.5-0.5b", device="cpu")  # the torch path needs nothing
    monkeypatch.setattr(machine, "no_cuda", lambda: None)
    FastOptions(model="shape:qwen2.5-0.5b", kernels="persistent")  # may be a GPU: the build decides
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    FastOptions(model="shape:qwen2.5-0.5b", kernels="persistent", device="cpu")
