"""Dynamic draft trees (tree_depth, tree_expand): the growth rule on hand-made draft
distributions, its invariants (parents first, the budget, fixed forward widths), and the
hf and fast drafts' trees end to end on tiny models (CPU, float32)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import DraftContext
from flashspec_core.tree import Feed, check_parents, grow_tree, keep_best, tree_candidates
from flashspec_fast.draft import FastDraftOptions, make_draft
from flashspec_hf.draft import HFDraft
from flashspec_hf.keys import DraftOptions
from flashspec_hf.loading import ModelOptions, load_model

V = 6
# The draft's next-token probabilities after each path (tokens from the root); unlisted: uniform.
HAND = {
    (): {0: 0.6, 1: 0.3},
    (0,): {2: 0.9, 3: 0.05},
    (1,): {4: 0.5, 2: 0.4},
    (0, 2): {1: 0.7, 0: 0.2},
    (1, 4): {3: 0.6, 1: 0.3},
}


def _logp(path: tuple[int, ...]) -> torch.Tensor:
    probs = HAND.get(path, {})
    rest = (1 - sum(probs.values())) / (V - len(probs))
    return torch.tensor([probs.get(t, rest) for t in range(V)]).log()


class HandDraft:
    """A draft that reads HAND, recording each level's feed."""

    def __init__(self) -> None:
        self.paths: list[tuple[int, ...]] = []  # per fed block slot
        self.feeds: list[Feed] = []

    def __call__(self, level: Feed) -> torch.Tensor:
        self.feeds.append(level)
        for j, (up, token) in enumerate(zip(level.parents.tolist(), level.tokens[0].tolist(), strict=True)):
            assert level.first + j == len(self.paths)
            self.paths.append((self.paths[up] if up >= 0 else ()) + (token,))
        return torch.stack([_logp(self.paths[level.first + j]) for j in range(level.tokens.shape[1])])[None]


def test_the_tree_keeps_the_most_likely_paths_of_the_expanded_frontier() -> None:
    # Level 1: 0 (.6), 1 (.3), both fed. Level 2: 0-2 (.54), 0-3 (.03), 1-4 (.15), 1-2 (.12); fed
    # 0-2 and 1-4. Level 3: 0-2-1 (.378), 0-2-0 (.108), 1-4-3 (.09), 1-4-1 (.045). The best five
    # overall, best first: 0, 0-2, 0-2-1, 1, 1-4 (1-2 at .12 is the sixth).
    draft = HandDraft()
    tree = grow_tree(_logp(())[None], draft, expand=2, depth=3, budget=5)
    assert tree.tokens.tolist() == [[0, 2, 1, 1, 4]]
    assert tree.parents.tolist() == [-1, 0, 1, -1, 3]
    assert tree.fed.tolist() == [0, 2, -1, 1, 3]  # 0-2-1 is a leaf of the last level: never fed
    assert [(f.depth, f.first, f.tokens.tolist(), f.parents.tolist(), f.bits.tolist()) for f in draft.feeds] == [
        (1, 0, [[0, 1]], [-1, -1], [0b1, 0b10]), (2, 2, [[2, 4]], [0, 1], [0b101, 0b1010])]
    wider = grow_tree(_logp(())[None], HandDraft(), expand=2, depth=3, budget=7)
    assert wider.tokens.tolist() == [[0, 2, 1, 1, 4, 2, 0]] and wider.parents.tolist() == [-1, 0, 1, -1, 3, 3, 1]


def test_a_batch_shares_the_shape_its_rows_find_most_likely_together() -> None:
    """The shared score is a path's probability summed over rows: row 0 alone would keep its
    first root child's child (.45 against .36), but row 1 prefers the second's (.4455 against
    .125) by more."""
    root = torch.tensor([[0.5, 0.4, 0.05, 0.05], [0.5, 0.45, 0.025, 0.025]]).log()
    after = torch.tensor([[[0.9, 0.05, 0.03, 0.02], [0.02, 0.9, 0.05, 0.03]],
                          [[0.25, 0.25, 0.25, 0.25], [0.002, 0.003, 0.005, 0.99]]]).log()  # [B, fed node, V]
    tree = grow_tree(root, lambda level: after, 2, 2, 3)
    assert tree.parents.tolist() == [-1, -1, 1] and tree.tokens.tolist() == [[0, 1, 1], [0, 1, 3]]
    alone = grow_tree(root[:1], lambda level: after[:1], 2, 2, 3)
    assert alone.parents.tolist() == [-1, 0, -1] and alone.tokens.tolist() == [[0, 0, 1]]


