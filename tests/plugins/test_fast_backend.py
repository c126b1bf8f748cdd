"""The fast back-end on tiny random Qwen2 models (CPU, no graphs): exact against hf."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError
from flashspec_fast.model import RECOMPILE_LIMIT, ModelArgs, Ops, Transformer, load_weights, read_config, rms_norm

PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11]]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("tiny_fast"))


def _config(models: dict[str, Path], backend: str, dtype: str, selector: str = "fixed", arms: Any = None) -> dict:
    extra = {"max_len": 128} if backend == "fast" else {}
    if arms is None:
        arms = [
            {"use": backend, "model": str(models["close"]), "gamma": 3, "dtype": dtype, "name": "close", **extra},
            {"use": backend, "model": str(models["far"]), "gamma": 2, "dtype": dtype, "name": "far", **extra},
            {"use": "prompt_lookup", "gamma": 4, "name": "lookup"},
            {"use": "none", "name": "none"},
        ]
    return {
        "target": {"use": backend, "model": str(models["target"]), "dtype": dtype, "chat_template": False, **extra},
        "arm": arms,
        "verifier": {"use": "reference"},
        "selector": {"use": selector},
    }


def _cpu(models: dict[str, Path], backend: str) -> dict:
    table = _config(models, backend, "float64")["target"]
    return {**table, "device": "cpu"}


def _target_only(models: dict[str, Path], backend: str, dtype: str) -> Any:
    return build_pipeline(_config(models, backend, dtype, arms=[{"use": "none", "name": "none"}]))


def test_logits_match_hf_forward(models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    path = models["target"]
    args = ModelArgs.from_hf(read_config(path))
    model = Transformer(args, load_weights(path, args, torch.float64, torch.device("cpu")), max_len=32)
    model.allocate(1)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    pos = torch.arange(6)[None]
    ours = model.forward(ids, pos, pos)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()(ids).logits
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_attention_span_changes_nothing(models: dict[str, Path]) -> None:
    """Attending only the first ``span`` slots gives the full-cache logits bit for bit."""
    path = models["target"]
    args = ModelArgs.from_hf(read_config(path))
    model = Transformer(args, load_weights(path, args, torch.float64, torch.device("cpu")), max_len=512)
    model.allocate(2)
    ids = torch.randint(0, 16, (2, 100))
    pos = torch.arange(100).repeat(2, 1)
    assert model.span_for(100) == 128 and model.span_for(129) == 256 and model.span_for(10_000) == 512
    full = model.forward(ids, pos, pos)
    assert torch.equal(model.forward(ids, pos, pos, span=model.span_for(100)), full)


def test_a_used_cache_changes_no_logit(models: dict[str, Path]) -> None:
    """A request scored after a longer one (whose keys and values still fill the slots past
    this request's positions) gets the fresh cache's logits bit for bit: stale slots are masked."""
    from flashspec_fast.options import FastOptions
    from flashspec_fast.target import make_target

    def target() -> Any:
        return make_target(FastOptions(model=str(models["target"]), dtype="float32", max_len=512, chat_template=False))

    def score(t: Any, prompt: list[int], drafts: list[int]) -> torch.Tensor:
        tokens = torch.tensor([prompt])
        t.prefill(tokens, [len(prompt)])
        return t.score(tokens, [len(prompt)], torch.tensor([drafts]))

    prompt, drafts = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15]
    used = target()
    score(used, [(i * 7) % 16 for i in range(240)], [5, 6, 7, 8, 9, 10, 11])  # fills slots up to 247
    assert torch.equal(score(used, prompt, drafts), score(target(), prompt, drafts))


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="Inductor on CPU needs a C compiler")
def test_fused_ops_match_eager(models: dict[str, Path]) -> None:
    """fuse = true (Inductor-compiled norm, rotary + cache writes, SwiGLU), run here on
    CPU: same logits and same cache contents as the eager pieces, ragged rows included.
    RMSNorm computes in float32 as transformers' does (even for a float64 model), so the
    two differ by float32 rounding of a reordered reduction; a wrong slot, rotation or
    head would differ by O(1)."""
    path = models["target"]
    args = ModelArgs.from_hf(read_config(path))
    weights = load_weights(path, args, torch.float64, torch.device("cpu"))
    eager, fused = (Transformer(args, weights, max_len=64, fuse=f) for f in (False, True))
    for m in (eager, fused):
        m.allocate(2)
    ids = torch.randint(0, 16, (2, 6))
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [63, 63, 0, 1, 2, 3]])  # row 1: two padding writes to the scratch slot
    for step in range(2):  # the second call reads what the first one cached
        p = pos + 6 * step
        w = torch.where(pos == 63, 63, p)
        p = torch.where(pos == 63, 0, p)
        torch.testing.assert_close(fused.forward(ids, p, w, span=64), eager.forward(ids, p, w, span=64), rtol=1e-5, atol=1e-5)
    live = slice(0, 63)  # the scratch slot holds whichever padding write came last
    torch.testing.assert_close(fused.k_cache[:, :, live], eager.k_cache[:, :, live], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.v_cache[:, :, live], eager.v_cache[:, :, live], rtol=1e-5, atol=1e-5)
    assert (fused.k_cache[:, :, live] != 0).sum() == (eager.k_cache[:, :, live] != 0).sum()  # same slots written


def test_fused_ops_take_more_input_layouts_than_dynamos_default_limit() -> None:
    """The drafts' prewarm meets a ninth compiled variant of the fused RMSNorm on the H200,
    past dynamo's default limit of 8 per function, which fails a fullgraph compile; these
    seventeen layouts (2-D and 3-D, sizes of 1, strided views) need nine variants here too,
    so this fails under dynamo's default limit."""
    ops = Ops(fuse=True)
    gen = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    layouts = [r(1, 8), r(3, 8), r(1, 1, 8), r(2, 1, 8), r(1, 3, 8), r(2, 3, 8), r(3, 3, 8), r(4, 10, 8)[:, :3],
               r(2, 5, 8)[:, 1:4], r(8, 8)[2:5], r(1, 6, 8)[:, 2:3], r(2, 2, 8), r(4, 8)[::2], r(3, 2, 8),
               r(2, 6, 8)[:, ::2], r(16, 8)[3:4], r(3, 1, 8)]
    weight = torch.ones(8, dtype=torch.float64)
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT
    for x in layouts:  # float32 inside, as transformers' RMSNorm
        torch.testing.assert_close(ops.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6), rtol=1e-5, atol=1e-5)


