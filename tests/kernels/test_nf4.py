"""flashspec_kernels.nf4 (Triton's interpreter on the CPU) against its plain-torch reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from flashspec_kernels.gemv import Config, pick  # noqa: E402
from flashspec_kernels.nf4 import KERNEL_ROWS, MAX_ROWS, nf4_gemv, nf4_linear  # noqa: E402
from flashspec_kernels.nf4_format import GROUP, NF4_VALUES, dequantize, quantize  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]
# rows, columns, input width: one row; a column block cut short; K past a group and a
# kernel step (not a multiple of either); a full 16-row tile; K under one group
SHAPES = [(1, 64, 128), (3, 45, 200), (16, 96, 320), (7, 33, 40)]


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn((n, k), generator=torch.Generator().manual_seed(seed)) * 0.05


def _reference(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float32 sums of the dequantized weight (rounded once to x's dtype), rounded once."""
    w = dequantize(packed, scales, x.dtype, x.shape[-1]).float()
    return torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


def test_the_format_is_the_nearest_code_times_the_groups_absmax() -> None:
    book = torch.tensor(NF4_VALUES)
    # each weight exactly a code times its group's scale (the absmax, since +-1 is in the book)
    idx = torch.randint(0, 16, (4, 2 * GROUP), generator=torch.Generator().manual_seed(1))
    idx[:, 0] = 15  # a +1 code in every group, so the absmax is the scale
    idx[:, GROUP] = 0  # and a -1 in the second
    scale = torch.tensor([[0.5, 2.0], [1.0, 0.25], [3.0, 1.0], [0.125, 4.0]])
    w = book[idx] * scale.repeat_interleave(GROUP, 1)
    packed, scales = quantize(w)
    assert packed.dtype == torch.uint8 and packed.shape == (4, GROUP) and scales.shape == (4, 2)
    assert torch.equal(scales, scale)
    assert torch.equal(packed & 15, idx[:, 0::2].to(torch.uint8)) and torch.equal(packed >> 4, idx[:, 1::2].to(torch.uint8))
    assert torch.equal(dequantize(packed, scales, torch.float32), w)
    # anything else goes to its nearest code; a zero group stays zero
    w = _weight(8, 3 * GROUP)
    w[2, :GROUP] = 0.0
    packed, scales = quantize(w)
    got = dequantize(packed, scales, torch.float32)
    norm = (w.reshape(8, 3, GROUP) / scales[..., None].clamp_min(1e-30)).reshape(8, -1)
    nearest = book[(norm[..., None] - book).abs().argmin(-1)] * scales.repeat_interleave(GROUP, 1)
    assert torch.allclose(got, nearest) and not got[2, :GROUP].any()