@pytest.mark.parametrize(("batch", "expand", "depth", "budget"), [(1, 3, 4, 16), (3, 2, 5, 9), (2, 4, 3, 36), (1, 1, 4, 4)])
def test_invariants_on_random_drafts(batch: int, expand: int, depth: int, budget: int) -> None:
    gen = torch.Generator().manual_seed(expand * 10 + depth)
    widths = []

    def feed(level: Feed) -> torch.Tensor:
        widths.append(level.tokens.shape)
        logits = torch.randn((batch, expand, 11), generator=gen) * 3
        logits[..., 0] = 30.0 if level.depth == 2 else logits[..., 0]  # q = 1: a child ties its parent
        return torch.log_softmax(logits, dim=-1)

    root = torch.log_softmax(torch.randn((batch, 11), generator=gen), dim=-1)
    tree = grow_tree(root, feed, expand, depth, budget)
    n = min(budget, tree_candidates(expand, depth))
    assert tree.tokens.shape == (batch, n) and tree.parents.shape == tree.fed.shape == (n,)
    assert widths == [(batch, expand)] * (depth - 1)  # every level's forward has the same width
    check_parents(tree.parents)  # parents first
    plist = tree.parents.tolist()
    for node, up in enumerate(plist):  # siblings differ; a child's parent was fed
        assert up == -1 or tree.fed[up] >= 0
        kin = [m for m in range(node) if plist[m] == up]
        assert all((tree.tokens[:, m] != tree.tokens[:, node]).all() for m in kin)


def test_keep_best_keeps_a_parent_that_ties_its_child() -> None:
    score = torch.tensor([-1.0, -2.0, -1.0, -1.0])  # candidates 2 and 3 are children of 0, equal to it
    keep, parents = keep_best(score, torch.tensor([-1, -1, 0, 2]), 3)
    assert keep.tolist() == [0, 2, 3] and parents.tolist() == [-1, 0, 1]


@pytest.mark.parametrize("bad", [{"tree_depth": 3}, {"tree_expand": 2},
                                 {"tree_depth": 3, "tree_expand": 2, "tree_width": [2, 2]},
                                 {"tree_depth": 3, "tree_expand": 2, "tree_children": "sample"}], ids=str)
def test_dynamic_tree_keys_are_checked(models: dict[str, Path], bad: dict[str, Any]) -> None:
    for cls in (DraftOptions, FastDraftOptions):
        with pytest.raises(ValueError, match="tree_depth|tree_width|dynamic tree"):
            cls(model=str(models["close"]), **bad)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("dynamic_tree"))


ROWS = [[1, 2, 3, 4, 5, 1, 2], [3, 4]]


def _tokens(rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    lengths = [len(r) for r in rows]
    return torch.tensor([r + [0] * (max(lengths) - len(r)) for r in rows]), lengths


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=6)],
                         ids=["greedy", "sampled"])
def test_fast_and_hf_drafts_grow_the_same_trees(models: dict[str, Path], sampling: SamplingParams) -> None:
    """Four steps, each kept through rollback_path along the deepest path the tree has: a wrong
    compaction of either draft's cache (a node's fed slot mistaken) changes later trees."""
    opts = FastDraftOptions(model=str(models["close"]), dtype="float32", device="cpu", max_len=128, compile=False,
                            attention="sdpa", chat_template=False, tree_depth=4, tree_expand=3)
    fast = make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    model, _ = load_model(ModelOptions(model=str(models["close"]), dtype="float32", device="cpu"))
    hf = HFDraft(model, 16, tree_depth=4, tree_expand=3)
    rows = [list(r) for r in ROWS]
    for step in range(4):
        tokens, lengths = _tokens(rows)
        a = fast.propose(tokens, lengths, 12, sampling, None)
        b = hf.propose(tokens, lengths, 12, sampling, None)
        assert a.probs is None and b.probs is None and a.tokens.shape == (2, 12)
        assert a.parents is not None and b.parents is not None and a.parents.tolist() == b.parents.tolist()
        assert torch.equal(a.tokens, b.tokens), (a.tokens, b.tokens)
        plist = a.parents.tolist()
        deepest = max(range(12), key=lambda n: (len(_path(plist, n)), -n))
        path = _path(plist, deepest)[: 1 + step % 4]  # keep 1, 2, 3 or 4 nodes (the 4th never fed)
        paths = torch.tensor([path + [-1] * (4 - len(path)), [-1] * 4])
        fast.rollback_path(paths)
        hf.rollback_path(paths)
        rows[0] += [int(a.tokens[0, n]) for n in path] + [5]
        rows[1] += [9]
    assert fast.seen == hf.lm.seen