def test_greedy_across_span_buckets_equals_hf(models: dict[str, Path]) -> None:
    """Rows that grow from the 128-slot span into the 256-slot one, with every arm."""
    cfg = _config(models, "fast", "float64", "ucb1")
    for table in (cfg["target"], *cfg["arm"]):
        if table["use"] == "fast":
            table["max_len"] = 512
    spec = build_pipeline(cfg)
    hf = _target_only(models, "hf", "float64")
    batch = [PROMPTS[0] * 16, PROMPTS[1] * 60]  # 112 and 120 tokens
    got = spec.generate(batch, max_new_tokens=40, temperature=0.0).token_ids
    assert got == hf.generate(batch, max_new_tokens=40, temperature=0.0).token_ids


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("selector", ["fixed", "ucb1"])
def test_greedy_speculative_equals_target_only_and_hf(models: dict[str, Path], dtype: str, selector: str) -> None:
    """A ragged batch of 3 with every arm (ucb1 switches arms mid-sequence): same tokens everywhere."""
    spec = build_pipeline(_config(models, "fast", dtype, selector))
    plain = _target_only(models, "fast", dtype)
    hf = _target_only(models, "hf", dtype)
    played = set()
    for batch in ([PROMPTS[0]], PROMPTS):
        got = spec.generate(batch, max_new_tokens=24, temperature=0.0)
        want = plain.generate(batch, max_new_tokens=24, temperature=0.0).token_ids
        assert got.token_ids == want
        assert hf.generate(batch, max_new_tokens=24, temperature=0.0).token_ids == want
        played |= {r.arm_name for r in got.steps}
    if selector == "ucb1":  # its opening sweep (each arm twice when drawn ahead) spans both calls
        assert played == {"close", "far", "lookup", "none"}


