"""flashspec_bench.replay (recorded steps through the step policy) and the simulator's step observations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from flashspec_bench import replay
from flashspec_bench.simulation import SpecDecodeArms, play
from flashspec_selectors.selectors import Factored, FactoredConfig

# Two arms: plain steps, and a draft that accepts 3 of 3 at one row but costs 10x the step at 8 rows.
RECORDED = {
    "sources": ["synthetic"],
    "request_tokens": [12] * 8,
    "arms": {
        "none": [[1, 0, 2.0, [0]], [8, 0, 2.5, [0] * 8]],
        "draft": [[1, 3, 3.0, [3]], [1, 3, 3.0, [3]], [1, 3, 90.0, [3]], [8, 3, 25.0, [3] * 8]],
    },
}


def test_pools_drop_captures_and_put_none_first() -> None:
    names, pools, dropped = replay.pools(RECORDED)
    assert names == ["none", "draft"]
    assert dropped == 1  # the 90 ms step is over 5x the draft's median
    assert sorted(pools[1]) == [1, 8] and len(pools[1][1]) == 2


def test_each_arm_is_replayed_at_its_widest_recorded_width() -> None:
    names, _, _ = replay.pools(RECORDED)
    assert replay.widths(RECORDED, names) == [0, 3]
    assert replay.replay(RECORDED, [1], seeds=1)["arm_widths"] == [0, 3]


def test_draw_step_takes_the_nearest_batch_size_and_resamples_rows() -> None:
    _, pools, _ = replay.pools(RECORDED)
    rng = np.random.default_rng(0)
    width, step_s, acc = replay.draw_step(pools[1], 6, rng)  # nearer 8 than 1
    assert (width, step_s, acc) == (3, 0.025, [3] * 6)
    width, step_s, acc = replay.draw_step(pools[1], 3, rng)  # nearer 1: its one row drawn three times
    assert (width, step_s, acc) == (3, 0.003, [3, 3, 3])


def test_replay_ranks_the_draft_at_one_row_and_plain_steps_at_eight(tmp_path: Path) -> None:
    result = replay.replay(RECORDED, [1, 8], seeds=2)
    assert result["batches"]["1"]["best_fixed_arm"] == "draft"
    assert result["batches"]["8"]["best_fixed_arm"] == "none"
    for batch in ("1", "8"):
        systems = result["batches"][batch]["systems"]
        assert systems["fixed:none"]["vs_target_only"] == 1.0
        assert set(systems) == {"thompson_per_bucket", "factored", "factored_per_request", "factored_mean", "fixed:none", "fixed:draft"}
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(RECORDED))
    out = tmp_path / "replay.json"
    assert replay.main(["--steps", str(steps), "--batches", "1", "--seeds", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["batches"]["1"]["best_fixed_arm"] == "draft"


def test_other_recordings_never_overwrite_the_committed_replay(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Extracting or replaying another run's steps without --out is refused, naming the file it
    would have replaced (it used to write docs/benchmarks/bandit-replay.json)."""
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(RECORDED))
    committed = replay.OUT.read_bytes()
    with pytest.raises(SystemExit):
        replay.main(["--steps", str(steps), "--batches", "1", "--seeds", "1"])
    err = capsys.readouterr().err
    assert "give --out" in err and "docs/benchmarks/bandit-replay.json" in err
    assert replay.OUT.read_bytes() == committed


def test_the_simulator_shows_factored_each_step() -> None:
    env = SpecDecodeArms([0.0, 0.6, 0.8], [0, 4, 4], [1.0, 1.2, 2.2], "throughput")
    outcomes = env.sample(np.random.default_rng(0), 400)
    selector = Factored(FactoredConfig(seed=0), 3)
    arms = play(selector, env, outcomes)
    assert selector.steps.sum() == 400  # every step observed, not only rewarded
    assert np.mean(arms[200:] == 1) > 0.9  # E[N + 1] / cost: 2.30 / 1.2 beats 3.36 / 2.2 and 1 / 1


# ------------------------------------------------ replay in the run's domain order

# A bench run at batch 1: ten requests of domain "a" where the lookup accepts 4 of 6 every
# step, then ten of domain "b" where it matches nothing (a plain step) and a draft of width 3
# at 3 ms accepts 2; plain steps take 2 ms.
DOMAINS = [("a", {"lookup": (4, 6, 2.0), "draft": (0, 3, 3.0)}), ("b", {"lookup": (0, 0, 2.0), "draft": (2, 3, 3.0)})]
TOKENS = 60


