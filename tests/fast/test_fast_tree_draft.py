"""The fast draft's trees (``tree_width``): the hf draft's nodes on the same model, kept
across steps through rollback_path, and float32 greedy output equal to target-only with a
fast target scoring them.

CPU, float32, tiny random Qwen2 models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _host_reads import no_host_reads
from _tiny import tiny_family

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import DraftContext, ProposesTrees
from flashspec_core.tree import tree_shape
from flashspec_fast.draft import FastDraft, FastDraftOptions, make_draft, tree_levels
from flashspec_hf.draft import HFDraft
from flashspec_hf.loading import ModelOptions, load_model

WIDTHS = (2, 2, 1)
ROWS = [[1, 2, 3, 4, 5, 1, 2], [3, 4]]
# per step, each row's accepted nodes of the shape tree_shape(WIDTHS, 8) = [-1, -1, 0, 0, 1, 1, 2, 3]
# (-1 padded), the first row taking a younger sibling, the second a leaf of the unfed last level
PATHS = [torch.tensor([[1, 4, -1], [0, 2, 6]]), torch.tensor([[-1, -1, -1], [1, 5, -1]]),
         torch.tensor([[0, 3, 7], [0, -1, -1]])]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("fast_tree_draft"))


def _fast(path: Path, attention: str = "sdpa", widths: tuple[int, ...] = WIDTHS) -> FastDraft:
    opts = FastDraftOptions(model=str(path), dtype="float32", device="cpu", max_len=128, compile=False,
                            attention=attention, chat_template=False, tree_width=widths)
    return make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))


def _hf(path: Path, tree_children: str = "topk") -> HFDraft:
    model, _ = load_model(ModelOptions(model=str(path), dtype="float32", device="cpu"))
    return HFDraft(model, 16, WIDTHS, tree_children)


def _tokens(rows: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    lengths = [len(r) for r in rows]
    return torch.tensor([r + [0] * (max(lengths) - len(r)) for r in rows]), lengths


@pytest.mark.parametrize(("attention", "sampling"), [
    ("sdpa", SamplingParams(temperature=0.0)),
    ("sdpa", SamplingParams(temperature=0.8, top_k=6)),
    pytest.param("triton", SamplingParams(temperature=0.0), marks=pytest.mark.skipif(
        __import__("importlib").util.find_spec("triton") is None, reason="triton not installed")),
], ids=["greedy", "sampled", "greedy-triton"])
def test_fast_tree_nodes_are_the_hf_drafts(models: dict[str, Path], attention: str, sampling: SamplingParams) -> None:
    """Three steps, each kept through rollback_path: a wrong compaction of the draft's cache
    (a rejected branch left, a fed node not moved) changes the next step's nodes."""
    fast, hf = _fast(models["close"], attention), _hf(models["close"])
    rows = [list(r) for r in ROWS]
    gen = torch.Generator().manual_seed(0)
    for paths in PATHS:
        tokens, lengths = _tokens(rows)
        a = fast.propose(tokens, lengths, 8, sampling, gen)
        b = hf.propose(tokens, lengths, 8, sampling, gen)
        assert a.probs is None and b.probs is None
        assert a.parents is not None and a.parents.tolist() == tree_shape(WIDTHS, 8) == b.parents.tolist()
        assert torch.equal(a.tokens, b.tokens), (a.tokens, b.tokens)
        fast.rollback_path(paths)
        hf.rollback_path(paths)
        for b, path in enumerate(paths.tolist()):
            rows[b] += [int(a.tokens[b, n]) for n in path if n >= 0] + [(len(rows[b]) * 5) % 16]
    assert fast.seen == hf.lm.seen


def test_sampled_children_are_the_hf_drafts(models: dict[str, Path]) -> None:
    """tree_children = "sample": the same Exp(1) noise (one vector per sibling group, level
    order) gives the same nodes and laws on both back-ends over three kept steps; the laws
    are each child's given its elder siblings, and greedy steps keep the top-k."""
    opts = FastDraftOptions(model=str(models["close"]), dtype="float32", device="cpu", max_len=128, compile=False,
                            chat_template=False, tree_width=WIDTHS, tree_children="sample")
    fast = make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    hf = _hf(models["close"], "sample")
    sampling = SamplingParams(temperature=0.9, top_k=8)
    rows = [list(r) for r in ROWS]
    gens = [torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)]
    for paths in PATHS:
        tokens, lengths = _tokens(rows)
        a = fast.propose(tokens, lengths, 8, sampling, gens[0])
        b = hf.propose(tokens, lengths, 8, sampling, gens[1])
        assert a.probs is not None and b.probs is not None
        assert torch.equal(a.tokens, b.tokens), (a.tokens, b.tokens)
        torch.testing.assert_close(a.probs, b.probs)
        for kids in ([0, 1], [2, 3], [4, 5]):  # siblings differ, and a younger one's law lacks its elder
            assert (a.tokens[:, kids[0]] != a.tokens[:, kids[1]]).all()
            assert (a.probs[:, kids[1]].gather(1, a.tokens[:, kids[:1]]) == 0).all()
        torch.testing.assert_close(a.probs.sum(-1), torch.ones(2, 8))
        fast.rollback_path(paths)
        hf.rollback_path(paths)
        for b_, path in enumerate(paths.tolist()):
            rows[b_] += [int(a.tokens[b_, n]) for n in path if n >= 0] + [(len(rows[b_]) * 5) % 16]
    tokens, lengths = _tokens(rows)
    greedy = fast.propose(tokens, lengths, 8, SamplingParams(temperature=0.0), gens[0])
    assert greedy.probs is None
    assert torch.equal(greedy.tokens, _fast(models["close"]).propose(tokens, lengths, 8, SamplingParams(0.0), None).tokens)