def test_fast_spec_equals_hf_spec_sampled(models: dict[str, Path]) -> None:
    """Same seed, same noise: sampled output of fast and hf back-ends agree (float64, CPU).

    On CPU one ``[gamma, B, V]`` exponential draw equals gamma ``[B, V]`` draws in sequence;
    CUDA's Philox offsets differ per call, so there the two back-ends sample differently."""
    arms = lambda b: [{"use": b, "model": str(models["close"]), "gamma": 3, "dtype": "float64", "name": "c",  # noqa: E731
                       "device": "cpu", **({"max_len": 128} if b == "fast" else {})}]
    fast = build_pipeline(_config(models, "fast", "float64", arms=arms("fast")) | {"target": _cpu(models, "fast")})
    hf = build_pipeline(_config(models, "hf", "float64", arms=arms("hf")) | {"target": _cpu(models, "hf")})
    a = fast.generate(PROMPTS, max_new_tokens=16, temperature=0.8, seed=3).token_ids
    b = hf.generate(PROMPTS, max_new_tokens=16, temperature=0.8, seed=3).token_ids
    assert a == b


def test_rollback_is_position_only(models: dict[str, Path]) -> None:
    """After a rejection the draft's bookkeeping keeps the accepted prefix; the cache is untouched."""
    pipe = build_pipeline(_config(models, "fast", "float64", arms=[
        {"use": "fast", "model": str(models["far"]), "gamma": 4, "dtype": "float64", "name": "far", "max_len": 128}
    ]))
    draft = pipe.arms[0].provider
    result = pipe.generate([PROMPTS[0]], max_new_tokens=20, temperature=0.0)
    rejected = [r for r in result.steps if r.accepted[0] < 4]
    assert rejected, "the far draft should be rejected at least once"
    last = result.steps[-1]
    assert draft.seen == [len(PROMPTS[0]) + sum(r.emitted for r in result.steps[:-1]) + min(last.accepted[0], 3)]


def test_gamma_zero_arm_runs_on_fast_path(models: dict[str, Path]) -> None:
    pipe = _target_only(models, "fast", "float64")
    result = pipe.generate(PROMPTS, max_new_tokens=8, temperature=0.0)
    assert all(r.gamma == 0 and set(r.accepted) == {0} for r in result.steps)
    assert all(len(t) == 8 or t[-1] == 15 for t in result.token_ids)


def test_max_len_too_small_is_a_clear_error(models: dict[str, Path]) -> None:
    cfg = _config(models, "fast", "float64", arms=[{"use": "none", "name": "none"}])
    cfg["target"]["max_len"] = 12
    # refused before the prefill, naming both lengths (the context is max_len less one scratch slot)
    with pytest.raises(ValueError, match=r"^a prompt of \d+ tokens plus max_new_tokens = 8 plus 0 draft slots exceeds "
                                         r"the target's context of 11 tokens$"):
        build_pipeline(cfg).generate([PROMPTS[2]], max_new_tokens=8)


def test_a_draft_with_less_context_than_its_target_refuses_a_long_prompt_before_the_prefill(
        models: dict[str, Path]) -> None:
    """A fast draft's own cache holds ``max_len - 1`` tokens: a request its target holds but the
    draft does not is refused before the prefill, naming the draft, not at the first step; the
    pipeline's context (the server's) is the least of them."""
    arms = [{"use": "fast", "model": str(models["close"]), "gamma": 3, "dtype": "float64", "name": "close",
             "max_len": 16}, {"use": "fast", "model": str(models["far"]), "gamma": 2, "dtype": "float64",
                              "name": "tree", "max_len": 32, "tree_depth": 3, "tree_expand": 4}]
    pipe = build_pipeline(_config(models, "fast", "float64", arms=arms))
    assert pipe.max_context == 15 and pipe.policy.arms[1].provider.max_context == 32 - 1 - (2 * 4 - 1)
    with pytest.raises(ValueError, match=r"^a prompt of 11 tokens plus max_new_tokens = 8 plus 3 draft slots exceeds "
                                         r"the context of arm 'close''s draft of 15 tokens$"):
        pipe.generate([PROMPTS[2]], max_new_tokens=8)
    assert len(pipe.generate([PROMPTS[2]], max_new_tokens=1).token_ids[0]) == 1


