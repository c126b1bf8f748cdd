"""flashspec_bench.replay (recorded steps through the step policy) and the simulator's step observations."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

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
        assert set(systems) == {"thompson_per_bucket", "factored", "fixed:none", "fixed:draft"}
    steps = tmp_path / "steps.json"
    steps.write_text(json.dumps(RECORDED))
    out = tmp_path / "replay.json"
    assert replay.main(["--steps", str(steps), "--batches", "1", "--seeds", "1", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["batches"]["1"]["best_fixed_arm"] == "draft"


def test_the_simulator_shows_factored_each_step() -> None:
    env = SpecDecodeArms([0.0, 0.6, 0.8], [0, 4, 4], [1.0, 1.2, 2.2], "throughput")
    outcomes = env.sample(np.random.default_rng(0), 400)
    selector = Factored(FactoredConfig(seed=0), 3)
    arms = play(selector, env, outcomes)
    assert selector.steps.sum() == 400  # every step observed, not only rewarded
    assert np.mean(arms[200:] == 1) > 0.9  # E[N + 1] / cost: 2.30 / 1.2 beats 3.36 / 2.2 and 1 / 1
