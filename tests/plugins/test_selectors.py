"""flashspec_selectors: the bandit arm selectors and the step rewards."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _tiny import pipeline_dict, tiny_family
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec_core import ArmSelector, ComponentSpec, hookimpl
from flashspec_core.build import build_pipeline
from flashspec_core.registry import build_registry
from flashspec_core.rewards import ThroughputReward, acceptance_reward
from flashspec_selectors.plugin import selector_specs
from flashspec_selectors.selectors import (
    UCB1,
    DiscountedThompson,
    DiscountedThompsonConfig,
    FixedConfig,
    GLRThompson,
    GLRThompsonConfig,
    RequestThompson,
    RequestThompsonConfig,
    SlidingWindowUCB,
    SlidingWindowUCBConfig,
    Thompson,
    ThompsonConfig,
    UCB1Config,
    glr_change,
    glr_threshold,
)

NAMES = ["fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "glr_thompson", "request_thompson",
         "factored"]


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


def test_glr_default_rules() -> None:
    cfg = GLRThompsonConfig()
    assert cfg.effective_delta == pytest.approx(0.01)
    assert cfg.effective_forced == pytest.approx(math.sqrt(math.log(10_000) / 10_000))
    assert GLRThompson(cfg, 3).period == 98  # floor(3 / 0.0303)
    assert GLRThompson(GLRThompsonConfig(forced=0.0), 3).period == 0
    assert GLRThompsonConfig(horizon=400, breakpoints=4).effective_delta == pytest.approx(0.025)


@pytest.mark.parametrize("forced", [-0.1, 1.5, "x", math.nan])
def test_glr_bad_forced(forced: object) -> None:
    with pytest.raises(ValueError, match=r"forced must be a number in \[0, 1\]"):
        GLRThompsonConfig(forced=forced)  # type: ignore[arg-type]


def test_glr_change_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = np.concatenate([rng.random(rng.integers(1, 40)) < 0.2, rng.random(rng.integers(1, 40)) < 0.8]).astype(float)
        n, mu = len(x), x.mean()

        def kl(p: float, q: float) -> float:
            p, q = min(max(p, 1e-12), 1 - 1e-12), min(max(q, 1e-12), 1 - 1e-12)
            return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))

        stat = max(s * kl(x[:s].mean(), mu) + (n - s) * kl(x[s:].mean(), mu) for s in range(1, n))
        for delta in (0.5, 0.01, 1e-6):
            assert glr_change(np.cumsum(x), delta) == (stat > glr_threshold(n, delta))


def test_glr_thompson_restarts_after_a_change_and_follows_the_new_best_arm() -> None:
    rng = np.random.default_rng(1)
    selector = GLRThompson(GLRThompsonConfig(seed=0), 2)
    for t in range(4000):
        means = (0.8, 0.2) if t < 2000 else (0.2, 0.8)
        a = selector.select()
        selector.update(a, float(rng.random() < means[a]))
        if t == 1999:
            assert selector.restarts == 0  # no false alarm in the first phase
    assert selector.restarts >= 1
    assert [selector.select() for _ in range(100)].count(1) >= 90


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


def test_request_thompson_settles_on_the_arm_of_requests_that_rewarded_alike() -> None:
    # Two kinds of request: kind A pays on arm 0, kind B on arm 2; arm 1 is mediocre for both.
    kinds = {"A": [0.9, 0.5, 0.1], "B": [0.1, 0.5, 0.9]}
    selector = RequestThompson(RequestThompsonConfig(seed=0, initial_round=0), 3)  # the posterior alone
    for i in range(20):
        selector.begin_request(1)
        means = kinds["AB"[i % 2]]
        for k in range(3):  # every arm a few times, so the profiles are complete
            for _ in range(3):
                selector.update(k, means[k])
    for kind, best in (("A", 0), ("B", 2)):
        selector.begin_request(1)
        selector.update(1, 0.5)  # uninformative
        selector.update(best, kinds[kind][best])  # one telling reward
        picks = [selector.select() for _ in range(50)]
        assert picks.count(best) >= 45, (kind, picks)


def test_request_thompson_opens_each_request_with_a_round_of_every_arm() -> None:
    """Kind A pays on arm 1 only, and arm 0 (no speculation) pays 0.5 for every kind: without
    the opening round a request that starts on arm 0 learns nothing about its kind."""
    for rounds in (1, 2):
        selector = RequestThompson(RequestThompsonConfig(seed=0, initial_round=rounds, skip_first=0), 3)
        for _ in range(3):
            selector.begin_request(1)
            opening = []
            for _ in range(3 * rounds):
                opening.append(selector.select())
                selector.update(opening[-1], [0.5, 0.9, 0.1][opening[-1]])
            assert opening == [k for k in range(3) for _ in range(rounds)]
        picks = []
        for _ in range(30):
            picks.append(selector.select())
            selector.update(picks[-1], [0.5, 0.9, 0.1][picks[-1]])
        assert picks.count(1) >= 25, picks  # the rest: the new-kind branch's Beta draws


def test_request_thompson_without_requests_is_one_long_request() -> None:
    selector = RequestThompson(RequestThompsonConfig(seed=1), 2)
    for _ in range(300):
        a = selector.select()
        selector.update(a, 0.8 if a == 1 else 0.2)
    assert len(selector.past) == 0
    assert [selector.select() for _ in range(20)].count(1) >= 18


def test_request_thompson_memory_is_bounded_and_totals_follow_it() -> None:
    selector = RequestThompson(RequestThompsonConfig(memory=3, seed=0, skip_first=0), 2)
    for i in range(6):
        selector.begin_request(1)
        selector.update(i % 2, 1.0)
    selector.begin_request(2)
    assert len(selector.past) == 3
    assert selector.totals[0].tolist() == [1.0, 2.0]  # requests 3, 4, 5 played arms 1, 0, 1
    selector.begin_request(1)  # an empty request is not remembered
    assert len(selector.past) == 3


def test_request_thompson_leaves_each_requests_first_rewards_out() -> None:
    """The first decode step is the hardest to draft in every domain: with ``skip_first``
    (default 1) its reward changes neither the request's statistics nor the likelihoods."""
    selector = RequestThompson(RequestThompsonConfig(seed=0), 2)
    for _ in range(2):
        selector.begin_request(1)
        selector.update(1, 0.0)  # left out
        assert selector.now.sum() == 0 and not selector.loglik.any()
        selector.update(1, 0.9)
        assert selector.now[:, 1].tolist() == [1.0, 0.9, pytest.approx(0.81)]
    selector.begin_request(1)
    assert selector.totals[0].tolist() == [0.0, 2.0]  # one counted play per request
    skip2 = RequestThompson(RequestThompsonConfig(seed=0, skip_first=2), 2)
    skip2.begin_request(1)
    for r in (0.0, 0.1, 0.7):
        skip2.update(0, r)
    assert skip2.now[0].tolist() == [1.0, 0.0] and skip2.now[1, 0] == pytest.approx(0.7)