def test_unknown_key_fails_at_load(models: dict[str, Path]) -> None:
    cfg = _config(models, "fast", "float64")
    cfg["target"]["compiled"] = True
    with pytest.raises(ConfigError, match="compiled"):
        build_pipeline(cfg)


def test_nf4_decodes_as_the_model_with_its_dequantized_weights(models: dict[str, Path]) -> None:
    """quantization = "nf4" (no bitsandbytes needed): the greedy tokens of the model whose
    linear weights were replaced by their NF4 round trip in float32."""
    from flashspec_kernels.nf4_format import dequantize, quantize

    cfg = _config(models, "fast", "float32", arms=[{"use": "none", "name": "none"}])
    plain = build_pipeline(cfg)
    for layer in plain.target.model.w.layers:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            w = getattr(layer, name)
            w.copy_(dequantize(*quantize(w), w.dtype, w.shape[1]))
    cfg["target"]["quantization"] = "nf4"
    nf4 = build_pipeline(cfg)
    assert type(nf4.target.model.w.layers[0].wqkv).__name__ == "NF4Linear"
    want = plain.generate(PROMPTS, max_new_tokens=6).token_ids
    assert nf4.generate(PROMPTS, max_new_tokens=6).token_ids == want


def test_nf4_kernel_path_matches_the_dequantized_path() -> None:
    """The fused kernel (Triton's interpreter here; on CUDA by default) and the dequantized
    matrix give the same layer output for a decoding step's rows."""
    pytest.importorskip("triton")
    from flashspec_fast.nf4 import NF4Linear

    g = torch.Generator().manual_seed(0)
    w, b, x = torch.randn((40, 96), generator=g) * 0.05, torch.randn(40, generator=g), torch.randn((2, 3, 96), generator=g)
    fused, plain = NF4Linear(w, kernel=True), NF4Linear(w, kernel=False)
    assert not NF4Linear(w).kernel  # a CPU weight: the dequantized path by default
    torch.testing.assert_close(fused(x, b), plain(x, b), rtol=1e-5, atol=1e-6)


def test_synthetic_verifier_accepts_at_the_given_rate(models: dict[str, Path]) -> None:
    cfg = _config(models, "fast", "float32", arms=[
        {"use": "fast", "model": str(models["far"]), "gamma": 4, "dtype": "float32", "name": "far", "max_len": 128}
    ])
    cfg["verifier"] = {"use": "synthetic", "acceptance": 1.0}
    cfg["target"]["max_len"] = 128
    result = build_pipeline(cfg).generate([PROMPTS[1]], max_new_tokens=25)
    assert all(r.accepted == (4,) for r in result.steps)


