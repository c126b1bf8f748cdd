"""The persistent decoder (:mod:`flashspec_kernels.decoder`) against :func:`decode_ref` (CPU, Triton's interpreter).

Every phase runs as its own launch here (the interpreter runs a grid's programs one after
another, so a grid barrier would never open); the work loops, masks and partial sums are
the GPU's. Shapes hit the masked edges: head dims whose half is below, at and above the 16
column pairs an item rotates, query groups wider than one 16-row tile, several attention
splits, a shallow forward, fewer programs than items.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from flashspec_kernels import decoder as dec  # noqa: E402


@pytest.fixture(autouse=True)
def _interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def model(layers: int, dim: int, heads: int, kv: int, hd: int, ffn: int, slots: int, dtype: torch.dtype,
          bias: bool = True, seed: int = 0) -> tuple[dec.Stacked, dec.Shape, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.1).to(dtype)

    nqkv = (heads + 2 * kv) * hd
    w = dec.Stacked(wqkv=r(layers, nqkv, dim), bqkv=r(layers, nqkv) if bias else None, attn_norm=1 + r(layers, dim),
                    wo=r(layers, dim, heads * hd), mlp_norm=1 + r(layers, dim), w_gate_up=r(layers, 2 * ffn, dim),
                    w_down=r(layers, dim, ffn), norm=1 + r(dim))
    inv = 1.0 / (1e4 ** (torch.arange(0, hd, 2).float() / hd))
    freqs = torch.arange(slots).float()[:, None] * inv[None]
    emb = torch.cat((freqs, freqs), -1)
    return w, dec.Shape(heads, kv, hd, 1e-6), emb.cos().to(dtype), emb.sin().to(dtype)


def run(w: dec.Stacked, shape: dec.Shape, cos: torch.Tensor, sin: torch.Tensor, batch: int, width: int, span: int,
        layers: int | None = None, programs: int = 3, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """The kernel's and the reference's (normed rows, residual stream, K cache, V cache)."""
    gen = torch.Generator().manual_seed(seed)
    dtype, n_layers, slots = w.wqkv.dtype, w.wqkv.shape[0], cos.shape[0]
    kc = (torch.randn(n_layers, batch + 1, slots, shape.kv_heads * shape.head_dim, generator=gen) * 0.1).to(dtype)
    vc = (torch.randn(kc.shape, generator=gen) * 0.1).to(dtype)
    starts = torch.randint(0, span - width + 1, (batch,), generator=gen)
    pos = (starts[:, None] + torch.arange(width)).view(-1)
    slot_ids = (torch.arange(batch)[:, None] * slots + pos.view(batch, width)).view(-1)
    x = (torch.randn(batch * width, w.wqkv.shape[2], generator=gen) * 0.5).to(dtype)
    ref = [x.clone(), kc.clone(), vc.clone()]
    want = dec.decode_ref(w, shape, cos, sin, ref[0], pos, slot_ids, ref[1], ref[2], width, span, layers)
    got = dec.Decoder(w, shape, cos, sin, programs=programs).forward(x, pos, slot_ids, kc, vc, width, span, layers)
    return got, want, x, ref[0], kc, ref[1], vc, ref[2]


CASES = [  # layers, dim, heads, kv heads, head dim, ffn, batch, width, span, shallow
    (2, 64, 4, 2, 16, 96, 2, 3, 256, None),  # half a head (8) below the 16 pairs of an item
    (2, 96, 7, 1, 64, 160, 1, 1, 512, None),  # the 0.5B's grouping (7 queries per KV head), 4 splits
    (3, 96, 6, 2, 32, 128, 4, 4, 300, 2),  # a shallow forward; 24 queries per KV head: two row tiles
    (1, 80, 2, 2, 48, 80, 16, 1, 200, None),  # 16 rows; a head dim that is not a power of two
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_float32_matches_the_reference(case: tuple) -> None:
    layers, dim, heads, kv, hd, ffn, batch, width, span, shallow = case
    w, shape, cos, sin = model(layers, dim, heads, kv, hd, ffn, 512, torch.float32, bias=layers != 3)
    got, want, x, x_ref, kc, kc_ref, vc, vc_ref = run(w, shape, cos, sin, batch, width, span, shallow)
    for a, b in ((got, want), (x, x_ref), (kc, kc_ref), (vc, vc_ref)):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_errors_stay_within_twice_torchs(dtype: torch.dtype) -> None:
    """Against a float64 run, the kernel's error is at most twice plain torch's in the same dtype."""
    w, shape, cos, sin = model(2, 96, 6, 2, 32, 128, 512, dtype)
    got, want, *_ = run(w, shape, cos, sin, 2, 2, 300)
    exact = run_float64(w, shape, cos, sin)
    err_kernel = (got.double() - exact).abs().max().item()
    err_torch = (want.double() - exact).abs().max().item()
    assert err_kernel <= 2 * err_torch + 1e-3, (err_kernel, err_torch)


def run_float64(w: dec.Stacked, shape: dec.Shape, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The reference in float64 over the same (16-bit) weights, inputs and caches as ``run``'s call above."""
    up = dec.Stacked(wqkv=w.wqkv.double(), bqkv=None if w.bqkv is None else w.bqkv.double(),
                     attn_norm=w.attn_norm.double(), wo=w.wo.double(), mlp_norm=w.mlp_norm.double(),
                     w_gate_up=w.w_gate_up.double(), w_down=w.w_down.double(), norm=w.norm.double())
    gen = torch.Generator().manual_seed(1)
    dtype, n_layers, slots, batch, width, span = w.wqkv.dtype, w.wqkv.shape[0], cos.shape[0], 2, 2, 300
    kc = (torch.randn(n_layers, batch + 1, slots, shape.kv_heads * shape.head_dim, generator=gen) * 0.1).to(dtype)
    vc = (torch.randn(kc.shape, generator=gen) * 0.1).to(dtype)
    starts = torch.randint(0, span - width + 1, (batch,), generator=gen)
    pos = (starts[:, None] + torch.arange(width)).view(-1)
    slot_ids = (torch.arange(batch)[:, None] * slots + pos.view(batch, width)).view(-1)
    x = (torch.randn(batch * width, w.wqkv.shape[2], generator=gen) * 0.5).to(dtype)
    return dec.decode_ref(up, shape, cos.double(), sin.double(), x.double(), pos, slot_ids, kc.double(), vc.double(),
                          width, span)


