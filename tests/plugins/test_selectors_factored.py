"""flashspec_selectors: the ``factored`` selector (acceptance pooled over batch sizes, a linear step cost)."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from _tiny import pipeline_dict, tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError, parse_config
from flashspec_core.contracts import ObservesSteps, RequestAware, SeesWidths
from flashspec_core.policy import Arm, NoDraft, PolicySettings, StepPolicy
from flashspec_core.registry import build_registry
from flashspec_core.rewards import make_reward
from flashspec_selectors.selectors import (
    Factored,
    FactoredConfig,
    Thompson,
    ThompsonConfig,
    chain_acceptance_prior,
    cost_features,
    expected_least,
    predicted_throughput,
    request_prior_rows,
    shared_slopes_fit,
    width_slope_information,
)

PLANTED = np.array([2e-3, 5e-5, 2e-5])  # seconds: per step, per row, per drafted token of a row


def planted_time(rows: int, width: int, coefficients: np.ndarray = PLANTED) -> float:
    return float(cost_features(rows, width) @ coefficients)


def feed(selector: Factored, arm: int, rows: int, width: int, accepted: int, step_s: float) -> None:
    selector.observe(arm, rows, width, [accepted] * rows, step_s)


def test_cost_model_recovers_a_planted_linear_cost() -> None:
    rng = np.random.default_rng(0)
    selector = Factored(FactoredConfig(seed=0), 2)
    other = np.array([1e-3, 2e-4, 0.0])  # a second arm with another cost, so the pooled prior is off for arm 1
    for _ in range(400):
        rows, width = int(rng.integers(1, 33)), int(rng.integers(0, 9))
        noise = 1.0 + 0.01 * rng.standard_normal()
        feed(selector, 1, rows, width, 0, planted_time(rows, width) * noise)
        feed(selector, 0, rows, 0, 0, planted_time(rows, 0, other) * noise)
    np.testing.assert_allclose(selector.cost_coefficients(1), PLANTED, rtol=0.05, atol=2e-6)
    np.testing.assert_allclose(selector.cost_coefficients(0)[:2], other[:2], rtol=0.05, atol=2e-6)


def test_an_arm_seen_at_small_batches_predicts_its_cost_at_32_rows() -> None:
    selector = Factored(FactoredConfig(seed=0), 2)
    for rows in (1, 2, 4, 8, 16, 32):
        for _ in range(20):
            feed(selector, 0, rows, 0, 0, planted_time(rows, 0))
    for rows in (1, 4):  # the draft arm never above four rows
        for _ in range(20):
            feed(selector, 1, rows, 4, 3, planted_time(rows, 4) + 1e-3)
    at_32 = float(cost_features(32, 4) @ selector.cost_coefficients(1))
    assert at_32 == pytest.approx(planted_time(32, 4) + 1e-3, rel=0.05)


def test_picks_none_when_every_draft_predicts_lower_throughput() -> None:
    selector = Factored(FactoredConfig(seed=1), 3)  # arm 0 drafts nothing
    for rows in (1, 8, 32):
        for _ in range(30):
            feed(selector, 0, rows, 0, 0, planted_time(rows, 0))
            feed(selector, 1, rows, 4, 0, planted_time(rows, 4) + 1e-3)  # rejects everything, and slower
            feed(selector, 2, rows, 2, 1, 2.5 * planted_time(rows, 2))  # accepts 1 of 2 at 2.5x the time
    for rows in (1, 8, 32):
        selector.see_rows(rows)
        assert [selector.select() for _ in range(200)] == [0] * 200


def test_drafts_at_one_row_and_not_at_32_from_the_same_steps() -> None:
    # The draft's cost grows with rows * width; at one row it pays, at 32 it does not.
    cost = np.array([2e-3, 5e-5, 2e-4])
    selector = Factored(FactoredConfig(seed=2), 2)
    for rows in (1, 2, 4, 8, 16, 32):
        for _ in range(15):
            feed(selector, 0, rows, 0, 0, planted_time(rows, 0, cost))
            feed(selector, 1, rows, 4, 2, planted_time(rows, 4, cost))
    assert predicted_throughput(1, 2, planted_time(1, 4, cost)) > predicted_throughput(1, 0, planted_time(1, 0, cost))
    assert predicted_throughput(32, 2, planted_time(32, 4, cost)) < predicted_throughput(32, 0, planted_time(32, 0, cost))
    selector.see_rows(1)
    assert sum(selector.select() == 1 for _ in range(200)) > 190
    selector.see_rows(32)
    assert sum(selector.select() == 0 for _ in range(200)) > 190


def test_expected_least_is_the_mean_of_the_least_of_independent_rows() -> None:
    counts = np.array([[0.0, 0.0, 5.0, 0.0], [1.0, 1.0, 0.0, 0.0], [2.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(expected_least(counts, 1), [2.0, 0.5, 1.0, 0.0])
    np.testing.assert_allclose(expected_least(counts, 3), [2.0, 0.125, (2 / 4) ** 3 + (1 / 4) ** 3 * 2, 0.0])
    rng = np.random.default_rng(0)
    draws = rng.choice(4, p=counts[2] / counts[2].sum(), size=(200_000, 5)).min(1)
    assert expected_least(counts, 5)[2] == pytest.approx(draws.mean(), abs=0.01)


@pytest.mark.parametrize(("static_batch", "arm"), [(True, 0), (False, 1)])
def test_a_draft_whose_rows_split_between_none_and_many_loses_a_static_batch(static_batch: bool, arm: int) -> None:
    # Half the rows accept 6 of 8 and half none: 4 tokens per row on average, more tokens per
    # second than plain decoding at 32 rows, but a static batch waits on the rows that get 1.
    selector = Factored(FactoredConfig(seed=3, static_batch=static_batch), 2)
    for rows in (1, 32):
        for _ in range(30):
            selector.observe(0, rows, 0, [0] * rows, planted_time(rows, 0))
            selector.observe(1, rows, 8, [0, 6] * (rows // 2) or [6], planted_time(rows, 8))
    assert predicted_throughput(32, 3, planted_time(32, 8)) > predicted_throughput(32, 0, planted_time(32, 0))
    selector.see_rows(32)
    assert sum(selector.select() == arm for _ in range(200)) > 190
    selector.see_rows(1)  # one row: the least is the mean, and the draft pays either way
    assert sum(selector.select() == 1 for _ in range(200)) > 190


def test_a_few_unlucky_counts_do_not_shut_the_best_arm_out() -> None:
    # The 0.6-rate draft (1.92 tokens per time unit on average) accepted 2 tokens in its first
    # 11 steps; the 0.8-rate one (1.53) is well known. A normal draw around so tight a spread
    # would hardly ever retry the first (about 1 in 10^4 steps).
    selector = Factored(FactoredConfig(seed=4, warmup=0), 3)
    for _ in range(2):
        selector.observe(0, 1, 0, [0], 1.0)
    for n in [0] * 9 + [1, 1]:
        selector.observe(1, 1, 4, [n], 1.2)
    for n in [2, 3, 2] * 100:
        selector.observe(2, 1, 4, [n], 2.2)
    assert sum(selector.select() == 1 for _ in range(20_000)) > 20


def test_the_acceptance_prior_is_the_chain_mean_under_a_uniform_rate() -> None:
    alpha = (np.arange(200_000) + 0.5) / 200_000  # midpoints of [0, 1]
    for width in (0, 1, 4, 8):
        expected = sum(float(np.mean(alpha**i)) for i in range(1, width + 1))  # E[sum_i alpha^i]
        assert chain_acceptance_prior(width) == pytest.approx(expected, abs=1e-6)
    assert chain_acceptance_prior(np.array([2.5]))[0] == pytest.approx((1 / 2 + 1 / 3 + 1 / 2 + 1 / 3 + 1 / 4) / 2)


def test_the_least_of_rows_prior_is_the_mean_least_chain_under_a_uniform_rate() -> None:
    rng = np.random.default_rng(0)
    alpha = rng.random(200_000)
    for rows, width in ((1, 3), (4, 3), (8, 6), (32, 8)):
        # A row's chain accepts i or more with probability alpha^i; the rows share alpha.
        least = np.stack([rng.random((alpha.size, rows)).max(1) < alpha**i for i in range(1, width + 1)]).sum(0)
        assert chain_acceptance_prior(width, rows) == pytest.approx(least.mean(), abs=0.01)
    assert chain_acceptance_prior(3, 32) < 0.06 < 1.0 < chain_acceptance_prior(3)


def _plain_and_a_costly_draft(rows: int, static_batch: bool = True) -> Factored:
    # Three arms: plain decoding and a draft, both opened and costed at one row and at ``rows``
    # (so the fit tells the slopes); arm 2 not played yet.
    selector = Factored(FactoredConfig(seed=6, static_batch=static_batch), 3)
    for _ in range(4):
        for r in (1, rows):
            selector.observe(0, r, 0, [0] * r, planted_time(r, 0))
            selector.observe(1, r, 4, ([0, 4] * r)[:r], planted_time(r, 4) + 3e-3)
    return selector


def test_an_arm_is_not_opened_where_its_prior_cannot_beat_the_costed_arms() -> None:
    selector = _plain_and_a_costly_draft(32)
    selector.see_rows(32)  # the least of 32 rows' chains expects under 0.06 tokens: not worth a forced play
    assert 2 not in [selector.select() for _ in range(200)]
    selector.see_rows(1)  # at one row a chain of the same width expects a token or more
    assert selector.select() == 2 and selector.outstanding[2] == 1


def test_held_back_arms_open_where_rows_are_refilled() -> None:
    # Refilled rows are scored by the mean row, whose prior does not fall with the rows.
    selector = _plain_and_a_costly_draft(32, static_batch=False)
    selector.see_rows(32)
    assert selector.select() == 2


def test_a_wide_draft_that_accepts_nothing_is_dropped_within_a_few_plays() -> None:
    # Twice a plain step's time for eight drafted tokens (a CPU verifying nine), none ever accepted.
    plays = []
    for seed in range(40):
        selector = Factored(FactoredConfig(seed=seed), 2)
        for _ in range(64):
            arm = selector.select()
            feed(selector, arm, 1, 8 * arm, 0, 0.33 * (1 + arm))
        plays.append(selector.steps[1])
    assert np.mean(plays) < 7  # the two opening plays and a few more; width / 2 as the prior mean gave 10


def test_plays_every_arm_once_then_the_model() -> None:
    selector = Factored(FactoredConfig(seed=0, initial=1, warmup=0), 3)
    feed(selector, 0, 1, 0, 0, 2e-3)
    assert selector.select() == 1
    feed(selector, 1, 1, 4, 0, 3e-3)
    assert selector.select() == 2


def test_warm_up_steps_count_acceptance_but_not_cost() -> None:
    # A draft arm whose first step paid for its model's prefill (20x a warm step).
    selector = Factored(FactoredConfig(seed=0, initial=1, warmup=1), 2)
    feed(selector, 0, 1, 0, 0, 2e-3)
    assert selector.select() == 0  # the warm-up step, then one that is fitted
    feed(selector, 0, 1, 0, 0, 2e-3)
    assert selector.select() == 1
    feed(selector, 1, 1, 4, 4, 60e-3)
    assert selector.select() == 1 and selector.fitted.tolist() == [1, 0] and selector.acc[1, 1] == 4
    feed(selector, 1, 1, 4, 4, 3e-3)
    assert selector.fitted.tolist() == [1, 1]
    assert float(cost_features(1, 4) @ selector.cost_coefficients(1)) < 4e-3
    assert sum(selector.select() == 1 for _ in range(200)) > 190  # 5 tokens in 3 ms beats 1 in 2 ms
    # Without a warm-up the prefill is priced as the arm's cost, and the arm is never played again.
    cold = Factored(FactoredConfig(seed=0, initial=1, warmup=0), 2)
    feed(cold, 0, 1, 0, 0, 2e-3)
    feed(cold, 1, 1, 4, 4, 60e-3)
    assert sum(cold.select() == 1 for _ in range(200)) < 5


@pytest.mark.parametrize("draw_ahead", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_opening_plays_each_arm_warmup_plus_initial_times(draw_ahead: bool, seed: int) -> None:
    # Under draw-ahead each step is chosen before the last one is observed; an opening play
    # chosen but not yet observed still counts, so no arm is opened more often than asked.
    selector = Factored(FactoredConfig(seed=seed, warmup=1, initial=1), 3)
    arms = [Arm(name=f"arm{k}", provider=NoDraft(), gamma=4) for k in range(3)]
    policy = StepPolicy(arms, selector, make_reward("throughput"), PolicySettings(draw_ahead=draw_ahead))
    policy.begin(1)
    played = []
    for _ in range(6):
        plan = policy.choose([0])
        played.append(plan.choice)
        policy.learn(plan, 4, [1], 1e-3)  # equal costs: the cost-aware gate holds no arm back
    assert sorted(played) == [0, 0, 1, 1, 2, 2]


def test_a_capture_is_left_out_once_but_a_second_slow_step_counts() -> None:
    selector = Factored(FactoredConfig(seed=0, warmup=0), 1)
    for _ in range(5):
        feed(selector, 0, 4, 2, 1, 3e-3)
    feed(selector, 0, 4, 2, 1, 60e-3)  # a graph capture
    assert selector.fitted[0] == 5 and selector.steps[0] == 6
    feed(selector, 0, 4, 2, 1, 60e-3)  # the arm really got slow
    assert selector.fitted[0] == 6
    off = Factored(FactoredConfig(seed=0, outlier=0, warmup=0), 1)
    for _ in range(5):
        feed(off, 0, 4, 2, 1, 3e-3)
    feed(off, 0, 4, 2, 1, 60e-3)
    assert off.fitted[0] == 6


def test_without_observations_it_is_thompson_on_rewards() -> None:
    factored, thompson = Factored(FactoredConfig(seed=5), 3), Thompson(ThompsonConfig(seed=5), 3)
    rng = np.random.default_rng(0)
    for _ in range(200):
        a, b = factored.select(), thompson.select()
        assert a == b
        r = float(rng.random())
        factored.update(a, r)
        thompson.update(b, r)


@pytest.mark.parametrize(("keys", "message"), [
    ({"outlier": 1.0}, "outlier must be 0"), ({"prior_rows": 0}, "prior_rows must be"),
    ({"ridge": -1.0}, "ridge must be"), ({"initial": -1}, "initial must be"), ({"warmup": -1}, "warmup must be"),
    ({"static_batch": 1}, "static_batch"), ({"token_cost": -0.01}, "token_cost must be a finite number >= 0"),
    ({"token_cost": float("inf")}, "token_cost must be"), ({"request_rows": -1.0}, "request_rows must be"),
    ({"refit": -0.1}, "refit must be a finite number >= 0")])
def test_bad_config(keys: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FactoredConfig(**keys)  # type: ignore[arg-type]


def test_a_negative_token_cost_is_a_config_error_naming_the_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    tiny = tiny_family(tmp_path_factory.mktemp("factored_token_cost"))
    registry = build_registry(autoload=False)
    with pytest.raises(ConfigError, match=r"\[selector\] key 'token_cost': token_cost must be a finite number >= 0"):
        parse_config(pipeline_dict(tiny["target"], [], "factored", token_cost=-0.5), registry)
    assert parse_config(pipeline_dict(tiny["target"], [], "factored", token_cost=0.0), registry)


def test_see_widths_refuses_a_wrong_count_or_a_negative_width() -> None:
    selector = Factored(FactoredConfig(), 2)
    for widths in ([0], [0, 3, 4], [0, -1]):
        with pytest.raises(ValueError, match="widths must be 2 integers >= 0"):
            selector.see_widths(widths)


def test_observe_refuses_a_bad_step_time() -> None:
    with pytest.raises(ValueError, match="step_s"):
        Factored(FactoredConfig(), 2).observe(0, 1, 0, [0], float("nan"))


class _Recording(Factored):
    def __init__(self) -> None:
        super().__init__(FactoredConfig(seed=0), 2)
        self.calls: list[tuple[object, ...]] = []

    def see_rows(self, rows: int) -> None:
        self.calls.append(("rows", rows))
        super().see_rows(rows)

    def observe(self, arm: int, rows: int, width: int, accepted: object, step_s: float) -> None:
        self.calls.append(("observe", arm, rows, width, tuple(accepted), step_s))  # type: ignore[arg-type]
        super().observe(arm, rows, width, accepted, step_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("draw_ahead", [False, True])
def test_the_policy_shows_the_selector_each_steps_rows_and_shape(draw_ahead: bool) -> None:
    selector = _Recording()
    assert isinstance(selector, ObservesSteps)
    arms = [Arm(name="none", provider=NoDraft(), gamma=0), Arm(name="draft", provider=NoDraft(), gamma=4)]
    policy = StepPolicy(arms, selector, make_reward("throughput"), PolicySettings(draw_ahead=draw_ahead))
    policy.begin(3)
    plan = policy.choose([0, 1, 2])
    assert selector.calls == [("rows", 3)]
    policy.learn(plan, 4, [1, 2, 0], 0.004)
    observed = [c for c in selector.calls if c[0] == "observe"]
    assert observed == [("observe", plan.choice, 3, 4, (1, 2, 0), 0.004)]
    if draw_ahead:  # the next step's choice was drawn for this step's rows, before the observation
        assert selector.calls[1] == ("rows", 3) and selector.calls[2][0] == "observe"
    plan = policy.choose([0, 2])
    assert ("rows", 2) in selector.calls or draw_ahead


def test_factored_in_a_pipeline_learns_from_every_chosen_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    tiny = tiny_family(tmp_path_factory.mktemp("factored"))
    registry = build_registry(autoload=False)
    pipe = build_pipeline(pipeline_dict(tiny["target"], [tiny["close"]], "factored", seed=0), registry)
    out = pipe.generate([[1, 2, 3], [4, 5], [6, 7, 8, 9]], max_new_tokens=6)
    assert all(len(ids) == 6 for ids in out.token_ids)
    selector = pipe.selector
    assert isinstance(selector, Factored)
    assert selector.steps.sum() > 0 and selector.acc[0].sum() >= selector.steps.sum()  # rows per step seen


def test_batch_buckets_with_factored_are_refused_before_any_model_loads(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    tiny = tiny_family(tmp_path_factory.mktemp("factored_buckets"))
    said: list[str] = []  # build_pipeline reports each load here, the target's first
    config = pipeline_dict(tiny["target"], [], "factored", batch_buckets=[1, 8])
    with pytest.raises(ConfigError, match=r"\[selector\] key 'batch_buckets'.*drop batch_buckets"):
        build_pipeline(config, build_registry(autoload=False), progress=said.append)
    assert said == []
    build_pipeline(pipeline_dict(tiny["target"], [], "factored"), build_registry(autoload=False), progress=said.append)
    assert said and said[0].startswith("loading target")


# ------------------------------------------------ widths, the plain arm first, unseen arms' prices


@pytest.mark.parametrize("seed", range(6))
def test_plain_decoding_is_played_first_until_it_is_costed(seed: int) -> None:
    # Told the widths, the plain arm (width 0, here the middle one) opens before any draft,
    # however the first Thompson draw would have fallen.
    selector = Factored(FactoredConfig(seed=seed, warmup=1, initial=1, plain_per_class=0), 3)
    selector.see_widths([4, 0, 6])
    assert [selector.select(), selector.select()] == [1, 1]  # its warm-up step, and one drawn ahead
    feed(selector, 1, 1, 0, 0, 2e-3)  # the warm-up: not costed yet
    assert selector.select() == 1  # drawn ahead of the observation that costs it
    feed(selector, 1, 1, 0, 0, 2e-3)
    assert selector.fitted[1] == 1
    selector.see_rows(1)
    assert selector.select() in (0, 2)  # costed: the drafts open


def test_the_policy_tells_the_selector_each_arms_width_and_none_plays_first() -> None:
    # A lookup (gamma 2) falling back to a draft (gamma 5) may propose 5 tokens a row.
    arms = [Arm(name="lookup", provider=NoDraft(), gamma=2, fallback=2), Arm(name="none", provider=NoDraft(), gamma=0),
            Arm(name="draft", provider=NoDraft(), gamma=5, selectable=False)]
    for seed in range(6):  # whichever arm the first Thompson draw would pick
        selector = Factored(FactoredConfig(seed=seed), 2)
        assert isinstance(selector, SeesWidths)
        policy = StepPolicy(arms, selector, make_reward("throughput"))
        assert policy.widths() == [5, 0]
        policy.begin(4)
        assert selector.gammas is not None and selector.gammas.tolist() == [5, 0]
        assert arms[policy.choose([0, 1, 2, 3]).arm].name == "none"


def test_an_unseen_cheap_arm_is_opened_at_one_row_beside_an_expensive_played_one() -> None:
    # Plain steps take 2 ms; a self-draft takes 12 ms and accepts all 3 (333 tokens/s, below
    # plain's 500). Priced at the mean intercept (7 ms) an unseen lookup of width 2 (1.83
    # tokens a priori) could not beat plain decoding; at the least (plain's) it can.
    selector = Factored(FactoredConfig(seed=0), 3)
    selector.see_widths([0, 3, 2])
    for _ in range(3):
        feed(selector, 0, 1, 0, 0, 2e-3)
        feed(selector, 1, 1, 3, 3, 12e-3)
    selector.see_rows(1)
    assert selector.select() == 2


@pytest.mark.parametrize(("cost", "opened"), [(0.0, True), (8 / 28, True), (16 / 28, False)])
def test_an_arm_s_declared_drafting_cost_keeps_it_closed_where_that_cost_rules_it_out(cost: float, opened: bool) -> None:
    # Plain steps take 2 ms (500 tokens/s). An unseen chain of 3 (a priori 1.08 accepted, 2.08
    # tokens a step) at plain's cost plus 3 drafted tokens at `cost` of a 2 ms forward each:
    # free, 1040 tokens/s; on 8 of 28 layers 3.71 ms, 561; on 16 of 28, 5.43 ms, 383 < 500.
    selector = Factored(FactoredConfig(seed=0, token_cost=0.0), 2)
    selector.see_widths([0, 3])
    selector.see_costs([0.0, cost])
    for _ in range(3):
        selector.observe(0, 1, 0, [0], 2e-3)
        selector.observe(0, 2, 0, [0, 0], 2.1e-3)
    selector.see_rows(1)
    assert (selector.select() == 1) == opened


def test_see_costs_checks_one_finite_non_negative_cost_per_arm() -> None:
    selector = Factored(FactoredConfig(seed=0), 2)
    for bad in ([0.0], [0.0, -0.1], [0.0, math.inf]):
        with pytest.raises(ValueError, match="costs must be 2 finite numbers >= 0"):
            selector.see_costs(bad)
    selector.see_costs([0.0, 0.5])
    assert selector.costs.tolist() == [0.0, 0.5]


def test_the_policy_tells_a_selector_each_arm_s_drafting_cost_its_fallback_s_where_dearer() -> None:
    class Priced(NoDraft):
        def __init__(self, draft_cost: float) -> None:
            self.draft_cost = draft_cost

    arms = [Arm(name="self", provider=Priced(0.25), gamma=3), Arm(name="lookup", provider=NoDraft(), gamma=6,
            fallback=2), Arm(name="draft", provider=Priced(0.5), gamma=3, selectable=False),
            Arm(name="none", provider=NoDraft(), gamma=0)]
    selector = Factored(FactoredConfig(seed=0), 3)
    policy = StepPolicy(arms, selector, make_reward("throughput"))
    assert policy.costs() == [0.25, 0.5, 0.0]
    policy.begin(1)
    assert selector.costs.tolist() == [0.25, 0.5, 0.0]


@pytest.mark.parametrize(("token_cost", "opened_at_32"), [(0.01, False), (0.0, True)])
def test_token_cost_keeps_an_unseen_draft_from_looking_free_at_32_rows(token_cost: float, opened_at_32: bool) -> None:
    # Only plain steps seen, all at 32 rows: no step tells what a drafted token costs. Free, a
    # draft's prior (0.03 tokens from the least of 32 rows) would beat plain decoding.
    selector = Factored(FactoredConfig(seed=0, token_cost=token_cost, plain_per_class=0), 2)
    selector.see_widths([0, 3])
    for _ in range(3):
        selector.observe(0, 32, 0, [0] * 32, planted_time(32, 0))
    selector.see_rows(32)
    assert (selector.select() == 1) == opened_at_32
    selector.see_rows(1)
    assert selector.select() == 1


def test_shared_slopes_fit_prices_an_unseen_arm_at_the_least_intercept_and_token_cost() -> None:
    # Plain steps at 1 and 2 rows (intercept 2 ms, 0.1 ms a row) and a 12 ms draft at one row;
    # arm 2 never played. No step has drafted at two row counts, so the width slope is the prior.
    xtx, xty = np.zeros((3, 3, 3)), np.zeros((3, 3))
    for arm, rows, width, step_s in ((0, 1, 0, 2.1e-3), (0, 2, 0, 2.2e-3), (1, 1, 3, 12e-3)):
        x = cost_features(rows, width)
        xtx[arm] += np.outer(x, x)
        xty[arm] += x * step_s
    fit = shared_slopes_fit(xtx, xty, token_cost=0.05)
    np.testing.assert_allclose(fit[0], [2e-3, 1e-4, 0.05 * 2.1e-3], rtol=1e-5)
    np.testing.assert_allclose(fit[2], fit[0], rtol=1e-5)  # the least intercept, not the mean
    assert float(cost_features(1, 3) @ fit[1]) == pytest.approx(12e-3)


# ------------------------------------------------ per request: each request's own acceptance counts


def _pooled_then_a_request(request_rows: float, seed: int) -> Factored:
    """Plain decoding (2 ms), a lookup of width 6 at plain cost that accepted 5 a step in the
    earlier requests, and a 0.5B draft of width 3 at 3 ms that accepts 2; then a request in
    which the lookup has matched nothing for 40 steps."""
    selector = Factored(FactoredConfig(seed=seed, warmup=0, request_rows=request_rows), 3)
    selector.see_widths([0, 6, 3])
    selector.begin_request(1)
    for _ in range(100):
        feed(selector, 0, 1, 0, 0, 2e-3)
        feed(selector, 1, 1, 6, 5, 2e-3)
        feed(selector, 2, 1, 3, 2, 3e-3)
    selector.begin_request(1)
    for _ in range(40):
        feed(selector, 1, 1, 6, 0, 2e-3)
    return selector


@pytest.mark.parametrize("seed", range(4))
def test_a_lookup_that_matches_nothing_in_this_request_is_priced_by_this_request(seed: int) -> None:
    # Pooled, the lookup's 100 good steps outweigh 40 empty ones (4.6 tokens a step at 2 ms
    # against the draft's 3 at 3 ms); priced by this request (its 40 rows and 8 pooled ones:
    # 1.7 tokens a step), it loses to the draft.
    selector = _pooled_then_a_request(0.0, seed)
    pooled = [selector.select() for _ in range(200)]
    selector = _pooled_then_a_request(8.0, seed)
    own = [selector.select() for _ in range(200)]
    assert pooled.count(1) > 190
    assert own.count(2) > 190


def test_a_new_request_prices_every_arm_by_the_pooled_counts_again() -> None:
    selector = _pooled_then_a_request(8.0, 0)
    assert isinstance(selector, RequestAware)
    assert selector.request[:, 1].tolist() == [40.0, 0.0, 0.0]
    selector.begin_request(1)
    assert not selector.request.any()
    assert selector.acc[0].tolist() == [100.0, 140.0, 100.0]  # the pooled counts keep every request
    # The lookup accepted 5 in one request and 0 in the other: a new request's price is the
    # pooled mean with the whole spread between requests, worth one row (request_prior_rows).
    assert selector.request_weight.tolist() == [8.0, 1.0, 8.0]
    assert [selector.select() for _ in range(200)].count(1) > 120


def _dl_rows(requests: list[list[int]], cap: float) -> float:
    """request_prior_rows for one arm, from its rows' accepted counts per request, written out
    as the one-way random-effects moment estimate."""
    means = np.array([np.mean(r) for r in requests])
    sizes = np.array([len(r) for r in requests], dtype=float)
    total = sizes.sum()
    within = sum(float(np.sum((np.array(r) - np.mean(r)) ** 2)) for r in requests) / (total - len(requests))
    grand = float(sizes @ means) / total
    between = float(sizes @ (means - grand) ** 2)
    tau2 = (between - (len(requests) - 1) * within) / (total - float(sizes @ sizes) / total)
    return cap if tau2 <= 0 else float(np.clip(within / tau2, 1.0, cap))


def _between(requests: list[list[int]]) -> np.ndarray:
    selector = Factored(FactoredConfig(seed=0, request_rows=8.0), 1)
    for rows in requests:
        selector.begin_request(len(rows))
        selector.observe(0, len(rows), 6, rows, 2e-3)
    selector.begin_request(1)
    return selector.between


@pytest.mark.parametrize("requests", [
    [[5, 6, 4, 5], [0, 1, 0, 0, 1, 0, 0, 0], [3, 2]],  # requests that differ: a few rows' worth
    [[5, 6, 4, 5], [6, 5, 4, 6, 5, 4, 5, 6], [5, 4]],  # alike: the cap
    [[1, 3, 0, 2], [2, 0, 3, 1, 2, 2, 1, 3], [3, 0]],
])
def test_request_prior_rows_is_the_moment_estimate_of_within_over_between_spread(requests: list[list[int]]) -> None:
    got = request_prior_rows(_between(requests), 8.0)
    assert got.tolist() == pytest.approx([_dl_rows(requests, 8.0)])
    assert request_prior_rows(_between(requests[:1]), 8.0).tolist() == [8.0]  # one request: the cap


def _alternating_requests(request_rows: float, seed: int) -> Factored:
    """Plain decoding (2 ms) and a draft of width 3 that accepts 2 at 3 ms, each request; a lookup
    of width 6 at plain cost whose rows accept 4 to 6 in every other request and 0 or 1 in the
    rest; then a request where the lookup's first 8 tries accepted nothing."""
    rng = np.random.default_rng(seed)
    selector = Factored(FactoredConfig(seed=seed, warmup=0, request_rows=request_rows), 3)
    selector.see_widths([0, 6, 3])
    for request in range(10):
        selector.begin_request(1)
        for _ in range(20):
            feed(selector, 0, 1, 0, 0, 2e-3)
            feed(selector, 1, 1, 6, int(rng.integers(4, 7)) if request % 2 else int(rng.integers(2)), 2e-3)
            feed(selector, 2, 1, 3, 2, 3e-3)
    selector.begin_request(1)
    for _ in range(8):
        feed(selector, 1, 1, 6, 0, 2e-3)
    return selector