@pytest.mark.parametrize("behind", [0, 5, 14, 30])
def test_draft_catches_up_inside_its_first_forward(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                    behind: int) -> None:
    """A draft whose rows fell behind (another arm ran) drafts what a draft that catches up in a
    forward of its own drafts, in one forward fewer while it is at most FUSED_CATCH_UP behind."""
    from flashspec_core import SamplingParams
    from flashspec_core.contracts import DraftContext
    from flashspec_fast import draft as fd
    from flashspec_fast.options import FastOptions
    from flashspec_fast.target import bucket

    opts = FastOptions(model=str(models["close"]), dtype="float64", max_len=128, chat_template=False)
    context = DraftContext(target=None, vocab=16, device=torch.device("cpu"))
    rows = [[1, 2, 3, 4, 5, 1, 2, 3, 9, 4], [3, 4, 5, 6, 7, 8]]
    grown = [r + [(7 * i + len(r)) % 16 for i in range(behind)] for r in rows]  # tokens another arm emitted
    lengths = [len(r) for r in grown]
    tokens = torch.tensor([r + [0] * (max(lengths) - len(r)) for r in grown])
    sampling = SamplingParams(temperature=1.0)

    def propose(fused: int) -> tuple[Any, int]:
        monkeypatch.setattr(fd, "FUSED_CATCH_UP", fused)
        d = fd.make_draft(opts, context)
        first = torch.tensor([rows[0], rows[1] + [0] * (len(rows[0]) - len(rows[1]))])
        d.propose(first, [len(r) for r in rows], 3, sampling, torch.Generator().manual_seed(1))
        d.rollback([0, 0])  # the draft has seen each row up to its last token
        calls = []
        forward = d.model.forward
        monkeypatch.setattr(d.model, "forward", lambda *a, **k: calls.append(a[0].shape) or forward(*a, **k))
        out = d.propose(tokens, lengths, 3, sampling, torch.Generator().manual_seed(2))
        return out, len(calls)

    limit = fd.FUSED_CATCH_UP
    fused, n_fused = propose(limit)
    apart, n_apart = propose(0)
    assert torch.equal(fused.tokens, apart.tokens)
    torch.testing.assert_close(fused.probs, apart.probs, rtol=1e-9, atol=1e-12)
    # the first forward feeds `behind` tokens (at least 2); more than `limit` need a catch-up forward of their own
    assert n_apart == 3 + int(behind > 2) and n_fused == 3 + int(bucket(behind, least=2) > limit)