def _bench_runs() -> dict[str, object]:
    prompts = [(10 * d + i, name) for d, (name, _) in enumerate(DOMAINS) for i in range(10)]
    runs: dict[str, object] = {}
    for system, arm in (("target_only", None), ("fixed:lookup", "lookup"), ("fixed:draft", "draft")):
        requests, steps = [], []
        for batch_id, (prompt, domain) in enumerate(prompts):
            requests.append({"prompt": prompt, "domain": domain, "new_tokens": TOKENS, "batch_id": batch_id})
            accepted, width, ms = (0, 0, 2.0) if arm is None else dict(DOMAINS)[domain][arm]
            left = TOKENS
            while left > 0:
                steps.append({"arm_name": arm or "none", "batch_size": 1, "gamma": width, "step_ms": ms,
                              "accepted": [accepted]})
                left -= min(accepted + 1, left)
        runs[system] = {"requests": requests, "steps": steps}
    return runs


def test_sweep_lines_each_requests_steps_up_by_position() -> None:
    data = replay.sweep(_bench_runs())  # type: ignore[arg-type]
    assert [len(b) for b in data["batches"]] == [1] * 20 and data["batches"][10][0][1] == "b"
    assert data["arms"]["lookup"]["traces"]["0"][:3] == [[0, 4, 6], [5, 4, 6], [10, 4, 6]]
    assert data["arms"]["lookup"]["traces"]["10"][:2] == [[0, 0, 0], [1, 0, 0]]
    trace = replay.Trace(data, ["none", "draft", "lookup"])
    assert trace.row(2, 0, 7) == (4, 6)  # position 7 lies in the step that started at 5
    assert trace.step_s(1, 1, True, np.random.default_rng(0)) == 0.003


def test_per_request_counts_leave_a_lookup_that_stopped_matching() -> None:
    result = replay.replay_domains({"sweeps": {"1": replay.sweep(_bench_runs())}}, seeds=2)["1"]  # type: ignore[arg-type]
    systems = result["systems"]
    assert systems["fixed:lookup"]["by_domain"] == {"a": 5.0, "b": 1.0}
    assert result["best_fixed_by_domain"] == {"a": ["lookup", 5.0], "b": ["draft", 2.0]}
    # Pooled, the lookup's domain-a counts keep it played on b; per request, the draft takes b.
    assert systems["factored"]["by_domain"]["b"] < 1.2
    assert systems["factored_per_request"]["by_domain"]["b"] > 1.4


def _timed_runs(outside_ms: float = 5.0, first_ms: float = 9.0) -> dict[str, object]:
    """:func:`_bench_runs` with each batch's wall time (its steps plus ``outside_ms``), the draft's
    first step of every batch at ``first_ms`` (its prefill), and a selector run that played the
    lookup throughout."""
    runs = _bench_runs()
    runs["bandit:x"] = {"requests": [dict(q) for q in runs["fixed:lookup"]["requests"]],  # type: ignore[index]
                        "steps": runs["fixed:lookup"]["steps"]}  # type: ignore[index]
    for system, run in runs.items():
        steps = iter(run["steps"])  # type: ignore[index]
        for q in run["requests"]:  # type: ignore[index]
            left, ms, first = q["new_tokens"], 0.0, True
            while left > 0:
                s = next(steps)
                if system == "fixed:draft" and first:
                    s["step_ms"] = first_ms
                first = False
                ms += s["step_ms"]
                left -= min(s["accepted"][0] + 1, left)
            q["wall_s"] = (ms + outside_ms) / 1e3
    return runs


def test_sweep_keeps_first_steps_outside_time_order_and_the_measured_selectors() -> None:
    data = replay.sweep(_timed_runs(), ["draft", "lookup", "none"])  # type: ignore[arg-type]
    assert data["order"] == ["draft", "lookup", "none"]
    assert data["outside_ms"] == [5.0] * 20
    assert data["arms"]["draft"]["firsts"] == [[1, 3, 9.0]] * 10 + [[1, 3, 9.0]] * 10
    assert data["arms"]["none"]["firsts"][0] == [1, 0, 2.0]
    # the selector run is the lookup's: tokens/s over target-only per domain, prefill included
    a_lookup, a_plain = 12 * 2.0 + 5.0, 60 * 2.0 + 5.0  # domain a: 4 accepted of 6 -> 12 steps
    assert data["measured"]["bandit:x"]["a"] == round(a_plain / a_lookup, 3)
    assert data["measured"]["bandit:x"]["b"] == 1.0