@pytest.mark.parametrize("seed", range(3))
def test_where_requests_differ_a_request_drops_an_arm_after_a_few_empty_tries(seed: int) -> None:
    # Worth 8 rows, the pooled 2.7 tokens a step still outweigh 8 empty tries (1.4 expected); worth
    # what the spread between requests says (about one row), the request's own zeros decide.
    fixed = _alternating_requests(8.0, seed)
    fixed.request_weight[:] = 8.0  # request_rows as a fixed weight
    kept = [fixed.select() for _ in range(200)]
    learnt = _alternating_requests(8.0, seed)
    assert learnt.request_weight[1] < 2.0
    dropped = [learnt.select() for _ in range(200)]
    assert kept.count(1) > 120
    assert dropped.count(2) > 170


@pytest.mark.parametrize("request_rows", [0.0, 8.0])
def test_choices_come_from_finished_steps_and_the_seed_only(request_rows: float) -> None:
    # Two selectors on one seed and one history choose alike; what a step accepts reaches the
    # choices only after it is observed (a replayed history of steps, accepted 0 to 6).
    rng = np.random.default_rng(1)
    history = [(int(rng.integers(3)), int(rng.integers(7))) for _ in range(150)]
    a, b = (Factored(FactoredConfig(seed=3, request_rows=request_rows), 3) for _ in range(2))
    for t, (arm, accepted) in enumerate(history):
        if t % 25 == 0:
            a.begin_request(1)
            b.begin_request(1)
        assert a.select() == b.select()
        feed(a, arm, 1, 6 * (arm > 0), min(accepted, 6 * (arm > 0)), 2e-3 + 1e-3 * arm)
        feed(b, arm, 1, 6 * (arm > 0), min(accepted, 6 * (arm > 0)), 2e-3 + 1e-3 * arm)


