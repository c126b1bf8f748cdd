"""flashspec_core.tree.sample_children: a model draft's sibling group drawn without
replacement (``tree_children = "sample"``), and the per-child laws it reports, which the
reference and Triton verifiers must treat exactly as their own without-replacement rule."""

from __future__ import annotations

import pytest
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise, probs_from_logits, race
from flashspec_core.tree import TreeDraft, sample_children, sibling_q, verify_tree_random, without_replacement_rows

_TINY = torch.finfo(torch.float32).tiny


def _group(batch: int, vocab: int, seed: int, zeros: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, V] (about ``zeros`` of each row knocked out, never the whole row) and Exp(1) noise."""
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn((batch, vocab), generator=g)
    drop = (torch.rand((batch, vocab), generator=g) < zeros) & (torch.arange(vocab) > 0)
    q = probs_from_logits(logits.masked_fill(drop, float("-inf")), SamplingParams(1.0))
    return q, torch.empty((batch, vocab)).exponential_(generator=g).clamp_min_(_TINY)


def test_children_are_sequential_races_without_the_elder_tokens() -> None:
    """Top-w of q / E is the race for the eldest, then the same race over the rest, ..."""
    q, expo = _group(500, 9, 0)
    tokens, rows = sample_children(q, 4, expo)
    left = q.clone()
    for i in range(4):
        assert torch.equal(tokens[:, i], race(left, expo))
        torch.testing.assert_close(rows[:, i], left / left.sum(-1, keepdim=True))
        left = left.scatter(1, tokens[:, i : i + 1], 0.0)
    assert all(len(set(r)) == 4 for r in tokens.tolist())


def test_a_group_wider_than_the_support_repeats_the_eldest_one_hot() -> None:
    q = torch.tensor([[0.0, 0.7, 0.0, 0.3, 0.0, 0.0]]).repeat(200, 1)
    tokens, rows = sample_children(q, 4, torch.empty_like(q).exponential_(generator=torch.Generator().manual_seed(1)))
    assert sorted(set(tokens[:, 0].tolist())) == [1, 3]  # both orders occur
    assert torch.equal(tokens[:, :2].sort(dim=1).values, torch.tensor([[1, 3]]).expand(200, 2))
    assert torch.equal(tokens[:, 2:], tokens[:, :1].expand(200, 2))
    assert torch.equal(rows[:, 2:], torch.nn.functional.one_hot(tokens[:, 2:], 6).float())
    torch.testing.assert_close(rows.sum(-1), torch.ones(200, 4))


def _trees(q: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> tuple[TreeDraft, TreeDraft]:
    """The root's group as the drafts report it (per-child laws, with replacement) and as
    drawn without replacement from q (one row per child, the verifier removes the elders)."""
    parents = torch.full((tokens.shape[1],), -1, dtype=torch.int64)
    group = q[:, None].expand(-1, tokens.shape[1], -1).contiguous()
    return TreeDraft(tokens, parents, rows), TreeDraft(tokens, parents, group, without_replacement=True)


@pytest.mark.parametrize("zeros", [0.0, 0.7], ids=["full", "sparse"])
def test_reported_laws_verify_as_without_replacement(zeros: float) -> None:
    """Same noise, same tokens: the per-child laws verified with replacement are the
    without-replacement rule on q (sibling_q), wherever the support allows the group."""
    batch, vocab, width = 2_000, 7, 3
    q, expo = _group(batch, vocab, 2, zeros)
    tokens, rows = sample_children(q, width, expo)
    ok = (q > 0).sum(-1) >= width  # a group past q's support has no without-replacement law
    reported, without = _trees(q[ok], tokens[ok], rows[ok])
    for node in range(width):
        torch.testing.assert_close(sibling_q(reported, node, (), vocab),
                                   sibling_q(without, node, tuple(range(node)), vocab))
    g = torch.Generator().manual_seed(3)
    p = probs_from_logits(torch.randn((int(ok.sum()), width + 1, vocab), generator=g), SamplingParams(1.0))
    noise = Noise.draw(p.shape[0], width, vocab, g, "cpu")
    a, b = verify_tree_random(p, reported, noise), verify_tree_random(p, without, noise)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.path, b.path)
    assert 0 < int((a.num_accepted > 0).sum()) < p.shape[0]


def test_triton_verifies_the_reported_laws_as_its_without_replacement_rule() -> None:
    pytest.importorskip("triton")
    from flashspec_kernels.verify_tree import verify_tree_triton

    batch, vocab, width = 256, 11, 3
    q, expo = _group(batch, vocab, 4)
    tokens, rows = sample_children(q, width, expo)
    reported, without = _trees(q, tokens, rows)
    g = torch.Generator().manual_seed(5)
    logits = torch.randn((batch, width + 1, vocab), generator=g)
    sampling = SamplingParams(1.0)
    noise = Noise.draw(batch, width, vocab, g, "cpu")
    want = verify_tree_random(probs_from_logits(logits, sampling), without, noise)
    got = verify_tree_triton(logits, tokens, reported.parents, rows, sampling, noise=noise)  # type: ignore[arg-type]
    assert torch.equal(want.tokens, got.tokens) and torch.equal(want.path, got.path)


def test_without_replacement_rows_zero_when_nothing_is_left() -> None:
    q = torch.tensor([[0.5, 0.5, 0.0]])
    rows = without_replacement_rows(q, torch.tensor([[0, 1, 2]]))
    torch.testing.assert_close(rows[0, :2], torch.tensor([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]]))
    assert torch.equal(rows[0, 2], torch.zeros(3))
