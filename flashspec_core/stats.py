"""Summary statistics of a run, from its step records alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashspec_core.contracts import StepRecord


def summarize(steps: Sequence[StepRecord], arm_names: Sequence[str], new_tokens: Sequence[int], wall_s: float) -> dict[str, Any]:
    """Acceptance per arm and per position, mean accepted length, tokens/s."""
    def blank() -> dict[str, Any]:
        return {"steps": 0, "row_steps": 0, "drafted": 0, "accepted": 0, "emitted": 0, "by_position": []}

    per_arm = {name: blank() for name in arm_names}
    for rec in steps:
        arm = per_arm.setdefault(rec.arm_name, blank())  # the batch limit's steps appear only when it ran
        arm["steps"] += 1
        arm["row_steps"] += len(rec.accepted)
        arm["drafted"] += rec.gamma * len(rec.accepted)
        arm["accepted"] += sum(rec.accepted)
        arm["emitted"] += rec.emitted
        counts = arm["by_position"]
        counts.extend([0] * (rec.gamma - len(counts)))
        for n in rec.accepted:
            for i in range(n):
                counts[i] += 1
    for arm in per_arm.values():
        rows = max(arm["row_steps"], 1)
        arm["acceptance_rate"] = arm["accepted"] / arm["drafted"] if arm["drafted"] else None
        arm["acceptance_by_position"] = [c / rows for c in arm.pop("by_position")]
        arm["mean_accepted_length"] = arm["emitted"] / rows if arm["row_steps"] else None
    row_steps = sum(len(r.accepted) for r in steps)
    total = sum(new_tokens)
    return {
        "steps": len(steps),
        "new_tokens": total,
        "wall_s": wall_s,
        "tokens_per_s": total / wall_s if wall_s > 0 else 0.0,
        "mean_accepted_length": sum(r.emitted for r in steps) / row_steps if row_steps else 0.0,
        "draft_ms": sum(r.draft_ms for r in steps),
        "target_ms": sum(r.target_ms for r in steps),
        "verify_ms": sum(r.verify_ms for r in steps),
        "arms": per_arm,
        "plain_steps": sum(1 for r in steps if r.gamma == 0 and not r.captured and r.step_ms > 0),
        "vs_plain": vs_plain(steps),
    }


MIN_PLAIN_STEPS = 3


def vs_plain(steps: Sequence[StepRecord]) -> float | None:
    """The run's tokens per step-millisecond over those of its own plain steps (no draft; a
    lookup without a match is one too): how much faster than plain decoding it decoded, from
    step times alone (prefill left out), where it took at least :data:`MIN_PLAIN_STEPS` plain
    steps. Steps that captured a CUDA graph are left out of both."""
    timed = [r for r in steps if not r.captured and r.step_ms > 0]
    plain = [r for r in timed if r.gamma == 0]
    if len(plain) < MIN_PLAIN_STEPS:
        return None
    rate = sum(r.emitted for r in timed) / sum(r.step_ms for r in timed)
    return rate / (sum(r.emitted for r in plain) / sum(r.step_ms for r in plain))
