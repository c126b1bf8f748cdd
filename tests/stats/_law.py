"""The pipeline law gate of :mod:`flashspec_core.testing.tiny`, under the name the stats tests import."""

import random
from typing import Any

import attrs

from flashspec_core.registry import Registry
from flashspec_core.testing.tiny import ALPHA, Adversaries, gate, law_of

__all__ = ["ALPHA", "Adversaries", "SteadyClock", "gate", "law_of", "seeded"]


def seeded(config: dict[str, Any], registry: Registry, seed: int = 0) -> dict[str, Any]:
    """``config`` with its selector's own generator seeded where the selector takes a ``seed``
    (Thompson sampling and its kin draw from fresh OS entropy otherwise), so a gate's samples,
    and its p-value, are the same each run."""
    spec = registry.get("selector", config["selector"]["use"])
    if spec.config_cls is not None and "seed" in attrs.fields_dict(spec.config_cls):
        config["selector"].setdefault("seed", seed)
    return config



class SteadyClock:
    """A stand-in for the ``time`` module of :mod:`flashspec_core.pipeline` whose
    ``perf_counter`` moves 0.5 to 2 ms a call, from a seeded generator: step times (which
    selectors pricing arms by their cost learn from) vary as on a machine, but the same way
    each run, so a gate's samples do not depend on the machine's load."""

    def __init__(self, seed: int = 0) -> None:
        self._rng, self._now = random.Random(seed), 0.0

    def perf_counter(self) -> float:
        self._now += self._rng.uniform(5e-4, 2e-3)
        return self._now
