"""flashspec_bench.simulation and .scenarios: environments, regret accounting and the bandit-sim CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from flashspec_bench import scenarios
from flashspec_bench.simulation import (
    PiecewiseBernoulli,
    SpecDecodeArms,
    expected_accepted,
    main,
    selector_factories,
    simulate,
    summarise,
    thompson_bound_leading,
    ucb1_bound,
)

FAST = ["-T", "300", "--seeds", "2", "--no-progress"]


def test_main_writes_json_and_png(tmp_path: Path) -> None:
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    assert main(["--env", "bernoulli", "--means", "0.3,0.7,0.5", *FAST, "--json", str(out), "--png", str(png)]) == 0
    data = json.loads(out.read_text())
    assert set(data["selectors"]) == {"ucb1", "thompson", "sliding_window_ucb", "discounted_thompson"}
    for entry in data["selectors"].values():
        assert len(entry["final_regret"]) == 2
        lo, hi = entry["ci95"]
        assert lo <= entry["mean"] <= hi
        assert entry["curve"]["t"][-1] == 300
    assert data["ucb1_bound"] == pytest.approx(ucb1_bound([0.3, 0.7, 0.5], 300), abs=1e-3)
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(
    "args",
    [
        ["--env", "acceptance", "--rates", "0.5,0.8", "--gammas", "3,5"],
        ["--env", "piecewise", "--phases", "0.2,0.8;0.8,0.2;0.5,0.6"],
        ["--env", "drifting", "-K", "4"],
        [
            "--env",
            "costed",
            "--rates",
            "0,0.6,0.8",
            "--gammas",
            "0,4,4",
            "--costs",
            "1,1.2,2.2",
            "--reward",
            "acceptance",
        ],
        ["--env", "costed", "--reward", "throughput", "--selectors", "fixed,ucb1", "--set", "fixed.arm=1"],
    ],
)
def test_every_env_runs(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    assert main([*args, *FAST, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for entry in data["selectors"].values():
        assert all(np.isfinite(entry["final_regret"]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "ucb1.c=-1"], "c must be a finite number > 0"),
        (["--selectors", "nope"], "unknown selector 'nope'"),
        (["--set", "ucb1.bogus=1"], "selector 'ucb1'"),
        (["--selectors", "fixed", "--set", "fixed.arm=5"], "out of range for 3 arms"),
        (["-K", "4", "--means", "0.1,0.2"], "--arms 4 does not match"),
    ],
)
def test_bad_options_exit_2_with_message(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*args, *FAST]) == 2
    assert message in capsys.readouterr().err


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "bandit-sim" in capsys.readouterr().out


def test_ucb1_regret_below_its_bound() -> None:
    env = PiecewiseBernoulli([[0.1, 0.9]])
    horizon = 2000
    result = simulate(env, selector_factories(["ucb1"], {}, 2), horizon, range(10))
    final = result.regret("ucb1")[:, -1]
    bound = ucb1_bound([0.1, 0.9], horizon)
    assert bound < 0.1 * 0.8 * horizon  # the bound is far from vacuous here
    assert final.max() < bound


def test_regret_is_dynamic_after_a_change_point() -> None:
    env = PiecewiseBernoulli([[0.2, 0.8], [0.8, 0.2]], [50])
    mu = env.expected(100)
    assert mu[49].tolist() == [0.2, 0.8] and mu[50].tolist() == [0.8, 0.2]
    result = simulate(env, selector_factories(["fixed"], {}, 2), 100, [0])  # always arm 0
    regret = result.regret("fixed")[0]
    assert regret[49] == pytest.approx(50 * 0.6) and regret[-1] == pytest.approx(50 * 0.6)


def test_accepted_count_is_truncated_geometric() -> None:
    env = SpecDecodeArms([0.0, 0.5, 0.9, 1.0], [3, 3, 5, 4])
    outcomes = env.sample(np.random.default_rng(0), 40_000)
    assert outcomes.tokens is not None
    accepted = outcomes.tokens - 1
    assert accepted[:, 0].max() == 0 and np.all(accepted[:, 3] == 4)
    assert accepted.mean(axis=0) == pytest.approx(expected_accepted(env.rates, env.gammas), abs=0.03)
    # P(N = n) = a^n (1 - a) for n < gamma, a^gamma at n = gamma
    freq = np.bincount(accepted[:, 1], minlength=4) / len(accepted)
    assert freq == pytest.approx([0.5, 0.25, 0.125, 0.125], abs=0.01)


def test_costed_rewards_pick_different_arms() -> None:
    """A bigger draft accepts more but costs more: only the throughput reward finds the faster arm."""
    kw = {"rates": [0.6, 0.8], "gammas": [4, 4], "costs": [1.2, 2.2]}
    fast = int(np.argmax(SpecDecodeArms(**kw).expected(1)[0]))  # type: ignore[arg-type]
    assert fast == 0
    fractions = {}
    for kind in ("reward", "throughput"):
        env = SpecDecodeArms(**kw, reward_kind=kind)  # type: ignore[arg-type]
        result = simulate(env, selector_factories(["thompson"], {}, 2), 1500, range(3))
        fractions[kind] = float(result.best_arm_fraction("thompson").mean())
    assert fractions["reward"] < 0.2 < 0.8 < fractions["throughput"]


def test_thompson_bound_leading_term() -> None:
    """sum Delta ln T / kl(mu, mu*): by hand for two arms, 0 for equal arms, finite at mean 0."""
    kl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert thompson_bound_leading([0.5, 0.9], 1000) == pytest.approx(0.4 * math.log(1000) / kl)
    assert thompson_bound_leading([0.4, 0.4], 1000) == 0.0
    assert thompson_bound_leading([0.0, 0.5], 100) == pytest.approx(0.5 * math.log(100) / math.log(2))
    summary = summarise(simulate(PiecewiseBernoulli([[0.3, 0.7]]), selector_factories(["thompson"], {}, 2), 300, [0]))
    assert summary["thompson_bound_leading"] == pytest.approx(thompson_bound_leading([0.3, 0.7], 300), abs=1e-3)


def test_summary_reports_throughput_for_costed_env() -> None:
    env = SpecDecodeArms([0.6, 0.8], [4, 4], [1.2, 2.2], "throughput")
    summary = summarise(simulate(env, selector_factories(["ucb1"], {}, 2), 200, [0, 1]))
    entry = summary["selectors"]["ucb1"]
    assert len(entry["throughput"]) == 2 and entry["throughput_mean"] > 0
    assert "ucb1_bound" not in summary


ROOT = Path(__file__).resolve().parents[2]


def test_committed_results_have_the_promised_shape() -> None:
    data = json.loads((ROOT / "docs" / "benchmarks" / "bandit-sim.json").read_text())
    summary = data["summary"]
    selectors = {"ucb1", "thompson", "sliding_window_ucb", "discounted_thompson"}
    assert set(summary["paper_table"]) == selectors | {"ucb1_bound", "thompson_bound_leading"}
    assert summary["paper_table"]["ucb1_bound"] == pytest.approx(ucb1_bound([0.3, 0.7, 0.5], 10_000), abs=1e-3)
    lead = summary["paper_table"]["thompson_bound_leading"]
    assert lead == pytest.approx(thompson_bound_leading([0.3, 0.7, 0.5], 10_000), abs=1e-3)
    # the stationary goal: each regret, its whole 95% interval, inside its selector's bound
    assert summary["paper_table"]["ucb1"]["ci95"][1] < summary["paper_table"]["ucb1_bound"]
    assert summary["paper_table"]["thompson"]["ci95"][1] < lead
    assert set(summary["nonstationary"]) == selectors
    for name in selectors:
        for table in ("paper_table", "nonstationary"):
            lo, hi = summary[table][name]["ci95"]
            assert lo <= summary[table][name]["mean"] <= hi
        assert len(data["scenarios"]["stationary"]["selectors"][name]["final_regret"]) >= 20


def test_committed_nonstationary_goal_follows_from_the_tables() -> None:
    """``summary.nonstationary_goal`` is what scenarios.verdict gives on the committed
    per-selector numbers of each changing scenario; and the verdict names a forgetting
    selector only when its mean is below both plain selectors'."""
    data = json.loads((ROOT / "docs" / "benchmarks" / "bandit-sim.json").read_text())
    goal = data["summary"]["nonstationary_goal"]
    assert set(goal) == {"switch_at_half", "four_phase", "drifting", "best_arm_degrades", "domain_shift"}
    for scenario, v in goal.items():
        per = {k: {"mean": e["mean"], "ci95": e["ci95"]} for k, e in data["scenarios"][scenario]["selectors"].items()}
        assert v == scenarios.verdict(per)
        for name in v["below_both_plain"]:
            assert per[name]["mean"] < min(per["ucb1"]["mean"], per["thompson"]["mean"])


def test_verdict_separates_only_on_disjoint_intervals() -> None:
    verdict = scenarios.verdict
    per = {
        "ucb1": {"mean": 100.0, "ci95": [90.0, 110.0]},
        "thompson": {"mean": 500.0, "ci95": [400.0, 600.0]},
        "sliding_window_ucb": {"mean": 95.0, "ci95": [85.0, 105.0]},  # below, not apart
        "discounted_thompson": {"mean": 80.0, "ci95": [75.0, 85.0]},  # below and apart
        "glr_thompson": {"mean": 120.0, "ci95": [110.0, 130.0]},
    }
    v = verdict(per)
    assert v["below_both_plain"] == ["sliding_window_ucb", "discounted_thompson"]
    assert v["separated_from_both_plain"] == ["discounted_thompson"]
    assert v["best_plain_mean"] == 100.0
