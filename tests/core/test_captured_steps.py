"""Steps that captured a CUDA graph: flagged in the record and the log line, not learned from."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_lm
from structlog.testing import capture_logs

from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Arm, NoDraft
from flashspec_core.policy import PolicySettings, StepPolicy
from flashspec_core.rewards import make_reward
from flashspec_selectors.plugin import selector_specs

LEARNING = [s.name for s in selector_specs() if s.name != "fixed"]  # fixed learns nothing either way


@pytest.mark.parametrize("name", LEARNING)
def test_a_selector_does_not_learn_from_a_captured_step(name: str) -> None:
    spec = next(s for s in selector_specs() if s.name == name)
    selector = spec.factory(spec.default_config(), 2)
    arms = [Arm("a", NoDraft(), 0), Arm("b", NoDraft(), 0)]
    policy = StepPolicy(arms, selector, make_reward("throughput"), PolicySettings(draw_ahead=False))
    for step in range(6):  # some history first, so that an update has something to move
        policy.learn(policy.choose([0]), 0, [0], 0.001 * (1 + step % 3))
    plan = policy.choose([0])
    before = pickle.dumps(selector)
    reward = policy.learn(plan, 0, [0], 0.5, captured=True)
    assert 0.0 <= reward <= 1.0  # scored for the record all the same
    assert pickle.dumps(selector) == before
    policy.learn(plan, 0, [0], 0.5)
    assert pickle.dumps(selector) != before  # the same step, not captured, is learned from


class _Graphs:
    """A graph cache as :class:`~flashspec_core.contracts.CapturesGraphs` exposes it."""

    def __init__(self) -> None:
        self.captures = 0


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_lm(tmp_path_factory.mktemp("captured") / "target", vocab=16, seed=0, init=0.3, dtype=torch.float32)


def test_the_record_and_the_log_line_say_which_steps_captured(target: Path) -> None:
    """A target that captures a graph per (batch, width), as the fast one does: the steps that
    met a new one are flagged, and only the others update the selector."""
    pipe = build_pipeline({
        "target": {"model": str(target), "dtype": "float32", "chat_template": False},
        "arm": [{"use": "prompt_lookup", "gamma": 2}, {"use": "prompt_lookup", "gamma": 4}, {"use": "none"}],
        "verifier": {"use": "reference"},
        "selector": {"use": "thompson"},
    })
    graphs, seen, captured = _Graphs(), set(), []
    score = pipe.target.score

    def scored(tokens: Any, lengths: Any, ids: torch.Tensor) -> Any:
        key = tuple(ids.shape)
        captured.append(key not in seen)
        if key not in seen:
            seen.add(key)
            graphs.captures += 1
        return score(tokens, lengths, ids)

    pipe.target.score, pipe.target.graphs = scored, graphs
    updates, update = [0], pipe.policy.selectors[0].update

    def counted(arm: int, reward: float) -> None:
        updates[0] += 1
        update(arm, reward)

    pipe.policy.selectors[0].update = counted
    with capture_logs() as lines:
        result = pipe.generate([[1, 2, 3, 1, 2, 3, 4], [5, 6, 5, 6, 5]], max_new_tokens=30)
    steps = [line for line in lines if line["event"] == "step"]
    assert [r.captured for r in result.steps] == [line["captured"] for line in steps] == captured
    assert any(captured) and not all(captured)
    assert updates[0] == captured.count(False)
