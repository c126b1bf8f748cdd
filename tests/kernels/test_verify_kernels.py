"""Triton verify kernels against the plain-torch reference (flashspec_core.sampling), and the
``triton`` verifier plugin that wraps them (flashspec_triton).

Without a GPU these run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1), where the launcher tiles many rows per program (ROWS) and trims
the pads; test_rows_per_program and test_gpu_launch_shapes pin ROWS, and the GPU's
ROWS = 1 launch, so both paths of the same kernels are checked here. Small block sizes
make V=1271 span several blocks and slices.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from flashspec_core.contracts import SamplingParams  # noqa: E402
from flashspec_core.sampling import Noise  # noqa: E402
from flashspec_kernels import verify as ops  # noqa: E402
from flashspec_triton.plugin import TritonVerifier, TritonVerifierConfig  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# the interpreter evaluates log(0) (q = 0, u = 0) with numpy, which warns; -inf is intended
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of 256 logits: V=1271 spans 5 blocks, so slices and block edges are exercised."""
    monkeypatch.setattr(ops, "PASS_CONFIG", {2: (256, 4), 4: (256, 4)})
    monkeypatch.setattr(ops, "ARGMAX_CONFIG", {2: (256, 4), 4: (256, 4)})
    monkeypatch.setattr(ops, "RACE_BLOCK_V", 256)