def test_the_format_is_bitsandbytes_nf4() -> None:
    bnb = pytest.importorskip("bitsandbytes.functional")
    w = _weight(48, 4 * GROUP, seed=2)
    packed, scales = quantize(w)
    q, state = bnb.quantize_4bit(w, quant_type="nf4", blocksize=GROUP)
    assert torch.equal(dequantize(packed, scales, torch.float32), bnb.dequantize_4bit(q, state, quant_type="nf4"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_is_the_dequantized_matmul(dtype: torch.dtype, m: int, n: int, k: int, bias: bool) -> None:
    packed, scales = quantize(_weight(n, k))
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn((m, k), generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    got, want = nf4_gemv(x, packed, scales, b), _reference(x, packed, scales, b)
    assert got.dtype == dtype and got.shape == (m, n)
    if dtype == torch.float32:  # the same products, summed in another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # one rounding of float32 sums that differ in their last bits at most
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", [Config(16, 64, 3), Config(32, 128, 2), None], ids=["split3", "split2", "picked"])
def test_slices_of_k_add_up_to_the_dequantized_matmul(dtype: torch.dtype, config: Config | None) -> None:
    """K split over programs (the last slice to arrive adds the partials in order), with a slice
    boundary inside a group and a last slice cut short; ``None``: what ``pick`` chooses for a
    narrow matrix with a long K, which splits it."""
    n, k = 40, 1000
    if config is None:
        assert pick(n, k).split_k > 1
    packed, scales = quantize(_weight(n, k, seed=9))
    g = torch.Generator().manual_seed(10)
    x, b = torch.randn((5, k), generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
    got, want = nf4_gemv(x, packed, scales, b, config=config), _reference(x, packed, scales, b)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-2)
    assert torch.equal(nf4_gemv(x[1:2], packed, scales, b, config=config)[0], got[1])  # a row alone: the same bits


def test_groups_past_k_read_nothing_past_the_scales() -> None:
    """K of one group in steps of four: the step's last three groups start past K, and the last
    column's scales are the tensor's last; what lies past them (NaN here) must not be read."""
    n, k = 33, 40
    packed, scales = quantize(_weight(n, k, seed=11))
    buf = torch.full((scales.numel() + 64,), float("nan"))
    buf[: scales.numel()] = scales.flatten()
    fenced = buf[: scales.numel()].view_as(scales)
    x = torch.randn((2, k), generator=torch.Generator().manual_seed(12))
    got = nf4_gemv(x, packed, fenced, config=Config(16, 256, 1))
    torch.testing.assert_close(got, _reference(x, packed, scales, None), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_rows_result_does_not_depend_on_the_other_rows(dtype: torch.dtype) -> None:
    packed, scales = quantize(_weight(80, 256, seed=3))
    x = torch.randn((MAX_ROWS, 256), generator=torch.Generator().manual_seed(4)).to(dtype)
    together = nf4_gemv(x, packed, scales)
    for i in (0, 5, MAX_ROWS - 1):
        assert torch.equal(nf4_gemv(x[i : i + 1], packed, scales)[0], together[i])


def test_nf4_linear_takes_any_leading_shape_and_wide_inputs_dequantize() -> None:
    packed, scales = quantize(_weight(24, 128, seed=5))
    x = torch.randn((2, 3, 128), generator=torch.Generator().manual_seed(6))
    got = nf4_linear(x, packed, scales)
    assert got.shape == (2, 3, 24)
    torch.testing.assert_close(got, nf4_linear(x, packed, scales, kernel=False), rtol=1e-5, atol=1e-6)
    wide = torch.randn((KERNEL_ROWS + 1, 128), generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(nf4_linear(wide, packed, scales), _reference(wide, packed, scales, None))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_few_tiles_of_rows_take_the_kernel_with_each_rows_own_bits(dtype: torch.dtype) -> None:
    """40 rows (a verify forward of 8 rows and 5 positions): three launches of at most 16 rows
    into one output, each row's bits what it gets alone, as a decoding row's do."""
    packed, scales = quantize(_weight(48, 192, seed=13))
    g = torch.Generator().manual_seed(14)
    x, b = torch.randn((40, 192), generator=g).to(dtype), torch.randn(48, generator=g).to(dtype)
    got = nf4_linear(x.reshape(8, 5, 192), packed, scales, b).reshape(40, 48)
    for i in (0, 15, 16, 39):
        assert torch.equal(got[i], nf4_gemv(x[i : i + 1], packed, scales, b)[0])
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-7, "atol": 1e-2}
    torch.testing.assert_close(got, _reference(x, packed, scales, b), **tol)
    with pytest.raises(ValueError, match=r"out must be \[2, 48\]"):
        nf4_gemv(x[:2], packed, scales, out=torch.empty((3, 48), dtype=dtype))


def test_bad_inputs_are_named() -> None:
    packed, scales = quantize(_weight(24, 128))
    with pytest.raises(ValueError, match=f"at most {MAX_ROWS} rows, got 17: use nf4_linear"):
        nf4_gemv(torch.zeros((17, 128)), packed, scales)
    with pytest.raises(ValueError, match=r"x \[1, 192\] does not fit the NF4 weight"):
        nf4_gemv(torch.zeros((1, 192)), packed, scales)
    with pytest.raises(ValueError, match="2-D weight"):
        quantize(torch.zeros(4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_kernel_on_cuda_matches_and_replays_in_a_graph(dtype: torch.dtype) -> None:
    """On the GPU: the 1.5B's QKV shape at 1 and 4 rows against the dequantized matmul, a row
    alone and in the tile with the same bits, and a CUDA-graph replay equal to the eager call."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    n, k = 2048, 1536
    w = _weight(n, k, seed=8).cuda()
    packed, scales = quantize(w)
    b = torch.randn(n, device="cuda").to(dtype)
    x = torch.randn((4, k), device="cuda").to(dtype)
    got, want = nf4_gemv(x, packed, scales, b), _reference(x, packed, scales, b)
    torch.testing.assert_close(got, want, rtol=1e-5 if dtype == torch.float32 else 2**-7, atol=1e-5 if dtype == torch.float32 else 1e-2)
    assert torch.equal(nf4_gemv(x[2:3], packed, scales, b)[0], got[2])
    static = x[:1].clone()
    nf4_gemv(static, packed, scales, b)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = nf4_gemv(static, packed, scales, b)
    static.copy_(x[3:4])
    graph.replay()
    assert torch.equal(out, nf4_gemv(x[3:4], packed, scales, b))


def test_pick_drops_stages_for_little_shared_memory_and_never_steps_k_below_a_group() -> None:
    """Less shared memory takes stages away first; a step of K shorter than the 64-weight group the
    kernel reads at a time is never tried, and where one stage does not fit the error says so."""
    import attrs

    from flashspec_kernels.nf4 import pick as nf4_pick
    from flashspec_kernels.nf4 import shared_bytes

    roomy = nf4_pick(8960, 1536)
    one = shared_bytes(attrs.evolve(roomy, num_stages=1), 2)
    tight = nf4_pick(8960, 1536, shared=one)
    assert roomy.num_stages > 1 and tight == attrs.evolve(roomy, num_stages=1) and tight.block_k % GROUP == 0
    with pytest.raises(ValueError, match=f"at its floor, {GROUP}"):
        nf4_pick(8960, 1536, shared=one - 1)
