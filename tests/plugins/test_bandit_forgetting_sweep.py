"""benchmarks/bandit_forgetting_sweep.py on a short run, and its committed output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark

sweep = load_benchmark("bandit_forgetting_sweep")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"


def test_settings_scale_the_rules_memory() -> None:
    s = sweep.settings(10_000)
    assert s["sliding_window_ucb@1"][1] == {"window": 607}
    assert s["sliding_window_ucb@4"][1] == {"window": 2428}
    assert s["discounted_thompson@1"][1]["discount"] == pytest.approx(0.9975)
    assert 1 / (1 - s["discounted_thompson@0.25"][1]["discount"]) == pytest.approx(100)
    assert s["ucb1"] == ("ucb1", {}, 1.0) and s["thompson"] == ("thompson", {}, 1.0)


def _fake_summary(means: dict[str, float]) -> dict:
    return {"selectors": {k: {"mean": m, "ci95": [m - 1, m + 1]} for k, m in means.items()}}


def test_table_lists_the_multiples_below_both_plain_selectors() -> None:
    means = {"ucb1": 100.0, "thompson": 500.0}
    for label, (name, _, m) in sweep.settings(10_000).items():
        if name == "sliding_window_ucb":
            means[label] = 300.0 / m  # longer memory, less regret: below 100 from 4x
        elif name == "discounted_thompson":
            means[label] = 150.0  # never below
    t = sweep.table(_fake_summary(means), 10_000)
    sw, dts = t["verdict"]["sliding_window_ucb"], t["verdict"]["discounted_thompson"]
    assert sw["below_both_plain"] == [4.0, 8.0, 16.0]
    assert sw["separated_from_both_plain"] == [4.0, 8.0, 16.0]  # 75 + 1 < 99
    assert (sw["best_multiple"], sw["rule_mean"]) == (16.0, 300.0)
    assert dts["below_both_plain"] == [] and dts["rule_mean"] == 150.0
    assert t["best_plain_mean"] == 100.0
    assert [r["window"] for r in t["by_multiple"]["sliding_window_ucb"]][:3] == [152, 304, 607]


def test_short_run_writes_json_and_png(tmp_path: Path) -> None:
    argv = ["--horizon", "300", "--seeds", "2", "--scenarios", "switch_at_half", "--out", str(tmp_path)]
    assert sweep.main([*argv, "--no-progress"]) == 0
    data = json.loads((tmp_path / "bandit-forgetting-sweep.json").read_text())
    assert list(data["summary"]) == ["switch_at_half"] and data["config"]["horizon"] == 300
    assert not list(tmp_path.glob("*.tmp"))
    png = tmp_path / "bandit-forgetting-sweep.png"
    png.unlink()
    assert sweep.main(["--plot-only", "--out", str(tmp_path)]) == 0 and png.stat().st_size > 0


def test_unknown_scenario_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        sweep.main(["--scenarios", "switch_at_half,nope"])
    assert "unknown nope" in capsys.readouterr().err


def test_committed_verdicts_follow_from_their_rows() -> None:
    """The committed verdicts are what table() gives on the committed per-seed summaries."""
    data = json.loads((DOCS / "bandit-forgetting-sweep.json").read_text())
    assert data["config"]["horizon"] == 10_000 and len(data["config"]["seeds"]) >= 20
    for scenario, run in data["runs"].items():
        assert data["summary"][scenario] == sweep.table(run, data["config"]["horizon"])
