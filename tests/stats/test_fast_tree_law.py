"""Pipeline-level exactness of the fast back-end's draft trees: a fast target scoring the
fast draft's tree, its children the top-k or drawn without replacement (``tree_children``),
and a lookup tree, the first 3 generated tokens following the target's law (the gate of
test_pipeline_law, on the same tiny target and drafts)."""

from __future__ import annotations

from typing import Any

import pytest
from _law import ALPHA, gate, law_of

from flashspec_core.build import build_pipeline

pytestmark = pytest.mark.stats
FAST = {"use": "fast", "dtype": "float32", "device": "cpu", "max_len": 128, "compile": False, "chat_template": False}


def fast_tree_dict(setup: dict[str, Any], selector: str = "fixed", children: str = "topk") -> dict[str, Any]:
    """The fast tree arm first (a fixed selector plays it), a lookup tree and a fast chain."""
    tree = {**FAST, "model": str(setup["drafts"][0]), "gamma": 7, "tree_width": [2, 2, 1], "tree_children": children}
    return {
        "target": {**FAST, "model": str(setup["target"])},
        "arm": [{**tree, "name": "fast-tree"},
                {"use": "prompt_lookup", "gamma": 4, "branches": 2, "name": "lookup-tree"},
                {**FAST, "model": str(setup["drafts"][1]), "gamma": 3, "name": "fast-chain"}],
        "verifier": {"use": "reference"},
        "selector": {"use": selector, **({"arm": 0} if selector == "fixed" else {})},
    }


@pytest.mark.parametrize("children", ["topk", "sample"])
@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 5}], ids=["t1", "top_k"])
def test_law_holds_for_the_fast_tree_arm(law_setup: dict[str, Any], sampling: dict[str, Any], children: str) -> None:
    pipe = build_pipeline(fast_tree_dict(law_setup, children=children), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


def test_law_holds_with_fast_trees_among_chains(law_setup: dict[str, Any]) -> None:
    sampling = {"temperature": 1.0}
    pipe = build_pipeline(fast_tree_dict(law_setup, "alternate_on_rejection"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


def test_the_gate_rejects_a_fast_target_that_keeps_a_rejected_branch(law_setup: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: commit_path moves nothing, so the slots after an accepted node can hold an
    elder rejected sibling's keys and values, which later forwards read."""
    sampling = {"temperature": 1.0}
    pipe = build_pipeline(fast_tree_dict(law_setup), law_setup["registry"])
    monkeypatch.setattr(pipe.target.model, "move_slots", lambda moves: None)
    p = gate(pipe, law_of(law_setup, sampling), sampling)
    assert p < ALPHA, p
