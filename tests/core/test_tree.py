"""flashspec_core.tree: tree shape helpers, TreeDraft validation, verification edge cases
decided by hand, equality with the chain reference for width-1 trees, and the
tree-attention helpers against a chain forward of the accepted path."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
import pytest
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise, probs_from_logits
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.tree_exactness import impossible_emissions
from flashspec_core.testing.tree_mutants import zero_uniform_inputs
from flashspec_core.tree import (
    TreeDraft,
    accepted_cache_indices,
    ancestor_matrix,
    chain_parents,
    check_parents,
    children,
    elder_siblings,
    node_depths,
    path_to,
    residual,
    sibling_q,
    tree_attention_mask,
    tree_positions,
    verify_tree,
    verify_tree_greedy,
    verify_tree_random,
)
from flashspec_reference.plugin import ReferenceVerifier

# root -> 0, 1; 0 -> 2, 3, 4; 1 -> 5; 2 -> 6, 7
RAGGED = (-1, -1, 0, 0, 0, 1, 2, 2)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Small tensors: threads only contend on the shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _parents(parents: tuple[int, ...] = RAGGED) -> torch.Tensor:
    return torch.tensor(parents, dtype=torch.int64)


def _noise(uniform: list[list[float]], vocab: int) -> Noise:
    u = torch.tensor(uniform, dtype=torch.float32)
    return Noise(u, torch.ones((u.shape[0], vocab)))


def test_shape_helpers() -> None:
    assert node_depths(RAGGED) == (1, 1, 2, 2, 2, 2, 3, 3)
    assert children(RAGGED) == (0, 1) and children(RAGGED, 0) == (2, 3, 4) and children(RAGGED, 7) == ()
    assert path_to(RAGGED, 7) == (0, 2, 7) and path_to(RAGGED, -1) == ()
    assert elder_siblings(RAGGED) == ((), (0,), (), (2,), (2, 3), (), (), (6,))
    assert chain_parents(3).tolist() == [-1, 0, 1] and node_depths(chain_parents(3)) == (1, 2, 3)
    draft = TreeDraft(torch.zeros((2, 8), dtype=torch.int64), _parents())
    assert draft.max_depth == 3 and draft.children(1) == (5,) and draft.path_to(5) == (1, 5)


@pytest.mark.parametrize(
    ("parents", "message"),
    [((-1, 1), r"parents\[1\] = 1"), ((-1, 0, 3, 1), r"parents\[2\] = 3"), ((-2,), r"parents\[0\] = -2")],
)
def test_parents_must_be_topological(parents: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_parents(parents)
    with pytest.raises(ValueError, match=message):
        TreeDraft(torch.zeros((1, len(parents)), dtype=torch.int64), torch.tensor(parents))


def test_helpers_reject_out_of_range_nodes() -> None:
    with pytest.raises(ValueError, match="node 8 is out of range"):
        children(RAGGED, 8)
    with pytest.raises(ValueError, match="node -2 is out of range"):
        path_to(RAGGED, -2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tokens": torch.zeros((2, 8), dtype=torch.int32)}, r"tokens must be \[B, N\] int64"),
        ({"parents": _parents()[:7]}, "parents has 7 nodes"),
        ({"parents": _parents().int()}, r"parents must be a \[N\] int64 CPU tensor"),
        ({"q": torch.full((2, 8, 5), 0.2, dtype=torch.float64)}, r"q must be \[B, N, V\] float32"),
        ({"q": torch.full((2, 7, 5), 0.2)}, r"q must be \[B, N, V\] float32"),
        ({"q": None, "without_replacement": True}, "without_replacement needs q"),
    ],
)
def test_tree_draft_validation(change: dict[str, object], message: str) -> None:
    fields = {"tokens": torch.zeros((2, 8), dtype=torch.int64), "parents": _parents(), "q": torch.full((2, 8, 5), 0.2)}
    with pytest.raises(ValueError, match=message):
        TreeDraft(**{**fields, **change})  # type: ignore[arg-type]


def test_verify_checks_shapes() -> None:
    draft = TreeDraft(torch.zeros((2, 8), dtype=torch.int64), _parents())
    with pytest.raises(ValueError, match=r"p must be \[B, N \+ 1, V\]"):
        verify_tree(torch.full((2, 8, 4), 0.25), draft)
    with pytest.raises(ValueError, match=r"noise must be uniform \[B, N\]"):
        verify_tree(torch.full((2, 9, 4), 0.25), draft, Noise(torch.zeros((2, 7)), torch.ones((2, 4))))
    with pytest.raises(ValueError, match="draft q has V = 5"):
        verify_tree(torch.full((2, 9, 4), 0.25), attrs.evolve(draft, q=torch.full((2, 8, 5), 0.2)))


def test_zero_probability_node_never_accepted_even_with_u_zero() -> None:
    p, draft, noise = zero_uniform_inputs()
    verdict = verify_tree_random(p, draft, noise)
    assert verdict.num_accepted.eq(0).all()
    assert impossible_emissions(p, verdict) == 0


def test_all_rejected_draws_from_the_final_residual() -> None:
    """p = (0.3, 0.3, 0.4), deterministic children 0 then 1, u = 0.9: both rejected,
    the residual is p without 0 and 1, i.e. all on token 2 whatever the exponentials."""
    p = torch.tensor([[0.3, 0.3, 0.4]]).expand(3, 3)[None].repeat(4, 1, 1)  # [4, 3, 3]
    draft = TreeDraft(torch.tensor([[0, 1]] * 4), _parents((-1, -1)))
    noise = Noise(torch.full((4, 2), 0.9), torch.rand((4, 3)) + 0.01)
    verdict = verify_tree_random(p, draft, noise)
    assert verdict.tokens.tolist() == [[2, -1]] * 4 and verdict.num_accepted.tolist() == [0] * 4


def test_younger_sibling_is_tested_against_the_residual() -> None:
    """p = (0.5, 0.5), i.i.d. siblings from q = (1, 0): the eldest (token 0) is accepted iff
    u < 0.5; after its rejection the residual is (0, 1), so a younger token-1 sibling is
    accepted for any u (its q is 0), and one more token-0 sibling is never accepted."""
    p = torch.tensor([[0.5, 0.5]] * 4)[None].repeat(3, 1, 1)  # [3, 4, 2]
    q = torch.tensor([1.0, 0.0]).expand(3, 3, 2).contiguous()
    tokens = torch.tensor([[0, 1, 0], [0, 0, 1], [0, 0, 1]])
    draft = TreeDraft(tokens, _parents((-1, -1, -1)), q)
    verdict = verify_tree_random(p, draft, _noise([[0.7, 0.99, 0.0], [0.7, 0.0, 0.5], [0.2, 0.9, 0.9]], 2))
    assert verdict.path[:, 0].tolist() == [1, 2, 0]


def test_accepted_node_descends_with_its_own_p() -> None:
    """Root child 0 (token 1) is sure to pass; its child 1 (token 2) has p = 0 at the
    root's position but p = 1 at node 0's, so it must be accepted, and the bonus comes from
    p at node 1."""
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]])
    draft = TreeDraft(torch.tensor([[1, 2]]), _parents((-1, 0)))
    verdict = verify_tree_random(p, draft, _noise([[0.5, 0.5]], 3))
    assert verdict.tokens.tolist() == [[1, 2, 0]] and verdict.path.tolist() == [[0, 1]]


def test_without_replacement_q_removes_elder_siblings() -> None:
    q = torch.tensor([[0.5, 0.3, 0.2]]).expand(1, 3, 3).contiguous()
    draft = TreeDraft(torch.tensor([[0, 1, 2]]), _parents((-1, -1, -1)), q, without_replacement=True)
    torch.testing.assert_close(sibling_q(draft, 0, (), 3), torch.tensor([[0.5, 0.3, 0.2]]))
    torch.testing.assert_close(sibling_q(draft, 1, (0,), 3), torch.tensor([[0.0, 0.6, 0.4]]))
    torch.testing.assert_close(sibling_q(draft, 2, (0, 1), 3), torch.tensor([[0.0, 0.0, 1.0]]))
    with_replacement = attrs.evolve(draft, without_replacement=False)
    torch.testing.assert_close(sibling_q(with_replacement, 2, (0, 1), 3), torch.tensor([[0.5, 0.3, 0.2]]))


def test_residual_falls_back_to_p_when_empty() -> None:
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    torch.testing.assert_close(
        residual(p, torch.tensor([[0.2, 0.8], [1.0, 0.0]])), torch.tensor([[0.2, 0.8], [0.0, 1.0]])
    )


def test_generator_and_noise_agree() -> None:
    g = torch.Generator().manual_seed(5)
    p = torch.softmax(torch.randn((64, 9, 7), generator=g), dim=-1)
    q = torch.softmax(torch.randn((64, 8, 7), generator=g), dim=-1)
    draft = TreeDraft(torch.randint(0, 7, (64, 8), generator=g), _parents(), q)
    want = verify_tree_random(p, draft, Noise.draw(64, 8, 7, torch.Generator().manual_seed(1), "cpu"))
    got = verify_tree(p, draft, torch.Generator().manual_seed(1))
    assert torch.equal(want.tokens, got.tokens) and torch.equal(want.path, got.path)
    assert got.as_verdict().num_accepted.equal(got.num_accepted)


def test_greedy_follows_the_eldest_argmax_child() -> None:
    scores = torch.zeros((1, 9, 4))
    best = [1, 2, 0, 0, 3, 0, 0, 0, 0]  # argmax at the root and at each node
    scores[0, torch.arange(9), torch.tensor(best)] = 1.0
    # root children: 0 (token 1), 1 (token 1, a duplicate); 0 -> 2, 3, 4; 2 -> 6, 7
    draft = TreeDraft(torch.tensor([[1, 1, 0, 2, 2, 3, 1, 1]]), _parents())
    verdict = verify_tree_greedy(scores, draft)
    assert verdict.path.tolist() == [[0, 3, -1]] and verdict.tokens.tolist() == [[1, 2, 3, -1]]


SAMPLINGS = [SamplingParams(1.0), SamplingParams(0.6, top_k=5), SamplingParams(1.7, top_p=0.8)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("gamma", [0, 1, 4])
def test_width_one_tree_equals_the_chain_reference(sampling: SamplingParams, deterministic: bool, gamma: int) -> None:
    """Same uniforms and exponentials: the chain verifier and a chain-shaped tree emit the same tokens."""
    inputs = vc.random_inputs(2_000, gamma, 33, seed=3, sampling=sampling, deterministic=deterministic)
    noise = Noise.draw(2_000, gamma, 33, torch.Generator().manual_seed(4), "cpu")
    want = ReferenceVerifier().verify_with_noise(
        inputs.target_logits, inputs.draft_tokens, inputs.draft_probs, sampling, noise
    )
    draft = TreeDraft.chain(inputs.draft_tokens, inputs.draft_probs)
    got = verify_tree(probs_from_logits(inputs.target_logits, sampling), draft, noise)
    assert torch.equal(got.num_accepted, want.num_accepted)
    assert torch.equal(got.tokens, want.tokens)
    if gamma:  # the inputs exercise both outcomes
        assert 0 < int(want.num_accepted.sum()) < 2_000 * gamma


@pytest.mark.parametrize("sampling", [SamplingParams(0.0), SamplingParams(0.0, top_k=3, top_p=0.5)], ids=str)
def test_width_one_greedy_tree_equals_the_chain_reference(sampling: SamplingParams) -> None:
    inputs = vc.random_inputs(2_000, 4, 33, seed=3, sampling=sampling, pattern=["accept", "accept"])
    noise = Noise.draw(2_000, 4, 33, torch.Generator().manual_seed(4), "cpu")
    want = ReferenceVerifier().verify_with_noise(inputs.target_logits, inputs.draft_tokens, None, sampling, noise)
    p = probs_from_logits(inputs.target_logits, sampling)
    got = verify_tree(p, TreeDraft.chain(inputs.draft_tokens), greedy=True)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.num_accepted, want.num_accepted)


def test_attention_mask_and_positions() -> None:
    anc = ancestor_matrix(RAGGED)
    assert anc[7].nonzero().flatten().tolist() == [0, 2, 7] and anc[5].nonzero().flatten().tolist() == [1, 5]
    mask = tree_attention_mask(RAGGED, prefix_len=3)
    assert mask.shape == (8, 11) and mask[:, :3].all()
    assert torch.equal(mask[:, 3:], anc)
    assert tree_positions(RAGGED, start=10).tolist() == [10, 10, 11, 11, 11, 11, 12, 12]
    chain = tree_attention_mask(chain_parents(4), prefix_len=0)
    assert torch.equal(chain, torch.ones((4, 4), dtype=torch.bool).tril())
    with pytest.raises(ValueError, match="prefix_len must be >= 0"):
        tree_attention_mask(RAGGED, -1)


def test_accepted_cache_indices() -> None:
    path = torch.tensor([[0, 2, 7], [1, -1, -1], [-1, -1, -1]])
    assert accepted_cache_indices(path, prefix_len=5).tolist() == [[5, 7, 12], [6, -1, -1], [-1, -1, -1]]
    with pytest.raises(ValueError, match="int64"):
        accepted_cache_indices(path.int())


class _ToyAttention:
    """One causal attention layer with learned absolute positions: enough to tell a wrong
    mask or position id from a right one."""

    def __init__(self, vocab: int, dim: int = 8, positions: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.emb = torch.randn((vocab, dim), generator=g, dtype=torch.float64)
        self.pos = torch.randn((positions, dim), generator=g, dtype=torch.float64)
        self.w = torch.randn((3, dim, dim), generator=g, dtype=torch.float64)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, positions [T]; mask [T, P + T]; cache [2, P, dim] -> outputs [T, dim], kv [2, P + T, dim]."""
        x = self.emb[tokens] + self.pos[positions]
        kv = torch.stack([x @ self.w[1], x @ self.w[2]])
        kv = kv if cache is None else torch.cat([cache, kv], dim=1)
        scores = ((x @ self.w[0]) @ kv[0].T).masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ kv[1], kv


