"""The run summary's speed-up against its own plain steps."""

from __future__ import annotations

import io

import pytest

from flashspec_core.cli import _print_summary
from flashspec_core.contracts import StepRecord
from flashspec_core.stats import summarize


def _step(i: int, gamma: int, emitted: int, ms: float, captured: bool = False) -> StepRecord:
    return StepRecord(step=i, arm=int(gamma > 0), arm_name="d" if gamma else "plain", gamma=gamma, batch_size=1,
                      accepted=(emitted - 1,), emitted=emitted, reward=0.0, draft_ms=0.0, target_ms=ms,
                      verify_ms=0.0, step_ms=ms, captured=captured)


def test_speed_up_against_the_run_s_own_plain_steps() -> None:
    plain = [_step(i, 0, 1, 10.0) for i in range(3)]  # 0.1 tokens per ms
    spec = [_step(3 + i, 4, 4, 20.0) for i in range(3)]  # 0.2 tokens per ms
    captured = [_step(6, 4, 1, 500.0, captured=True), _step(7, 0, 1, 400.0, captured=True)]
    summary = summarize(plain + spec + captured, ["plain", "d"], [1] * 18, 1.0)
    # (3 + 12) tokens in (30 + 60) ms against 3 tokens in 30 ms; captures left out of both
    assert summary["vs_plain"] == pytest.approx((15 / 90) / (3 / 30))
    assert summary["plain_steps"] == 3
    out = io.StringIO()
    _print_summary(summary, out)
    assert "about 1.67x plain decoding (step times against its 3 plain steps)" in out.getvalue()


def test_no_estimate_from_too_few_plain_steps() -> None:
    summary = summarize([_step(0, 0, 1, 10.0), _step(1, 0, 1, 10.0), _step(2, 4, 4, 20.0)], ["plain", "d"], [6], 1.0)
    assert summary["vs_plain"] is None
    out = io.StringIO()
    _print_summary(summary, out)
    assert "plain decoding" not in out.getvalue()