def test_arm_order_reads_the_config() -> None:
    config = '[[arm]]\nuse = "suffix"\n\n[[arm]]\nuse = "none"\nname = "plain"\n'
    assert replay.arm_order(config) == ["suffix", "plain"]
    assert replay.arm_order(None) == []


def test_an_arms_first_step_of_a_batch_and_the_prefill_are_charged() -> None:
    data = replay.sweep(_timed_runs(first_ms=12.0), ["none", "lookup", "draft"])  # type: ignore[arg-type]
    trace = replay.Trace(data, ["none", "lookup", "draft"])
    rng = np.random.default_rng(0)
    assert trace.step_s(2, 1, True, rng, first=True) == 0.012 and trace.step_s(2, 1, True, rng) == 0.003
    result = replay.replay_domains({"sweeps": {"1": data}}, seeds=1)["1"]
    assert result["arms"] == ["none", "lookup", "draft"]  # the config's order
    # fixed draft on domain b: 20 steps of 3 ms (2 accepted of 3) a request, the first at 12 ms (a capture would be over 5x the median), plus 5 ms
    b_draft, b_plain = 12.0 + 19 * 3.0 + 5.0, 60 * 2.0 + 5.0
    assert result["systems"]["fixed:draft"]["by_domain"]["b"] == round(b_plain / b_draft, 3)
    assert result["measured"]["bandit:x"]["b"] == 1.0


def test_only_arms_recorded_near_the_batch_size_take_part() -> None:
    """An arm recorded at one row only is left out at eight rows (its one-row steps would price
    an eight-row step); at one row both take part."""
    recorded = {**RECORDED, "arms": {**RECORDED["arms"], "lookup": [[1, 4, 2.1, [2]], [1, 4, 2.1, [3]]]}}
    result = replay.replay(recorded, [1, 8], seeds=1)
    assert result["batches"]["1"]["arms"] == ["none", "draft", "lookup"]
    assert result["batches"]["8"]["arms"] == ["none", "draft"]
    assert "fixed:lookup" not in result["batches"]["8"]["systems"]


def test_static_rows_compare_a_steps_least_row_with_the_slowest_row() -> None:
    """Two rows, one accepting 3 of 3 each step and one 0 (it never matches): the slowest row
    accepts nothing; two rows that accept 3 and 0 in turn: the slowest row accepts 1.5 a step.
    The steps' counts have the same histogram (mean 1.5), so the least of two rows drawn from
    it, what the selector scores a static batch by, is 0.75 in both."""
    def runs(pattern: list[list[int]]) -> dict[str, object]:
        requests = [{"prompt": p, "domain": "a", "new_tokens": 40, "batch_id": 0} for p in (0, 1)]
        left, steps, i = [40, 40], [], 0
        while any(n > 0 for n in left):
            live = [b for b in (0, 1) if left[b] > 0]
            acc = [pattern[i % len(pattern)][b] for b in live]
            steps.append({"arm_name": "draft", "batch_size": len(live), "gamma": 3, "step_ms": 3.0, "accepted": acc})
            for b, a in zip(live, acc, strict=True):
                left[b] -= min(a + 1, left[b])
            i += 1
        plain = [{"arm_name": "none", "batch_size": 2, "gamma": 0, "step_ms": 2.0, "accepted": [0, 0]}] * 40
        return {"target_only": {"requests": requests, "steps": plain}, "fixed:draft": {"requests": requests, "steps": steps}}

    apart = replay.sweep(runs([[3, 0]]))["static_rows"]["draft"]["a"]  # type: ignore[arg-type]
    assert apart == {"mean": 1.5, "least_of_step": 0.75, "slowest_row": 0.0}
    turns = replay.sweep(runs([[3, 0], [0, 3]]))["static_rows"]["draft"]["a"]  # type: ignore[arg-type]
    assert turns == {"mean": 1.5, "least_of_step": 0.75, "slowest_row": 1.5}


