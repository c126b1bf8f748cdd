"""The pipeline-level gate must reject planted pipeline bugs (it passes the real code)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from _law import ALPHA, gate, law_of
from _tiny import pipeline_dict

from flashspec_core import Draft, DraftProvider, SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Arm
from flashspec_hf.lm import CachedLM

pytestmark = pytest.mark.stats
SAMPLING = {"temperature": 1.0}


def test_kv_cache_not_rolled_back_is_caught(law_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(CachedLM, "drop_last", lambda self, count: None)
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"][:1], "fixed", dtype="float32"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, SAMPLING), SAMPLING) < ALPHA


class PeekingDraft:
    """What a selector that peeks at the current draft amounts to, per row: use the
    model arm's proposal only where its first token is ``token``, else fall back to
    prompt lookup. The choice depends on this step's draft, which the theorem forbids."""

    def __init__(self, model: DraftProvider, lookup: DraftProvider, token: int) -> None:
        self.model, self.lookup, self.token = model, lookup, token
        self._use_model: list[bool] = []

    def reset(self) -> None:
        self.model.reset()
        self.lookup.reset()

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams, generator: Any) -> Draft:
        a = self.model.propose(tokens, lengths, gamma, sampling, generator)
        b = self.lookup.propose(tokens, lengths, gamma, sampling, generator)
        assert a.probs is not None
        use = a.tokens[:, 0].cpu() == self.token
        self._use_model = use.tolist()
        one_hot = torch.nn.functional.one_hot(b.tokens, a.probs.shape[-1]).to(a.probs)
        return Draft(
            tokens=torch.where(use[:, None], a.tokens.cpu(), b.tokens),
            probs=torch.where(use[:, None, None].to(a.probs.device), a.probs, one_hot.to(a.probs.device)),
        )

    def rollback(self, num_accepted: Sequence[int]) -> None:
        self.model.rollback([n if u else 0 for n, u in zip(num_accepted, self._use_model, strict=True)])


def test_selector_peeking_at_the_draft_is_caught(law_setup: dict[str, Any]) -> None:
    law = law_of(law_setup, SAMPLING)
    mode = max((s for s in law if len(s) >= 1), key=lambda s: law[s])[0]
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"][:1], "fixed", dtype="float32"), law_setup["registry"])
    model_arm, lookup_arm = pipe.arms[:2]  # the model draft and the padded lookup
    pipe.arms = [Arm("peek", PeekingDraft(model_arm.provider, lookup_arm.provider, mode), model_arm.gamma)]
    assert gate(pipe, law, SAMPLING) < ALPHA
