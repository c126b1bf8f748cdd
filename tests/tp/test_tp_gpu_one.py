"""One GPU (NCCL, CUDA graphs): one rank through the sharded code scores as the plain target.

What one GPU can check of the two-GPU path: the all-reduces of a one-rank NCCL group
captured inside the target's graphs, replayed step after step, and the tree commit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny import tiny_family

from flashspec_fast.options import FastTargetOptions
from flashspec_fast.target import make_target
from flashspec_fast.tp import make_tp_target

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_one_rank_with_graphs_scores_as_the_plain_target(tmp_path: Path) -> None:
    path = tiny_family(tmp_path)["target"]
    opts = FastTargetOptions(model=str(path), dtype="float32", device="cuda:0", max_len=128, compile=True,
                             chat_template=False)
    plain, sharded = make_target(opts), make_tp_target(opts, 1)
    try:
        tokens, lengths = torch.tensor([[1, 2, 3, 4, 5, 0, 0, 0], [3, 4, 5, 6, 7, 8, 9, 10]]), [5, 8]
        parents = torch.tensor([-1, -1, 0, 1])
        for t in (plain, sharded):
            t.prefill(tokens, lengths)
        for step in range(3):  # the second and third steps replay the captured graphs
            draft = torch.tensor([[step + 1, 2, 3, 4], [5, 6, 7, step + 8]], device="cuda")
            want, got = plain.score_tree(tokens, lengths, draft, parents), sharded.score_tree(tokens, lengths, draft, parents)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            paths = torch.tensor([[0, 2], [1, -1]])
            for t in (plain, sharded):
                t.commit_path(paths)
            lengths = [n + 1 + k for n, k in zip(lengths, (2, 1), strict=True)]
            tokens = torch.cat([tokens, torch.full((2, 4), 6)], dim=1)
        assert sharded.graphs.captures > 0
    finally:
        sharded.close()
