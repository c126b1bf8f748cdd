"""flashspec_bench.verify_analysis on a tiny hand-made verify-kernels JSON (no GPU, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flashspec_bench import verify_analysis as va

GBS = 4096.0  # the 1 GiB copy's rate


def _shape(b: int, gamma: int, v: int, dtype: str, ms: dict[str, float | None], first_call_s: float = 0.0,
           fraction: float = 0.5) -> dict[str, Any]:
    """One shape's times (ms); walls are twice the device times unless given."""
    return {"B": b, "gamma": gamma, "V": v, "dtype": dtype, "ms": ms, "first_call_s": first_call_s,
            "fraction": fraction}


# logits: A 0.16M, B 1.28M; C, D 20.48M; E 81.92M; F 147.456M. MiB: A 0.3, B 2.4, C 39.1, D 78.1 (graphed at
# 96 MiB), E 156.3, F 281.3 (direct).
SHAPES = [
    _shape(1, 4, 32000, "bfloat16", dict(triton=0.04, direct=0.2, graph=0.03, copy=0.005, pass_=0.004, exact=0.06,
                                         reference=0.4, compile=None)),
    _shape(8, 4, 32000, "bfloat16", dict(triton=0.06, direct=0.15, graph=0.04, copy=0.01, pass_=0.006, exact=0.09,
                                         reference=0.3, compile=0.12), first_call_s=3.0),
    _shape(128, 4, 32000, "bfloat16", dict(triton=0.15, direct=0.15, graph=0.12, copy=0.05, pass_=0.03, exact=0.2,
                                           reference=0.225, compile=0.3), fraction=0.3),
    _shape(128, 4, 32000, "float32", dict(triton=0.3, direct=0.3, graph=0.1, copy=0.08, pass_=0.05, exact=0.35,
                                          reference=0.9, compile=0.45, triton_wall=0.6, compile_wall=0.5),
           first_call_s=2.0),
    _shape(512, 4, 32000, "bfloat16", dict(triton=0.21, direct=0.21, graph=0.15, copy=0.1, pass_=0.09, exact=0.28,
                                           reference=0.42, compile=0.42), fraction=0.7),
    _shape(512, 8, 32000, "bfloat16", dict(triton=0.33, direct=0.33, graph=0.32, copy=0.15, pass_=0.18, exact=0.495,
                                           reference=0.66, compile=0.396), fraction=0.9),
]


def _raw(s: dict[str, Any]) -> dict[str, Any]:
    row = {k: s[k] for k in ("B", "gamma", "V", "dtype")}
    if s["ms"]["compile"] is not None:
        row["compile_first_call_s"] = s["first_call_s"]
    return row


def _summary(s: dict[str, Any]) -> dict[str, Any]:
    m, comp = s["ms"], s["ms"]["compile"]
    return {**{k: s[k] for k in ("B", "gamma", "V", "dtype")},
            "triton_ms": m["triton"], "triton_graph_ms": m["graph"], "logits_pass_ms": m["pass_"],
            "reference_ms": m["reference"], "compile_ms": comp, "triton_wall_ms": m.get("triton_wall", 2 * m["triton"]),
            "reference_wall_ms": 2 * m["reference"],
            "compile_wall_ms": None if comp is None else m.get("compile_wall", 2 * comp),
            "bandwidth_fraction": s["fraction"], "read_floor_ms": m["pass_"] / 2,
            "read_floor_fraction": min(1.0, 2 * s["fraction"]),
            "speedup_vs_reference": m["reference"] / m["triton"],
            "speedup_vs_compile": None if comp is None else comp / m["triton"]}


DATA = {
    "commit": "dcd459a", "sm_count": 132,
    "config": {"defaults": {"graph_max_bytes": 96 << 20}},
    "copy_bandwidth": {"gbs": GBS},
    "cuda_graph": {"exact_replays_equal": [True, True], "philox_counter": [[1, 2], [2, 3], [3, 3]],
                   "philox_rows_valid": [True, False], "philox_tokens_changed": [True]},
    "step_graphs": {"cases": [{"identical": True}, {"identical": True}, {"identical": False}]},
    "equality": {"rows": 10, "mismatched_rows": 0, "cases": [
        {"B": 2, "gamma": 1, "V": 7, "dtype": "torch.float32", "q": q, "sampling": "t1", "trial": t}
        for q in (False, True) for t in range(3)]},
    "raw": [_raw(s) for s in SHAPES],
    "summary": {"copy_bandwidth_gbs": GBS, "rows": [_summary(s) for s in SHAPES]},
}


