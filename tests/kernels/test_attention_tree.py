"""The Triton decode-attention kernel with a draft tree block against a dense masked reference.

The reference mask is built from :func:`flashspec_core.tree.tree_attention_mask` (slot by
slot, row by row), independently of the kernel's ancestor bitmasks. Shapes cover trees of
1, 3, 7 and 15 nodes (chains, bushes, uneven ones), several rows whose blocks start at
different slots, blocks that straddle a slot block (``BLOCK_N``) and a split boundary,
grouped queries over several row tiles, and a level forward (the draft's) whose queries
are a block's last nodes.
"""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from flashspec_core.tree import ancestor_bits, node_depths, tree_attention_mask, tree_shape  # noqa: E402
from flashspec_kernels import attention as att  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TREES = {
    1: [-1],
    3: [-1, -1, 0],
    7: tree_shape([2, 2, 1], 7),
    15: tree_shape([3, 2, 2], 15),
    "chain7": list(range(-1, 6)),
    "uneven": [-1, 0, 0, 1, 1, 4, -1, 6],
}


def dense_mask(parents: list[int], starts: list[int], queries: list[int], span: int) -> torch.Tensor:
    """[B, T, span] bool: the root query (-1) sees slots 0..start-1; node n sees those and, in
    the block, its row of tree_attention_mask."""
    rows = []
    for s in starts:
        tree = tree_attention_mask(parents, s)  # [N, s + N]
        row = torch.zeros((len(queries), span), dtype=torch.bool)
        for t, node in enumerate(queries):
            if node < 0:
                row[t, :s] = True
            else:
                row[t, : s + len(parents)] = tree[node]
        rows.append(row)
    return torch.stack(rows).to(DEV)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    group = q.shape[2] // k.shape[2]
    span = allowed.shape[-1]
    kk = k[:, :span].transpose(1, 2).repeat_interleave(group, dim=1).double()
    vv = v[:, :span].transpose(1, 2).repeat_interleave(group, dim=1).double()
    scores = q.transpose(1, 2).double() @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    return (torch.softmax(scores, -1) @ vv).transpose(1, 2).float()


def tree_case(parents: list[int], starts: list[int], queries: list[int], heads: int, kv: int, hd: int, slots: int,
              seed: int) -> tuple[torch.Tensor, ...]:
    """q, k, v, pos and the TreeBlock of a forward whose queries are ``queries`` (-1: the root)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    batch, width = len(starts), len(queries)
    q = torch.randn((batch, width, heads, hd), generator=g, device=DEV)
    k = torch.randn((batch, slots, kv, hd), generator=g, device=DEV)
    v = torch.randn((batch, slots, kv, hd), generator=g, device=DEV)
    depths, bits = node_depths(parents), ancestor_bits(parents)
    start = torch.tensor(starts, device=DEV)
    offset = torch.tensor([0 if n < 0 else depths[n] for n in queries], device=DEV)
    pos = start[:, None] - 1 + offset[None]  # the root at start - 1, a node at start + depth - 1
    qbits = torch.tensor([0 if n < 0 else bits[n] for n in queries], device=DEV)[None].expand(batch, -1).contiguous()
    return q, k, v, pos, att.TreeBlock(start=start, bits=qbits, nodes=len(parents))


@pytest.mark.parametrize(
    ("tree", "starts", "heads", "kv", "hd", "span"),
    [
        (1, [5], 4, 4, 16, 64),  # one node, batch 1, one split
        (3, [10, 62, 3], 6, 2, 32, 128),  # a block across the first slot block's end (62..64)
        (7, [60, 1, 120, 33], 12, 2, 64, 256),  # GQA G = 6 over 3 row tiles; blocks across 64 and 128
        (15, [100, 49], 14, 2, 64, 256),  # the widest tree the kernel takes (T = 16), G = 7: 7 tiles
        ("chain7", [7, 64], 4, 2, 80, 128),  # a chain as a tree; head dim padded; block starting on a boundary
        ("uneven", [127, 2, 40], 4, 1, 16, 256),  # one KV head; a block starting at the last slot of a split
    ],
)
def test_tree_block_matches_dense_masked_reference(tree, starts, heads, kv, hd, span) -> None:
    parents = TREES[tree]
    queries = [-1, *range(len(parents))]
    q, k, v, pos, block = tree_case(parents, starts, queries, heads, kv, hd, span + 8, seed=len(parents))
    allowed = dense_mask(parents, starts, queries, span)
    want = reference(q, k, v, allowed)
    got = att.decode_attention(q, k, v, pos, span, tree=block)
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    torch.testing.assert_close(att.decode_attention_ref(q, k, v, pos, span, tree=block), want, rtol=2e-5, atol=2e-5)


def test_a_level_forward_sees_only_its_nodes_ancestors() -> None:
    """The draft's per-level forward: the queries are the block's last level, earlier levels cached."""
    parents = tree_shape([2, 2, 2], 14)
    level = [n for n, d in enumerate(node_depths(parents)) if d == 3]
    block_nodes = parents[: level[-1] + 1]
    q, k, v, pos, block = tree_case(block_nodes, [30, 70], level, 6, 2, 16, 136, seed=3)
    want = reference(q, k, v, dense_mask(block_nodes, [30, 70], level, 128))
    torch.testing.assert_close(att.decode_attention(q, k, v, pos, 128, tree=block), want, rtol=2e-5, atol=2e-5)


def test_planted_values_off_a_nodes_path_change_nothing() -> None:
    """Huge keys and values in the block's non-ancestor slots and above the block leave every
    node's output as it is (those slots are read, and masked to weight zero)."""
    parents = TREES[7]
    queries = [-1, *range(7)]
    q, k, v, pos, block = tree_case(parents, [20, 90], queries, 4, 2, 16, 200, seed=11)
    clean = att.decode_attention(q, k, v, pos, 128, tree=block)
    for node in (3, 5):  # leaves: no query's ancestor but their own
        k2, v2 = k.clone(), v.clone()
        for b, s in enumerate([20, 90]):
            k2[b, s + 7 :], v2[b, s + 7 :] = 1e4, 1e4  # above the block
            k2[b, s + node], v2[b, s + node] = 1e4, 1e4
        planted = att.decode_attention(q, k2, v2, pos, 128, tree=block)
        others = [t for t, n in enumerate(queries) if n != node]
        torch.testing.assert_close(planted[:, others], clean[:, others], rtol=0, atol=0)


def test_bad_tree_block_is_a_clear_error() -> None:
    q, k, v, pos, block = tree_case([-1, 0], [4], [-1, 0, 1], 2, 2, 16, 64, seed=0)
    with pytest.raises(ValueError, match=r"TreeBlock: .*bits \(1, 3\)"):
        att.decode_attention(q[:, :2], k, v, pos[:, :2], 64, tree=block)
