"""Pipeline-level exactness: the first 3 generated tokens follow the target's law.

A tiny target (V = 16) makes the law of the first 3 tokens enumerable from the
target alone; the full pipeline (KV caches, rollback, ragged batches, arms that
switch mid-sequence) must reproduce it whatever the selector, adversarial ones
included. Each gate is a chi-square test on N = 12,000 sequences at level
ALPHA = 1e-3; the same gate must reject the planted pipeline bugs below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _law import chi_square_pvalue, generate_sequences, sequence_law
from _tiny import perturbed_lm, pipeline_dict, tiny_lm

from flashspec_core import ComponentSpec, hookimpl
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import SamplingParams
from flashspec_core.registry import build_registry

pytestmark = pytest.mark.stats

N = 12_000
BATCH = 2000
ALPHA = 1e-3  # per gate; 9 gates here, so a false alarm in ~1% of clean runs at most
PROMPT = [1, 2, 3, 1, 2]
LENGTH = 3
EOS = 15


class AlternateOnRejection:
    """Legal but adversarial: switch arm whenever the last step had a rejection."""

    def __init__(self, config: Any, num_arms: int) -> None:
        self.num_arms, self.arm = num_arms, 0

    def select(self) -> int:
        return self.arm

    def update(self, arm: int, reward: float) -> None:
        if reward < 1.0:
            self.arm = (self.arm + 1) % self.num_arms


class StrangeParity:
    """Legal but strange: arm = parity of the running count of sub-0.5 rewards, plus a rotation."""

    def __init__(self, config: Any, num_arms: int) -> None:
        self.num_arms, self.low, self.t = num_arms, 0, 0

    def select(self) -> int:
        return (self.low % 2 + self.t // 3) % self.num_arms

    def update(self, arm: int, reward: float) -> None:
        self.t += 1
        self.low += reward < 0.5


class _Adversaries:
    @hookimpl
    def flashspec_arm_selectors(self):
        return [
            ComponentSpec("alternate_on_rejection", "selector", AlternateOnRejection),
            ComponentSpec("strange_parity", "selector", StrangeParity),
        ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("law")
    target = tiny_lm(root / "target", vocab=16, seed=0, init=0.3)
    drafts = [perturbed_lm(target, root / "close", noise=0.3, seed=1), tiny_lm(root / "far", vocab=16, seed=7, init=0.3)]
    return {"target": target, "drafts": drafts, "registry": build_registry(extra_plugins=[_Adversaries()])}


def law_of(setup: dict[str, Any], sampling: dict[str, Any]) -> dict[tuple[int, ...], float]:
    return sequence_law(setup["target"], PROMPT, LENGTH, SamplingParams(**sampling), EOS)


def gate(pipe: Any, law: dict[tuple[int, ...], float], sampling: dict[str, Any], seed: int = 0) -> float:
    """The p-value of the pipeline's first-3-token law against the target's."""
    return chi_square_pvalue(generate_sequences(pipe, PROMPT, N, LENGTH, BATCH, seed, **sampling), law)


SAMPLINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
]
SELECTORS = ["fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "alternate_on_rejection", "strange_parity"]


@pytest.mark.parametrize("selector", SELECTORS)
def test_law_holds_for_every_selector(setup: dict[str, Any], selector: str) -> None:
    sampling = SAMPLINGS[0]
    pipe = build_pipeline(pipeline_dict(setup["target"], setup["drafts"], selector, dtype="float32"), setup["registry"])
    assert gate(pipe, law_of(setup, sampling), sampling) > ALPHA


@pytest.mark.parametrize("sampling", SAMPLINGS[1:], ids=["top_k", "top_p"])
def test_law_holds_with_filtering(setup: dict[str, Any], sampling: dict[str, Any]) -> None:
    pipe = build_pipeline(pipeline_dict(setup["target"], setup["drafts"], "alternate_on_rejection", dtype="float32"), setup["registry"])
    assert gate(pipe, law_of(setup, sampling), sampling) > ALPHA
