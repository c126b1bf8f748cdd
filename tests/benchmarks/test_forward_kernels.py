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


def test_merge_keeps_the_rows_a_run_did_not_measure_and_refuses_another_device(tmp_path: Path) -> None:
    """A run of one shape merged into a full result: its rows replace the old ones of the same key,
    the others stay with their own commit, and the summary is taken over all of them."""
    def row(shape: str, kernels: str, ms: float, quantization: str = "none") -> dict[str, object]:
        return {"role": "target" if shape == "1.5b" else "draft", "shape": shape, "kernels": kernels,
                "quantization": quantization, "batch": 1, "width": 1, "forward_ms_p50": ms, "floor_ms": 0.5,
                "over_floor": ms / 0.5, "fraction_of_floor": 0.5 / ms, "tokens_per_s": 1e3 / ms}

    old = {"device": "H100", "cuda": "13.0", "commit": "aaa", "config": {"batches": [1, 8]},
           "rows": [row("1.5b", "torch", 2.0), row("1.5b", "gemv", 2.2), row("0.5b", "torch", 1.0),
                    row("1.5b", "torch", 20.0, "nf4")]}
    run = {"device": "H100", "cuda": "13.0", "commit": "bbb", "config": {"batches": [1]},
           "rows": [row("1.5b", "torch", 1.9), row("1.5b", "torch", 4.75, "nf4")]}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "run.json").write_text(json.dumps(run))
    out = tmp_path / "out.json"
    assert forward_kernels.main(["--from-run", str(tmp_path / "run.json"), "--merge", str(tmp_path / "old.json"),
                                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["merged"]["rows_kept"] == 2 and data["merged"]["rows_by_commit"] == {"bbb": 2, "aaa": 2}
    assert sorted((r["shape"], r["kernels"], r["quantization"], r["commit"]) for r in data["rows"]) == [
        ("0.5b", "torch", "none", "aaa"), ("1.5b", "gemv", "none", "aaa"), ("1.5b", "torch", "nf4", "bbb"),
        ("1.5b", "torch", "none", "bbb")]
    assert data["summary"]["nf4_vs_bf16_b1"] == pytest.approx(0.4)  # this run's 1.9 ms against its 4.75
    assert data["summary"]["draft_forward_over_floor"] == pytest.approx(2.0)  # the kept row
    with pytest.raises(ValueError, match="measured on 'A100'"):
        forward_kernels.merge(run, {**old, "device": "A100"}, "old.json")
    with pytest.raises(SystemExit):
        forward_kernels.parse(["--from-run", str(tmp_path / "run.json")])


def test_a_measured_run_merges_into_an_earlier_result(tmp_path: Path) -> None:
    """--merge beside a measurement (not only --from-run): the run's rows replace the earlier
    ones of the same key, and the written file holds no path objects (the config leaves the
    two file options out)."""
    old, out = tmp_path / "old.json", tmp_path / "out.json"
    assert forward_kernels.main(["--smoke", "--no-nf4", "--kernels", "torch", "gemv", "--out", str(old)]) == 0
    assert forward_kernels.main(["--smoke", "--no-nf4", "--kernels", "torch", "--merge", str(old),
                                 "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert "merge" not in data["config"] and "from_run" not in data["config"]
    assert data["merged"]["rows_kept"] == 2  # the gemv rows; the torch rows are this run's
    assert {(r["shape"], r["kernels"]) for r in data["rows"]} == {
        ("qwen2.5-1.5b", "torch"), ("qwen2.5-7b", "torch"), ("qwen2.5-1.5b", "gemv"), ("qwen2.5-7b", "gemv")}
    assert [r["kernels"] for r in data["rows"]][:2] == ["torch", "torch"]  # this run's rows first
