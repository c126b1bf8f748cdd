"""flashspec_bench.tensor_parallel: the summary of the one- and two-rank runs."""

from __future__ import annotations

import pytest

from flashspec_bench.tensor_parallel import summary


def row(shape: str, tp: int, tps: float, acc: float | None = None, speedup: float = 0.0) -> dict[str, object]:
    if acc is None:
        return {"target_shape": shape, "tensor_parallel": tp, "system": "target-only", "tokens_per_s": tps}
    return {"target_shape": shape, "tensor_parallel": tp, "system": "speculative", "tokens_per_s": tps,
            "acceptance": acc, "gamma": 4, "speedup_vs_own_target_only": speedup}


def test_summary_gives_the_two_rank_ratio_per_shape_and_each_rank_counts_speedups() -> None:
    rows = [row("qwen2.5-32b", 1, 20.0), row("qwen2.5-32b", 1, 50.0, 0.8, 2.5), row("qwen2.5-32b", 2, 36.0),
            row("qwen2.5-32b", 2, 81.0, 0.8, 2.25), row("qwen2.5-14b", 2, 70.0)]
    out = summary(rows)
    assert out["tp2_vs_tp1_32b"] == pytest.approx(1.8)
    assert "tp2_vs_tp1_14b" not in out  # no one-rank run of that shape to compare with
    assert out["speedup"] == {"tp1": {"qwen2.5-32b": {"a0.8_g4": 2.5}}, "tp2": {"qwen2.5-32b": {"a0.8_g4": 2.25}}}
