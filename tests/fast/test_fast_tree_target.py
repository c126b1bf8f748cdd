"""The fast target scores draft trees: per node the logits of a chain forward of its path,
and after commit_path the cache of a target that only ever saw the accepted path.

CPU, float32, tiny random Qwen2 models; SDPA and the Triton kernel (interpreted)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny import tiny_family

from flashspec_core.contracts import ScoresTrees
from flashspec_core.tree import path_to
from flashspec_fast.options import FastOptions
from flashspec_fast.target import FastTarget, make_target, path_moves

ATTENTIONS = ["sdpa", pytest.param("triton", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("triton") is None, reason="triton not installed"))]
PARENTS = torch.tensor([-1, -1, 0, 0, 1, 2, 5])  # depths 1 1 2 2 2 3 4
NODES = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 5, 6, 7], [9, 9, 9, 2, 2, 3, 3]])


@pytest.fixture(scope="module")
def target_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family(tmp_path_factory.mktemp("fast_tree"))["target"]


def _target(path: Path, attention: str) -> FastTarget:
    opts = FastOptions(model=str(path), dtype="float32", device="cpu", max_len=128, compile=False,
                       attention=attention, chat_template=False)
    return make_target(opts)


def _batch() -> tuple[torch.Tensor, list[int]]:
    tokens, lengths = torch.zeros((3, 40), dtype=torch.long), [5, 7, 2]
    tokens[0, :5] = torch.tensor([1, 2, 3, 4, 5])
    tokens[1, :7] = torch.tensor([3, 4, 5, 6, 7, 8, 9])
    tokens[2, :2] = torch.tensor([12, 13])
    return tokens, lengths


def _fresh(target: FastTarget, tokens: torch.Tensor, lengths: list[int]) -> FastTarget:
    target.prefill(tokens, lengths)
    return target


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_score_tree_gives_each_node_its_paths_chain_logits(target_path: Path, attention: str) -> None:
    tokens, lengths = _batch()
    tree, chain = _target(target_path, attention), _target(target_path, attention)
    logits = _fresh(tree, tokens, lengths).score_tree(tokens, lengths, NODES, PARENTS)
    assert logits.shape == (3, 8, 16)
    for n in range(len(PARENTS)):
        want = _fresh(chain, tokens, lengths).score(tokens, lengths, NODES[:, list(path_to(PARENTS, n))])
        torch.testing.assert_close(logits[:, n + 1], want[:, -1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits[:, 0], want[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_commit_path_leaves_the_cache_of_the_accepted_path_alone(target_path: Path, attention: str) -> None:
    """Rejected nodes' keys and values are planted with huge values before the commit: the next
    step scores exactly as on a target that only ever saw the accepted tokens."""
    tokens, lengths = _batch()
    tree = _fresh(_target(target_path, attention), tokens, lengths)
    tree.score_tree(tokens, lengths, NODES, PARENTS)
    paths = torch.tensor([[0, 2, -1, -1], [1, 4, -1, -1], [-1, -1, -1, -1]])  # row 2 keeps nothing
    model = tree.model
    for b, row in enumerate(paths.tolist()):
        for n in set(range(len(PARENTS))) - set(row):
            model.k_cache[:, b, lengths[b] + n] = 1e4
            model.v_cache[:, b, lengths[b] + n] = -1e4
    tree.commit_path(paths)
    accepted = [[NODES[b, n].item() for n in row if n >= 0] for b, row in enumerate(paths.tolist())]
    assert tree.cached == [n + len(a) for n, a in zip(lengths, accepted, strict=True)]
    for b, kept in enumerate(accepted):
        new = [*kept, 14]  # the accepted path, then a recovered or bonus token
        tokens[b, lengths[b] : lengths[b] + len(new)] = torch.tensor(new)
        lengths[b] += len(new)
    extra = torch.tensor([[1, 2], [3, 4], [5, 6]])
    after = tree.score(tokens, lengths, extra)
    want = _fresh(_target(target_path, attention), tokens, lengths).score(tokens, lengths, extra)
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-5)


def test_fast_target_declares_scores_trees(target_path: Path) -> None:
    """The pipeline routes tree arms only to targets that pass this check."""
    assert isinstance(_target(target_path, "sdpa"), ScoresTrees)


def test_path_moves_compact_each_row_and_pad_with_self_copies() -> None:
    moves, kept = path_moves([5, 7], torch.tensor([[1, 3, 6], [2, -1, -1]]), max_len=100)
    assert kept == [3, 1]
    assert moves[0].tolist() == [6, 8, 11, 109, 108, 109]  # sources: row 1 pads with its own slots
    assert moves[1].tolist() == [5, 6, 7, 107, 108, 109]
    empty, none = path_moves([5], torch.full((1, 2), -1), max_len=100)
    assert empty.shape == (2, 0) and none == [0]
