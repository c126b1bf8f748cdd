"""The ArmSelector contract, for every registered selector (see flashspec_core.testing.selector_contract)."""

from __future__ import annotations

import random

import pytest

from flashspec_core.contracts import ArmSelector, RequestAware
from flashspec_core.testing import selector_contract as sc

NAMES = sc.selector_names()


@pytest.fixture(params=NAMES)
def selector(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.parametrize("num_arms", [1, 2, 5])
def test_play(selector: str, num_arms: int) -> None:
    make = lambda seed: sc.load_selector(selector, num_arms, seed)  # noqa: E731
    sc.check_play(make, num_arms)
    sc.check_rewards(make, num_arms)
    sc.check_deterministic(make, num_arms)


def test_request_aware(selector: str) -> None:
    declared = sc.check_request_aware(lambda seed: sc.load_selector(selector, 3, seed), 3)
    assert declared == isinstance(sc.load_selector(selector, 3), RequestAware)


def test_request_thompson_declares_begin_request() -> None:
    assert sc.check_request_aware(lambda seed: sc.load_selector("request_thompson", 3, seed), 3)


class _Unseeded:
    """A selector that draws from OS entropy whatever its seed (a planted bug)."""

    def __init__(self, num_arms: int) -> None:
        self.num_arms, self.rng = num_arms, random.Random()

    def select(self) -> int:
        return self.rng.randrange(self.num_arms)

    def update(self, arm: int, reward: float) -> None:
        pass


class _OffByOne(_Unseeded):
    def select(self) -> int:
        return self.num_arms


def test_the_checks_catch_broken_selectors() -> None:
    unseeded: sc.MakeSelector = lambda seed: _Unseeded(4)  # noqa: E731
    with pytest.raises(AssertionError, match="choices differ"):
        sc.check_deterministic(unseeded, 4)
    off_by_one: sc.MakeSelector = lambda seed: _OffByOne(4)  # noqa: E731
    with pytest.raises(AssertionError, match=r"outside \[0, 4\)"):
        sc.check_play(off_by_one, 4)
    with pytest.raises(AssertionError, match="built for 3"):
        sc.check_play(off_by_one, 3)


def test_selectors_are_arm_selectors(selector: str) -> None:
    assert isinstance(sc.load_selector(selector, 2), ArmSelector)
