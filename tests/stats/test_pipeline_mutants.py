"""The pipeline-level gate must reject planted pipeline bugs (it passes the real code)."""

from __future__ import annotations

from typing import Any

import pytest
from _law import ALPHA, gate, law_of
from _tiny import pipeline_dict

from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Arm
from flashspec_core.testing.tiny import PeekingDraft
from flashspec_hf.lm import CachedLM

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
