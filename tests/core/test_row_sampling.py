"""Per-row sampling (RowSampling) and seeded rows: the warp, the coupling, the verifiers' entry point."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from flashspec_core.contracts import RowSampling, SamplingParams, VerifiesRows
from flashspec_core.sampling import (
    UNIT,
    Noise,
    filter_logits,
    gumbel_noise,
    probs_from_logits,
    verify_greedy,
    verify_random,
    verify_rows,
    warp_logits,
)
from flashspec_core.testing import verifier_contract as vc

MIXED = (SamplingParams(0.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.3, top_k=5))


def _inputs(batch: int, gamma: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn((batch, gamma + 1, vocab), generator=g)
    q = torch.softmax(logits[:, :gamma] + torch.randn((batch, gamma, vocab), generator=g), dim=-1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)
    return logits, tokens, q


def test_rowsampling_validates_and_summarises() -> None:
    with pytest.raises(ValueError, match="seeds has 2 entries for 1 rows"):
        RowSampling([SamplingParams()], seeds=[1, 2])
    with pytest.raises(ValueError, match="one SamplingParams per row"):
        RowSampling([])
    assert RowSampling([MIXED[1]] * 3).uniform == MIXED[1]
    assert RowSampling([MIXED[1]] * 3, seeds=[None, 4, None]).uniform is None
    assert RowSampling(MIXED).uniform is None
    assert RowSampling([MIXED[2], MIXED[1], MIXED[2]]).draft_params == MIXED[2]


def test_warp_is_each_rows_filter_and_greedy_is_one_hot() -> None:
    logits, _, _ = _inputs(6, 2, 33)
    params = [MIXED[b % 3] for b in range(6)]
    warped = warp_logits(logits, params)
    for b, p in enumerate(params):
        if p.greedy:
            best = torch.argmax(filter_logits(logits[b], p), dim=-1)
            assert torch.equal(torch.softmax(warped[b], -1), torch.nn.functional.one_hot(best, 33).float())
        else:
            assert torch.equal(warped[b], filter_logits(logits[b], p))
            assert torch.allclose(probs_from_logits(warped[b], UNIT), probs_from_logits(logits[b], p))


def _reference(logits: torch.Tensor, tokens: torch.Tensor, q: torch.Tensor | None, s: SamplingParams,
               gen: torch.Generator | None):  # type: ignore[no-untyped-def]
    if s.greedy:
        return verify_greedy(logits, tokens, s)
    return verify_random(logits, tokens, q, s, Noise.draw(tokens.shape[0], tokens.shape[1], logits.shape[-1], gen, "cpu"))


def test_uniform_rows_are_the_plain_verify() -> None:
    logits, tokens, q = _inputs(4, 3, 40)
    for s in MIXED:
        a = verify_rows(logits, tokens, q, RowSampling([s] * 4), torch.Generator().manual_seed(1), _reference)
        b = _reference(logits, tokens, q, s, torch.Generator().manual_seed(1))
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)


def test_a_greedy_row_in_a_mixed_batch_is_greedy() -> None:
    logits, tokens, q = _inputs(30, 3, 40)
    rows = RowSampling([MIXED[b % 3] for b in range(30)])
    got = verify_rows(logits, tokens, q, rows, torch.Generator().manual_seed(2), _reference)
    greedy = verify_greedy(logits, tokens, MIXED[0])
    assert torch.equal(got.tokens[::3], greedy.tokens[::3])


def test_a_seeded_row_emits_its_gumbel_max_sample_whatever_the_draft() -> None:
    logits, tokens, q = _inputs(3, 4, 50)
    rows = RowSampling(MIXED, seeds=[None, 11, 12], starts=[5, 9, 2])
    warped = warp_logits(logits, rows.params)
    target = torch.argmax(warped[1:] + gumbel_noise(torch.tensor([11, 12]), torch.tensor([9, 2]), 5, 50), dim=-1)
    for draft in (tokens, target[:, :4].repeat(3, 1)[:3]):
        got = verify_rows(logits, draft, None, rows, torch.Generator().manual_seed(3), _reference)
        for b in (1, 2):
            n = int(got.num_accepted[b])
            assert got.tokens[b, : n + 1].tolist() == target[b - 1, : n + 1].tolist()


def test_seeded_first_token_follows_the_rows_law() -> None:
    """Over seeds, a seeded row's token is distributed as its warped p (chi-square)."""
    logits = torch.randn((1, 1, 12), generator=torch.Generator().manual_seed(4)) * 2
    s = MIXED[2]
    n = 6000
    rows = RowSampling([s] * n, seeds=list(range(n)), starts=[7] * n)
    got = verify_rows(logits.expand(n, 1, 12), torch.zeros((n, 0), dtype=torch.long), None, rows, None, _reference)
    p = probs_from_logits(logits[0, 0], s)
    keep = p > 0
    counts = torch.bincount(got.tokens[:, 0], minlength=12).double()
    assert counts[~keep].sum() == 0
    expected = p[keep].double() / p[keep].double().sum() * n
    assert stats.chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("name", ["reference", "triton"])
def test_bundled_verifiers_verify_rows(name: str) -> None:
    verifier = vc.load_verifier_or_skip(name, config={"noise": "exact"} if name == "triton" else None)
    assert isinstance(verifier, VerifiesRows)
    logits, tokens, q = _inputs(6, 3, 37)
    rows = RowSampling([MIXED[b % 3] for b in range(6)], seeds=[None, None, None, 5, None, None], starts=[4] * 6)
    got = verifier.verify_rows(logits, tokens, q, rows, torch.Generator().manual_seed(9))
    want = verify_rows(logits, tokens, q, rows, torch.Generator().manual_seed(9), _reference)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)