def _path(parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


def _arm(models: dict[str, Path], use: str) -> dict[str, Any]:
    common = {"dtype": "float32", "chat_template": False}
    if use == "fast":
        common = {**common, "device": "cpu", "max_len": 128, "compile": False}
    return {"use": use, "model": str(models["close"]), "gamma": 10, "tree_depth": 4, "tree_expand": 3,
            "name": "dyn", **common}


@pytest.mark.parametrize("use", ["hf", "fast"])
def test_greedy_dynamic_tree_output_is_target_only_output(models: dict[str, Path], use: str) -> None:
    target = {"use": use, "model": str(models["target"]), **{k: v for k, v in _arm(models, use).items()
                                                             if k in ("dtype", "chat_template", "device", "max_len",
                                                                      "compile")}}
    pipe = build_pipeline({"target": target, "arm": [_arm(models, use)], "verifier": {"use": "reference"}})
    plain = build_pipeline({"target": target, "arm": [{"use": "none", "gamma": 0}]})
    widths: list[tuple[int, ...]] = []
    score_tree = pipe.target.score_tree

    def counted(*args: Any) -> torch.Tensor:
        widths.append(tuple(args[2].shape))
        return score_tree(*args)  # type: ignore[no-any-return]

    pipe.target.score_tree = counted
    prompts = [ROWS[0], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11], ROWS[1]]
    for batch in ([prompts[0]], prompts):
        got = pipe.generate(batch, max_new_tokens=20, temperature=0.0)
        assert got.token_ids == plain.generate(batch, max_new_tokens=20, temperature=0.0).token_ids
    assert len(widths) > 3 and {w[1] for w in widths} == {10}  # every tree the budget's width
    assert max(max(s.accepted) for s in got.steps) >= 2


def test_fast_prewarm_asks_for_every_key_a_dynamic_tree_step_can_need(models: dict[str, Path]) -> None:
    opts = FastDraftOptions(model=str(models["close"]), dtype="float32", device="cpu", max_len=300,
                            chat_template=False, tree_depth=3, tree_expand=2)
    d = make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    sampling, gamma, gen = SamplingParams(temperature=0.0), 6, torch.Generator().manual_seed(0)
    assert d.prewarm(1, gamma, sampling, off_gpu=True) == len(d.graphs.keys) > 0
    warmed = set(d.graphs.keys)
    for length in (2, 17, 121, 200, d.model.scratch - 7):
        tokens = torch.randint(0, 16, (1, length + 1), generator=gen)
        for behind in sorted({0, 2, 9, 16, length}):
            d.reset()
            d.seen = [max(length - behind, 0)]
            draft = d.propose(tokens, [length], gamma, sampling, gen)
            assert draft.parents is not None
            d.rollback_path(torch.full((1, 1 + behind % 3), -1))  # a tree as deep as the budget lets it
    assert d.graphs.keys <= warmed, sorted(map(str, d.graphs.keys - warmed))
    assert any(key[0] == "grow" for key in warmed)


@pytest.mark.gpu
def test_on_the_gpu_a_dynamic_tree_captures_a_graph_per_node_count_not_per_shape(models: dict[str, Path]) -> None:
    """fast target and draft with CUDA graphs and the triton verifier, float32, greedy: the
    output is target-only's, and however many tree shapes the steps grow, the target scores
    and the verifier verifies them through one graph per (batch, node count)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    common = {"dtype": "float32", "chat_template": False, "device": "cuda", "max_len": 128, "compile": True}
    target = {"use": "fast", "model": str(models["target"]), **common}
    arm = {"use": "fast", "model": str(models["close"]), "gamma": 10, "tree_depth": 4, "tree_expand": 3, "name": "dyn",
           **common}
    pipe = build_pipeline({"target": target, "arm": [arm], "verifier": {"use": "triton"}})
    plain = build_pipeline({"target": target, "arm": [{"use": "none", "gamma": 0}], "verifier": {"use": "triton"}})
    shapes: set[tuple[int, ...]] = set()
    score_tree = pipe.target.score_tree

    def seen(*args: Any) -> torch.Tensor:
        shapes.add(tuple(args[3].flatten().tolist()))  # the parents
        return score_tree(*args)  # type: ignore[no-any-return]

    pipe.target.score_tree = seen
    prompts = [ROWS[0], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11], ROWS[1]]
    for batch in ([prompts[0]], prompts):
        got = pipe.generate(batch, max_new_tokens=24, temperature=0.0)
        assert got.token_ids == plain.generate(batch, max_new_tokens=24, temperature=0.0).token_ids
    tree_keys = [k for k in pipe.target.graphs.keys if isinstance(k, tuple) and k and k[0] == "tree"]
    assert len(shapes) > 2, shapes  # the trees did change shape
    assert len(tree_keys) <= 2, tree_keys  # batch 1 and 3, ten nodes, one span (max_len 128)
    assert len(pipe.verifier._graphs) <= 4, len(pipe.verifier._graphs)  # tree verify at batch 1 and 3, a chain or two
