"""flashspec_bench.cpu_dtype: the summary's ratios, and the committed result the docs quote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashspec_bench import cpu_dtype
from flashspec_models.weights import KNOWN_MODELS

RESULT = Path(cpu_dtype.__file__).resolve().parents[2] / "docs" / "benchmarks" / "cpu-dtype.json"


def _run(cache: str, compute: str, rate: float, tokens: list[int]) -> dict[str, Any]:
    return {"cache_dtype": cache, "compute_dtype": compute, "median_tokens_per_s": rate, "load_s": 1.0,
            "peak_rss_gib": 2.0, "tokens": tokens}


def test_summary_compares_each_system_with_the_float32_cache() -> None:
    builds = [{"model": "m", "cache_dtype": "bfloat16", "disk_gib": 1.0, "build_s": 30.0},
              {"model": "m", "cache_dtype": "float32", "disk_gib": 2.0, "build_s": 20.0}]
    runs = [_run("float32", "float32", 2.0, [1, 2]), _run("bfloat16", "float32", 1.5, [1, 2]),
            _run("bfloat16", "bfloat16", 0.5, [1, 3])]
    out = cpu_dtype.summary(builds, runs)
    assert out["m"] == {"disk_ratio": 0.5, "build_ratio": 1.5}
    assert out["bfloat16_cache_float32_compute"]["speed_vs_float32_cache"] == 0.75
    assert out["bfloat16_cache_float32_compute"]["load_vs_float32_cache"] == 1.0
    assert out["bfloat16_cache_float32_compute"]["same_tokens_as_float32_cache"] is True
    assert out["bfloat16_cache_bfloat16_compute"]["same_tokens_as_float32_cache"] is False


def test_summary_compares_fast_loads_with_the_float32_cache() -> None:
    fast = [{"model": "m", "cache_dtype": "float32", "compute_dtype": "float32", "load_s": 2.0, "peak_rss_gib": 4.0},
            {"model": "m", "cache_dtype": "bfloat16", "compute_dtype": "float32", "load_s": 3.0, "peak_rss_gib": 3.0},
            {"model": "n", "cache_dtype": "float32", "compute_dtype": "float32", "load_s": 1.0, "peak_rss_gib": 1.0}]
    out = cpu_dtype.summary([], [], fast)
    assert out["fast_n_float32_cache_float32_compute"]["load_vs_float32_cache"] == 1.0
    assert out["fast_m_bfloat16_cache_float32_compute"] == {"load_s": 3.0, "peak_rss_gib": 3.0,
                                                          "load_vs_float32_cache": 1.5, "peak_rss_vs_float32_cache": 0.75}


def test_committed_result_is_what_its_script_summarises() -> None:
    data = json.loads(RESULT.read_text())
    assert data["script"] == cpu_dtype.SCRIPT and data["dirty"] is False
    assert data["summary"] == cpu_dtype.summary(data["builds"], data["runs"], data["fast_loads"])
    # weights.KnownModel.float32_gib (the first-use line's disk figure) rounds the measured sizes
    for build in data["builds"]:
        if build["cache_dtype"] == "float32":
            assert round(build["disk_gib"], 1) == KNOWN_MODELS[build["model"]].float32_gib
