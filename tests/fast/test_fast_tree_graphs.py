"""The fast target keys a tree forward's graph on (batch, node count, span), never on the tree's
shape, which reaches the forward as data: a dynamic tree, whose shape changes every step at a
fixed node count, replays one graph.

Off the GPU no graph can be captured: a fake graph re-runs the captured function on the captured
input tensors (as a CUDA graph re-reads its addresses), so a shape baked into the function rather
than copied into its inputs scores the first shape's tree again here, as it would on the GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_fast import graphs as graph_module
from flashspec_fast.options import FastOptions
from flashspec_fast.target import FastTarget, make_target

# Trees of 7 nodes, as a dynamic tree's steps may give; then one of 5
SHAPES_7 = [(-1, -1, 0, 0, 1, 2, 5), (-1, 0, 1, 2, 3, 4, 5), (-1, -1, -1, 0, 1, 2, 3), (-1, 0, 0, 0, 1, 4, 4)]
NODES = torch.tensor([[5, 6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 5, 6, 7], [9, 9, 9, 2, 2, 3, 3]])


@pytest.fixture(scope="module")
def target_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family(tmp_path_factory.mktemp("fast_tree_graphs"))["target"]


def _target(path: Path) -> FastTarget:
    opts = FastOptions(model=str(path), dtype="float32", device="cpu", max_len=128, compile=False,
                       attention="sdpa", chat_template=False)  # fmt: skip
    return make_target(opts)


def _batch() -> tuple[torch.Tensor, list[int]]:
    tokens, lengths = torch.zeros((3, 40), dtype=torch.long), [5, 7, 2]
    tokens[0, :5] = torch.tensor([1, 2, 3, 4, 5])
    tokens[1, :7] = torch.tensor([3, 4, 5, 6, 7, 8, 9])
    tokens[2, :2] = torch.tensor([12, 13])
    return tokens, lengths


class FakeGraph:
    def __init__(self, fn: Any, inputs: list[torch.Tensor], out: torch.Tensor) -> None:
        self.fn, self.inputs, self.out = fn, inputs, out

    def pool(self) -> None:
        return None

    def replay(self) -> None:
        self.out.copy_(self.fn(*self.inputs))


def test_one_graph_scores_every_tree_shape_of_a_node_count(target_path: Path, monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:  # fmt: skip
    def fake_capture(fn: Any, inputs: list[torch.Tensor], pool: Any, warmups: int) -> tuple[FakeGraph, Any]:
        out = fn(*inputs)
        return FakeGraph(fn, inputs, out), out

    monkeypatch.setattr(graph_module, "capture", fake_capture)
    tokens, lengths = _batch()
    graphed, eager = _target(target_path), _target(target_path)
    graphed.graphs.enabled = True
    for parents in [*SHAPES_7, (-1, 0, 0, 1, 2)]:
        nodes = NODES[:, : len(parents)]
        graphed.prefill(tokens, lengths)
        eager.prefill(tokens, lengths)
        got = graphed.score_tree(tokens, lengths, nodes, torch.tensor(parents)).clone()
        want = eager.score_tree(tokens, lengths, nodes, torch.tensor(parents))
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    tree_keys = sorted(k for k in graphed.graphs.keys if k[0] == "tree")
    span = graphed.model.span_for(max(lengths) + 7)
    assert tree_keys == [("tree", 3, 5, graphed.model.span_for(max(lengths) + 5)), ("tree", 3, 7, span)]
    assert sum(1 for k in graphed.graphs._graphs if k[0] == "tree") == 2  # captured once per node count