def test_an_arm_with_a_fallback_replays_its_leader_where_it_proposed_else_the_fallback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep arm with a fallback that the recording lacks plays the lookup's recorded steps
    where the lookup proposed (domain a) and the draft's where it did not (domain b): the best
    fixed arm of both domains, and every system has it among its arms."""
    monkeypatch.setattr(replay, "SWEEP_FALLBACKS", (("lookup", "draft"), ("absent", "draft")))
    result = replay.replay_domains({"sweeps": {"1": replay.sweep(_bench_runs())}}, seeds=2)["1"]  # type: ignore[arg-type]
    assert result["arms"] == ["none", "draft", "lookup", "lookup-or-draft"]
    assert result["systems"]["fixed:lookup-or-draft"]["by_domain"] == {"a": 5.0, "b": 2.0}
    assert result["best_fixed_by_domain"] == {"a": ["lookup", 5.0], "b": ["draft", 2.0]}
    assert result["systems"]["factored_per_request"]["plays"]["lookup-or-draft"] > 0
    assert result["systems"]["factored_per_request"]["plays"]["lookup"] == 0  # the leader alone: fixed runs only


def test_the_shipped_selector_is_also_replayed_over_every_arm() -> None:
    """Given ``all_arms``, the replay adds the shipped selector choosing among every arm but those
    (what the arms the shipped design leaves out cost or gain it); the fixed systems play them all."""
    names = ["none", "self-l8-g3", "draft", "lookup", "lookup-or-draft"]
    out = replay.systems(names, [0, 3, 3, 6, 6], seed=0, alone={"lookup", "self-l8-g3"}, all_arms={"lookup"})
    assert [a.name for a in out["factored_per_request"]().arms if a.selectable] == ["none", "draft", "lookup-or-draft"]
    assert [a.name for a in out["factored_per_request_all_arms"]().arms if a.selectable] == [
        "none", "self-l8-g3", "draft", "lookup-or-draft"]
    assert "fixed:self-l8-g3" in out
    assert "factored_per_request_all_arms" not in replay.systems(names, [0, 3, 3, 6, 6], 0, {"lookup"}, {"lookup"})
    # the shipped arms and the self arms, which declare their share of the target's 28 layers
    priced = out["factored_per_request_self_priced"]().arms
    assert [a.name for a in priced if a.selectable] == ["none", "self-l8-g3", "draft", "lookup-or-draft"]
    assert [getattr(a.provider, "draft_cost", None) for a in priced] == [None, 8 / 28, None, None, None]


def test_the_domain_replay_chooses_among_the_shipped_design_s_arms_where_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the recording has the arms of gpu.toml's design (``BANDIT_ARMS``), the domain replay's
    selectors choose among those only; every other arm is played by its fixed system alone."""
    monkeypatch.setattr(replay, "SWEEP_FALLBACKS", (("lookup", "draft"),))
    monkeypatch.setattr(replay, "BANDIT_ARMS", ("lookup-or-draft", "none"))
    result = replay.replay_domains({"sweeps": {"1": replay.sweep(_bench_runs())}}, seeds=2)["1"]  # type: ignore[arg-type]
    plays = result["systems"]["factored_per_request"]["plays"]
    assert plays["draft"] == plays["lookup"] == 0 and plays["lookup-or-draft"] > 0
    assert result["systems"]["factored_per_request_all_arms"]["plays"]["lookup"] == 0  # the leader: never chosen


def test_a_recorded_arm_with_a_fallback_is_replayed_from_its_two_arms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sweep timed the arm with a fallback itself, its recorded steps do not say which
    arm drafted, so the replay still plays its two arms' steps: here its own recording (the
    draft's steps throughout, 3 ms each) would give domain a the draft's 2.0x, not the lookup's 5.0x."""
    monkeypatch.setattr(replay, "SWEEP_FALLBACKS", (("lookup", "draft"),))
    runs = _bench_runs()
    runs["fixed:lookup-or-draft"] = {"requests": [dict(q) for q in runs["fixed:draft"]["requests"]],  # type: ignore[index]
                                     "steps": [{**s, "arm_name": "lookup-or-draft"}
                                               for s in runs["fixed:draft"]["steps"]]}  # type: ignore[index]
    result = replay.replay_domains({"sweeps": {"1": replay.sweep(runs)}}, seeds=1)["1"]  # type: ignore[arg-type]
    assert result["arms"].count("lookup-or-draft") == 1
    assert result["systems"]["fixed:lookup-or-draft"]["by_domain"] == {"a": 5.0, "b": 2.0}
