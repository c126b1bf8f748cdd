"""The skinny-GEMM kernels against their plain-torch reference (Triton's interpreter on CPU).

Shapes hit the masked edges: M of 1, 3, 16 and 19 (two row tiles), N and K that are not
multiples of the blocks, and K split into slices (the last slice short). float32 must match
the reference to rounding; 16-bit outputs must be no further from a float64 reference than
twice plain torch's own error in the same dtype, give or take one rounding (the kernel rounds
where torch does).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from flashspec_kernels import gemv as mod
from flashspec_kernels.gemv import Config, gemv, gemv_ref, pick

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEV == "cuda" else [])
EPILOGUES = ["plain", "bias", "norm", "norm+bias", "residual", "glu", "norm+glu"]
CONFIGS = {"one slice": Config(32, 64, 1), "three slices": Config(16, 64, 3)}


def case(m: int, n: int, k: int, epilogue: str, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor,
                                                                                             dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * scale).to(DEV, dtype)

    glu = "glu" in epilogue
    x, w = rnd(m, k), rnd(2 * n if glu else n, k, scale=k**-0.5)
    kw: dict[str, Any] = {"eps": 1e-6, "glu": glu}
    if "bias" in epilogue:
        kw["bias"] = rnd(n)
    if "norm" in epilogue:
        kw["norm"] = rnd(k, scale=0.5) + 1
    if epilogue == "residual":
        kw["residual"] = rnd(m, n)
    return x, w, kw


def fresh(kw: dict[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The keywords with their own copy of the residual (updated in place), in ``dtype``."""
    return {k: (v.to(dtype) if dtype else v.clone()) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, kw: dict[str, Any]) -> None:
    want = gemv_ref(x, w, **fresh(kw))
    assert got.shape == want.shape and got.dtype == want.dtype
    if x.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
        return
    exact = gemv_ref(x.double(), w.double(), **fresh(kw, torch.float64))
    err, torch_err = ((t.double() - exact).abs().max().item() for t in (got, want))
    # plus one rounding of the largest output: over a few outputs the max error is one rounding's luck
    ulp = torch.finfo(x.dtype).eps * exact.abs().max().item()
    assert err <= 2 * torch_err + ulp, f"kernel error {err:.3g} against torch's {torch_err:.3g} in {x.dtype}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("m", [1, 16])
def test_matches_the_reference(dtype: torch.dtype, epilogue: str, m: int) -> None:
    x, w, kw = case(m, 40, 200, epilogue, dtype)
    for config in CONFIGS.values():
        check(gemv(x, w, config=config, **fresh(kw)), x, w, kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
@pytest.mark.parametrize(("m", "n", "k"), [(3, 1, 16), (19, 33, 300), (3, 70, 64)])
def test_odd_shapes(dtype: torch.dtype, config: Config, m: int, n: int, k: int) -> None:
    for epilogue in ("norm+bias", "residual", "norm+glu"):
        x, w, kw = case(m, n, k, epilogue, dtype, seed=n)
        check(gemv(x, w, config=config, **fresh(kw)), x, w, kw)


def test_the_residual_is_updated_in_place() -> None:
    x, w, kw = case(3, 40, 200, "residual", torch.float32)
    resid = kw["residual"].clone()
    out = gemv(x, w, residual=resid, config=CONFIGS["three slices"])
    assert out.data_ptr() == resid.data_ptr()
    torch.testing.assert_close(resid, gemv_ref(x, w, residual=kw["residual"].clone()), rtol=2e-5, atol=2e-5)


def test_rows_strided_like_a_last_token_view() -> None:
    """``x[:, -1]`` of a ``[B, T, D]`` stream: rows a stride apart (the LM head's input)."""
    g = torch.Generator().manual_seed(5)
    stream = torch.randn((3, 4, 72), generator=g).to(DEV)
    w, norm = torch.randn((50, 72), generator=g).to(DEV), torch.randn(72, generator=g).to(DEV)
    x = stream[:, -1]
    torch.testing.assert_close(gemv(x, w, norm=norm), gemv_ref(x, w, norm=norm), rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(DEV != "cuda", reason="the interpreter's dot is numpy's, whose bits for a row may depend on the others")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_gets_the_same_bits_whatever_the_other_rows(dtype: torch.dtype) -> None:
    """A token alone, inside 16 rows, and in the second tile of 19: identical bits (split K too)."""
    x, w, kw = case(19, 40, 200, "norm+bias", dtype, seed=2)
    for config in CONFIGS.values():
        full = gemv(x, w, config=config, **kw)
        for i in (0, 7, 15, 18):
            assert torch.equal(gemv(x[i : i + 1], w, config=config, **kw), full[i : i + 1])
        assert torch.equal(gemv(x[:16], w, config=config, **kw), full[:16])


def test_split_k_leaves_its_counters_zero() -> None:
    """The last slice of each tile resets its counter, so the next launch (a graph replay) starts clean."""
    x, w, kw = case(19, 20, 200, "norm+glu", torch.float32, seed=4)
    for _ in range(2):
        check(gemv(x, w, config=Config(16, 32, 4), **kw), x, w, kw)
    assert not mod.prepare(torch.device(DEV)).any()


def test_pick_fills_the_gpu_from_the_matrix_alone() -> None:
    sms = 132
    for n, k, glu in ((1536, 1536, False), (1536, 8960, False), (8960, 1536, True), (896, 4864, False),
                      (151936, 1536, False)):
        cfg = pick(n, k, glu, sms)
        programs = -(-n // cfg.block_n) * cfg.split_k
        assert programs >= min(mod.PROGRAMS_PER_SM * sms, -(-n // 16) * mod.MAX_SPLIT_K) or cfg.split_k > 1
        assert cfg.split_k <= max(1, -(-k // cfg.block_k) // 2), "a slice holds at least two steps"
    assert pick(151936, 1536).split_k == 1 and pick(1536, 8960).split_k > 1


@pytest.mark.parametrize(("change", "match"), [
    ("k", r"are not \[M, K\] and \[N, K\]"), ("dtype", "both must be"), ("bias", "bias"),
    ("two", "one epilogue at a time"), ("glu", "even N"), ("w", "contiguous"),
])
def test_bad_input_is_a_clear_error(change: str, match: str) -> None:
    x, w, kw = case(2, 8, 16, "plain", torch.float32)
    bias = torch.zeros(8, device=DEV)
    args: dict[str, Any] = {
        "k": dict(x=x[:, :8], w=w), "dtype": dict(x=x, w=w.double()), "bias": dict(x=x, w=w, bias=bias[:5]),
        "two": dict(x=x, w=w, bias=bias, residual=torch.zeros(2, 8, device=DEV)),
        "glu": dict(x=x, w=w[:7], glu=True), "w": dict(x=x, w=torch.zeros(16, 8, device=DEV).t()),
    }[change]
    with pytest.raises(ValueError, match=match):
        gemv(**args)
