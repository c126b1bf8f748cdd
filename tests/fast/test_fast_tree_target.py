"""The fast target scores draft trees: per node the logits of a chain forward of its path,
and after commit_path the cache of a target that only ever saw the accepted path.

CPU, float32, tiny random Qwen2 models; SDPA and the Triton kernel (interpreted)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from _host_reads import no_host_reads
from _tiny import tiny_family

from flashspec_core.contracts import ScoresTrees
from flashspec_core.tree import path_to
from flashspec_fast.options import FastOptions
from flashspec_fast.target import FastTarget, kept_counts, make_target, path_moves

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


def path_moves_ref(starts: Sequence[int], paths: torch.Tensor, max_len: int) -> tuple[torch.Tensor, list[int]]:
    """The host version path_moves replaced: moves only up to the batch's most kept nodes
    ([2, B * max kept]), built on the host, and the kept counts read back."""
    paths = paths.cpu()
    kept = (paths >= 0).long().cumprod(1).sum(1) if paths.shape[1] else torch.zeros(paths.shape[0], dtype=torch.long)
    width = int(kept.max()) if kept.numel() else 0
    cols = torch.arange(width)[None]  # [1, width]
    base = torch.arange(len(starts))[:, None] * max_len + torch.tensor(list(starts), dtype=torch.long)[:, None]
    src = base + torch.where(cols < kept[:, None], paths[:, :width], cols)
    return torch.stack([src.flatten(), (base + cols).flatten()]), [int(k) for k in kept.tolist()]


def _moved(cache: torch.Tensor, moves: torch.Tensor) -> torch.Tensor:
    """move_slots' semantics on a [B * S, C] cache: every source read before any write."""
    out = cache.clone()
    out.index_copy_(0, moves[1], cache.index_select(0, moves[0]))
    return out


def _random_paths(gen: torch.Generator, batch: int, depth: int, nodes: int) -> torch.Tensor:
    """Each row a random prefix of increasing node ids (a tree path in level order), -1 padded."""
    paths = torch.full((batch, depth), -1, dtype=torch.long)
    for b in range(batch):
        kept = int(torch.randint(0, depth + 1, (1,), generator=gen))
        paths[b, :kept] = torch.randperm(nodes, generator=gen)[:kept].sort().values
    return paths


