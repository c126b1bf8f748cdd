"""benchmarks/verify_kernels_analysis.py on a tiny hand-made verify-kernels JSON (no GPU, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


va = load_benchmark("verify_kernels_analysis")
GBS = 4096.0  # the 1 GiB copy's rate


def _shape(b: int, gamma: int, v: int, dtype: str, ms: dict[str, float | None], first_call_s: float = 0.0,
           fraction: float = 0.5) -> dict[str, Any]:
    """One shape's times (ms); walls are twice the device times unless given."""
    return {"B": b, "gamma": gamma, "V": v, "dtype": dtype, "ms": ms, "first_call_s": first_call_s,
            "fraction": fraction}


# logits: A 0.16M, B 1.28M; C, D 20.48M; E 81.92M; F 147.456M. MiB: A 0.3, B 2.4, C 39.1, D 78.1 (graphed at
# dcd459a's 96 MiB; at 1b9e1fc's 16M logits only A and B were), E 156.3, F 281.3 (direct; E host-bound).
# graph + copy against direct: A, B win; C loses; D wins; E, F lose.
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
    m = s["ms"]
    row = {k: s[k] for k in ("B", "gamma", "V", "dtype")}
    row["logits_bytes"] = s["B"] * (s["gamma"] + 1) * s["V"] * (2 if s["dtype"] == "bfloat16" else 4)
    row.update(triton_graph={"ms": m["graph"]}, copy_same_size={"ms": m["copy"]}, triton_direct={"ms": m["direct"]})
    if m["compile"] is not None:
        row["compile_first_call_s"] = s["first_call_s"]
    return row


def _summary(s: dict[str, Any]) -> dict[str, Any]:
    m, comp = s["ms"], s["ms"]["compile"]
    return {**{k: s[k] for k in ("B", "gamma", "V", "dtype")},
            "triton_ms": m["triton"], "triton_direct_ms": m["direct"], "triton_exact_ms": m["exact"],
            "triton_graph_ms": m["graph"], "logits_pass_ms": m["pass_"], "reference_ms": m["reference"],
            "compile_ms": comp, "triton_wall_ms": m.get("triton_wall", 2 * m["triton"]),
            "reference_wall_ms": 2 * m["reference"],
            "compile_wall_ms": None if comp is None else m.get("compile_wall", 2 * comp),
            "bandwidth_fraction": s["fraction"], "copy_same_size_ms": m["copy"],
            "bandwidth_fraction_vs_same_size_copy": s["fraction"] + 0.1,
            "speedup_vs_reference": m["reference"] / m["triton"],
            "speedup_vs_compile": None if comp is None else comp / m["triton"]}


def _sweep_row(b: int, gamma: int, v: int, block: int, warps: int, per_sm: int, ms: float) -> dict[str, Any]:
    return {"dtype": "torch.bfloat16", "B": b, "gamma": gamma, "V": v, "BLOCK_V": block, "num_warps": warps,
            "programs_per_sm": per_sm, "ms": ms, "gbs": 2048.0}


# two shapes (10.9M and 147.8M logits), the commit's default (4096, 8) and (4096, 4), 4 and 8 programs per SM
PASS_SWEEP = [_sweep_row(8, 8, 151936, blk, w, sm, ms) for blk, w, sm, ms in
              ((4096, 8, 4, 2.0), (4096, 8, 8, 1.5), (4096, 4, 4, 1.0), (4096, 4, 8, 1.2))] + \
             [_sweep_row(128, 8, 128256, blk, w, sm, ms) for blk, w, sm, ms in
              ((4096, 8, 4, 4.0), (4096, 8, 8, 3.0), (4096, 4, 4, 6.0), (4096, 4, 8, 3.0))]
RACE_SWEEP = [{"B": b, "gamma": g, "V": 151936, "RACE_BLOCK_V": blk, "num_warps": w, "step_graph_ms": ms}
              for b, g, blk, w, ms in ((8, 8, 2048, 4, 0.06), (8, 8, 8192, 8, 0.045),
                                       (128, 4, 2048, 4, 0.18), (128, 4, 8192, 8, 0.175))]