def test_a_joined_row_catches_up_in_a_forward_of_its_own_rows(models: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A row re-seated in a running batch (reset_rows) with a prompt far past FUSED_CATCH_UP
    catches up in a rows-forward over that row alone while the others draft in the fused first
    forward, and the draft is what a fresh draft of the whole batch (one ragged catch-up over
    every row) proposes, to float64 rounding."""
    from flashspec_core import SamplingParams
    from flashspec_core.contracts import DraftContext
    from flashspec_fast import draft as fd
    from flashspec_fast.options import FastOptions

    opts = FastOptions(model=str(models["close"]), dtype="float64", max_len=128, chat_template=False)
    context = DraftContext(target=None, vocab=16, device=torch.device("cpu"))
    g = torch.Generator().manual_seed(5)
    lengths = [10, 6, 31, 9]
    tokens = torch.zeros((4, 32), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.randint(0, 16, (n,), generator=g)
    before = tokens.clone()
    before[2, :5] = torch.tensor([3, 1, 4, 1, 5])  # the request row 2 held before the join
    sampling = SamplingParams(temperature=1.0)

    joined = fd.make_draft(opts, context)
    joined.propose(before, [10, 6, 5, 9], 3, sampling, torch.Generator().manual_seed(1))
    joined.rollback([0, 0, 0, 0])
    joined.reset_rows([2])
    fed_rows = []
    forward = joined.model.forward
    monkeypatch.setattr(joined.model, "forward",
                        lambda *a, **k: fed_rows.append(k.get("rows") is not None) or forward(*a, **k))
    got = joined.propose(tokens, lengths, 3, sampling, torch.Generator().manual_seed(2))
    fresh = fd.make_draft(opts, context).propose(tokens, lengths, 3, sampling, torch.Generator().manual_seed(2))
    assert torch.equal(got.tokens, fresh.tokens)
    torch.testing.assert_close(got.probs, fresh.probs, rtol=1e-9, atol=1e-12)
    assert fed_rows == [True, False, False, False]  # row 2's rows-forward, then the fused draft loop



def test_decode_kernel_forward_matches_sdpa(models: dict[str, Path]) -> None:
    """attention = "triton" (the decode kernel, in the interpreter here) against SDPA, same
    weights and cache: a 20-token prefill (SDPA in both), then decode widths 1, 4 and 9 and a
    ragged row with padding, to float32 rounding."""
    path = models["target"]
    args = ModelArgs.from_hf(read_config(path))
    weights = load_weights(path, args, torch.float32, torch.device("cpu"))
    sdpa, kern = (Transformer(args, weights, max_len=256, attention=a) for a in ("sdpa", "triton"))
    assert kern.decode_kernel and not sdpa.decode_kernel
    for m in (sdpa, kern):
        m.allocate(2)
    ids = torch.randint(0, 16, (2, 20))
    pos = torch.arange(20).repeat(2, 1)
    torch.testing.assert_close(kern.forward(ids, pos, pos, span=128), sdpa.forward(ids, pos, pos, span=128))
    at = 20
    for width in (1, 4, 9):
        ids = torch.randint(0, 16, (2, width))
        pos = torch.arange(at, at + width).repeat(2, 1)
        write = pos.clone()
        if width == 4:  # row 1 catches up two tokens: two padding slots (position 0, the scratch slot)
            pos[1, :2], write[1, :2] = 0, 255
        got, want = kern.forward(ids, pos, write, span=128), sdpa.forward(ids, pos, write, span=128)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        at += width


def test_greedy_with_the_decode_kernel_equals_hf(models: dict[str, Path]) -> None:
    """Every fast model on the decode kernel (float32): speculative greedy tokens are HF's."""
    cfg = _config(models, "fast", "float32", "ucb1")
    for table in (cfg["target"], *cfg["arm"]):
        if table["use"] == "fast":
            table["attention"] = "triton"
    spec = build_pipeline(cfg)
    assert spec.target.model.decode_kernel
    hf = _target_only(models, "hf", "float32")
    got = spec.generate(PROMPTS, max_new_tokens=24, temperature=0.0).token_ids
    assert got == hf.generate(PROMPTS, max_new_tokens=24, temperature=0.0).token_ids


@pytest.mark.parametrize(("dtype", "interpret", "match"), [
    ("float64", "1", "head dim of at most 256 and float16/bfloat16/float32"),
    ("float32", "0", "needs TRITON_INTERPRET=1"),
])
def test_decode_kernel_refusals_are_clear(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, dtype: str,
                                          interpret: str, match: str) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    cfg = _config(models, "fast", dtype, arms=[{"use": "none", "name": "none"}])
    cfg["target"]["attention"] = "triton"
    with pytest.raises((ConfigError, ValueError), match=match):
        build_pipeline(cfg)


def test_draft_prewarm_asks_for_every_graph_key_a_step_can_need(models: dict[str, Path]) -> None:
    """After prewarm, no (span, width) of the drafting loop or of the separate catch-up that any
    length and catch-up distance can reach is new: on the GPU none is captured while serving."""
    from flashspec_core import SamplingParams
    from flashspec_core.contracts import DraftContext
    from flashspec_fast import draft as fd
    from flashspec_fast.options import FastOptions

    opts = FastOptions(model=str(models["close"]), dtype="float32", max_len=300, chat_template=False)
    d = fd.make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    sampling, gamma = SamplingParams(temperature=0.0), 3
    assert d.prewarm(1, gamma, sampling) == 0 == len(d.graphs.keys)  # no CUDA graphs here: nothing to capture
    assert d.prewarm(1, gamma, sampling, off_gpu=True) == len(d.graphs.keys) > 0
    warmed = set(d.graphs.keys)
    gen = torch.Generator().manual_seed(0)
    top = d.model.scratch
    for length in (2, 3, 17, 40, 64, 126, 127, 128, 129, 200, 255, 256, top - gamma - 1):
        tokens = torch.randint(0, 16, (1, length + gamma + 1), generator=gen)
        for behind in sorted({0, 1, 2, 5, 9, 16, 17, 33, 70, length - 2, length}):
            d.reset()
            d.seen = [max(length - behind, 0)]
            d.propose(tokens, [length], gamma, sampling, gen)
    assert d.graphs.keys <= warmed, sorted(map(str, d.graphs.keys - warmed))
    assert d.seen == [] or d.seen  # usable afterwards
    with pytest.raises(ValueError, match="must be >= 1"):
        d.prewarm(1, 0, sampling, off_gpu=True)
    assert d.prewarm(2, 2, SamplingParams(temperature=0.7), off_gpu=True) > 0  # sampled: noise drawn on the device


def test_draft_prewarm_covers_the_catch_up_of_rows_that_joined(models: dict[str, Path]) -> None:
    """At four rows, prewarm asks for the rows-forwards of one and two rows far behind at every
    length (three pad to a run of four, the whole batch, and catch up in the ragged forward):
    a join's catch-up captures nothing new."""
    from flashspec_core import SamplingParams
    from flashspec_core.contracts import DraftContext
    from flashspec_fast import draft as fd
    from flashspec_fast.options import FastOptions

    opts = FastOptions(model=str(models["close"]), dtype="float32", max_len=300, chat_template=False)
    d = fd.make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    sampling, gamma, batch = SamplingParams(temperature=0.0), 3, 4
    assert d.prewarm(batch, gamma, sampling, off_gpu=True) == len(d.graphs.keys) > 0
    warmed = set(d.graphs.keys)
    d.graphs.keys.clear()  # from here: the keys the steps ask for
    gen = torch.Generator().manual_seed(0)
    for length in (20, 40, 64, 126, 129, 200, d.model.scratch - gamma - 1):
        tokens = torch.randint(0, 16, (batch, length + gamma + 1), generator=gen)
        for far in ([2], [0, 3], [0, 1, 3]):
            d.reset()
            d.seen = [0 if b in far else length - 1 for b in range(batch)]
            d.propose(tokens, [length] * batch, gamma, sampling, gen)
    assert d.graphs.keys <= warmed, sorted(map(str, d.graphs.keys - warmed))
    assert {k[1] for k in d.graphs.keys if k[0] == "rows"} == {1, 2}
    assert any(k[0] == "ragged" and k[1] == batch for k in d.graphs.keys)


def test_draft_prewarm_bounded_to_longest_covers_those_steps_and_no_longer_ones(models: dict[str, Path]) -> None:
    """``longest`` bounds the prewarm (a bounded warm-up stays short): every step of rows up to
    ``longest`` tokens is covered, a longer row asks for a key it left out, and it asks for fewer keys."""
    from flashspec_core import SamplingParams
    from flashspec_core.contracts import DraftContext
    from flashspec_fast import draft as fd
    from flashspec_fast.options import FastOptions

    opts = FastOptions(model=str(models["close"]), dtype="float32", max_len=600, chat_template=False)
    sampling, gamma, longest = SamplingParams(temperature=0.0), 3, 200

    def draft() -> fd.FastDraft:
        return fd.make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))

    bounded, full = draft(), draft()
    assert 0 < bounded.prewarm(1, gamma, sampling, off_gpu=True, longest=longest) < full.prewarm(
        1, gamma, sampling, off_gpu=True)
    warmed = set(bounded.graphs.keys)
    assert warmed < full.graphs.keys
    gen = torch.Generator().manual_seed(0)
    for length in (2, 17, 64, 125, 129, longest - gamma):
        tokens = torch.randint(0, 16, (1, length + gamma + 1), generator=gen)
        for behind in sorted({0, 1, 5, 16, 33, length - 2, length}):
            bounded.reset()
            bounded.seen = [max(length - behind, 0)]
            bounded.propose(tokens, [length], gamma, sampling, gen)
    assert bounded.graphs.keys <= warmed, sorted(map(str, bounded.graphs.keys - warmed))
    bounded.reset()
    bounded.propose(torch.randint(0, 16, (1, 400), generator=gen), [390], gamma, sampling, gen)
    assert bounded.graphs.keys - warmed  # past the bound: a span the bounded prewarm left out
    with pytest.raises(ValueError, match="longest 0"):
        bounded.prewarm(1, gamma, sampling, off_gpu=True, longest=0)