def test_without_request_rows_requests_change_no_choice() -> None:
    # request_rows = 0 is the pooled selector: begin_request leaves every draw as it was.
    quiet, told = (Factored(FactoredConfig(seed=2), 3) for _ in range(2))
    rng = np.random.default_rng(0)
    for t in range(120):
        if t % 10 == 0:
            told.begin_request(1)
        arm = quiet.select()
        assert told.select() == arm
        accepted = int(rng.integers(5)) * (arm > 0)
        for selector in (quiet, told):
            feed(selector, arm, 1, 4 * (arm > 0), accepted, 2e-3 * (1 + arm))
def _random_trace(selector: Factored, steps: int, seed: int, check: Any = None) -> list[int]:
    """Play ``selector`` for ``steps`` steps over three arms (widths 0, 4, 2) at changing live
    rows, refills and widths, observing planted costs and random accepted counts; ``check``
    (if given) runs before each select."""
    rng = np.random.default_rng(seed)
    widths = [0, 4, 2]
    selector.see_widths(widths)
    chosen = []
    for t in range(steps):
        if t == steps // 2:
            widths = [0, 5, 2]  # arms swapped between requests
            selector.see_widths(widths)
        selector.rows_refilled(bool(t % 7 == 0))
        rows = int(rng.choice([1, 2, 8, 16, 32]))
        selector.see_rows(rows)
        if check is not None:
            check(selector)
        arm = selector.select()
        width = widths[arm]
        accepted = rng.integers(0, width + 1, size=rows).tolist()
        selector.observe(arm, rows, width, accepted, planted_time(rows, width) * (1 + 0.05 * rng.standard_normal()))
        selector.update(arm, float(rng.uniform()))
        chosen.append(arm)
    return chosen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_refit_0_the_cached_views_choose_as_a_fresh_refit_would(seed: int) -> None:
    # Every state select reads must drop the views it made stale: a copy whose views and fit are
    # thrown away (recomputed from scratch) draws the same choice from the same generator state.
    selector = Factored(FactoredConfig(seed=seed, refit=0.0), 3)
    rng = np.random.default_rng(seed)
    widths = [0, 4, 2]
    selector.see_widths(widths)
    for t in range(300):
        if t == 150:
            widths = [0, 5, 2]
            selector.see_widths(widths)
        selector.rows_refilled(bool(t % 7 == 0))
        rows = int(rng.choice([1, 2, 8, 16, 32]))
        selector.see_rows(rows)
        fresh = copy.deepcopy(selector)
        fresh._fit, fresh._views = None, {}
        arm = selector.select()
        assert fresh.select() == arm, f"step {t}: the cached views chose {arm}"
        width = widths[arm]
        accepted = rng.integers(0, width + 1, size=rows).tolist()
        selector.observe(arm, rows, width, accepted, planted_time(rows, width) * (1 + 0.05 * rng.standard_normal()))
        selector.update(arm, float(rng.uniform()))