DATA = {
    "commit": "dcd459a", "sm_count": 132,
    "config": {"programs_wanted": 1056, "PASS_CONFIG": {"2": [4096, 4], "4": [2048, 4]}, "RACE_BLOCK_V": 8192,
               "RACE_WARPS": 8},
    "copy_bandwidth": {"gbs": GBS},
    "pass_sweep": PASS_SWEEP, "race_sweep": RACE_SWEEP,
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
    assert out["source"] == {"json": "in.json", "measured_at_commit": "dcd459a", "defaults": {
        "graph_max": 96 << 20, "graph_unit": "bytes", "graph_from": "graph_max_bytes at dcd459a",
        "pass_config": {"2": [4096, 8], "4": [4096, 8]}, "race": [8192, 8], "programs_per_sm": 4}}
    groups = [v for v in out.values() if isinstance(v, dict) and v is not out["source"]]
    assert groups and all("how" in g for g in groups)


def test_graphed_by_bytes(out: dict[str, Any]) -> None:
    s = out["shapes"]
    assert (s["graphed"], s["direct"]) == (4, 2)  # at 16M logits (the old rule) it would be (2, 4)
    assert s["graphed_mib"]["max"] == 78.125 and s["direct_mib"]["min"] == 156.25  # D, E
    g = out["graphed_steps"]
    assert g["step_us"] == {"min": 40.0, "max": 300.0, "median": 105.0}
    assert g["step_minus_graph_us"]["median"] == 25.0
    assert g["direct_over_step"] == {"min": 1.0, "max": 5.0}
    assert g["faster_than_direct"] == [2, 4]
    assert [r["shape"] for r in g["not_faster_than_direct"]] == ["B=128 gamma=4 V=32000 bfloat16",
                                                                 "B=128 gamma=4 V=32000 float32"]
    assert g["batch_sizes"] == {"bfloat16": {"32000": [1, 8, 128]}, "float32": {"32000": [128]}}
    assert out["exact"]["graphed_us"] == {"min": 60.0, "max": 350.0}


@pytest.mark.parametrize(("commit", "config", "graphed"), [
    ("1b9e1fc", {}, 2),  # graph_max_logits = 1 << 24: A and B
    ("dcd459a", {"graph_max_bytes": 50 << 20}, 3),  # the threshold the JSON records wins: A, B, C
])
def test_graph_threshold_of_the_run(tmp_path: Path, commit: str, config: dict[str, Any], graphed: int) -> None:
    o = _analyse(tmp_path, {**DATA, "commit": commit, "config": {**DATA["config"], **config}})
    assert (o["shapes"]["graphed"], o["shapes"]["direct"]) == (graphed, 6 - graphed)
    if commit == "1b9e1fc":  # its defaults: pass (8192, 8), not in this sweep; race (2048, 4)
        assert o["pass_sweep"]["per_dtype"]["bfloat16"]["default"]["score"] is None
        assert o["race_sweep"]["default"] == "2048x4" and o["graph_threshold"]["graph_max_mib"] is None


def test_graphed_at_the_threshold() -> None:
    """At dcd459a a step replays when its logits take at most 96 MiB, in either dtype; at 1b9e1fc, 2^24 logits."""
    def row(n: int, dtype: str) -> dict[str, Any]:
        return {"B": 1, "gamma": 0, "V": n, "dtype": dtype}

    mib, new, old = 1 << 20, va.DEFAULTS["dcd459a"], va.DEFAULTS["1b9e1fc"]
    assert new.graphed(row(48 * mib, "bfloat16")) and not new.graphed(row(48 * mib + 1, "bfloat16"))
    assert new.graphed(row(24 * mib, "float32")) and not new.graphed(row(24 * mib + 1, "float32"))
    assert old.graphed(row(1 << 24, "float32")) and not old.graphed(row((1 << 24) + 1, "bfloat16"))


def test_unknown_commit_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _analyse(tmp_path, {**DATA, "commit": "abc1234"})


def test_direct_steps_and_race_share(out: dict[str, Any]) -> None:
    d = out["direct_steps"]
    assert d["shapes"] == 2 and d["logits"] == {"min": 81920000, "max": 147456000}
    assert d["host_bound"] == [{"shape": "B=512 gamma=4 V=32000 bfloat16", "step_us": 210.0, "triton_direct_us": 210.0,
                                "mib": 156.25, "graph_us": 150.0, "graph_plus_copy_us": 250.0}]
    assert d["others_step_minus_graph_us"]["max"] == pytest.approx(10.0)
    race = out["above_100M"]["largest_shape"]["bfloat16"]
    assert race["graph_minus_pass_us"] == pytest.approx(140.0) and race["share_of_graph"] == pytest.approx(0.4375)


def test_pass_bandwidth(out: dict[str, Any]) -> None:
    bf16 = out["pass_bandwidth"]["per_dtype"]["bfloat16"]
    assert bf16["goal_band"]["min"] == 0.3 and bf16["goal_band"]["max"] == 0.7
    assert bf16["goal_band"]["min_shape"] == "B=128 gamma=4 V=32000 bfloat16"
    # C's same-size copy: 2 x 40.96 MB in 0.05 ms = 1638.4 GB/s, 0.4 of 4096
    assert bf16["goal_band_same_size_copy_over_copy"]["min"] == pytest.approx(0.4)
    assert bf16["above_100M_by_B"]["512"]["max"] == 0.9
    assert out["pass_bandwidth"]["goal_band_pass_us"] == {"min": 30.0, "max": 90.0}  # C, D, E
    goal = bf16["goal"]["bandwidth_fraction"]
    assert goal["reached"] == [1, 3]  # C 0.3, E 0.7, F 0.9
    assert goal["smallest_reaching"]["shape"].startswith("B=512 gamma=8") and goal["largest_missing"]["logits"] == 81920000
    assert out["pass_bandwidth"]["per_dtype"]["float32"]["goal"]["bandwidth_fraction"]["reached"] == [0, 1]


def test_speedups(out: dict[str, Any]) -> None:
    ref, comp = out["vs_reference"], out["vs_compile"]
    assert ref["speedup"] == {"min": 1.5, "max": 10.0}
    assert ref["lowest"] == {"shape": "B=128 gamma=4 V=32000 bfloat16", "step_us": 150.0, "reference_us": 225.0,
                             "graph_us": 120.0}
    assert (comp["shapes"], comp["faster"], comp["wall_faster"]) == (5, 5, 4)
    assert comp["speedup"]["min"] == pytest.approx(1.2) and comp["lowest"]["shape"].startswith("B=512 gamma=8")
    assert [r["shape"] for r in comp["wall_slower"]] == ["B=128 gamma=4 V=32000 float32"]
    assert (comp["compiles"], comp["compile_s"]) == (2, {"min": 2.0, "max": 3.0})
    assert out["exact"]["b512_exact_over_step"] == {"min": 1.3333, "max": 1.5}


def test_graph_threshold(out: dict[str, Any]) -> None:
    t = out["graph_threshold"]
    assert t["wins_up_to_mib"] == round(2_560_000 / 2**20, 4)  # B
    assert t["first_loss_mib"] == 39.0625  # C: 40.96 MB
    assert t["loses_from_mib"] == 156.25  # E
    assert t["between_wins"] == [1, 2] and [r["shape"] for r in t["between"]][1] == "B=128 gamma=4 V=32000 float32"
    assert t["graph_max_mib"] == 96.0


def test_sweeps(out: dict[str, Any]) -> None:
    s = out["pass_sweep"]
    assert (s["shapes"], s["pairs"], s["programs_per_sm"], s["launcher_programs_per_sm"]) == (2, 2, [4, 8], 8)
    bf16 = s["per_dtype"]["bfloat16"]
    # scores: (4096, 4, 8) = 1.2/1 + 3/3 = 2.2 is the pick and what the run used; the default (4096, 8, 4)
    # 2 + 4/3; at the default's 4 per SM (4096, 4) scores 1 + 2
    assert bf16["pick"] == bf16["used"] == {"block_warps": [4096, 4], "programs_per_sm": 8, "lane_max": False,
                                            "score": 2.2}
    assert bf16["default"] == {"block_warps": [4096, 8], "programs_per_sm": 4, "lane_max": False, "score": 3.3333}
    assert bf16["best_score_by_lane_max"] == {"false": 2.2}  # a sweep from before the per-lane max
    assert bf16["default_over_used_minus_1"] == {"min": 0.3333, "max": 0.6667}  # 4/3 - 1, 2/1.2 - 1
    assert bf16["best_at_default_programs_per_sm"] == {"block_warps": [4096, 4], "score": 3.0}
    assert bf16["per_shape_best_programs_per_sm"] == {"min": 4, "max": 8}
    assert bf16["goal_band_best_fraction"]["fraction_of_copy"] == {"min": 0.5, "max": 0.5}
    r = out["race_sweep"]
    assert (r["default"], r["used"]) == ("8192x8", "8192x8")
    assert r["summed_us"] == {"2048x4": 240.0, "8192x8": 220.0}


def test_checks(out: dict[str, Any]) -> None:
    c = out["checks"]
    assert c["exact_replays_equal"] == [2, 2] and c["philox_counter_advanced_by_one"] == [2, 3]
    assert c["philox_rows_valid"] == [1, 2] and c["step_graphs_identical"] == [2, 3]
    assert c["equality"]["cases"] == 6 and c["equality"]["draws_per_setting"] == {"min": 3, "max": 3}
    assert c["equality"]["graphed_shapes"] == c["equality"]["shapes"] == ["B=2 gamma=1 V=7 float32"]


def test_defaults_recorded_by_the_benchmark_win_over_the_table() -> None:
    """A JSON whose config records the code's defaults (verify_kernels.py since 029a2b0)
    needs no entry in DEFAULTS; its pass config is per bytes per logit."""
    rec = {"PASS_CONFIG": {"2": [4096, 4], "4": [2048, 4]}, "RACE_BLOCK_V": 8192, "RACE_WARPS": 8,
           "PROGRAMS_PER_SM": 32, "graph_max_bytes": 64 << 20}
    d = va.run_defaults({"commit": "not-in-the-table", "config": {"defaults": rec}})
    assert d.pass_config == {2: (4096, 4), 4: (2048, 4)} and d.programs_per_sm == 32 and d.race == (8192, 8)
    assert d.graphed({"B": 1, "gamma": 1, "V": 16 << 20, "dtype": "bfloat16"})  # 64 MiB: graphed
    assert not d.graphed({"B": 1, "gamma": 1, "V": 16 << 20, "dtype": "float32"})  # 128 MiB: direct
    with pytest.raises(ValueError, match="no defaults known"):
        va.run_defaults({"commit": "not-in-the-table", "config": {}})


def test_sweep_scores_keep_the_lane_max_apart() -> None:
    """Rows of both forms of the pass's max score separately; the pick can be either."""
    def row(b: int, lane: bool, ms: float) -> dict[str, Any]:
        return {"dtype": "torch.bfloat16", "B": b, "gamma": 4, "V": 32000, "BLOCK_V": 4096, "num_warps": 4,
                "programs_per_sm": 8, "lane_max": lane, "ms": ms, "gbs": 1.0}

    rows = [row(8, False, 2.0), row(8, True, 1.0), row(32, False, 4.0), row(32, True, 3.0)]
    out = va.pass_sweep_dtype(rows, (4096, 4, 8, False), (4096, 4, 8, False), copy_gbs=2.0)
    assert out["pick"] == {"block_warps": [4096, 4], "programs_per_sm": 8, "lane_max": True, "score": 2.0}
    assert out["best_score_by_lane_max"] == {"false": 2 + 4 / 3, "true": 2.0}
    assert out["default_over_used_minus_1"] == {"min": 0.0, "max": 0.0}
