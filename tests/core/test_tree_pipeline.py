"""Draft trees end to end on tiny models: lookup branches and an hf draft tree, hf target, reference verifier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.contracts import Draft, SamplingParams
from flashspec_core.pipeline import Arm
from flashspec_core.sampling import Noise
from flashspec_core.testing import draft_contract as dc
from flashspec_core.tree import chain_parents
from flashspec_hf.draft import HFDraft, tree_shape
from flashspec_hf.loading import ModelOptions, load_model
from flashspec_lookup.lookup import LookupConfig, PromptLookupDraft
from flashspec_reference.plugin import ReferenceVerifier

PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11]]
TREE_ARMS: dict[str, dict[str, Any]] = {
    "lookup-tree": {"use": "prompt_lookup", "gamma": 6, "branches": 3},
    "hf-tree": {"use": "hf", "gamma": 8, "tree_width": [2, 2, 1]},
    "hf-tree-sampled": {"use": "hf", "gamma": 8, "tree_width": [2, 2, 1], "tree_children": "sample"},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("tree"))


def _config(models: dict[str, Path], arm: dict[str, Any], dtype: str = "float32", **extra: Any) -> dict[str, Any]:
    if arm["use"] == "hf":
        arm = {**arm, "model": str(models["close"]), "dtype": dtype}
    return {
        "target": {"model": str(models["target"]), "dtype": dtype, "chat_template": False, **extra.get("target", {})},
        "arm": [{**arm, "name": "tree"}],
        "verifier": {"use": "reference", **extra.get("verifier", {})},
    }


def _plain(models: dict[str, Path]) -> Any:
    return build_pipeline({"target": {"model": str(models["target"]), "dtype": "float32", "chat_template": False},
                           "arm": [{"use": "none", "gamma": 0}]})


@pytest.mark.parametrize("arm", list(TREE_ARMS), ids=str)
def test_greedy_tree_output_is_target_only_output(models: dict[str, Path], arm: str) -> None:
    pipe, plain = build_pipeline(_config(models, TREE_ARMS[arm])), _plain(models)
    trees = _count_trees(pipe)
    for batch in ([PROMPTS[0]], PROMPTS):
        got = pipe.generate(batch, max_new_tokens=20, temperature=0.0)
        assert got.token_ids == plain.generate(batch, max_new_tokens=20, temperature=0.0).token_ids
        assert any(max(s.accepted) > 0 for s in got.steps)
    assert trees["scored"] > 3


def _count_trees(pipe: Any) -> dict[str, int]:
    """Count the target's score_tree calls (so a test knows trees, not chains, ran)."""
    counts, score_tree = {"scored": 0}, pipe.target.score_tree

    def counted(*args: Any) -> torch.Tensor:
        counts["scored"] += 1
        return score_tree(*args)  # type: ignore[no-any-return]

    pipe.target.score_tree = counted
    return counts


def test_tree_steps_accept_along_a_path_deeper_than_one(models: dict[str, Path]) -> None:
    pipe = build_pipeline(_config(models, TREE_ARMS["hf-tree"]))
    result = pipe.generate([PROMPTS[0]], max_new_tokens=30, temperature=0.0)
    assert max(max(s.accepted) for s in result.steps) >= 2  # the close draft's tree is followed past one level


@pytest.mark.parametrize("arm", list(TREE_ARMS), ids=str)
def test_sampled_tree_pipeline_runs_and_emits_valid_tokens(models: dict[str, Path], arm: str) -> None:
    pipe = build_pipeline(_config(models, TREE_ARMS[arm]))
    trees = _count_trees(pipe)
    result = pipe.generate(PROMPTS, max_new_tokens=12, temperature=0.9, top_k=6, seed=3)
    assert trees["scored"] > 0
    assert all(0 < len(ids) <= 12 and all(0 <= t < 16 for t in ids) for ids in result.token_ids)


def test_tree_arm_on_a_verifier_without_trees_is_refused_at_build(models: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"arm 'tree' \(prompt_lookup\) proposes draft trees.*verifier 'synthetic'"):
        build_pipeline(_config(models, TREE_ARMS["lookup-tree"], verifier={"use": "synthetic"}))