def test_tree_children_must_be_known(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"tree_children must be one of 'topk', 'sample'"):
        FastDraftOptions(model=str(models["close"]), tree_children="nucleus")


def test_rollback_path_keeps_only_the_fed_part_of_the_path(models: dict[str, Path]) -> None:
    fast = _fast(models["close"])
    tokens, lengths = _tokens(ROWS)
    fast.propose(tokens, lengths, 8, SamplingParams(temperature=0.0), None)
    with no_host_reads(PATHS[0]):  # the moves are made on the device; only the host copy is read
        fast.rollback_path(PATHS[0])  # row 1's third node (6) is on the last level: never fed
    assert fast.seen == [lengths[0] + 2, lengths[1] + 2]


def test_a_shape_cut_to_a_chain_is_proposed_as_a_chain(models: dict[str, Path]) -> None:
    fast = _fast(models["close"], widths=(1, 3))
    tokens, lengths = _tokens(ROWS)
    draft = fast.propose(tokens, lengths, 2, SamplingParams(temperature=0.7), torch.Generator().manual_seed(0))
    assert draft.parents is None and draft.probs is None and draft.tokens.shape == (2, 2)
    fast.rollback([2, 0])  # node 0 was fed (the first level), node 1 was not
    assert fast.seen == [lengths[0] + 1, lengths[1]]
    assert isinstance(fast, ProposesTrees) and fast.proposes_trees
    assert not _fast(models["close"], widths=(1, 1)).proposes_trees


def test_tree_levels_groups_siblings_per_depth() -> None:
    assert tree_levels(tree_shape((2, 2, 1), 8)) == [[(-1, 0, 2)], [(0, 2, 4), (1, 4, 6)], [(2, 6, 7), (3, 7, 8)]]
    assert tree_levels([-1, -1, -1, 0, 1]) == [[(-1, 0, 3)], [(0, 3, 4), (1, 4, 5)]]


def test_tree_width_must_be_positive_integers(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"tree_width must be a list of integers >= 1"):
        FastDraftOptions(model=str(models["close"]), tree_width=(2, 0))


def _config(models: dict[str, Path], arm: dict[str, Any]) -> dict[str, Any]:
    fast = {"use": "fast", "dtype": "float32", "device": "cpu", "max_len": 128, "compile": False,
            "chat_template": False}
    arm = {**fast, **arm, "name": "a"} if arm.get("use", "fast") == "fast" else {**arm, "name": "a"}
    return {"target": {**fast, "model": str(models["target"])}, "arm": [arm], "verifier": {"use": "reference"}}


def test_fast_tree_pipeline_greedy_output_is_target_only_output(models: dict[str, Path]) -> None:
    tree = build_pipeline(_config(models, {"model": str(models["close"]), "gamma": 8, "tree_width": list(WIDTHS)}))
    plain = build_pipeline(_config(models, {"use": "none", "gamma": 0}))
    scored = {"n": 0}
    score_tree = tree.target.score_tree

    def counted(*args: Any) -> torch.Tensor:
        scored["n"] += 1
        return score_tree(*args)  # type: ignore[no-any-return]

    tree.target.score_tree = counted
    prompts = [ROWS[0], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11], ROWS[1]]
    for batch in ([prompts[0]], prompts):
        got = tree.generate(batch, max_new_tokens=20, temperature=0.0)
        assert got.token_ids == plain.generate(batch, max_new_tokens=20, temperature=0.0).token_ids
    assert scored["n"] > 3
    assert max(max(s.accepted) for s in got.steps) >= 2  # the close draft's tree is followed past one level


def test_tree_prewarm_asks_for_every_key_a_tree_step_can_need(models: dict[str, Path]) -> None:
    """prewarm goes through propose, so a tree draft warms its tree graphs (here 6 nodes of gamma 8)."""
    opts = FastDraftOptions(model=str(models["close"]), dtype="float32", device="cpu", max_len=300,
                            chat_template=False, tree_width=(2, 2))
    d = make_draft(opts, DraftContext(target=None, vocab=16, device=torch.device("cpu")))
    sampling, gamma, gen = SamplingParams(temperature=0.0), 8, torch.Generator().manual_seed(0)
    assert d.prewarm(1, gamma, sampling, off_gpu=True) == len(d.graphs.keys) > 0
    warmed = set(d.graphs.keys)
    for length in (2, 17, 120, 121, 122, 127, 200, d.model.scratch - 7):
        tokens = torch.randint(0, 16, (1, length + 1), generator=gen)
        for behind in sorted({0, 2, 9, 16, length}):
            d.reset()
            d.seen = [max(length - behind, 0)]
            d.propose(tokens, [length], gamma, sampling, gen)
    assert d.graphs.keys <= warmed, sorted(map(str, d.graphs.keys - warmed))
    assert any(key[0] == "tree" for key in warmed)