def test_request_thompson_seed_reproduces() -> None:
    a, b = (RequestThompson(RequestThompsonConfig(seed=5), 3) for _ in range(2))
    rng = np.random.default_rng(0)
    for t in range(200):
        if t % 17 == 0:
            a.begin_request(1)
            b.begin_request(1)
        arm = a.select()
        assert b.select() == arm
        r = float(rng.random())
        a.update(arm, r)
        b.update(arm, r)


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


request_steps = st.lists(
    st.one_of(st.just("begin"), st.tuples(st.none() | st.integers(0, 5), rewards)), max_size=150
)


@settings(max_examples=60, deadline=None)
@given(num_arms=st.integers(1, 6), history=request_steps, memory=st.integers(1, 5), alpha=st.floats(0.01, 100.0))
def test_request_thompson_any_requests_and_rewards_keep_arms_in_range(
    num_arms: int, history: list[str | tuple[int | None, float]], memory: int, alpha: float
) -> None:
    selector = make("request_thompson", num_arms, memory=memory, alpha=alpha, seed=0)
    with np.errstate(all="raise", under="ignore"):
        for item in history:
            if item == "begin":
                selector.begin_request(1)  # type: ignore[attr-defined]
                continue
            assert isinstance(item, tuple)
            forced, reward = item
            arm = selector.select()
            assert isinstance(arm, int) and 0 <= arm < num_arms
            selector.update(forced % num_arms if forced is not None else arm, reward)
        assert 0 <= selector.select() < num_arms
    state = selector  # the bookkeeping stays consistent whatever the sequence
    assert isinstance(state, RequestThompson)
    assert len(state.past) <= memory
    assert np.allclose(state.totals, sum(state.past, np.zeros((3, num_arms))) + state.now)
    assert np.all(state.global_mean > 0) and np.all(state.global_mean < 1)


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