def test_a_row_gets_the_same_bits_alone_and_in_a_batch() -> None:
    w, shape, cos, sin = model(2, 64, 4, 2, 16, 96, 256, torch.float32)
    gen = torch.Generator().manual_seed(5)
    kc = torch.randn(2, 3, 256, 32, generator=gen) * 0.1
    vc = torch.randn(kc.shape, generator=gen) * 0.1
    x = torch.randn(3, 64, generator=gen)
    pos = torch.tensor([40, 150, 7])
    slots = torch.arange(3) * 256 + pos
    d = dec.Decoder(w, shape, cos, sin, programs=2)
    batch = d.forward(x.clone(), pos, slots, kc.clone(), vc.clone(), 1, 256)
    alone = d.forward(x[1:2].clone(), pos[1:2], pos[1:2], kc[:, 1:2].clone(), vc[:, 1:2].clone(), 1, 256)  # row 1 as row 0
    assert torch.equal(batch[1], alone[0])


def test_bad_inputs_are_named() -> None:
    w, shape, cos, sin = model(1, 64, 4, 2, 16, 96, 256, torch.float32)
    d = dec.Decoder(w, shape, cos, sin)
    kc = torch.zeros(1, 1, 256, 32)
    x = torch.zeros(17, 64)
    with pytest.raises(ValueError, match="1..16 rows"):
        d.forward(x, torch.zeros(17, dtype=torch.long), torch.zeros(17, dtype=torch.long), kc, kc.clone(), 1, 256)
    with pytest.raises(ValueError, match="span 300"):
        d.forward(x[:1], torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), kc, kc.clone(), 1, 300)
    with pytest.raises(ValueError, match="does not fit the weights"):
        d.forward(torch.zeros(1, 32), torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), kc,
                  kc.clone(), 1, 256)
    with pytest.raises(ValueError, match="rotary tables"):
        dec.Decoder(w, shape, cos[:, :8], sin[:, :8])
    with pytest.raises(ValueError, match="mode"):
        dec.Decoder(w, shape, cos, sin, mode="spin")
