"""The selector learns what a step cost its arm, not the host work that only waited beside it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from _tiny import one_arm_dict, tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import arm_seconds


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("tiny"))


def test_side_work_costs_the_arm_only_what_it_outlasts_the_device() -> None:
    assert arm_seconds(10.0, 8.0, 5.0) == 8.0  # 2 s outside the device span, all of it side work
    assert arm_seconds(10.0, 10.0, 5.0) == 10.0  # the side work ran while the device computed
    assert arm_seconds(10.0, 2.0, 3.0) == 7.0  # 8 s outside the span, 3 of them side work
    assert arm_seconds(10.0, 11.0, 1.0) == 10.0  # a span past the wall time (clock skew): nothing taken


def test_a_slow_selector_update_is_in_the_step_record_but_not_in_what_the_selector_learns(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe = build_pipeline(one_arm_dict(models["target"], {"use": "prompt_lookup", "gamma": 3}))
    settle, learned = pipe.policy.settle, []

    def slow_settle() -> None:
        time.sleep(0.04)
        settle()

    def commit(*args: Any, **kwargs: Any) -> float:
        learned.append(args[2])  # step_s
        return 1.0

    monkeypatch.setattr(pipe.policy, "settle", slow_settle)
    monkeypatch.setattr(pipe.policy, "commit", commit)
    result = pipe.generate([[1, 2, 3, 4, 1, 2, 3]], max_new_tokens=6, temperature=0.0)
    assert len(learned) == len(result.steps) > 0
    for record, seconds in zip(result.steps, learned, strict=True):
        assert record.step_ms >= 40.0  # the record keeps the wall time
        assert seconds * 1e3 <= record.step_ms - 35.0  # the selector does not pay for the sleep