def test_refits_follow_the_schedule_and_grow_with_the_log_of_the_steps() -> None:
    refit = 0.25
    selector = Factored(FactoredConfig(seed=0, refit=refit), 3)
    last: dict[str, Any] = {"refits": -1, "steps": np.zeros(3)}

    def check(s: Factored) -> None:  # the view select reads lags each arm by less than the schedule allows
        s._view()
        if s.refits != last["refits"]:
            last["refits"], last["steps"] = s.refits, s.steps.copy()
        due = np.maximum(last["steps"] + 1, np.ceil(last["steps"] * (1 + refit)))
        assert (s.steps < due).all()

    _random_trace(selector, 2000, seed=0, check=check)
    # Per arm every step of its first 1 / refit, then one per growth by refit: at most
    # 3 * (1 / refit + ln(2000 * refit) / ln(1 + refit)) and one more at the first costed step.
    assert selector.refits < 3 * (1 / refit + math.log(2000 * refit) / math.log(1 + refit)) + 2
    eager = Factored(FactoredConfig(seed=0, refit=0.0), 3)
    _random_trace(eager, 200, seed=0)
    assert eager.refits >= 190  # a refit before every select that follows an observe (the plain arm opens first)


def test_a_lone_played_arm_is_chosen_without_a_draw() -> None:
    # At 32 rows the gate holds both drafts back once plain decoding is costed: the choice is
    # certain, so select returns it without drawing (no generator state is used).
    selector = Factored(FactoredConfig(seed=0, plain_per_class=0), 3)
    selector.see_widths([0, 4, 2])
    selector.see_rows(32)
    for _ in range(4):
        assert selector.select() == 0
        feed(selector, 0, 32, 0, 0, planted_time(32, 0))
    state = copy.deepcopy(selector.rng.bit_generator.state)
    assert [selector.select() for _ in range(50)] == [0] * 50
    assert selector.rng.bit_generator.state == state
    selector.see_rows(1)  # one row: a draft may pay, so it opens
    assert selector.select() in (1, 2)