def _analyse(tmp_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    (tmp_path / "in.json").write_text(json.dumps(data))
    assert va.main(["--json", str(tmp_path / "in.json"), "--out", str(tmp_path / "out.json")]) == 0
    return json.loads((tmp_path / "out.json").read_text())


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _analyse(tmp_path_factory.mktemp("vka"), DATA)


def test_source_and_every_group_says_how(out: dict[str, Any]) -> None:
    assert out["source"] == {"json": "in.json", "measured_at_commit": "dcd459a", "graph_max_bytes": 96 << 20}
    assert out["script"] == "benchmarks/verify_kernels_analysis.py" and "date" in out
    groups = [v for v in out.values() if isinstance(v, dict) and v is not out["source"]]
    assert groups and all("how" in g for g in groups)


def test_graphed_by_bytes(out: dict[str, Any]) -> None:
    g = out["graphed_steps"]
    assert g["shapes"] == 4 and g["mib"]["max"] == 78.125  # A to D
    assert g["step_us"] == {"min": 40.0, "max": 300.0, "median": 105.0}
    assert g["step_minus_graph_us"]["median"] == 25.0
    assert g["batch_sizes"] == {"bfloat16": {"32000": [1, 8, 128]}, "float32": {"32000": [128]}}
    assert g["batch_1"] == {"graph_us": {"min": 30.0, "max": 30.0}, "pass_us": {"min": 4.0, "max": 4.0}}


def test_graphed_at_the_threshold() -> None:
    """A step replays when its logits take at most graph_max_bytes, in either dtype."""
    def row(n: int, dtype: str) -> dict[str, Any]:
        return {"B": 1, "gamma": 0, "V": n, "dtype": dtype}

    mib, d = 1 << 20, va.run_defaults({"config": {"defaults": {"graph_max_bytes": 96 << 20}}})
    assert d.graphed(row(48 * mib, "bfloat16")) and not d.graphed(row(48 * mib + 1, "bfloat16"))
    assert d.graphed(row(24 * mib, "float32")) and not d.graphed(row(24 * mib + 1, "float32"))


def test_a_run_without_recorded_defaults_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no defaults"):
        va.run_defaults({"config": {}})
    with pytest.raises(SystemExit):
        _analyse(tmp_path, {**DATA, "config": {}})


def test_pass_bandwidth(out: dict[str, Any]) -> None:
    bf16 = out["pass_bandwidth"]["per_dtype"]["bfloat16"]
    assert bf16["goal_band"]["min"] == 0.3 and bf16["goal_band"]["max"] == 0.7
    assert bf16["goal_band"]["min_shape"] == "B=128 gamma=4 V=32000 bfloat16"
    assert bf16["above_100M_by_B"]["512"]["max"] == 0.9
    assert out["pass_bandwidth"]["goal_band_pass_us"] == {"min": 30.0, "max": 90.0}  # C, D, E
    goal = bf16["goal"]
    assert goal["reached"] == [1, 3]  # C 0.3, E 0.7, F 0.9
    assert goal["smallest_reaching"]["shape"].startswith("B=512 gamma=8") and goal["largest_missing"]["logits"] == 81920000
    assert out["pass_bandwidth"]["per_dtype"]["float32"]["goal"]["reached"] == [0, 1]


def test_read_floor(out: dict[str, Any]) -> None:
    band = out["read_floor"]["per_dtype"]["bfloat16"]["goal_band"]
    assert band["pass_over_floor"] == {"min": 0.5, "max": 0.5}  # every floor here takes half the pass's time
    assert band["floor_reaching_goal"] == [1, 2]  # the bf16 band holds C (floor at 0.6 of copy) and E (1.0)
    smallest = out["read_floor"]["per_dtype"]["bfloat16"]["smallest_floor_reaching_goal"]
    assert smallest["shape"] == "B=1 gamma=4 V=32000 bfloat16"  # A's floor (1.0) reaches 0.8, at any size
def test_speedups(out: dict[str, Any]) -> None:
    ref, comp = out["vs_reference"], out["vs_compile"]
    assert ref["speedup"] == {"min": 1.5, "max": 10.0}
    assert ref["lowest"] == {"shape": "B=128 gamma=4 V=32000 bfloat16", "step_us": 150.0, "reference_us": 225.0,
                             "graph_us": 120.0}
    assert (comp["shapes"], comp["faster"], comp["wall_faster"]) == (5, 5, 4)
    assert comp["speedup"]["min"] == pytest.approx(1.2) and comp["lowest"]["shape"].startswith("B=512 gamma=8")
    assert [r["shape"] for r in comp["wall_slower"]] == ["B=128 gamma=4 V=32000 float32"]
    assert (comp["compiles"], comp["compile_s"]) == (2, {"min": 2.0, "max": 3.0})


def test_checks(out: dict[str, Any]) -> None:
    c = out["checks"]
    assert c["exact_replays_equal"] == [2, 2] and c["philox_counter_advanced_by_one"] == [2, 3]
    assert c["philox_rows_valid"] == [1, 2] and c["step_graphs_identical"] == [2, 3]
    assert c["equality"]["cases"] == 6 and c["equality"]["draws_per_setting"] == {"min": 3, "max": 3}
    assert c["equality"]["graphed_shapes"] == c["equality"]["shapes"] == ["B=2 gamma=1 V=7 float32"]
