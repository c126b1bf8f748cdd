"""Rewards that turn one decode step into a number in ``[0, 1]`` for a selector.

The step policy (:mod:`flashspec_core.policy`) computes one after each finished
step, so a selector fed with it depends on past acceptance alone and the output law
stays the target's. Two definitions (``[selector] reward = ...``), and why the
second is usually right:

* :func:`acceptance_reward` -- the mean fraction of drafted tokens accepted. It
  ignores what the step cost, so between a small cheap draft and a large slow one
  it prefers the large one whenever that one accepts more, even if it emits
  fewer tokens per second.
* :class:`ThroughputReward` -- emitted tokens per second of step time, divided by
  the largest tokens/s seen so far. Maximising it maximises speed, which is what
  speculative decoding is for; it also handles an arm that drafts nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol


def acceptance_reward(num_accepted: Sequence[int], gamma: int) -> float:
    """Mean over rows of ``num_accepted[b] / gamma``.

    ``gamma == 0`` (an arm that drafts nothing, i.e. plain decoding) gives 0: it
    proposes no token, so none can be accepted. This makes such an arm look
    worthless to an acceptance-driven selector even when it is the fastest; use
    :class:`ThroughputReward` to compare it fairly.

    :param num_accepted: accepted draft tokens per active row, each in ``[0, gamma]``.
    :param gamma: tokens drafted per row this step.
    :raises ValueError: no rows, ``gamma < 0``, or a count outside ``[0, gamma]``.
    """
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if len(num_accepted) == 0:
        raise ValueError("num_accepted is empty: a step needs at least one active row")
    for n in num_accepted:
        if not 0 <= n <= gamma:
            raise ValueError(f"num_accepted entries must be in [0, gamma={gamma}], got {n}")
    if gamma == 0:
        return 0.0
    return sum(int(n) for n in num_accepted) / (gamma * len(num_accepted))


class ThroughputReward:
    """Emitted tokens per second of step time, normalised by a running maximum.

    ``reward = (emitted / seconds) / max_tokens_per_s`` where the maximum is taken
    over every step observed so far, this one included, so the reward lies in
    ``[0, 1]`` and the fastest step yet scores 1. The scale therefore settles
    after the first few steps of each arm: early rewards can be a little high,
    which only adds early exploration. Keep one instance per selector, and feed
    it every step of that selector, whichever arm was played. The step policy
    keeps one per batch bucket: a step over eight rows emits about eight times
    the tokens of a step over one, so on one shared maximum the small batches'
    rewards would all sit near 0 and a selector could not compare arms there.
    """

    def __init__(self) -> None:
        self.max_tokens_per_s = 0.0

    def __call__(self, emitted: int, seconds: float) -> float:
        """Reward of a step that emitted ``emitted`` tokens in ``seconds``.

        :raises ValueError: ``emitted < 0`` or ``seconds`` not a finite number > 0.
        """
        if emitted < 0:
            raise ValueError(f"emitted must be >= 0, got {emitted}")
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
        rate = emitted / seconds
        if not math.isfinite(rate):
            raise ValueError(f"tokens per second overflowed: {emitted} tokens in {seconds!r} s")
        self.max_tokens_per_s = max(self.max_tokens_per_s, rate)
        if self.max_tokens_per_s == 0.0:  # nothing emitted yet on any step
            return 0.0
        return min(1.0, rate / self.max_tokens_per_s)


class StepReward(Protocol):
    """What the step policy calls after each step (one instance per scale: see
    :mod:`flashspec_core.policy`'s buckets and first arm)."""

    def __call__(self, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float: ...


class _Acceptance:
    def __call__(self, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
        return acceptance_reward(accepted, gamma)


class _Throughput:
    def __init__(self) -> None:
        self.rate = ThroughputReward()

    def __call__(self, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
        return self.rate(emitted, step_s)


def make_reward(name: str) -> StepReward:
    """``"acceptance"`` or ``"throughput"`` (fresh state per pipeline)."""
    if name == "acceptance":
        return _Acceptance()
    if name == "throughput":
        return _Throughput()
    raise ValueError(f"unknown reward {name!r}; expected 'acceptance' or 'throughput'")
