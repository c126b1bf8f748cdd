"""benchmarks/verify_flush.py's summary on hand-made rows (no GPU)."""

from __future__ import annotations

import pytest
from _scripts import load_benchmark

flush = load_benchmark("verify_flush")


def _row(logits: int, size: int, t0_us: float, stream_gbs: float, copy_gbs: float) -> dict:
    nbytes = logits * size
    ms = (t0_us * 1e-6 + nbytes / (stream_gbs * 1e9)) * 1e3
    frac = nbytes / (ms * 1e6) / copy_gbs
    times = {"do_bench": ms, "write": ms, "read": ms}
    return {"dtype": {2: "bfloat16", 4: "float32"}[size], "logits": logits, "bytes": nbytes,
            "pass_ms": times, "floor_ms": times, "pass_fraction": dict.fromkeys(times, frac),
            "floor_fraction": dict.fromkeys(times, frac)}


def test_fit_recovers_the_fixed_cost_and_the_size_for_the_goal() -> None:
    """time = 5 us + bytes / 4000 GB/s against a 4000 GB/s copy: 80% needs 5 us x 3200 GB/s /
    (1 - 0.8) = 80 MB, i.e. 40M bf16 logits; shapes below it miss the goal, above it meet it."""
    copy = 4000.0
    rows = [_row(n, s, 5.0, 4000.0, copy) for s in (2, 4) for n in (10_000_000, 30_000_000, 100_000_000, 400_000_000)]
    summary = flush.summarize(rows, {"do_bench": copy, "write": copy, "read": copy})
    f = summary["fit_read_flush"]["floor"]["bfloat16"]
    assert f["t0_us"] == pytest.approx(5.0, rel=1e-6) and f["stream_gbs"] == pytest.approx(4000.0, rel=1e-6)
    assert f["logits_for_goal"] == pytest.approx(40e6, rel=1e-6)
    assert summary["fit_read_flush"]["pass"]["float32"]["logits_for_goal"] == pytest.approx(20e6, rel=1e-6)
    assert summary["pass"]["read"]["bfloat16"]["at_goal"] == 2 and summary["pass"]["read"]["float32"]["at_goal"] == 3
    assert summary["met_with_read_flush"] is False


def test_a_stream_slower_than_the_goal_never_reaches_it() -> None:
    rows = [_row(n, 2, 5.0, 3000.0, 4000.0) for n in (10_000_000, 100_000_000)]
    rows += [_row(n, 4, 0.0, 4000.0, 4000.0) for n in (10_000_000, 100_000_000)]
    summary = flush.summarize(rows, {"do_bench": 4000.0, "write": 4000.0, "read": 4000.0})
    assert summary["fit_read_flush"]["floor"]["bfloat16"]["logits_for_goal"] is None
