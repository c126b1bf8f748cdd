"""benchmarks/verify_runs_compare.py on hand-made runs, and its committed output (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark

cmp = load_benchmark("verify_runs_compare")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def _run(commit: str, rows: list[tuple[int, int, int, str, float, float]]) -> dict:
    return {"commit": commit, "summary": {"rows": [
        {"B": b, "gamma": g, "V": v, "dtype": d, "logits_pass_ms": p, "triton_graph_ms": t}
        for b, g, v, d, p, t in rows]}}  # fmt: skip


def test_ratios_and_time_outside_the_pass() -> None:
    old = _run("a", [(512, 4, 128256, "bfloat16", 0.2, 0.5), (1, 4, 32000, "bfloat16", 0.005, 0.03)])
    new = _run("b", [(512, 4, 128256, "bfloat16", 0.1, 0.5), (1, 4, 32000, "bfloat16", 0.005, 0.06),
                     (8, 4, 32000, "float32", 0.01, 0.04)])  # fmt: skip  # not in the old run: left out
    out = cmp.compare(new, old)
    assert (out["new"], out["old"]) == ("b", "a") and len(out["rows"]) == 2
    big = out["rows"][0]
    assert big["pass_ratio"] == pytest.approx(0.5) and big["graph_ratio"] == pytest.approx(1.0)
    assert big["outside_pass_us"] == pytest.approx([300.0, 400.0]) and big["outside_pass_ratio"] == pytest.approx(4 / 3)
    g = out["groups"]
    assert g["bfloat16/b_ge_128"]["graph_ratio"] == {"min": 1.0, "median": 1.0, "max": 1.0, "n": 1}
    assert g["bfloat16/all"]["graph_ratio"]["max"] == pytest.approx(2.0)
    assert g["bfloat16/goal_band"]["pass_ratio"]["n"] == 1  # 512 x 5 x 128256 logits; 1 x 5 x 32000 is below 10M
    assert g["float32/all"]["pass_ratio"] is None


def test_committed_comparison_is_current(tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    assert cmp.main(["--dir", str(DOCS), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads((DOCS / "verify-kernels-h200-compare.json").read_text())