def _row_one_left(told: bool, seed: int) -> Factored:
    # A static batch of two rows drafted twenty steps: row 0 accepted 4 a step and finished, row 1
    # accepted nothing. Plain steps cost 1 ms, draft steps 2.5 ms at any rows.
    selector = Factored(FactoredConfig(seed=seed, request_rows=8.0, outlier=0), 2)
    selector.see_widths([0, 4])
    selector.begin_request(1)  # an earlier request of one row, so the costs are known at one row too
    for _ in range(5):
        selector.observe(0, 1, 0, [0], 1e-3)
        selector.observe(1, 1, 4, [2], 2.5e-3)
    selector.begin_request(2)
    for _ in range(3):
        selector.observe(0, 2, 0, [0, 0], 1e-3)
    for _ in range(20):
        if told:
            selector.see_row_ids([0, 1])
        selector.observe(1, 2, 4, [4, 0], 2.5e-3)
    if told:
        selector.see_row_ids([1])
    selector.see_rows(1)
    return selector


@pytest.mark.parametrize("seed", range(3))
def test_a_static_batch_prices_a_draft_by_the_rows_still_live(seed: int) -> None:
    # By the request's mean (2 tokens a row) the draft pays at one row, 3 tokens in 2.5 ms; the
    # row still live accepted nothing, and by its own counts (and 8 pooled rows) plain decoding wins.
    untold_selector, told_selector = _row_one_left(False, seed), _row_one_left(True, seed)
    untold = [untold_selector.select() for _ in range(200)]
    told = [told_selector.select() for _ in range(200)]
    assert untold.count(1) > 150
    assert told.count(0) > 190


