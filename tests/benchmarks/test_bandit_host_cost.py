"""benchmarks/bandit_host_cost.py: both systems report their none steps' host and policy times."""

from __future__ import annotations

import json
from pathlib import Path

from _scripts import load_benchmark

from flashspec_selectors.selectors import Factored, FactoredConfig


def test_both_systems_report_their_none_steps_and_runs_merge_by_label(tmp_path: Path) -> None:
    script = load_benchmark("bandit_host_cost")
    out = tmp_path / "host.json"
    args = ["--batches", "16", "--scenarios", "held", "--tokens", "6", "--requests", "1", "--out", str(out)]
    assert script.main([*args, "--label", "before"]) == 0
    assert script.main([*args, "--label", "after"]) == 0
    result = json.loads(out.read_text())
    assert set(result["runs"]) == {"before", "after"}  # the second run is stored beside the first
    row = result["runs"]["after"]["batches"]["16"]["held"]
    only = row["target_only"]
    assert only["steps"] == 5 and only["none_share"] == 1.0 and only["policy_ms_median"] > 0
    # primed with the H200's plain steps, the gate holds every draft back at 16 rows
    assert row["bandit"]["none_share"] == 1.0
    assert row["extra_policy_ms_median"] == row["bandit"]["policy_ms_median"] - only["policy_ms_median"]
    assert set(result["summary"]["after"]["16"]["held"]) == set(script.EXTRA)


def test_prime_has_every_arm_played_and_plain_decoding_win() -> None:
    script = load_benchmark("bandit_host_cost")
    selector = script.prime(Factored(FactoredConfig(seed=0), 3), [0, 4, 2], 16)
    assert (selector.steps > 0).all()
    assert sum(selector.select() == 0 for _ in range(200)) > 190
