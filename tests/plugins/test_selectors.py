"""flashspec_selectors: the bandit arm selectors and the step rewards."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec_core import ArmSelector
from flashspec_core.registry import build_registry
from flashspec_core.rewards import ThroughputReward, acceptance_reward
from flashspec_selectors.plugin import selector_specs
from flashspec_selectors.selectors import (
    UCB1,
    DiscountedThompson,
    DiscountedThompsonConfig,
    FixedConfig,
    SlidingWindowUCB,
    SlidingWindowUCBConfig,
    Thompson,
    ThompsonConfig,
    UCB1Config,
)

NAMES = ["fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson"]


def make(name: str, num_arms: int, **keys: object) -> ArmSelector:
    spec = build_registry(autoload=False).get("selector", name)
    assert spec.config_cls is not None
    return spec.factory(spec.config_cls(**keys), num_arms)


def test_registry_lists_every_selector() -> None:
    registry = build_registry(autoload=False)
    assert set(NAMES) <= set(registry.names("selector"))
    assert [s.name for s in selector_specs()] == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_factory_accepts_none_config_and_satisfies_protocol(name: str) -> None:
    spec = build_registry(autoload=False).get("selector", name)
    selector = spec.factory(None, 3)
    assert isinstance(selector, ArmSelector)
    assert selector.num_arms == 3


# ------------------------------------------------------------ config errors


@pytest.mark.parametrize(
    ("cls", "keys", "message"),
    [
        (FixedConfig, {"arm": -1}, "arm must be an integer >= 0"),
        (FixedConfig, {"arm": 1.5}, "arm must be an integer"),
        (UCB1Config, {"c": 0.0}, "c must be a finite number > 0"),
        (UCB1Config, {"c": math.inf}, "c must be a finite number > 0"),
        (UCB1Config, {"c": True}, "c must be a finite number > 0"),
        (UCB1Config, {"c": "2"}, "c must be a finite number > 0"),
        (ThompsonConfig, {"alpha0": 0}, "alpha0 must be a finite number > 0"),
        (ThompsonConfig, {"beta0": -1.0}, "beta0 must be a finite number > 0"),
        (ThompsonConfig, {"seed": -3}, "seed must be an integer >= 0"),
        (SlidingWindowUCBConfig, {"window": 0}, "window must be an integer >= 1"),
        (SlidingWindowUCBConfig, {"horizon": 1}, "horizon must be an integer >= 2"),
        (SlidingWindowUCBConfig, {"breakpoints": 0}, "breakpoints must be an integer >= 1"),
        (SlidingWindowUCBConfig, {"xi": math.nan}, "xi must be a finite number > 0"),
        (DiscountedThompsonConfig, {"discount": 0.0}, "discount must be a number in (0, 1]"),
        (DiscountedThompsonConfig, {"discount": 1.01}, "discount must be a number in (0, 1]"),
        (DiscountedThompsonConfig, {"alpha0": math.nan}, "alpha0 must be a finite number > 0"),
    ],
)
def test_bad_config_names_the_key(cls: type, keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        cls(**keys)


def test_fixed_arm_out_of_range_is_clear() -> None:
    with pytest.raises(ValueError, match=r"fixed selector: arm = 3 is out of range for 3 arms"):
        make("fixed", 3, arm=3)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("num_arms", [0, -1, 2.0, True])
def test_bad_num_arms(name: str, num_arms: object) -> None:
    with pytest.raises(ValueError, match="num_arms must be an integer >= 1"):
        make(name, num_arms)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reward", [math.nan, -0.01, 1.01, math.inf, "x", None])
def test_bad_reward_raises(name: str, reward: object) -> None:
    selector = make(name, 2)
    with pytest.raises(ValueError, match=r"reward must be a number in \[0, 1\]"):
        selector.update(0, reward)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arm", [-1, 2, 0.5])
def test_bad_arm_raises(name: str, arm: object) -> None:
    selector = make(name, 2)
    with pytest.raises(ValueError, match="out of range for 2 arms"):
        selector.update(arm, 0.5)  # type: ignore[arg-type]


# --------------------------------------------------------------- behaviour


def test_fixed_always_plays_its_arm() -> None:
    selector = make("fixed", 4, arm=2)
    for r in (0.0, 1.0, 0.5):
        assert selector.select() == 2
        selector.update(2, r)


def test_ucb1_plays_each_arm_once_then_uses_the_index() -> None:
    selector = UCB1(UCB1Config(), 3)
    for k, r in enumerate([0.2, 0.9, 0.5]):
        assert selector.select() == k
        selector.update(k, r)
    selector.update(1, 0.1)  # arm 1 now: mean 0.5 from 2 plays; t = 4
    index = [
        0.2 + math.sqrt(2 * math.log(4) / 1),
        0.5 + math.sqrt(2 * math.log(4) / 2),
        0.5 + math.sqrt(2 * math.log(4)),
    ]
    assert selector.select() == int(np.argmax(index)) == 2
    assert selector.select() == 2  # select alone changes nothing


def test_ucb1_prefers_the_better_arm_eventually() -> None:
    selector = UCB1(UCB1Config(), 2)
    rng = np.random.default_rng(0)
    pulls = [0, 0]
    for _ in range(2000):
        a = selector.select()
        pulls[a] += 1
        selector.update(a, float(rng.random() < (0.2, 0.8)[a]))
    assert pulls[1] > 1800


def test_thompson_fractional_update_is_exact() -> None:
    selector = Thompson(ThompsonConfig(alpha0=2.0, beta0=0.5), 2)
    for r in (0.25, 1.0, 0.0, 0.6):
        selector.update(0, r)
    assert selector.alpha.tolist() == pytest.approx([2.0 + 1.85, 2.0])
    assert selector.beta.tolist() == pytest.approx([0.5 + 2.15, 0.5])


def test_thompson_seed_reproduces() -> None:
    a, b = Thompson(ThompsonConfig(seed=7), 3), Thompson(ThompsonConfig(seed=7), 3)
    picks = []
    for _ in range(50):
        x, y = a.select(), b.select()
        picks.append(x)
        assert x == y
        a.update(x, 0.3)
        b.update(y, 0.3)
    assert len(set(picks)) > 1


def test_discounted_thompson_with_discount_one_is_thompson() -> None:
    plain = Thompson(ThompsonConfig(seed=3), 3)
    disc = DiscountedThompson(DiscountedThompsonConfig(discount=1.0, seed=3), 3)
    rng = np.random.default_rng(1)
    for _ in range(200):
        a = plain.select()
        assert disc.select() == a
        r = float(rng.random())
        plain.update(a, r)
        disc.update(a, r)


def test_discounted_thompson_decays_toward_prior() -> None:
    selector = DiscountedThompson(DiscountedThompsonConfig(discount=0.5), 2)
    selector.update(0, 1.0)
    selector.update(1, 0.0)
    assert selector.successes.tolist() == [0.5, 0.0]
    assert selector.failures.tolist() == [0.0, 1.0]


def test_default_rules() -> None:
    assert SlidingWindowUCBConfig().effective_window == math.ceil(2 * math.sqrt(10_000 * math.log(10_000)))
    assert SlidingWindowUCBConfig().effective_window == 607
    assert SlidingWindowUCBConfig(window=50).effective_window == 50
    assert DiscountedThompsonConfig().effective_discount == pytest.approx(0.9975)
    assert DiscountedThompsonConfig(horizon=400, breakpoints=4).effective_discount == pytest.approx(0.975)


def test_sliding_window_forgets() -> None:
    selector = SlidingWindowUCB(SlidingWindowUCBConfig(window=4), 2)
    for _ in range(4):
        selector.update(0, 1.0)
    assert selector.select() == 1  # never played: explored first
    selector.update(1, 0.0)
    assert selector.counts == [3, 1] and selector.sums == [3.0, 0.0]
    for _ in range(4):
        selector.update(1, 0.5)
    assert selector.counts == [0, 4]
    assert selector.select() == 0  # arm 0 fell out of the window


# ------------------------------------------------------------- properties

rewards = st.floats(min_value=0.0, max_value=1.0, allow_nan=False) | st.sampled_from([0.0, 1.0])
steps = st.lists(st.tuples(st.none() | st.integers(0, 5), rewards), max_size=120)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(num_arms=st.integers(1, 6), history=steps, window=st.integers(1, 8), discount=st.floats(0.01, 1.0))
def test_any_reward_sequence_keeps_arms_in_range(
    name: str, num_arms: int, history: list[tuple[int | None, float]], window: int, discount: float
) -> None:
    keys: dict[str, object] = {"window": window} if name == "sliding_window_ucb" else {}
    if name == "discounted_thompson":
        keys["discount"] = discount
    selector = make(name, num_arms, **keys)
    with np.errstate(all="raise", under="ignore"):  # 0/0 or overflow fails; decaying to 0 is fine
        for forced, reward in history:
            arm = selector.select()
            assert isinstance(arm, int) and 0 <= arm < num_arms
            # Sometimes the loop plays another arm than the one chosen (e.g. pinned); feed that.
            played = forced % num_arms if forced is not None else arm
            selector.update(played, reward)
        assert 0 <= selector.select() < num_arms


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reward", [0.0, 1.0])
def test_constant_rewards_and_unplayed_arms(name: str, reward: float) -> None:
    selector = make(name, 4)
    for _ in range(300):
        selector.update(0, reward)  # arms 1..3 never pulled
        assert 0 <= selector.select() < 4


# ----------------------------------------------------------------- rewards


def test_acceptance_reward() -> None:
    assert acceptance_reward([2, 4, 0], 4) == pytest.approx(0.5)
    assert acceptance_reward([3], 3) == 1.0
    assert acceptance_reward([0, 0], 0) == 0.0  # an arm that drafts nothing


@pytest.mark.parametrize(
    ("accepted", "gamma", "message"),
    [([5], 4, r"in \[0, gamma=4\]"), ([-1], 4, r"in \[0, gamma=4\]"), ([], 4, "empty"), ([0], -1, "gamma must")],
)
def test_acceptance_reward_errors(accepted: list[int], gamma: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        acceptance_reward(accepted, gamma)


def test_throughput_reward_normalises_by_running_max() -> None:
    reward = ThroughputReward()
    assert reward(0, 1.0) == 0.0  # nothing seen yet: no 0/0
    assert reward(4, 0.5) == 1.0  # 8 tok/s, the max so far
    assert reward(2, 0.5) == pytest.approx(0.5)
    assert reward(10, 0.5) == 1.0  # new max 20 tok/s
    assert reward(4, 0.5) == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("emitted", "seconds", "message"), [(-1, 1.0, "emitted"), (1, 0.0, "seconds"), (1, math.nan, "seconds")]
)
def test_throughput_reward_errors(emitted: int, seconds: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ThroughputReward()(emitted, seconds)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.floats(1e-9, 1e6)), min_size=1, max_size=50))
def test_throughput_reward_stays_in_unit_interval(steps: list[tuple[int, float]]) -> None:
    reward = ThroughputReward()
    for emitted, seconds in steps:
        r = reward(emitted, seconds)
        assert 0.0 <= r <= 1.0