def test_row_ids_must_ascend() -> None:
    selector = Factored(FactoredConfig(seed=0), 2)
    with pytest.raises(ValueError, match="ascending"):
        selector.see_row_ids([2, 1])


@pytest.mark.parametrize(("draft_rows", "opened"), [((16,), False), (tuple(range(1, 17)), True)])
def test_the_cost_floor_holds_only_where_no_step_tells_the_width_slope(draft_rows: tuple[int, ...], opened: bool) -> None:
    # A drafted token of a row costs 2 us, a tenth of token_cost's floor. Drafted at 1 to 16 rows,
    # the steps pin that down and an unseen arm opens at 16 rows on its prior (a chain of one
    # whose least row expects 1/17 token, for 32 us more a step); drafted at 16 rows only, the
    # draft's intercept absorbs its width, the floor holds (320 us) and the arm stays closed.
    cost = np.array([2e-3, 1e-5, 2e-6])
    selector = Factored(FactoredConfig(seed=0), 3)
    selector.see_widths([0, 3, 8])
    for _ in range(5):
        for rows in range(1, 17):
            selector.observe(0, rows, 0, [0] * rows, planted_time(rows, 0, cost))
        for rows in draft_rows:
            selector.observe(1, rows, 3, [0] * rows, planted_time(rows, 3, cost) + 1.5e-3)
    assert (width_slope_information(selector.xtx) > 0) == opened
    selector.see_rows(16)
    assert (selector.select() == 2) == opened