def inputs(b: int, gamma: int, v: int, dtype: torch.dtype, seed: int, with_q: bool = False):
    """Logits, drafts sampled from a q near p (so acceptance varies), q with exact zeros."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    logits = torch.randn((b, gamma + 1, v), generator=g, device=DEV) * 3
    q = torch.softmax(logits[:, :gamma] + torch.randn((b, gamma, v), generator=g, device=DEV), dim=-1)
    q = torch.where(torch.rand(q.shape, generator=g, device=DEV) < 0.2, 0.0, q)  # zeros, drafted ones too
    q = q / q.sum(-1, keepdim=True)
    tokens = torch.multinomial(q.reshape(-1, v) + 1e-6, 1, generator=g).reshape(b, gamma)
    return logits.to(dtype), tokens, (q if with_q else None)


def assert_same(got, want) -> None:
    assert torch.equal(got.num_accepted, want.num_accepted), (got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens), (got.tokens, want.tokens)


def check_exact(logits, tokens, q, sampling, seed: int, programs: int | None = None) -> None:
    b, gamma = tokens.shape
    noise = Noise.draw(b, gamma, logits.shape[-1], torch.Generator(device=DEV).manual_seed(seed), DEV)
    got = ops.verify_triton(logits, tokens, q, sampling, noise=noise, programs=programs)
    assert_same(got, ops.verify_ref(logits, tokens, q, sampling, noise))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b", [1, 3, 8])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_exact_matches_reference_odd_vocab(small_blocks, b: int, gamma: int, dtype: torch.dtype) -> None:
    logits, tokens, q = inputs(b, gamma, 1271, dtype, seed=b * 10 + gamma, with_q=True)
    check_exact(logits, tokens, None, SamplingParams(), seed=1, programs=3 * b * (gamma + 1) if b < 8 else None)
    check_exact(logits, tokens, q, SamplingParams(temperature=0.7), seed=2, programs=2 * b)


@pytest.mark.parametrize(
    ("b", "gamma", "dtype"),
    [
        (1, 1, torch.float32),
        (3, 4, torch.bfloat16),
        pytest.param(8, 7, torch.bfloat16, marks=pytest.mark.slow),
        pytest.param(8, 7, torch.float32, marks=pytest.mark.slow),
    ],
)
def test_exact_matches_reference_real_vocab(b: int, gamma: int, dtype: torch.dtype) -> None:
    logits, tokens, _ = inputs(b, gamma, 32000, dtype, seed=b + gamma)
    check_exact(logits, tokens, None, SamplingParams(), seed=3)


def test_exact_with_draft_probs_real_vocab() -> None:
    logits, tokens, q = inputs(2, 3, 32000, torch.bfloat16, seed=5, with_q=True)
    check_exact(logits, tokens, q, SamplingParams(), seed=4, programs=16)


def test_exact_with_top_k_top_p(small_blocks) -> None:
    logits, tokens, q = inputs(3, 4, 1271, torch.bfloat16, seed=6, with_q=True)
    check_exact(logits, tokens, None, SamplingParams(temperature=0.8, top_k=50, top_p=0.9), seed=5, programs=40)
    check_exact(logits, tokens, q, SamplingParams(top_p=0.5), seed=6)


def test_exact_with_minus_inf_logits(small_blocks) -> None:
    b, gamma, v = 4, 4, 1271
    logits, tokens, q = inputs(b, gamma, v, torch.float32, seed=7, with_q=True)
    g = torch.Generator(device=DEV).manual_seed(8)
    logits = logits.masked_fill(torch.rand(logits.shape, generator=g, device=DEV) < 0.3, float("-inf"))
    logits[:, :, 256:768] = float("-inf")  # whole blocks of -inf
    logits[0, 0, tokens[0, 0]] = float("-inf")  # a drafted token with p = 0 is always rejected
    check_exact(logits, tokens, None, SamplingParams(), seed=9, programs=60)
    check_exact(logits, tokens, q, SamplingParams(temperature=1.5), seed=10)


def test_certain_acceptance_and_bonus(small_blocks) -> None:
    """Drafts equal to a near one-hot target are all accepted; the bonus comes from p."""
    b, gamma, v = 3, 4, 1271
    logits = torch.full((b, gamma + 1, v), -30.0, device=DEV)
    tokens = torch.randint(0, v, (b, gamma), generator=torch.Generator(device=DEV).manual_seed(1), device=DEV)
    logits[:, :gamma].scatter_(-1, tokens[..., None], 30.0)
    logits[:, gamma] = torch.randn((b, v), device=DEV)
    noise = Noise.draw(b, gamma, v, torch.Generator(device=DEV).manual_seed(2), DEV)
    got = ops.verify_triton(logits, tokens, None, SamplingParams(), noise=noise)
    assert got.num_accepted.tolist() == [gamma] * b
    assert_same(got, ops.verify_ref(logits, tokens, None, SamplingParams(), noise))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_matches_reference_with_ties(small_blocks, dtype: torch.dtype) -> None:
    b, gamma, v = 8, 4, 1271
    g = torch.Generator(device=DEV).manual_seed(11)
    logits = torch.randint(0, 4, (b, gamma + 1, v), generator=g, device=DEV).to(dtype)  # many tied maxima
    logits[1, :, 300:] = float("-inf")
    best = torch.argmax(logits.float(), dim=-1)
    tokens = torch.where(torch.rand((b, gamma), generator=g, device=DEV) < 0.8, best[:, :gamma], 0)
    got = ops.verify_triton(logits, tokens, None, SamplingParams(temperature=0), programs=3 * b * (gamma + 1))
    assert_same(got, ops.verify_ref(logits, tokens, None, SamplingParams(temperature=0)))
    top_p = SamplingParams(temperature=0, top_p=0.3)
    assert_same(ops.verify_triton(logits, tokens, None, top_p), ops.verify_ref(logits, tokens, None, top_p))


def test_greedy_real_vocab() -> None:
    logits, tokens, _ = inputs(3, 4, 32000, torch.bfloat16, seed=12)
    tokens[:, :2] = torch.argmax(logits[:, :2].float(), dim=-1)
    greedy = SamplingParams(temperature=0)
    assert_same(ops.verify_triton(logits, tokens, None, greedy), ops.verify_ref(logits, tokens, None, greedy))


def test_non_contiguous_inputs(small_blocks) -> None:
    logits, tokens, q = inputs(3, 4, 1271, torch.float32, seed=13, with_q=True)
    logits_t = logits.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    tokens_t = tokens.t().contiguous().t()
    assert not logits_t.is_contiguous() and not tokens_t.is_contiguous()
    check_exact(logits_t, tokens_t, q, SamplingParams(), seed=14)


@pytest.mark.parametrize(
    ("temperature", "dtype", "gpu_launch"),
    [(1.0, torch.float32, False), (0.7, torch.float32, False), (0.7, torch.bfloat16, True)],
)
def test_lse_and_log_p_within_twice_torch_fp32_error(
    monkeypatch: pytest.MonkeyPatch, temperature: float, dtype: torch.dtype, gpu_launch: bool
) -> None:
    """The kernels' lse and log p against float64, within twice torch's float32 error on the
    same inputs; the bf16 case runs the GPU's launch (PASS_TILE's tile form of the pass)."""
    b, gamma, v = 4, 4, 32000
    x = torch.randn((b, gamma + 1, v), generator=torch.Generator(device=DEV).manual_seed(15), device=DEV) * 5
    if gpu_launch:
        assert ops.PASS_TILE[dtype.itemsize] > 0
        monkeypatch.setattr(ops, "_interpreting", lambda device: False)
    x = x.to(dtype)
    tokens = torch.randint(0, v, (b, gamma), device=DEV)
    lse, log_p = ops.log_probs_at_draft(x, tokens, SamplingParams(temperature=temperature))
    ref = torch.log_softmax(x.double() / temperature, dim=-1)
    ref_lse = torch.logsumexp(x.double() / temperature, dim=-1)
    ref_lp = ref[:, :gamma].gather(-1, tokens[..., None]).squeeze(-1)
    x32 = x.float()
    t32 = torch.log_softmax(x32 / temperature, dim=-1)
    torch_lse_err = (torch.logsumexp(x32 / temperature, dim=-1).double() - ref_lse).abs().max()
    torch_lp_err = (t32[:, :gamma].gather(-1, tokens[..., None]).squeeze(-1).double() - ref_lp).abs().max()
    ulp = torch.finfo(torch.float32).eps * ref_lse.abs().max()  # the output's own rounding
    assert (lse.double() - ref_lse).abs().max() <= 2 * torch_lse_err + ulp
    assert (log_p.double() - ref_lp).abs().max() <= 2 * torch_lp_err + ulp


DRAWS = ["one_stage", "two_stage"]  # philox mode's two draws of the recovered / bonus token


def first_token_counts(rows: int, probs: list[float], seed: int, draw: str = "auto") -> torch.Tensor:
    v = len(probs)
    logits = torch.log(torch.tensor(probs, device=DEV)).expand(rows, 2, v).contiguous()
    tokens = torch.zeros((rows, 1), dtype=torch.int64, device=DEV)  # the draft always proposes token 0
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(seed), DEV)
    out = ops.verify_triton(logits, tokens, None, SamplingParams(), state=state, draw=draw)
    return torch.bincount(out.tokens[:, 0], minlength=v).double()


def chi_square(counts: torch.Tensor, probs: list[float]) -> float:
    expected = counts.sum() * torch.tensor(probs, dtype=torch.float64, device=counts.device)
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("draw", DRAWS)
def test_philox_first_token_follows_p(draw: str) -> None:
    """Accepted or recovered, the first emitted token is distributed as p (coarse check)."""
    probs = [0.4, 0.3, 0.2, 0.1]
    assert chi_square(first_token_counts(48, probs, seed=1, draw=draw), probs) < 21.1  # p = 1e-4, 3 dof


def test_two_stage_only_at_large_batch_and_vocab() -> None:
    """"auto" keeps the one-stage race where the two-stage draw measured slower (B <= 32, or
    V = 32000 at any B) and takes the two-stage draw where it measured faster (B >= 128 with
    V >= 128256)."""
    assert not any(ops.two_stage_wanted(b, v) for b in (1, 8, 32) for v in (32000, 128256, 151936))
    assert not any(ops.two_stage_wanted(b, 32000) for b in (128, 512))
    assert all(ops.two_stage_wanted(b, v) for b in (128, 512) for v in (128256, 151936))


def test_bad_draw_is_refused() -> None:
    logits, tokens, _ = inputs(1, 2, 64, torch.float32, seed=3)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(3), DEV)
    with pytest.raises(ValueError, match="draw must be one of auto, one_stage, two_stage, got 'twostage'"):
        ops.verify_triton(logits, tokens, None, SamplingParams(), state=state, draw="twostage")


def test_auto_draw_is_the_wanted_form(small_blocks, monkeypatch: pytest.MonkeyPatch) -> None:
    """"auto" gives the one-stage tokens below the thresholds and the two-stage ones above."""
    logits, tokens, q = inputs(3, 4, 1271, torch.float32, seed=30, with_q=True)
    start = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(30), DEV)
    run = {d: ops.verify_triton(logits, tokens, q, SamplingParams(), state=start.clone(), draw=d)
           for d in ("auto", *DRAWS)}  # fmt: skip
    assert run["one_stage"].tokens.tolist() != run["two_stage"].tokens.tolist()  # the two forms differ here
    assert_same(run["auto"], run["one_stage"])
    monkeypatch.setattr(ops, "TWO_STAGE_MIN_BATCH", 1)
    monkeypatch.setattr(ops, "TWO_STAGE_MIN_VOCAB", 1)
    assert_same(ops.verify_triton(logits, tokens, q, SamplingParams(), state=start.clone()), run["two_stage"])


@pytest.mark.slow
def test_philox_first_token_follows_p_many_rows() -> None:
    probs = [0.35, 0.25, 0.2, 0.1, 0.05, 0.05]
    assert chi_square(first_token_counts(600, probs, seed=2), probs) < 25.7  # p = 1e-4, 5 dof


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize("with_q", [False, True])
def test_philox_draw_spans_race_blocks(small_blocks, with_q: bool, draw: str) -> None:
    """Philox mode's race spans every race block (and slice) of row n. With V = 1271 in
    blocks of 256 and p spread over every block, the first emitted token (accepted draft or
    recovered token) and the bonus token after an accept both follow p (chi-square). Both
    draws run it; the two-stage draw (a block by its mass, then the race in it) fails it
    with a uniform block choice or always block 0."""
    from scipy.stats import chi2

    v, rows = 1271, 3000
    support = torch.tensor([0, 100, 255, 256, 300, 511, 700, 767, 768, 1000, 1200, 1270], device=DEV)
    weights = torch.tensor([3.0, 1.0, 2.0, 4.0, 6.0, 1.0, 2.0, 3.0, 5.0, 2.0, 1.0, 2.0], device=DEV)
    probs = weights / weights.sum()
    row = torch.full((v,), float("-inf"), device=DEV)
    row[support] = torch.log(probs)
    logits = row.expand(rows, 2, v).contiguous()
    tokens = torch.full((rows, 1), 300, dtype=torch.int64, device=DEV)  # p(300) = 0.19: often rejected
    q = None
    if with_q:  # drafts from a q that differs from p, and the drafted token sampled from q
        qw = torch.zeros(v, device=DEV)
        qw[support] = torch.linspace(1.0, 3.0, len(support), device=DEV)
        q = (qw / qw.sum()).expand(rows, 1, v).contiguous()
        tokens = torch.multinomial(q[:, 0], 1, generator=torch.Generator(device=DEV).manual_seed(5))
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(31), DEV)
    out = ops.verify_triton(logits, tokens, q, SamplingParams(), state=state, draw=draw)
    index = {int(t): i for i, t in enumerate(support)}
    limit = chi2.isf(1e-4, len(support) - 1)
    for name, toks in (("first", out.tokens[:, 0]), ("bonus", out.tokens[out.num_accepted == 1, 1])):
        assert all(int(t) in index for t in toks), name  # never a token of p = 0
        counts = torch.bincount(torch.tensor([index[int(t)] for t in toks]), minlength=len(support)).double()
        assert chi_square(counts, probs.tolist()) < limit, name


@pytest.mark.parametrize("draw", DRAWS)
def test_philox_state_advances_and_replays(small_blocks, draw: str) -> None:
    logits, tokens, _ = inputs(3, 4, 1271, torch.float32, seed=16)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(3), DEV)
    start = state.clone()
    first = ops.verify_triton(logits, tokens, None, SamplingParams(), state=state, draw=draw)
    assert int(state[1]) == int(start[1]) + 1
    again = ops.verify_triton(logits, tokens, None, SamplingParams(), state=start.clone(), draw=draw)
    assert_same(again, first)  # same (seed, counter): same tokens


def test_verdict_layout(small_blocks) -> None:
    logits, tokens, _ = inputs(5, 4, 1271, torch.bfloat16, seed=17)
    state = ops.new_philox_state(None, DEV)
    out = ops.verify_triton(logits, tokens, None, SamplingParams(), state=state)
    n = out.num_accepted
    pos = torch.arange(5, device=DEV)
    assert out.tokens.dtype == torch.int64 and out.tokens.shape == (5, 5)
    assert ((out.tokens[:, :4] == tokens) | (pos[:4] >= n[:, None])).all()
    assert ((out.tokens == -1) == (pos > n[:, None])).all()
    assert (out.tokens.gather(1, n[:, None]) >= 0).all()


@pytest.mark.parametrize("bad", [8, 11, -1, 10**9])
@pytest.mark.parametrize("mode", ["noise", "philox", "philox_q"])
def test_a_draft_id_outside_the_vocab_is_rejected_and_never_read(mode: str, bad: int) -> None:
    """The kernel module is public: ids outside [0, V) (the padding -1, a wrong tokenizer's ids)
    must be rejected without a read past the logits or q rows (10**9 used to crash the process)."""
    v, gamma = 8, 3
    logits = torch.full((2, gamma + 1, v), -20.0, device=DEV)
    logits[:, :, 2] = 20.0  # the target is all but sure of token 2 everywhere
    tokens = torch.tensor([[2, 2, 2], [bad, 2, 2]], device=DEV)
    q = None
    if mode == "philox_q":
        q = torch.full((2, gamma, v), 1.0 / v, device=DEV)
    sampling = SamplingParams(temperature=1.0)
    if mode == "noise":
        noise = Noise.draw(2, gamma, v, torch.Generator(device=DEV).manual_seed(0), DEV)
        out = ops.verify_triton(logits, tokens, q, sampling, noise=noise)
    else:
        out = ops.verify_triton(logits, tokens, q, sampling, state=ops.new_philox_state(None, DEV))
    assert out.num_accepted.tolist() == [gamma, 0]  # row 1 stops at its bad id
    assert out.tokens[1, 0].item() == 2  # the residual's draw, from the vocab
    assert ((out.tokens >= 0) & (out.tokens < v) | (out.tokens == -1)).all()


def test_bad_shapes_are_refused() -> None:
    logits, tokens, _ = inputs(2, 3, 64, torch.float32, seed=18)
    with pytest.raises(ValueError, match="gamma must be in 0..16, got 17"):
        ops.verify_triton(torch.zeros(2, 18, 64), torch.zeros(2, 17, dtype=torch.long), None, SamplingParams(temperature=0))
    with pytest.raises(ValueError, match="does not match"):
        ops.verify_triton(logits[:, :3], tokens, None, SamplingParams(temperature=0))
    with pytest.raises(ValueError, match="exactly one"):
        ops.verify_triton(logits, tokens, None, SamplingParams())


def test_plugin_registers_and_verifies(small_blocks) -> None:
    from flashspec_triton import plugin

    (spec,) = plugin.flashspec_verifiers()
    assert spec.name == "triton" and spec.kind == "verifier" and spec.config_cls is TritonVerifierConfig
    with pytest.raises(ValueError):
        TritonVerifierConfig(noise="bogus")
    exact = spec.factory(TritonVerifierConfig(noise="exact"), DEV)
    logits, tokens, q = inputs(2, 3, 1271, torch.float32, seed=19, with_q=True)
    noise = Noise.draw(2, 3, 1271, torch.Generator(device=DEV).manual_seed(4), DEV)
    assert_same(
        exact.verify_with_noise(logits, tokens, q, SamplingParams(), noise),
        ops.verify_ref(logits, tokens, q, SamplingParams(), noise),
    )
    g1, g2 = (torch.Generator(device=DEV).manual_seed(5) for _ in range(2))
    ref_noise = Noise.draw(2, 3, 1271, g2, DEV)  # exact mode draws the reference's noise from the generator
    assert_same(
        exact.verify(logits, tokens, q, SamplingParams(), g1),
        ops.verify_ref(logits, tokens, q, SamplingParams(), ref_noise),
    )
    philox = TritonVerifier(TritonVerifierConfig(), DEV)
    runs = [philox.verify(logits, tokens, None, SamplingParams(), torch.Generator(device=DEV).manual_seed(6))]
    runs.append(philox.verify(logits, tokens, None, SamplingParams(), torch.Generator(device=DEV).manual_seed(6)))
    assert_same(runs[0], runs[1])  # philox noise comes from the step's generator: same seed, same verdict


def test_registry_lists_triton() -> None:
    from flashspec_core.registry import build_registry

    try:
        registry = build_registry(autoload=False)
    except Exception as exc:  # another built-in plugin may be mid-edit; that is not this module's failure
        pytest.skip(f"registry does not build: {exc}")
    assert "triton" in registry.names("verifier")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_gamma_zero_is_a_plain_sample(temperature: float) -> None:
    """The no-speculation arm: no draft tokens, one token from p (same as the reference)."""
    gen = torch.Generator(device=DEV).manual_seed(11)
    logits = torch.randn(4, 1, 1271, generator=gen, device=DEV)
    empty = torch.zeros(4, 0, dtype=torch.long, device=DEV)
    sampling = SamplingParams(temperature=temperature)
    noise = Noise.draw(4, 0, 1271, gen, DEV)
    got = ops.verify_triton(logits, empty, None, sampling, noise=noise)
    want = ops.verify_ref(logits, empty, None, sampling, noise)
    assert got.tokens.tolist() == want.tokens.tolist()
    assert got.num_accepted.tolist() == [0, 0, 0, 0]


def _all_modes(logits, tokens, q, seed: int):
    """Exact (with and without q, top-k/top-p), greedy (with top-p) and philox verdicts (both draws)."""
    b, gamma = tokens.shape
    noise = Noise.draw(b, gamma, logits.shape[-1], torch.Generator(device=DEV).manual_seed(seed), DEV)
    state = ops.new_philox_state(torch.Generator(device=DEV).manual_seed(seed), DEV)
    filtered = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)
    return [
        ops.verify_triton(logits, tokens, None, SamplingParams(), noise=noise, programs=2 * b * (gamma + 1)),
        ops.verify_triton(logits, tokens, q, SamplingParams(temperature=0.7), noise=noise, programs=3 * b),
        ops.verify_triton(logits, tokens, q, filtered, noise=noise),
        ops.verify_triton(logits, tokens, None, SamplingParams(temperature=0), programs=2 * b * (gamma + 1)),
        ops.verify_triton(logits, tokens, None, SamplingParams(temperature=0, top_p=0.3)),
        ops.verify_triton(logits, tokens, q, SamplingParams(), state=state.clone(), draw="one_stage"),
        ops.verify_triton(logits, tokens, q, SamplingParams(), state=state.clone(), draw="two_stage"),
    ]


@pytest.mark.parametrize("rows", [1, 2, 4, 64])
def test_rows_per_program(small_blocks, monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    """Every ROWS gives the same tokens (B = 5: the last tile is partly empty); exact and
    greedy match the reference, and philox's stream does not depend on ROWS either."""
    logits, tokens, q = inputs(5, 4, 1271, torch.bfloat16, seed=20, with_q=True)
    want = _all_modes(logits, tokens, q, seed=21)
    monkeypatch.setattr(ops, "_rows_per_program", lambda device, n, width: rows)
    got = _all_modes(logits, tokens, q, seed=21)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)
    noise = Noise.draw(5, 4, 1271, torch.Generator(device=DEV).manual_seed(21), DEV)
    assert_same(got[1], ops.verify_ref(logits, tokens, q, SamplingParams(temperature=0.7), noise))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # bf16: the pass's TILE form