@pytest.mark.parametrize("gamma", [1, 2])
def test_small_gamma_fast_draft_equals_target_only(models: dict[str, Path], gamma: int) -> None:
    """gamma 1 and 2 (no or one one-token forward after the draft loop's first forward,
    the arms that pay where a draft costs half a target step): greedy tokens as target-only,
    and sampled tokens as the hf back-end's with the same seed."""
    arm = lambda b: [{"use": b, "model": str(models["close"]), "gamma": gamma, "dtype": "float64",  # noqa: E731
                      "name": f"close-g{gamma}", "device": "cpu", **({"max_len": 128} if b == "fast" else {})}]
    fast = build_pipeline(_config(models, "fast", "float64", arms=arm("fast")) | {"target": _cpu(models, "fast")})
    got = fast.generate(PROMPTS, max_new_tokens=20, temperature=0.0)
    assert {r.gamma for r in got.steps} == {gamma} and max(max(r.accepted) for r in got.steps) == gamma
    assert got.token_ids == _target_only(models, "fast", "float64").generate(PROMPTS, max_new_tokens=20).token_ids
    hf = build_pipeline(_config(models, "hf", "float64", arms=arm("hf")) | {"target": _cpu(models, "hf")})
    sampled = [p.generate(PROMPTS, max_new_tokens=16, temperature=0.8, seed=5).token_ids for p in (fast, hf)]
    assert sampled[0] == sampled[1]


