"""Rewards in [0, 1] that a selector learns from, computed after each step.

* ``acceptance`` (the default): the mean fraction of drafted tokens accepted,
  ``mean_b num_accepted[b] / gamma``. It ignores cost, so it prefers a bigger draft
  that accepts more even when that draft makes the step slower; the ``gamma = 0``
  arm drafts nothing and gets 0.
* ``throughput``: emitted tokens per second of step time, divided by the largest
  value seen so far (so the best step so far scores 1). It is what a user feels, and
  it lets a selector learn that speculation does not pay on some prompts.

Either is a function of finished steps only, so a selector fed with it depends on
past acceptance alone and the output law stays the target's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Reward(Protocol):
    def __call__(self, arm: int, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float: ...


def acceptance_reward(arm: int, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
    if gamma == 0 or not accepted:
        return 0.0
    return min(1.0, sum(accepted) / (gamma * len(accepted)))


class ThroughputReward:
    """Tokens per second, normalised by the running maximum (state lives per pipeline)."""

    def __init__(self) -> None:
        self.best = 0.0

    def __call__(self, arm: int, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
        rate = emitted / max(step_s, 1e-9)
        self.best = max(self.best, rate)
        return rate / self.best if self.best > 0 else 0.0


def make_reward(name: str) -> Reward:
    if name == "acceptance":
        return acceptance_reward
    if name == "throughput":
        return ThroughputReward()
    raise ValueError(f"unknown reward {name!r}; expected 'acceptance' or 'throughput'")