def test_an_unseen_draft_stays_closed_at_32_rows_after_plain_steps_at_one_batch_size() -> None:
    # Plain steps at 31 and 32 rows only: extrapolated to one row the step would take less than
    # nothing, so token_cost's scale there is 0, and the width slope no step tells is 0 with it.
    selector = Factored(FactoredConfig(seed=0, plain_per_class=0), 2)
    selector.see_widths([0, 3])
    for _ in range(20):
        for rows, step_s in ((31, 2.16e-3), (32, 2.26e-3)):
            selector.observe(0, rows, 0, [0] * rows, step_s)
    selector.see_rows(32)
    assert [selector.select() for _ in range(50)] == [0] * 50
    selector.see_rows(1)  # at one row a chain of three may pay
    assert selector.select() == 1


def test_likely_arms_are_every_arm_until_plain_is_costed_then_the_played_and_the_open_ones() -> None:
    """What the policy asks before it catches providers up (NarrowsArms): before plain decoding
    has a costed step every arm may play; after plain steps at 32 rows only, an unseen chain of
    three stays closed at 32 rows (so its provider need not index a batch's prompts) and may
    open at one row. Asking draws nothing: the choices after it are those without it."""
    def fed(ask: bool) -> tuple[Factored, list[int]]:
        selector = Factored(FactoredConfig(seed=3), 2)
        selector.see_widths([0, 3])
        if ask:
            assert selector.likely_arms(32) == [0, 1]
        for _ in range(20):
            for rows, step_s in ((31, 2.16e-3), (32, 2.26e-3)):
                selector.observe(0, rows, 0, [0] * rows, step_s)
        if ask:
            assert selector.likely_arms(32) == [0]
            assert selector.likely_arms(1) == [0, 1]
        selector.see_rows(32)
        return selector, [selector.select() for _ in range(10)]

    (asked, with_asking), (_, without) = fed(True), fed(False)
    assert with_asking == without == [0] * 10
    asked.observe(1, 1, 3, [2], 4e-3)
    assert asked.likely_arms(32) == [0, 1]  # played once: it may play again