def test_gpu_launch_shapes(small_blocks, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    """The launch a GPU gets (ROWS = 1, full G_PAD and S_PAD, PASS_CONFIG blocks, PASS_TILE),
    run here: same tokens as the interpreter's tiled launch."""
    logits, tokens, q = inputs(3, 7, 1271, dtype, seed=22, with_q=True)
    want = _all_modes(logits, tokens, q, seed=23)
    monkeypatch.setattr(ops, "_interpreting", lambda device: False)
    got = _all_modes(logits, tokens, q, seed=23)
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


def test_step_graphs_threshold_is_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA steps replay a graph when their logits take at most graph_max_bytes; CPU never."""
    from flashspec_triton.stepgraphs import StepGraphs

    class Logits:  # what wanted() reads of a CUDA tensor
        is_cuda = True

        def __init__(self, n: int, size: int) -> None:
            self.n, self.size = n, size

        def numel(self) -> int:
            return self.n

        def element_size(self) -> int:
            return self.size

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # a CPU build has no CUDA
    graphs = StepGraphs(TritonVerifierConfig().graph_max_bytes)
    mib = 1 << 20
    assert graphs.wanted(Logits(48 * mib, 2)) and not graphs.wanted(Logits(48 * mib + 1, 2))  # bf16: 96 MiB
    assert graphs.wanted(Logits(24 * mib, 4)) and not graphs.wanted(Logits(24 * mib + 1, 4))  # fp32
    assert not StepGraphs(0).wanted(Logits(1, 2))
    assert not graphs.wanted(torch.zeros(2, 3, 5))  # CPU tensors launch directly


def test_step_graphs_pin_by_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pinned graphs: captured on the second call whose large inputs sit at the same
    addresses, then replayed without copying them; small inputs are copied in every call;
    a new address, a new layout or pin=False never reuse them. The fake graph re-runs the
    step on the captured tensors, as a CUDA graph re-reads the captured addresses."""
    from flashspec_core.contracts import Verdict
    from flashspec_core.sampling import verify_greedy
    from flashspec_triton import stepgraphs

    class FakeGraph:
        def __init__(self, step, args, out: Verdict) -> None:
            self.step, self.args, self.out = step, list(args), out

        def pool(self) -> None:
            return None

        def replay(self) -> None:
            v = self.step(*self.args)
            self.out.tokens.copy_(v.tokens)
            self.out.num_accepted.copy_(v.num_accepted)

    captured: list[list[torch.Tensor]] = []

    def fake_capture(step, args, pool, warmups):
        captured.append(list(args))
        out = step(*args)
        return FakeGraph(step, args, out), out

    monkeypatch.setattr(stepgraphs, "PIN_MIN_BYTES", 256)
    monkeypatch.setattr(stepgraphs.StepGraphs, "usable", lambda self, logits: True)
    greedy = SamplingParams(temperature=0)

    def step(logits: torch.Tensor, tokens: torch.Tensor) -> Verdict:
        return verify_greedy(logits, tokens, greedy)

    def check(graphs: stepgraphs.StepGraphs, logits: torch.Tensor, tokens: torch.Tensor) -> None:
        got = graphs("k", step, logits, tokens)
        want = step(logits, tokens)
        assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn((2, 4, 40), generator=gen)  # 1280 bytes: pinned, above max_bytes below
    drafts = lambda: torch.randint(0, 40, (2, 3), generator=gen)  # noqa: E731  (48 bytes: copied)
    graphs = stepgraphs.StepGraphs(max_bytes=512, capture_fn=fake_capture)
    check(graphs, logits, drafts())  # first sighting, too big to copy: direct
    assert (len(graphs), graphs.pinned_replays, graphs.copied_replays) == (0, 0, 0)
    check(graphs, logits, drafts())  # second sighting: capture reading logits in place
    assert len(captured) == 1 and captured[0][0] is logits and captured[0][1] is not logits
    for _ in range(3):  # new contents at the same address and new drafts: replay, no capture
        logits.copy_(torch.randn(logits.shape, generator=gen))
        logits[:, :3].scatter_(2, torch.randint(0, 40, (2, 3, 1), generator=gen), 50.0)
        check(graphs, logits, drafts())
    assert len(captured) == 1 and graphs.pinned_replays == 4
    other = logits.clone()  # another address: first sighting again, direct
    check(graphs, other, drafts())
    assert len(captured) == 1 and graphs.pinned_replays == 4
    wide = torch.randn((2, 4, 80), generator=gen)[:, :, ::2]  # same shape, other strides
    check(graphs, wide, drafts())
    check(graphs, wide, drafts())
    assert len(captured) == 2 and captured[1][0] is wide

    captured.clear()  # pin=False under max_bytes: one copied graph per layout, inputs copied
    graphs = stepgraphs.StepGraphs(max_bytes=4096, pin=False, capture_fn=fake_capture)
    for _ in range(3):
        logits.copy_(torch.randn(logits.shape, generator=gen))
        check(graphs, logits, drafts())
    assert len(captured) == 1 and captured[0][0] is not logits
    assert (graphs.pinned_replays, graphs.copied_replays) == (0, 3)


def test_step_graphs_count_their_captures_and_keep_pinned_graphs_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """The triton verifier exposes its step graphs as a CapturesGraphs cache (``captures``,
    ``captured``, ``keys``), so a step that captures one is not learned from; copied graphs,
    which hold copies of their inputs, are evicted among themselves and never push a pinned
    graph out (a server meets a pinned graph per batch size, width and span)."""
    from flashspec_core.contracts import CapturesGraphs
    from flashspec_triton import stepgraphs

    class Graph:
        def pool(self) -> None:
            return None

        def replay(self) -> None:
            """Nothing to re-run: this test counts, it does not compare."""

    def fake_capture(step, args, pool, warmups):
        return Graph(), step(*args)

    monkeypatch.setattr(stepgraphs, "PIN_MIN_BYTES", 256)
    monkeypatch.setattr(stepgraphs.StepGraphs, "usable", lambda self, logits: True)
    step = lambda logits: logits.sum(dim=-1)  # noqa: E731
    graphs = stepgraphs.StepGraphs(max_bytes=100, max_graphs=1, max_pinned=2, capture_fn=fake_capture)
    pinned = [torch.zeros((2, w, 40)) for w in (1, 2)]  # 320 and 640 bytes: run directly, pinned when seen again
    for logits in pinned * 2:
        graphs("k", step, logits)
    assert graphs.captures == 2 and len(graphs) == 2 and set(graphs.captured) == graphs.keys
    for w in (3, 4, 5):  # 48 to 80 bytes: copied graphs, one kept at a time
        graphs("k", step, torch.zeros((1, w, 4)))
    assert graphs.captures == 5 and len(graphs) == 3  # both pinned graphs and the last copied one
    for logits in pinned:  # still held: replayed, not captured again
        graphs("k", step, logits)
    assert graphs.captures == 5 and graphs.pinned_replays == 4
    assert isinstance(TritonVerifier(TritonVerifierConfig()), CapturesGraphs)


def test_logsumexp_pass_partials_give_the_logsumexp() -> None:
    """The public pass launcher (what benchmarks time alone) computes the verifier's partials:
    merged, they give each row's log-sum-exp, over slices that hit the masked tail (V = 1271)."""
    logits = torch.randn((2, 3, 1271), generator=torch.Generator().manual_seed(0)) * 3
    part = ops.logsumexp_pass(logits)()
    m, s = part[0], part[1]  # [rows, nsplit]: max in logit units and the sum of exp2 at that max
    top = m.max(dim=1, keepdim=True).values
    lse = top.squeeze(1) + torch.log((s * torch.exp(m - top)).sum(dim=1))
    want = torch.logsumexp(logits.reshape(-1, 1271).double(), dim=1)
    torch.testing.assert_close(lse.double(), want, rtol=1e-5, atol=1e-5)
