"""The tree verifier takes a tree's shape as device data: the kernels read it only from the node
and elder tables, so with its outputs sized by the node count one captured graph serves every
tree of that node count (a dynamic tree changes its shape each step at a fixed count).

Off the GPU no graph can be captured: a fake graph re-runs the captured step on the captured
tensors, as a CUDA graph re-reads its addresses, so a shape baked into the step (rather than
copied into its inputs) gives a stale verdict here as it would on the GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from test_verify_tree_kernels import DEV, assert_same, small_blocks, tree_inputs  # noqa: E402, F401

from flashspec_core.contracts import SamplingParams  # noqa: E402
from flashspec_core.tree import TreeVerdict, node_depths  # noqa: E402
from flashspec_kernels import verify_tree as tree_ops  # noqa: E402
from flashspec_triton import stepgraphs  # noqa: E402
from flashspec_triton.plugin import TritonVerifier, TritonVerifierConfig  # noqa: E402

S = SamplingParams
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
# Trees of 6 nodes, as a dynamic tree's steps may give: depths 1 to 6, widths 1 to 6
SHAPES_6 = [
    (-1, -1, 0, 0, 1, 2),
    (-1, 0, 1, 2, 3, 4),
    (-1, -1, -1, -1, -1, -1),
    (-1, 0, 0, 1, 1, 3),
    (-1, -1, 1, 2, 2, 0),
]


def padded(logits, tokens, parents, probs, sampling, noise, without: bool) -> TreeVerdict:
    """verify_tree_tables with the outputs sized by the node count, as the plugin calls it."""
    nodes, elder = (t.to(DEV) for t in tree_ops.tree_tables(parents))
    return tree_ops.verify_tree_tables(logits, tokens, nodes, elder if without else None, len(parents), probs,
                                       sampling, noise=noise, without_replacement=without)  # fmt: skip


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("mode", ["deterministic", "iid", "without"])
def test_tables_padded_to_the_node_count_give_the_references_tokens(mode: str) -> None:
    """Over several shapes of one node count, temperatures and greedy: the verdict padded to
    depth N is the reference's, -1 past the tree's depth."""
    without = mode == "without"
    for seed, parents in enumerate(SHAPES_6):
        depth = max(node_depths(parents))
        logits, tokens, probs, noise = tree_inputs(3, parents, 301, mode, seed=40 + seed)
        for sampling in (S(1.0), S(0.7, top_k=20), S(0.0)):
            if without and sampling.greedy:
                continue
            given = None if sampling.greedy else noise
            got = padded(logits, tokens, parents, probs, sampling, given, without)
            want = tree_ops.verify_tree_ref(logits, tokens, parents, probs, sampling, given, without)
            assert got.path.shape == (3, 6) and got.tokens.shape == (3, 7)
            assert (got.path[:, depth:] == -1).all() and (got.tokens[:, depth + 1 :] == -1).all()
            cut = TreeVerdict(path=got.path[:, :depth], num_accepted=got.num_accepted, tokens=got.tokens[:, : depth + 1])
            assert_same(cut, want)


def test_tables_are_checked() -> None:
    logits, tokens = torch.zeros((1, 3, 5)), torch.zeros((1, 2), dtype=torch.long)
    nodes, elder = tree_ops.tree_tables((-1, 0))
    run = lambda n, e, d, **kw: tree_ops.verify_tree_tables(logits, tokens, n, e, d, None, S(0.0), **kw)  # noqa: E731
    with pytest.raises(ValueError, match=r"node_table must be \[3, N\] int32"):
        run(nodes[:, :1], elder, 2)
    with pytest.raises(ValueError, match=r"elder must be \[N, W\] int32"):
        run(nodes, elder.long(), 2)
    with pytest.raises(ValueError, match="must bound the depth"):
        run(nodes, elder, 3)
    with pytest.raises(ValueError, match="needs the elder-sibling table"):
        tree_ops.verify_tree_tables(logits, tokens, nodes, None, 2, torch.full((1, 2, 5), 0.2), S(1.0),
                                    noise=None, without_replacement=True)  # fmt: skip


class FakeGraph:
    def __init__(self, step, args, out: TreeVerdict) -> None:
        self.step, self.args, self.out = step, list(args), out

    def pool(self) -> None:
        return None

    def replay(self) -> None:
        v = self.step(*self.args)
        for name in ("path", "num_accepted", "tokens", "flags"):
            getattr(self.out, name).copy_(getattr(v, name))


@pytest.mark.usefixtures("small_blocks")
@pytest.mark.parametrize("mode", ["deterministic", "without"])
def test_one_graph_serves_every_shape_of_a_node_count(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The plugin keys a tree step's graph on its node count: shapes of 6 nodes share one capture
    and each replay emits the reference's verdict for its own shape (verdict shapes included);
    another node count captures another graph."""
    captures: list[int] = []

    def fake_capture(step, args, pool, warmups):
        captures.append(1)
        out = step(*args)
        return FakeGraph(step, args, out), out

    monkeypatch.setattr(stepgraphs.StepGraphs, "usable", lambda self, logits: True)
    exact = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV)
    exact._graphs = stepgraphs.StepGraphs(1 << 30, capture_fn=fake_capture)
    without = mode == "without"
    sampling = S(1.0) if without else S(0.0)
    # elder tables of one width without replacement (its width is a size, part of the key)
    shapes = [s for s in SHAPES_6 if max(map(len, _elders(s))) == 1] if without else SHAPES_6
    assert len(shapes) >= 2
    for seed, parents in enumerate(shapes):
        logits, tokens, probs, noise = tree_inputs(2, parents, 300, "without" if without else "deterministic",
                                                   seed=60 + seed)  # fmt: skip
        given = None if sampling.greedy else noise
        ptensor = torch.tensor(parents)
        got = exact.verify_tree_with_noise(logits, tokens, ptensor, probs, sampling, given, without_replacement=without)
        want = tree_ops.verify_tree_ref(logits, tokens, parents, probs, sampling, given, without)
        assert_same(got, want)
    assert len(captures) == 1
    logits, tokens, probs, noise = tree_inputs(2, (-1, 0, 0), 300, mode, seed=70)
    exact.verify_tree_with_noise(logits, tokens, torch.tensor([-1, 0, 0]), probs, sampling,
                                 None if sampling.greedy else noise, without_replacement=without)  # fmt: skip
    assert len(captures) == 2  # another node count: another graph


def _elders(parents: tuple[int, ...]) -> list[list[int]]:
    return [[m for m in range(n) if parents[m] == p] or [-1] for n, p in enumerate(parents)]
