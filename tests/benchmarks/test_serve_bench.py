"""flashspec_bench.serve: the statistics, and a smoke run against the tiny models on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashspec_bench import serve as sb


def test_percentile_interpolates_and_handles_no_values() -> None:
    assert sb.percentile([], 50) is None
    assert sb.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert sb.percentile([0.0, 10.0], 99) == pytest.approx(9.9)


def test_summarize_counts_tokens_over_the_wall_and_pools_gaps() -> None:
    requests = [sb.Request(0.010, (0.001, 0.003), 5, 0.02), sb.Request(0.030, (0.002,), 3, 0.04)]
    got = sb.summarize(requests, wall_s=2.0)
    assert got["output_tokens"] == 8 and got["output_tokens_per_s"] == 4.0
    assert got["ttft_ms_p50"] == 20.0 and got["itl_ms_p50"] == 2.0
    assert got["tpot_ms_p50"] == pytest.approx(3.75)  # (10 / 4 + 10 / 2) / 2


def test_summary_compares_with_no_spec_at_32_clients_only_where_both_ran() -> None:
    row = {"output_tokens_per_s": 300.0, "ttft_ms_p50": 5.0, "requests": 4}
    assert sb.summary({"spec": {"c32": row}}) == {"c32": {"output_tokens_per_s": 300.0, "ttft_ms_p50": 5.0}}
    both = sb.summary({"spec": {"c32": row}, "no_spec": {"c32": {**row, "output_tokens_per_s": 200.0}}})
    assert both["throughput_vs_no_spec_c32"] == 1.5


def test_no_spec_keeps_the_target_and_plays_one_plain_arm() -> None:
    config = {"target": {"model": "m"}, "arm": [{"use": "hf", "name": "d"}], "selector": {"use": "ucb1"}}
    plain = sb.no_spec(config)
    assert plain["target"] == config["target"] and [a["use"] for a in plain["arm"]] == ["none"]


def test_smoke_run_writes_every_level_with_and_without_speculation(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    out = tmp_path / "serve.json"
    assert sb.main(["--smoke", "--concurrency", "1,3", "--requests-per-client", "2", "--max-tokens", "6",
                    "--no-spec", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"commit", "device", "torch", "config", "runs", "summary"} <= set(result)
    for mode in ("spec", "no_spec"):
        for level, clients in (("c1", 1), ("c3", 3)):
            row = result["runs"][mode][level]
            assert row["requests"] == 2 * clients and row["output_tokens"] > 0
            assert row["ttft_ms_p50"] > 0 and row["output_tokens_per_s"] > 0