# ------------------------------------------------------- the pipeline hook


class _Recorder:
    """Plays arm 0 and records the calls it gets, in order."""

    calls: list[str] = []

    def __init__(self, config: object, num_arms: int) -> None:
        self.num_arms = num_arms

    def begin_request(self, rows: int) -> None:
        self.calls.append(f"begin {rows}")

    def select(self) -> int:
        self.calls.append("select")
        return 0

    def update(self, arm: int, reward: float) -> None:
        self.calls.append("update")


class _Plain:
    """An old-style selector without ``begin_request``."""

    def __init__(self, config: object, num_arms: int) -> None:
        self.num_arms = num_arms

    def select(self) -> int:
        return 0

    def update(self, arm: int, reward: float) -> None:
        pass


class _TestSelectors:
    @hookimpl
    def flashspec_arm_selectors(self) -> list[ComponentSpec[ArmSelector]]:
        return [ComponentSpec("recorder", "selector", _Recorder), ComponentSpec("plain", "selector", _Plain)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("hook"))


def test_pipeline_calls_begin_request_once_per_generate(tiny: dict[str, Path]) -> None:
    registry = build_registry(autoload=False, extra_plugins=[_TestSelectors()])
    pipe = build_pipeline(pipeline_dict(tiny["target"], [tiny["close"]], "recorder"), registry)
    _Recorder.calls = []
    pipe.generate([[1, 2, 3], [4, 5]], max_new_tokens=4)
    pipe.generate([[1, 2, 3]], max_new_tokens=4)
    calls = _Recorder.calls
    assert [c for c in calls if c.startswith("begin")] == ["begin 2", "begin 1"]
    second = calls.index("begin 1")
    assert calls[0] == "begin 2" and "select" in calls[1:second] and calls[second + 1] == "select"
    # selectors without the hook keep working
    plain = build_pipeline(pipeline_dict(tiny["target"], [tiny["close"]], "plain"), registry)
    assert len(plain.generate([[1, 2, 3]], max_new_tokens=4).token_ids[0]) == 4


def test_request_thompson_in_a_pipeline_keeps_one_profile_per_generate(tiny: dict[str, Path]) -> None:
    registry = build_registry(autoload=False)
    pipe = build_pipeline(pipeline_dict(tiny["target"], [tiny["close"]], "request_thompson", seed=0), registry)
    for _ in range(3):
        pipe.generate([[1, 2, 3]], max_new_tokens=6)
    assert isinstance(pipe.selector, RequestThompson)
    assert len(pipe.selector.past) == 2  # the third request is still the current one


def test_request_thompson_retries_an_arm_whose_first_reward_was_low() -> None:
    """On the H200 a request's first draft step, on the answer's hardest token,
    scored 0.2 where later ones scored 0.9, and no speculation scores about 0.57 for every
    request: playing the mean of the sampled profile kept such a request on no speculation
    for good. Past requests say arm 0 pays 0.9 here; after one low reward it must come back."""
    selector = RequestThompson(RequestThompsonConfig(seed=0), 2)
    for _ in range(20):  # past requests of this kind, with the usual spread of rewards
        selector.begin_request(1)
        for r in (0.95, 0.8, 0.9, 1.0, 0.85):
            selector.update(0, r)
        for r in (0.55, 0.6, 0.57):
            selector.update(1, r)
    stuck = 0
    for _ in range(20):
        selector.begin_request(1)
        selector.update(0, 0.2)  # the first step: low
        picks = []
        for _ in range(30):
            picks.append(selector.select())
            selector.update(picks[-1], 0.9 if picks[-1] == 0 else 0.57)
        stuck += picks.count(0) < 20
    assert stuck <= 2, stuck
