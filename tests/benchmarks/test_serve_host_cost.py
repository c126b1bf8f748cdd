"""benchmarks/serve_host_cost.py: every mode runs and reports its per-step times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark


def test_every_mode_reports_step_loop_and_cpu_times(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    script = load_benchmark("serve_host_cost")
    out = tmp_path / "host.json"
    assert script.main(["--tokens", "8", "--repeats", "1", "--out", str(out)]) == 0
    modes = json.loads(out.read_text())["modes"]
    assert set(modes) == set(script.MODES)
    for mode, row in modes.items():
        assert row["steps"] >= 2 and row["step_ms"] > 0 and row["loop_ms"] >= 0 and row["cpu_ms"] > 0, mode
        assert 0 < row["host_cpu_ms"] < row["cpu_ms"], mode  # the steps' own CPU time is taken out
        assert ("ttft_ms" in row) == (mode in script.STREAMED), mode
    summary = json.loads(out.read_text())["summary"]
    assert summary["extra_cpu_ms_c1"] == round(modes["http"]["host_cpu_ms"] - modes["generate"]["host_cpu_ms"], 4)
    assert summary["ttft_ms_c8"] == modes["http8"]["ttft_ms"] > 0
    # one prompt of 8 new tokens, the same steps whichever path decodes it (the one arm drafts alike)
    assert modes["generate"]["steps"] == modes["engine"]["steps"] == modes["http"]["steps"]


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(SystemExit):
        load_benchmark("serve_host_cost").main(["--modes", "generate,warp"])
