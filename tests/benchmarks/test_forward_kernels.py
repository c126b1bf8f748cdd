"""benchmarks/forward_kernels.py --smoke: tiny shapes on the CPU write a complete result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("triton")

from flashspec_bench import forward_kernels  # noqa: E402


def test_smoke_run_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "forward.json"
    assert forward_kernels.main(["--smoke", "--no-nf4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["label"].startswith("synthetic") and data["config"]["smoke"] and data["commit"]
    rows = data["rows"]
    assert {(r["shape"], r["kernels"]) for r in rows} == {
        (s, k) for s in ("qwen2.5-1.5b", "qwen2.5-7b") for k in ("torch", "gemv", "persistent")}
    assert all(r["forward_ms_p50"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    summary = data["summary"]
    for key in ("target_forward_over_floor", "draft_forward_over_floor", "synthetic_7b_fraction_of_floor",
                "nf4_vs_bf16_b1"):
        assert key in summary  # None on a CPU: no floor, no NF4 run
    fastest = min(r["forward_ms_p50"] for r in rows if r["role"] == "target")
    assert summary["target_only_tokens_per_s"]["1"] == pytest.approx(1e3 / fastest)
    assert set(summary["gemv_speedup"]) == set(summary["persistent_speedup"]) == {"qwen2.5-1.5b", "qwen2.5-7b"}


def test_summary_figures_against_the_floor() -> None:
    def row(role: str, kernels: str, ms: float, batch: int = 1, quantization: str = "none") -> dict[str, object]:
        floor = 0.5
        return {"role": role, "shape": role, "kernels": kernels, "quantization": quantization, "batch": batch,
                "width": 1, "forward_ms_p50": ms, "floor_ms": floor, "over_floor": ms / floor,
                "fraction_of_floor": floor / ms, "tokens_per_s": batch * 1e3 / ms}

    rows = [row("target", "torch", 1.0), row("target", "gemv", 0.8), row("draft", "torch", 0.6),
            row("draft", "gemv", 0.9), row("synthetic_7b", "gemv", 0.625), row("target", "torch", 2.0, batch=8),
            row("target", "torch", 1.6, quantization="nf4")]
    s = forward_kernels.summarize(rows, [1, 8])
    assert s["target_forward_over_floor"] == pytest.approx(1.6) and s["draft_forward_over_floor"] == pytest.approx(1.2)
    assert s["synthetic_7b_fraction_of_floor"] == pytest.approx(0.8)
    assert s["target_only_tokens_per_s"] == {"1": pytest.approx(1250.0), "8": pytest.approx(4000.0)}
    assert s["by_kernels"]["torch"]["target_forward_over_floor"] == pytest.approx(2.0)
    assert s["gemv_speedup"]["target"]["b1_w1"] == pytest.approx(1.25)
    assert s["nf4_vs_bf16_b1"] == pytest.approx(0.5)  # bf16's faster path, 0.8 ms, against 1.6 ms
    assert s["faster_kernels"] == {"target_b1": "gemv", "draft_b1": "torch", "synthetic_7b_b1": "gemv",
                                   "target_b8": "torch"}
