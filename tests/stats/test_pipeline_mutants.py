"""The pipeline-level gate must reject planted pipeline bugs (it passes the real code)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _law import ALPHA, gate, law_of
from _tiny import pipeline_dict
from test_pipeline_law import TREE_ARMS, tree_dict

import flashspec_hf.draft
from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Arm
from flashspec_core.sampling import race
from flashspec_core.testing.tiny import PeekingDraft
from flashspec_core.tree import path_to, without_replacement_rows
from flashspec_hf.lm import CachedLM
from flashspec_hf.target import HFTarget

pytestmark = pytest.mark.stats
SAMPLING = {"temperature": 1.0}


def test_kv_cache_not_rolled_back_is_caught(law_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CachedLM, "drop_last", lambda self, count: None)
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"][:1], "fixed", dtype="float32"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, SAMPLING), SAMPLING) < ALPHA


def test_selector_peeking_at_the_draft_is_caught(law_setup: dict[str, Any]) -> None:
    law = law_of(law_setup, SAMPLING)
    mode = max((s for s in law if len(s) >= 1), key=lambda s: law[s])[0]
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"][:1], "fixed", dtype="float32"), law_setup["registry"])
    model_arm, lookup_arm = pipe.arms[:2]  # the model draft and the padded lookup
    pipe.arms = [Arm("peek", PeekingDraft(model_arm.provider, lookup_arm.provider, mode), model_arm.gamma)]
    assert gate(pipe, law, SAMPLING) < ALPHA


def test_sampled_children_drawn_with_replacement_are_caught(law_setup: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted in the hf draft's tree_children = "sample": each child an independent race
    (duplicates allowed), reported with the laws of a draw without replacement."""

    gen = torch.Generator().manual_seed(1)

    def with_replacement(q: torch.Tensor, width: int, expo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        draws = [expo] + [torch.empty_like(expo).exponential_(generator=gen) for _ in range(width - 1)]
        tokens = torch.stack([race(q, e) for e in draws], dim=-1)
        return tokens, without_replacement_rows(q, tokens)

    monkeypatch.setattr(flashspec_hf.draft, "sample_children", with_replacement)
    pipe = build_pipeline(tree_dict(law_setup, arm=TREE_ARMS.index("hf-tree-sampled")), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, SAMPLING), SAMPLING) < ALPHA


def test_kv_cache_keeping_a_rejected_branch_is_caught(law_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """commit_path keeps, for each row's accepted count, the path to the last node scored
    (a rejected branch wherever the accepted path differs) instead of the accepted path."""
    score_tree, commit_path = HFTarget.score_tree, HFTarget.commit_path

    def scored(self: HFTarget, tokens: Any, lengths: Any, draft_tokens: Any, parents: Any) -> Any:
        self.last_parents = parents  # type: ignore[attr-defined]
        return score_tree(self, tokens, lengths, draft_tokens, parents)

    def keeps_last_branch(self: HFTarget, paths: Any) -> None:
        parents = self.last_parents  # type: ignore[attr-defined]
        last = list(path_to(parents, len(parents) - 1))
        wrong = paths.clone()
        for b, k in enumerate((paths >= 0).sum(1).tolist()):
            wrong[b, :k] = torch.tensor(last[:k] + [last[-1]] * (k - len(last)))[:k]
        commit_path(self, wrong)

    monkeypatch.setattr(HFTarget, "score_tree", scored)
    monkeypatch.setattr(HFTarget, "commit_path", keeps_last_branch)
    pipe = build_pipeline(tree_dict(law_setup, arm=1), law_setup["registry"])  # the hf draft's tree
    assert gate(pipe, law_of(law_setup, SAMPLING), SAMPLING) < ALPHA
