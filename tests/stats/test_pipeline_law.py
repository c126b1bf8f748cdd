"""Pipeline-level exactness: the first 3 generated tokens follow the target's law.

A tiny target (V = 16) makes the law of the first 3 tokens enumerable from the
target alone; the full pipeline (KV caches, rollback, ragged batches, arms that
switch mid-sequence) must reproduce it whatever the selector, adversarial ones
included. Each gate is a chi-square test on N = 12,000 sequences at level
ALPHA = 1e-3; the same gate must reject the planted pipeline bugs below.
"""

from __future__ import annotations

from typing import Any

import pytest
from _law import ALPHA, gate, law_of
from _tiny import pipeline_dict

from flashspec_core.build import build_pipeline

pytestmark = pytest.mark.stats
SAMPLINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
]
SELECTORS = ["fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "glr_thompson", "request_thompson", "alternate_on_rejection", "strange_parity"]


@pytest.mark.parametrize("selector", SELECTORS)
def test_law_holds_for_every_selector(law_setup: dict[str, Any], selector: str) -> None:
    sampling = SAMPLINGS[0]
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"], selector, dtype="float32"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


@pytest.mark.parametrize("sampling", SAMPLINGS[1:], ids=["top_k", "top_p"])
def test_law_holds_with_filtering(law_setup: dict[str, Any], sampling: dict[str, Any]) -> None:
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"], "alternate_on_rejection", dtype="float32"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA
