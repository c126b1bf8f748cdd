"""The Triton decode-attention kernel against SDPA with the model's causal mask.

On CPU it runs in Triton's interpreter; on a GPU (the same file, run on the H200) in bf16
and float32 too. Shapes cover grouped queries (G = 6, 7: the Qwen2.5 1.5B and 0.5B groups),
head dims that need padding (8, 80), one split and several, ragged rows with padding
tokens at position 0, and positions that end inside a block.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from _host_blas import dot_rows_position_invariant  # noqa: E402

from flashspec_kernels import attention as att  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32] + ([torch.bfloat16, torch.float16] if DEV == "cuda" else [])


def case(batch: int, width: int, heads: int, kv: int, hd: int, slots: int, span: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn((batch, width, heads, hd), generator=g, device=DEV).to(dtype)
    k = torch.randn((batch, slots, kv, hd), generator=g, device=DEV).to(dtype)
    v = torch.randn((batch, slots, kv, hd), generator=g, device=DEV).to(dtype)
    last = torch.randint(width - 1, span, (batch,), generator=g, device=DEV)
    pos = last[:, None] - (width - 1) + torch.arange(width, device=DEV)[None]
    pos[0, : width // 2] = 0  # ragged catch-up: row 0's first tokens are padding at position 0
    return q, k, v, pos


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("batch", "width", "heads", "kv", "hd", "slots", "span"),
    [
        (1, 1, 12, 2, 128, 300, 256),  # the 1.5B's decode step, several splits
        (1, 4, 14, 2, 64, 200, 128),  # the 0.5B's shape, a verify width
        (3, 9, 6, 2, 16, 130, 128),
        (2, 16, 4, 2, 8, 80, 64),  # the widest decode step, a padded head dim, one split (direct)
        (2, 3, 6, 2, 80, 700, 512),  # head dim 80 padded to 128
        (5, 1, 4, 4, 32, 64, 64),  # no grouping
    ],
)
def test_matches_sdpa(batch, width, heads, kv, hd, slots, span, dtype) -> None:
    q, k, v, pos = case(batch, width, heads, kv, hd, slots, span, dtype, seed=batch * 100 + width)
    got = att.decode_attention(q, k, v, pos, span)
    want = att.decode_attention_ref(q.float(), k.float(), v.float(), pos, span)
    assert got.shape == q.shape and got.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


def test_slots_past_a_rows_position_are_never_read() -> None:
    """Garbage (NaN) in every slot after each row's last position changes nothing."""
    q, k, v, pos = case(2, 4, 6, 2, 16, 256, 256, torch.float32, seed=7)
    clean = att.decode_attention(q, k, v, pos, 256)
    for b in range(2):
        k[b, int(pos[b].max()) + 1 :] = float("nan")
        v[b, int(pos[b].max()) + 1 :] = float("nan")
    assert torch.equal(att.decode_attention(q, k, v, pos, 256), clean)


def test_split_count_changes_only_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """One split (the direct path) and many give the same attention up to float32 rounding."""
    q, k, v, pos = case(1, 2, 6, 2, 32, 512, 512, torch.float32, seed=3)
    monkeypatch.setattr(att, "_chunk", lambda batch, kv: 512)
    one = att.decode_attention(q, k, v, pos, 512)
    monkeypatch.setattr(att, "_chunk", lambda batch, kv: 64)
    many = att.decode_attention(q, k, v, pos, 512)
    torch.testing.assert_close(one, many, rtol=1e-5, atol=1e-5)


# (query heads, KV heads, head dim): the 0.5B draft's; on the GPU also the 1.5B target's and the 7B's
HEAD_SHAPES = [(14, 2, 64)] + ([(12, 2, 128), (28, 4, 128)] if DEV == "cuda" else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv", "hd"), HEAD_SHAPES)
def test_a_query_gets_the_same_bits_in_any_forward(dtype: torch.dtype, heads: int, kv: int, hd: int) -> None:
    """The last token of a verify step (T = 1..9, the other queries before it), and at T = 4
    every token, get the bits the same token gets scored alone, under the step's span and a larger one,
    with the combine path (positions past the first split) and the direct one (span within
    it): what keeps greedy speculative tokens equal to target-only's in bf16."""
    bits = DEV == "cuda" or dot_rows_position_invariant()  # see tests/_host_blas.py

    def same(got: torch.Tensor, want: torch.Tensor, where: object) -> None:
        if bits:
            assert torch.equal(got, want), where
        else:  # the host BLAS rounds by row position: float32 rounding is all that may differ
            torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-7, msg=str(where))

    g = torch.Generator(device=DEV).manual_seed(11)
    slots = 512
    k = torch.randn((1, slots, kv, hd), generator=g, device=DEV).to(dtype)
    v = torch.randn((1, slots, kv, hd), generator=g, device=DEV).to(dtype)
    for last, spans in ((300, (320, 512)), (40, (64, 128))):
        q_last = torch.randn((1, 1, heads, hd), generator=g, device=DEV).to(dtype)
        alone = att.decode_attention(q_last, k, v, torch.tensor([[last]], device=DEV), spans[0])
        for width in (1, 4, 9):
            q = torch.cat([torch.randn((1, width - 1, heads, hd), generator=g, device=DEV).to(dtype), q_last], dim=1)
            pos = torch.arange(last - width + 1, last + 1, device=DEV)[None]
            for span in spans:
                out = att.decode_attention(q, k, v, pos, span)
                same(out[:, -1:], alone, (last, width, span))
            if width == 4:  # the earlier rows too (accepted tokens come from them): their tile reads past them
                for i in range(width - 1):
                    one = att.decode_attention(q[:, i : i + 1], k, v, pos[:, i : i + 1], spans[0])
                    same(out[:, i : i + 1], one, (last, i))


@pytest.mark.parametrize(
    ("change", "match"),
    [("width", "width 17"), ("span", "span 999"), ("pos", r"pos \(1, 3\)"), ("cache", "does not fit"),
     ("dtype", "not supported")],
)
def test_bad_input_is_a_clear_error(change: str, match: str) -> None:
    q, k, v, pos = case(1, 2, 6, 2, 16, 64, 64, torch.float32, seed=0)
    span = 64
    if change == "width":
        q, pos = q.repeat(1, 9, 1, 1)[:, :17], torch.arange(17, device=DEV)[None]
    elif change == "span":
        span = 999
    elif change == "pos":
        pos = torch.zeros((1, 3), dtype=torch.long, device=DEV)
    elif change == "cache":
        k = k[:, :, :, :8]
    else:
        q, k, v = q.double(), k.double(), v.double()
    with pytest.raises(ValueError, match=match):
        att.decode_attention(q, k, v, pos, span)