@pytest.mark.parametrize("below", [None, 3, 6])
def test_path_moves_equal_the_host_reference_for_random_paths(below: int | None) -> None:
    """The same copies as the host version where it copies, self-copies after, and the same
    cache afterwards; ``below`` (the draft's unfed last level) cuts a path as a -1 would."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        batch, depth, max_len = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(0, 5, (1,), generator=gen)), 40
        starts = torch.randint(1, max_len - 2 * depth - 8, (batch,), generator=gen)
        paths = _random_paths(gen, batch, depth, nodes=2 * depth + 8)
        cut = paths if below is None else torch.where(paths < below, paths, -1)
        want, want_kept = path_moves_ref(starts.tolist(), cut, max_len)
        got = path_moves(paths, starts, max_len, below)
        assert got.shape == (2, batch * depth) and kept_counts(paths, below) == want_kept
        width = max(want_kept, default=0)
        rows = got.view(2, batch, depth)
        assert torch.equal(rows[:, :, :width].reshape(2, -1), want)
        assert torch.equal(rows[0, :, width:], rows[1, :, width:])  # padding: self-copies
        cache = torch.randn((batch * max_len, 3), generator=gen)
        assert torch.equal(_moved(cache, got), _moved(cache, want))


def test_path_moves_compact_each_row_and_pad_with_self_copies() -> None:
    paths = torch.tensor([[1, 3, 6], [2, -1, -1]])
    moves = path_moves(paths, torch.tensor([5, 7]), max_len=100)
    assert kept_counts(paths) == [3, 1]
    assert moves[0].tolist() == [6, 8, 11, 109, 108, 109]  # sources: row 1 pads with its own slots
    assert moves[1].tolist() == [5, 6, 7, 107, 108, 109]
    none = torch.full((1, 2), -1)
    assert path_moves(none, torch.tensor([5]), max_len=100).tolist() == [[5, 6], [5, 6]] and kept_counts(none) == [0]
    assert kept_counts(torch.tensor([[0, 2, 5]]), below=5) == [2]  # node 5 is not below 5: the path ends there


def test_the_guard_catches_the_host_reference() -> None:
    """The old host version reads its kept counts back: the guard must refuse it."""
    paths = torch.tensor([[0, 2, -1], [1, -1, -1]])
    with no_host_reads(paths), pytest.raises(AssertionError, match="other than the host copy"):
        path_moves_ref([5, 7], paths, max_len=100)


def test_commit_path_reads_nothing_but_the_pipelines_host_copy(target_path: Path) -> None:
    tokens, lengths = _batch()
    tree = _fresh(_target(target_path, "sdpa"), tokens, lengths)
    tree.score_tree(tokens, lengths, NODES, PARENTS)
    verdict = torch.tensor([[2, 0, 2, 5, -1, 0], [1, 1, -1, -1, -1, 0], [0, -1, -1, -1, -1, 0]])
    paths = verdict[:, 1:-1]  # the pipeline's slice of its one host copy
    with no_host_reads(paths):
        tree.commit_path(paths)
    assert tree.cached == [5 + 3, 7 + 1, 2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_cache_after_commit_path_is_a_chain_targets(target_path: Path, seed: int) -> None:
    """Each row keeps the path to a random node (or nothing): the committed slots hold what a
    chain target that scored those tokens alone holds."""
    tokens, lengths = _batch()
    gen = torch.Generator().manual_seed(seed)
    depth = max(len(path_to(PARENTS, n)) for n in range(len(PARENTS)))
    paths = torch.full((3, depth), -1, dtype=torch.long)
    for b in range(3):
        node = int(torch.randint(-1, len(PARENTS), (1,), generator=gen))
        if node >= 0:
            path = path_to(PARENTS, node)[: int(torch.randint(1, depth + 1, (1,), generator=gen))]
            paths[b, : len(path)] = torch.tensor(path)
    tree = _fresh(_target(target_path, "sdpa"), tokens, lengths)
    tree.score_tree(tokens, lengths, NODES, PARENTS)
    tree.commit_path(paths)
    kept = kept_counts(paths)
    chain = _fresh(_target(target_path, "sdpa"), tokens, lengths)
    drafts = NODES.gather(1, paths.clamp_min(0))  # past a row's count: any token, rolled back
    chain.score(tokens, lengths, drafts)
    chain.rollback(kept)
    assert tree.cached == chain.cached == [n + k for n, k in zip(lengths, kept, strict=True)]
    for b, n in enumerate(tree.cached):
        for got, want in ((tree.model.k_cache, chain.model.k_cache), (tree.model.v_cache, chain.model.v_cache)):
            torch.testing.assert_close(got[:, b, :n], want[:, b, :n], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_commit_path_does_not_sync_on_cuda(target_path: Path) -> None:
    """Under CUDA's sync debug mode a host sync inside commit_path raises; graphs captured first."""
    tokens, lengths = _batch()
    opts = FastOptions(model=str(target_path), dtype="float32", device="cuda", max_len=128, compile=True,
                       attention="sdpa", chat_template=False)
    tree = make_target(opts)
    paths = torch.tensor([[0, 2, 5, -1], [1, -1, -1, -1], [-1, -1, -1, -1]])
    for debug in (False, True):
        _fresh(tree, tokens, lengths).score_tree(tokens, lengths, NODES.cuda(), PARENTS)
        torch.cuda.synchronize()  # the pipeline's one read
        torch.cuda.set_sync_debug_mode("error" if debug else "default")
        try:
            tree.commit_path(paths)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert tree.cached == [5 + 3, 7 + 1, 2]
