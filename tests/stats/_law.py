"""The exact law of the first few generated tokens of a tiny target, by enumeration."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from transformers import AutoModelForCausalLM

from flashspec_core import ComponentSpec, hookimpl
from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import probs_from_logits

N = 12_000
BATCH = 2000
ALPHA = 1e-3  # per gate; 11 gates in the suite, so a false alarm in ~1% of clean runs at most
PROMPT = [1, 2, 3, 1, 2]
LENGTH = 3
EOS = 15


def sequence_law(model_dir: Path, prompt: list[int], length: int, sampling: SamplingParams, eos: int) -> dict[tuple[int, ...], float]:
    """P(first ``length`` tokens = s) under autoregressive sampling from the target.

    Sequences that hit ``eos`` early end there. Computed in float64.
    """
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    law: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.no_grad():
        for _ in range(length):
            prefixes = list(frontier)
            ids = torch.tensor([prompt + list(p) for p in prefixes])
            probs = probs_from_logits(model(ids).logits[:, -1].double(), sampling).double()
            nxt: dict[tuple[int, ...], float] = {}
            for i, prefix in enumerate(prefixes):
                for tok in torch.nonzero(probs[i] > 0).flatten().tolist():
                    mass = frontier[prefix] * float(probs[i, tok])
                    seq = (*prefix, tok)
                    (law if tok == eos else nxt)[seq] = mass
            frontier = nxt
    law.update(frontier)
    return law


def chi_square_pvalue(samples: list[tuple[int, ...]], law: dict[tuple[int, ...], float], min_expected: float = 5.0) -> float:
    """Goodness of fit of observed sequences to ``law``; cells under ``min_expected`` merged."""
    n = len(samples)
    counts = Counter(samples)
    unknown = sum(c for s, c in counts.items() if s not in law)
    if unknown:
        return 0.0  # a sequence the target cannot produce
    cells = sorted(law, key=law.get, reverse=True)
    obs, exp, rest_o, rest_e = [], [], 0.0, 0.0
    for s in cells:
        e = law[s] * n
        if e >= min_expected:
            obs.append(counts.get(s, 0))
            exp.append(e)
        else:
            rest_o += counts.get(s, 0)
            rest_e += e
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    exp_arr = np.array(exp) * (n / np.sum(exp))
    return float(stats.chisquare(np.array(obs, dtype=float), exp_arr).pvalue)


def generate_sequences(pipe, prompt: list[int], n: int, length: int, batch: int, seed: int, **sampling) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    for i in itertools.count():
        if len(out) >= n:
            break
        result = pipe.generate([prompt] * batch, max_new_tokens=length, seed=seed * 1000 + i, **sampling)
        out.extend(tuple(ids) for ids in result.token_ids)
    return out[:n]


def law_of(setup: dict[str, Any], sampling: dict[str, Any]) -> dict[tuple[int, ...], float]:
    return sequence_law(setup["target"], PROMPT, LENGTH, SamplingParams(**sampling), EOS)


def gate(pipe: Any, law: dict[tuple[int, ...], float], sampling: dict[str, Any], seed: int = 0) -> float:
    """The p-value of the pipeline's first-3-token law against the target's."""
    return chi_square_pvalue(generate_sequences(pipe, PROMPT, N, LENGTH, BATCH, seed, **sampling), law)


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


class Adversaries:
    @hookimpl
    def flashspec_arm_selectors(self):
        return [
            ComponentSpec("alternate_on_rejection", "selector", AlternateOnRejection),
            ComponentSpec("strange_parity", "selector", StrangeParity),
        ]
