"""Pipeline-level exactness of dynamic draft trees (tree_depth, tree_expand) under sampling:
the tree's shape varies per step with the draft's probabilities, its children are top-k
tokens; the first 3 generated tokens must follow the target's law (the gate of
test_pipeline_law, on the same tiny target and drafts), on the fast and hf back-ends, and the
gate must catch a target that keeps a rejected node in its cache."""

from __future__ import annotations

from typing import Any

import pytest
from _law import ALPHA, gate, law_of

from flashspec_core.build import build_pipeline

pytestmark = pytest.mark.stats
FAST = {"use": "fast", "dtype": "float32", "device": "cpu", "max_len": 128, "compile": False, "chat_template": False}
HF = {"use": "hf", "dtype": "float32", "chat_template": False}


def dynamic_dict(setup: dict[str, Any], back_end: dict[str, Any], selector: str = "fixed") -> dict[str, Any]:
    """The dynamic tree arm first (a fixed selector plays it) and a chain of the far draft."""
    tree = {**back_end, "model": str(setup["drafts"][0]), "gamma": 7, "tree_depth": 3, "tree_expand": 2}
    target = {**back_end, "model": str(setup["target"])}
    return {
        "target": target,
        "arm": [{**tree, "name": "dynamic-tree"}, {**back_end, "model": str(setup["drafts"][1]), "gamma": 3,
                                                   "name": "chain"}],
        "verifier": {"use": "reference"},
        "selector": {"use": selector, **({"arm": 0} if selector == "fixed" else {})},
    }


@pytest.mark.parametrize(("back_end", "sampling"), [
    (FAST, {"temperature": 1.0}), (HF, {"temperature": 0.7, "top_k": 5}),
    pytest.param(FAST, {"temperature": 0.7, "top_k": 5}, marks=pytest.mark.slow),
    pytest.param(HF, {"temperature": 1.0}, marks=pytest.mark.slow)], ids=["fast-t1", "hf-top_k", "fast-top_k", "hf-t1"])
def test_law_holds_for_dynamic_trees(law_setup: dict[str, Any], back_end: dict[str, Any],
                                     sampling: dict[str, Any]) -> None:
    pipe = build_pipeline(dynamic_dict(law_setup, back_end), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


@pytest.mark.slow
def test_law_holds_with_dynamic_trees_among_chains(law_setup: dict[str, Any]) -> None:
    sampling = {"temperature": 1.0}
    pipe = build_pipeline(dynamic_dict(law_setup, FAST, "alternate_on_rejection"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


def test_the_gate_rejects_a_fast_target_that_keeps_a_rejected_branch(law_setup: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: commit_path moves nothing, so the slots after an accepted node of a dynamic tree
    (its nodes best first, siblings apart) can hold a rejected node's keys and values, which
    later forwards read."""
    sampling = {"temperature": 1.0}
    pipe = build_pipeline(dynamic_dict(law_setup, FAST), law_setup["registry"])
    monkeypatch.setattr(pipe.target.model, "move_slots", lambda moves: None)
    p = gate(pipe, law_of(law_setup, sampling), sampling)
    assert p < ALPHA, p