def test_plain_is_played_in_each_class_of_live_rows_until_it_has_steps_there() -> None:
    # Costed plain steps at one row only, drafts cheap per row there and dear at 32 rows: the
    # model alone would price plain at 32 rows by the drafts' per-row slope. With
    # plain_per_class = 2 the selector plays plain twice at 32 rows (class 5) before its model
    # chooses there; at 33 rows (the same class) it does not again; at 2 rows (class 1) it does.
    selector = Factored(FactoredConfig(seed=0, plain_per_class=2), 3)
    selector.see_widths([0, 1, 3])
    selector.see_rows(1)
    for _ in range(3):
        feed(selector, 0, 1, 0, 0, 2.0e-3)
    for rows in (1, 4, 8, 16, 32):  # a draft model's forwards: a cost per row whatever the width
        for _ in range(6):
            feed(selector, 1, rows, 1, 1, 2.8e-3 + 0.15e-3 * rows)
            feed(selector, 2, rows, 3, 2, 3.4e-3 + 0.15e-3 * rows)
    before = float(cost_features(32, 0) @ selector.cost_coefficients(0))
    selector.see_rows(32)
    plays = []
    for _ in range(2):
        plays.append(selector.select())
        feed(selector, 0, 32, 0, 0, 2.3e-3)
    assert plays == [0, 0]
    after = float(cost_features(32, 0) @ selector.cost_coefficients(0))
    assert before > 4e-3 and after < 3e-3  # priced by the drafts' slope, then by its own steps there
    selector.see_rows(33)
    assert selector.plain_costed[5] == 2 and selector._plain_here() is None
    selector.see_rows(2)
    assert selector.select() == 0  # a class without plain steps


def test_plain_plays_per_class_end_even_when_their_steps_never_count() -> None:
    # Plays drawn and dropped, or steps left out of the fit as outliers, are not costed steps: the
    # plays drawn in a class stop at twice plain_per_class, so a class is never held on plain.
    selector = Factored(FactoredConfig(seed=0, plain_per_class=1), 2)
    selector.see_widths([0, 3])
    selector.see_rows(1)
    for _ in range(4):
        feed(selector, 0, 1, 0, 0, 2.0e-3)
        feed(selector, 1, 1, 3, 2, 3.0e-3)
    selector.see_rows(32)
    drawn = [selector.select() for _ in range(5)]  # drawn ahead, never observed
    assert drawn[:2] == [0, 0] and selector.plain_drawn[5] == 2 and selector._plain_here() is None


def _lookup_that_matched_before(request_rows: float) -> Factored:
    """Plain decoding (2 ms) and a lookup of width 8 (2.1 ms) that accepted 6 of 8 in every
    earlier request: an unseen draft of width 3 cannot beat that lookup's pooled value."""
    selector = Factored(FactoredConfig(seed=0, request_rows=request_rows), 3)
    selector.see_widths([0, 8, 3])
    for _ in range(10):
        selector.begin_request(1)
        selector.see_rows(1)
        for _ in range(3):
            feed(selector, 0, 1, 0, 0, 2e-3)
        for _ in range(20):
            feed(selector, 1, 1, 8, 6, 2.1e-3)
    return selector


@pytest.mark.parametrize(("request_rows", "rows", "opens"), [(8.0, 1, True), (8.0, 4, False), (0.0, 1, False)])
def test_an_arm_held_back_opens_in_a_request_where_the_played_arms_match_nothing(
        request_rows: float, rows: int, opens: bool) -> None:
    # A new request in which the lookup matches nothing: at one live row the gate weighs the best
    # costed arm by this request's own counts (request_rows, worth 8 rows of the pooled 6), so the
    # draft opens once some 25 empty steps pull the lookup's value under the draft's prior; over 4
    # rows, or without request_rows, the pooled value holds it back.
    selector = _lookup_that_matched_before(request_rows)
    selector.begin_request(rows)
    selector.see_rows(rows)
    assert selector.select() != 2  # the lookup's pooled value beats the draft's prior here
    chosen = []
    for _ in range(40):
        feed(selector, 1, rows, 8, 0, 2.1e-3 * (1 + 0.05 * (rows - 1)))
        chosen.append(selector.select())
    assert (2 in chosen) == opens