def test_tree_arm_on_a_target_without_trees_is_refused(models: dict[str, Path]) -> None:
    class ChainOnly:  # both bundled targets score trees: hide that capability
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            if name in ("score_tree", "commit_path"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    pipe = _plain(models)
    pipe.target = ChainOnly(pipe.target)
    with pytest.raises(ValueError, match=r"arm 'tree' \(PromptLookupDraft\) proposes draft trees.*cannot score"):
        pipe.arms = [Arm("tree", PromptLookupDraft(LookupConfig(branches=3)), 6)]


def test_tree_arm_above_the_verifiers_node_limit_is_refused_at_build(models: dict[str, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose tree arm may propose more nodes (its gamma) than the verifier takes fails when
    the pipeline is built, naming the arm and the limit, not at the arm's first step."""
    pytest.importorskip("triton")
    from flashspec_kernels import verify_tree

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton verifier off CUDA
    with monkeypatch.context() as patch:
        patch.setattr(verify_tree, "MAX_NODES", 5)  # config refuses gamma > 64 = MAX_NODES itself
        with pytest.raises(ValueError, match=r"arm 'tree' \(prompt_lookup\) proposes draft trees of up to gamma = "
                                             r"6 nodes, but verifier 'triton' takes trees of at most 5 nodes"):
            build_pipeline(_config(models, TREE_ARMS["lookup-tree"], verifier={"use": "triton"}))
    pipe = build_pipeline(_config(models, {**TREE_ARMS["lookup-tree"], "gamma": verify_tree.MAX_NODES},
                                  verifier={"use": "triton"}))
    with pytest.raises(ValueError, match=rf"gamma = {verify_tree.MAX_NODES + 1} nodes, .* at most "
                                         rf"{verify_tree.MAX_NODES} nodes"):
        pipe.arms = [Arm("tree", PromptLookupDraft(LookupConfig(branches=3)), verify_tree.MAX_NODES + 1)]


def test_chain_arm_above_the_verifiers_chain_limit_is_refused_at_build(models: dict[str, Path],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The triton verifier takes chains of at most 16 draft tokens (config allows gamma 64): a longer
    chain arm fails when the pipeline is built, naming the arm and the limit; the reference takes it."""
    pytest.importorskip("triton")
    from flashspec_kernels import verify

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton verifier off CUDA
    chain = {"use": "prompt_lookup", "gamma": verify.MAX_GAMMA + 1}
    with pytest.raises(ValueError, match=rf"arm 'tree' \(prompt_lookup\) proposes up to gamma = {verify.MAX_GAMMA + 1} "
                                         rf"draft tokens, but verifier 'triton' takes chains of at most {verify.MAX_GAMMA}"):
        build_pipeline(_config(models, chain, verifier={"use": "triton"}))
    pipe = build_pipeline(_config(models, {**chain, "gamma": verify.MAX_GAMMA}, verifier={"use": "triton"}))
    with pytest.raises(ValueError, match=rf"at most {verify.MAX_GAMMA}: set the arm's gamma"):
        pipe.arms = [Arm("long", PromptLookupDraft(LookupConfig()), verify.MAX_GAMMA + 1)]
    assert build_pipeline(_config(models, chain)).policy.arms[0].gamma == verify.MAX_GAMMA + 1


def test_tree_arm_above_the_targets_node_limit_is_refused(models: dict[str, Path]) -> None:
    class Limited:  # a target that scores trees of at most 4 nodes (the fast target: 63)
        max_tree_nodes = 4

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    pipe = _plain(models)
    pipe.target = Limited(pipe.target)
    pipe.arms = [Arm("tree", PromptLookupDraft(LookupConfig(branches=3)), 4)]
    with pytest.raises(ValueError, match=r"arm 'tree' \(PromptLookupDraft\) proposes draft trees of up to gamma = 6 "
                                         r"nodes, but target .* takes trees of at most 4 nodes"):
        pipe.arms = [Arm("tree", PromptLookupDraft(LookupConfig(branches=3)), 6)]


def test_a_tree_from_a_provider_that_does_not_declare_trees_is_a_clear_error(models: dict[str, Path]) -> None:
    class Sneaky:
        def reset(self) -> None: ...

        def propose(self, tokens: torch.Tensor, lengths: Any, gamma: int, sampling: Any, generator: Any) -> Draft:
            return Draft(tokens=torch.ones((len(lengths), 2), dtype=torch.long), probs=None,
                         parents=torch.tensor([-1, -1]))

        def rollback(self, num_accepted: Any) -> None: ...

    pipe = _plain(models)
    pipe.arms = [Arm("sneaky", Sneaky(), 2)]
    with pytest.raises(RuntimeError, match="arm 'sneaky': Sneaky proposed a tree"):
        pipe.generate([PROMPTS[0]], max_new_tokens=3)


def test_tree_shape_is_level_order_cut_to_gamma() -> None:
    assert tree_shape([2, 2], 8) == [-1, -1, 0, 0, 1, 1]
    assert tree_shape([2, 2], 4) == [-1, -1, 0, 0]
    assert tree_shape([3, 1, 1], 5) == [-1, -1, -1, 0, 1]
    assert tree_shape([1, 1], 8) == [-1, 0]


def test_reference_tree_of_width_one_gives_the_chain_verdict() -> None:
    gen = torch.Generator().manual_seed(0)
    logits, tokens = torch.randn(3, 5, 7, generator=gen), torch.randint(0, 7, (3, 4), generator=gen)
    probs = torch.softmax(torch.randn(3, 4, 7, generator=gen), -1)
    verifier, sampling = ReferenceVerifier(), SamplingParams(temperature=0.8)
    for q in (None, probs):
        noise = Noise.draw(3, 4, 7, torch.Generator().manual_seed(1), "cpu")
        tree = verifier.verify_tree_with_noise(logits, tokens, chain_parents(4), q, sampling, noise)
        chain = verifier.verify_with_noise(logits, tokens, q, sampling, noise)
        assert torch.equal(tree.tokens, chain.tokens) and torch.equal(tree.num_accepted, chain.num_accepted)
        drawn = verifier.verify_tree(logits, tokens, chain_parents(4), q, sampling, torch.Generator().manual_seed(1))
        assert torch.equal(drawn.tokens, tree.tokens)


def _hf_draft(models: dict[str, Path], widths: tuple[int, ...], children: str = "topk") -> HFDraft:
    model, _ = load_model(ModelOptions(model=str(models["close"]), dtype="float64", device="cpu"))
    return HFDraft(model, 16, widths, children)


def test_hf_draft_tree_after_rollback_path_proposes_what_a_fresh_draft_does(models: dict[str, Path]) -> None:
    """The draft's cache keeps exactly the accepted path: its next tree equals a fresh draft's."""
    draft, fresh, greedy = _hf_draft(models, (2, 2, 1)), _hf_draft(models, (2, 2, 1)), SamplingParams(temperature=0)
    tokens, lengths = torch.zeros((2, 40), dtype=torch.long), [5, 3]
    tokens[0, :5], tokens[1, :3] = torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8, 9])
    for paths in ([[1, 3, 7], [0, -1, -1]], [[0, 2, -1], [-1, -1, -1]], [[1, 4, 8], [1, 5, 9]]):
        tree = draft.propose(tokens, lengths, 10, greedy, None)
        fresh.reset()
        assert torch.equal(tree.tokens, fresh.propose(tokens, lengths, 10, greedy, None).tokens)
        assert tree.parents is not None and tree.parents.tolist() == [-1, -1, 0, 0, 1, 1, 2, 3, 4, 5]
        draft.rollback_path(torch.tensor(paths))
        for b, path in enumerate(paths):
            kept = [tree.tokens[b, n].item() for n in path if n >= 0] + [11]  # the path, then a recovered token
            tokens[b, lengths[b] : lengths[b] + len(kept)] = torch.tensor(kept)
            lengths[b] += len(kept)


@pytest.mark.parametrize("sampling", dc.SAMPLINGS, ids=str)
@pytest.mark.parametrize("tree", ["lookup", "hf", "hf-sampled"])
def test_tree_drafts_keep_the_draft_contract(models: dict[str, Path], tree: str, sampling: SamplingParams) -> None:
    """The draft suite's history (chain rollbacks, steps elsewhere, empty proposals, reset) on tree proposals."""
    def make() -> Any:
        if tree == "lookup":
            return PromptLookupDraft(LookupConfig(branches=2))
        return _hf_draft(models, (2, 2), "sample" if tree == "hf-sampled" else "topk")

    dc.check_script(make, vocab=16, sampling=sampling)


@pytest.mark.parametrize("arm", [{"use": "prompt_lookup", "gamma": 4}, TREE_ARMS["lookup-tree"]], ids=["chain", "tree"])
def test_a_float64_target_runs_on_the_triton_verifier(models: dict[str, Path], arm: dict[str, Any],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """``dtype = "float64"`` is a target option, and on CUDA ``auto`` verifies with triton, whose kernels
    take 2- and 4-byte logits: float64 logits are read as float32, as the reference reads them, so
    the tokens are the reference's (exact noise), not a KeyError at the first step."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the triton verifier off CUDA
    tokens = {}
    for verifier in ({"use": "reference"}, {"use": "triton", "noise": "exact"}):
        pipe = build_pipeline(_config(models, arm, dtype="float64", verifier=verifier))
        tokens[verifier["use"]] = [pipe.generate(PROMPTS, max_new_tokens=5, temperature=t, seed=3).token_ids
                                   for t in (0.0, 1.0)]
    assert tokens["triton"] == tokens["reference"]