def test_tree_forward_and_compaction_match_a_chain_forward() -> None:
    """Scoring the tree in one forward (mask + positions) gives every accepted node the
    output a chain forward of its path gives, and the compacted cache is the chain's."""
    model = _ToyAttention(vocab=6)
    prefix = torch.tensor([3, 1, 4, 1])
    causal = torch.ones((4, 4), dtype=torch.bool).tril()
    _, cache = model(prefix, torch.arange(4), causal, None)
    nodes = torch.tensor([5, 2, 0, 3, 3, 1, 4, 2])
    out, kv = model(nodes, tree_positions(RAGGED, start=4), tree_attention_mask(RAGGED, prefix_len=4), cache)
    for leaf in range(len(RAGGED)):
        path = list(path_to(RAGGED, leaf))
        d = len(path)
        chain_mask = torch.cat([torch.ones((d, 4), dtype=torch.bool), torch.ones((d, d), dtype=torch.bool).tril()], 1)
        chain_out, chain_kv = model(nodes[path], 4 + torch.arange(d), chain_mask, cache)
        torch.testing.assert_close(out[path], chain_out)
        keep = torch.cat([torch.arange(4), accepted_cache_indices(torch.tensor(path), prefix_len=4)])
        torch.testing.assert_close(kv[:, keep], chain_kv)