def test_arms_with_one_draft_table_share_its_provider(models: dict[str, Path]) -> None:
    """The same draft at gamma 1, 2 and 3 is one model and one cache: a switch between the
    gammas (ucb1 plays each) leaves nothing to catch up, and the tokens are target-only's."""
    table = {"use": "fast", "model": str(models["close"]), "dtype": "float64", "max_len": 128}
    arms = [*({**table, "gamma": g, "name": f"close-g{g}"} for g in (1, 2, 3)),
            {**table, "model": str(models["far"]), "gamma": 2, "name": "far-g2"}, {"use": "none", "name": "none"}]
    spec = build_pipeline(_config(models, "fast", "float64", "ucb1", arms=arms))
    providers = [a.provider for a in spec.arms]
    assert providers[0] is providers[1] is providers[2] and providers[3] is not providers[0]
    got = spec.generate(PROMPTS, max_new_tokens=30, temperature=0.0)
    assert {r.arm_name for r in got.steps} >= {"close-g1", "close-g2", "close-g3"}
    assert got.token_ids == _target_only(models, "fast", "float64").generate(PROMPTS, max_new_tokens=30).token_ids


_WITHOUT_TRITON = """
import importlib.abc, json, sys


class NoTriton(importlib.abc.MetaPathFinder):  # as on a machine where triton is not installed
    def find_spec(self, name, path, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTriton())
from flashspec_core.build import build_pipeline

pipeline = build_pipeline(json.loads(sys.argv[1]))
out = pipeline.generate([[1, 2, 3, 4]], max_new_tokens=6)
assert "triton" not in sys.modules
print(len(out.token_ids[0]))
"""


def test_fast_backend_runs_without_triton(models: dict[str, Path], tmp_path: Path) -> None:
    """triton is an extra: without it the fast back-end still builds and decodes (SDPA and
    torch's ops instead of the Triton kernels), and every built-in plugin still imports.
    Before this, importing the fast plugin imported triton, so `flashspec generate` failed on
    a machine set up as README.md says."""
    import json
    import os
    import subprocess
    import sys

    cfg = _config(models, "fast", "float32")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_TRITON, json.dumps(cfg)], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) >= 6


def test_attention_triton_without_triton_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashspec_fast import model

    monkeypatch.setattr(model, "triton_kernels", lambda: None)
    assert model.decode_kernel("auto", 64, torch.float32, torch.device("cpu")) is False
    with pytest.raises(ValueError, match=r"needs the triton package: pip install 'flashspec-engine\[triton\]'"):
        model.decode_kernel("triton", 64, torch.float32, torch.device("cpu"))
