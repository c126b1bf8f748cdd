"""The rotary + cache-store kernel against its plain-torch reference (Triton's interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

from flashspec_fast.model import rope_store as model_rope_store
from flashspec_kernels.rope import rope_store, rope_store_ref

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# exact where both compute in the input's precision (float32 only on CPU: below); 16-bit: the kernel rounds once
# (as Inductor does), eager twice
DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16, torch.float16] if DEV == "cuda" else [])


def case(batch: int, width: int, heads: int, kv: int, hd: int, dtype: torch.dtype, seed: int = 0) -> tuple:
    g = torch.Generator(device="cpu").manual_seed(seed)
    qkv = torch.randn((batch, width, heads + 2 * kv, hd), generator=g).to(DEV, dtype)
    angle = torch.rand((batch, width, 1, hd // 2), generator=g) * 6.0
    cos, sin = (torch.cat((f(angle), f(angle)), dim=-1).to(DEV, dtype) for f in (torch.cos, torch.sin))
    slots_per_row = 40
    slots = (torch.arange(batch)[:, None] * slots_per_row + torch.randperm(slots_per_row, generator=g)[:width]).view(-1)
    return qkv, cos, sin, slots.to(DEV), batch * slots_per_row


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("batch", "width", "heads", "kv", "hd"), [(1, 1, 14, 2, 64), (3, 5, 12, 2, 128), (2, 7, 4, 4, 6)])
def test_matches_the_torch_rotation_and_store(dtype: torch.dtype, batch: int, width: int, heads: int, kv: int,
                                              hd: int) -> None:
    qkv, cos, sin, slots, rows = case(batch, width, heads, kv, hd, dtype)
    caches = [torch.full((rows, kv * hd), 7.0, dtype=dtype, device=DEV) for _ in range(4)]
    got = rope_store(qkv, cos, sin, caches[0], caches[1], slots, heads, kv)
    want = rope_store_ref(qkv, cos, sin, caches[2], caches[3], slots, heads, kv)
    # float32 on the GPU: the compiler contracts x1 * c1 - x2 * s1 into FMAs (one rounding where eager
    # torch has two), the only differences on the H200; within an ulp or two
    exact = dtype == torch.float64 or (dtype == torch.float32 and DEV == "cpu")
    tol = {} if exact else {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for a, b in ((got, want), (caches[0], caches[2]), (caches[1], caches[3])):
        if exact:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, **tol)
    untouched = torch.ones(rows, dtype=torch.bool, device=DEV)
    untouched[slots] = False
    assert (caches[0][untouched] == 7.0).all() and (caches[1][untouched] == 7.0).all()  # only the step's slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_the_fast_models_torch_path_is_the_reference(dtype: torch.dtype) -> None:
    """Where the kernel is off, the fast back-end rotates and stores with the reference's bits."""
    qkv, cos, sin, slots, rows = case(3, 5, 12, 2, 128, dtype, seed=1)
    caches = [torch.full((rows, 2 * 128), 7.0, dtype=dtype, device=DEV) for _ in range(4)]
    got = model_rope_store(qkv, cos, sin, caches[0], caches[1], slots, 12, 2)
    want = rope_store_ref(qkv, cos, sin, caches[2], caches[3], slots, 12, 2)
    for a, b in ((got, want), (caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(a, b)


def test_a_token_gets_the_same_bits_in_any_forward() -> None:
    """Elementwise per token: the last token alone and inside a wider forward."""
    qkv, cos, sin, slots, rows = case(1, 6, 12, 2, 128, torch.float32, seed=3)
    kc, vc = (torch.zeros((rows, 2 * 128), device=DEV) for _ in range(2))
    wide = rope_store(qkv, cos, sin, kc, vc, slots, 12, 2)
    kc1, vc1 = (torch.zeros((rows, 2 * 128), device=DEV) for _ in range(2))
    alone = rope_store(qkv[:, -1:], cos[:, -1:], sin[:, -1:], kc1, vc1, slots[-1:], 12, 2)
    assert torch.equal(wide[:, -1:], alone) and torch.equal(kc[slots[-1]], kc1[slots[-1]])


@pytest.mark.parametrize(("change", "match"), [
    ("heads", "does not hold 13 query"), ("cos", "cos/sin"), ("slots", "slots"), ("cache", "contiguous"),
    ("dtype", "caches in torch.float64"),
])
def test_bad_input_is_a_clear_error(change: str, match: str) -> None:
    qkv, cos, sin, slots, rows = case(1, 2, 12, 2, 8, torch.float32)
    kc, vc = (torch.zeros((rows, 16), device=DEV) for _ in range(2))
    heads = 13 if change == "heads" else 12
    if change == "cos":
        cos = cos[:, :1]
    if change == "slots":
        slots = slots[:1]
    if change == "cache":
        kc = torch.zeros((16, rows), device=DEV).t()
    if change == "dtype":
        kc = kc.double()
    with pytest.raises(ValueError, match=match):
        rope_store(qkv, cos, sin, kc, vc, slots, heads, 2)
