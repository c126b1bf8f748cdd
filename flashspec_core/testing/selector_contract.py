"""Contract checks for any :class:`~flashspec_core.contracts.ArmSelector`.

Each ``check_*`` function takes a factory ``make(seed) -> selector`` (a selector without
randomness ignores the seed), raises ``AssertionError`` with a readable message when
the contract is broken and returns nothing otherwise, so a third-party selector's test
module can apply them to its own selector::

    @pytest.mark.parametrize("num_arms", [1, 3])
    def test_acme_selector_contract(num_arms):
        make = lambda seed: GreedyFirst(GreedyFirstConfig(seed=seed), num_arms)
        check_play(make, num_arms)
        check_deterministic(make, num_arms)
        check_request_aware(make, num_arms)

The contract, for a selector built for ``num_arms`` arms:

* ``num_arms`` is the number it was built for; ``select()`` returns an integer in
  ``[0, num_arms)``, also when called again before the last choice's ``update`` (the
  pipeline draws the next choice ahead and may drop it unplayed);
* ``update(arm, reward)`` accepts every reward in ``[0, 1]``, the ends included;
* two selectors built with the same seed make the same choices given the same rewards;
* a selector that declares :class:`~flashspec_core.contracts.RequestAware` takes
  ``begin_request(rows)`` before the first ``select()`` of every request and keeps the
  other guarantees across requests.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from flashspec_core.contracts import ArmSelector, RequestAware
from flashspec_core.testing.components import component_config, component_names, component_spec, takes_seed

MakeSelector = Callable[[int], ArmSelector]


def selector_names() -> list[str]:
    """Every registered arm selector, built-ins and (unless disabled) installed plugins."""
    return component_names("selector")


def load_selector(name: str, num_arms: int, seed: int = 0, config: Mapping[str, Any] | None = None) -> ArmSelector:
    """Build registered selector ``name`` for ``num_arms`` arms; ``seed`` goes to its config's
    ``seed`` key when it has one (and ``config`` does not set it)."""
    spec = component_spec("selector", name)
    keys = dict(config or {})
    if takes_seed(spec):
        keys.setdefault("seed", seed)
    return spec.factory(component_config(spec, keys), num_arms)  # type: ignore[no-any-return]


@attrs.frozen
class Play:
    """A scripted run: ``requests`` requests of ``steps`` steps each; arm ``k``'s reward
    is its mean (spread evenly over ``[0, 1]``) plus noise, clipped, so 0 and 1 occur."""

    requests: int = 3
    steps: int = 60
    noise: float = 0.4
    seed: int = 0

    def reward(self, rng: random.Random, arm: int, num_arms: int) -> float:
        mean = (arm + 1) / (num_arms + 1)
        return min(1.0, max(0.0, mean + rng.gauss(0.0, self.noise)))


def play(selector: ArmSelector, num_arms: int, script: Play = Play()) -> list[int]:
    """The choices ``selector`` makes over ``script``, drawing each next choice ahead of
    the last one's update as the pipeline does, and dropping it at the end of a request."""
    assert selector.num_arms == num_arms, f"num_arms is {selector.num_arms!r}, built for {num_arms}"
    rng = random.Random(script.seed)
    choices: list[int] = []
    for request in range(script.requests):
        if isinstance(selector, RequestAware):
            selector.begin_request(1 + request % 3)
        ahead = _select(selector, num_arms)
        for _ in range(script.steps):
            choice, ahead = ahead, _select(selector, num_arms)
            selector.update(choice, script.reward(rng, choice, num_arms))
            choices.append(choice)
    return choices


def _select(selector: ArmSelector, num_arms: int) -> int:
    choice = selector.select()
    try:
        index = operator.index(choice)
    except TypeError:
        raise AssertionError(f"select() returned {choice!r}, not an integer") from None
    assert 0 <= index < num_arms, f"select() returned {index}, outside [0, {num_arms})"
    return index


def check_play(make: MakeSelector, num_arms: int, script: Play = Play()) -> None:
    """Every choice in range over a scripted run with draw-ahead."""
    play(make(script.seed), num_arms, script)


def check_rewards(make: MakeSelector, num_arms: int) -> None:
    """``update`` accepts the ends and the middle of ``[0, 1]`` for every arm, in any order."""
    selector = make(0)
    for reward in (0.0, 1.0, 0.5, 1e-12, 1.0 - 1e-12):
        for arm in range(num_arms):
            selector.update(arm, reward)
        _select(selector, num_arms)


def check_deterministic(make: MakeSelector, num_arms: int, script: Play = Play(), seed: int = 7) -> None:
    """Two selectors built with the same seed make the same choices given the same rewards."""
    a, b = play(make(seed), num_arms, script), play(make(seed), num_arms, script)
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    assert first is None, f"same seed {seed}, same rewards: the choices differ from step {first} on"


def check_request_aware(make: MakeSelector, num_arms: int, script: Play = Play()) -> bool:
    """For a :class:`RequestAware` selector: ``begin_request`` with 1 and several rows,
    before any ``select()`` and between requests, keeps choices in range and seeded runs
    equal. Returns whether the selector declares the capability (nothing to check if not)."""
    if not isinstance(make(0), RequestAware):
        return False
    selector = make(script.seed)
    assert isinstance(selector, RequestAware)
    selector.begin_request(4)
    selector.begin_request(1)  # a request that ended before its first step
    play(selector, num_arms, script)  # begin_request(1..3) before each request's first select()
    check_deterministic(make, num_arms, script)
    return True
