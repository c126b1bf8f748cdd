"""The step policy alone, with fake providers, selector and scorers (no model, no verifier)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs
import pytest
import torch

from flashspec_core.contracts import Draft, SamplingParams
from flashspec_core.policy import (
    BATCH_LIMIT,
    BATCH_LIMIT_ARM,
    Arm,
    NoDraft,
    Plan,
    PolicySettings,
    StepPolicy,
    observes_steps,
)
from flashspec_core.rewards import make_reward
from flashspec_selectors.selectors import Thompson, ThompsonConfig

B, L = 3, 16
TOKENS = torch.zeros((B, L), dtype=torch.long)
LENGTHS = [4, 5, 6]
SAMPLING = SamplingParams(temperature=0.0)
GEN = torch.Generator().manual_seed(0)


class FakeProvider:
    """Proposes ``widths[i]`` tokens at its i-th call (the last width after that); logs every call."""

    def __init__(self, name: str, log: list[tuple[Any, ...]], widths: Sequence[int] = (3,)) -> None:
        self.name, self.log, self.widths, self.calls = name, log, list(widths), 0

    def reset(self) -> None:
        self.log.append(("reset", self.name))

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        width = min(gamma, self.widths[min(self.calls, len(self.widths) - 1)])
        self.calls += 1
        self.log.append(("propose", self.name, gamma))
        return Draft(tokens=torch.ones((len(lengths), width), dtype=torch.long), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        self.log.append(("rollback", self.name, list(num_accepted)))


class FakeSelector:
    """Plays ``picks`` in turn; logs select() and update()."""

    def __init__(self, num_arms: int, log: list[tuple[Any, ...]], picks: Sequence[int] = (0,)) -> None:
        self.num_arms, self.log, self.picks, self.drawn = num_arms, log, list(picks), 0

    def select(self) -> int:
        arm = self.picks[self.drawn % len(self.picks)]
        self.drawn += 1
        self.log.append(("select", arm))
        return arm

    def update(self, arm: int, reward: float) -> None:
        self.log.append(("update", arm, reward))


class AwareSelector(FakeSelector):
    def begin_request(self, rows: int) -> None:
        self.log.append(("begin", rows))


class FakeReward:
    """Returns ``value`` and logs each call under the name of the scorer it serves."""

    def __init__(self, log: list[tuple[Any, ...]], value: float = 0.5) -> None:
        self.log, self.value, self.name = log, value, "main"

    def __deepcopy__(self, memo: dict[int, Any]) -> FakeReward:
        copy = FakeReward(self.log, self.value / 2)
        copy.name = "first"
        return copy

    def __call__(self, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
        self.log.append((self.name, gamma, tuple(accepted), emitted, step_s))
        return self.value


def _policy(log: list[tuple[Any, ...]], arms: list[Arm], picks: Sequence[int] = (0,), **settings: Any) -> StepPolicy:
    selector = FakeSelector(sum(a.selectable for a in arms), log, picks)
    return StepPolicy(arms, selector, FakeReward(log), PolicySettings(**settings))


def _step(policy: StepPolicy, rows: Sequence[int], accepted: Sequence[int], step_s: float = 0.01) -> tuple[Plan, Arm, float]:
    """One step as the pipeline runs it, with ``accepted`` standing in for the verifier's verdict."""
    plan = policy.plan(rows, TOKENS, LENGTHS, SAMPLING, GEN)
    draft, drafter = policy.propose(plan, TOKENS, LENGTHS, SAMPLING, GEN)
    policy.draw_next()
    reward = policy.commit(plan, accepted, step_s, drafter, int(draft.tokens.shape[1]))
    return plan, drafter, reward


def _kinds(log: list[tuple[Any, ...]], *kinds: str) -> list[tuple[Any, ...]]:
    return [entry for entry in log if entry[0] in kinds]


def test_batch_limit_plays_plainly_without_the_selector() -> None:
    """Above speculate_max_batch the step proposes nothing and is scored on the selector's
    scale, but the selector is neither asked nor updated (not even a draw ahead)."""
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm("d", FakeProvider("d", log), 3)], speculate_max_batch=2)
    plan, drafter, reward = _step(policy, [0, 1, 2], [0, 0, 0])
    assert plan.limited and plan.arm == BATCH_LIMIT_ARM and plan.choice is None and not plan.by_first
    assert drafter.name == BATCH_LIMIT and policy.played(plan).gamma == 0
    assert _kinds(log, "select", "update", "propose", "rollback") == []
    assert _kinds(log, "main", "first") == [("main", 0, (0, 0, 0), 3, 0.01)] and reward == 0.5
    plan, drafter, _ = _step(policy, [0, 2], [2, 0, 3])  # a row finished: under the limit again
    assert not plan.limited and plan.arm == 0 and plan.choice == 0 and drafter.name == "d"
    assert _kinds(log, "select", "update") == [("select", 0), ("select", 0), ("update", 0, 0.5)]
    assert _kinds(log, "main")[-1] == ("main", 3, (2, 3), 7, 0.01)  # the live rows' counts alone


def test_first_arm_with_a_match_plays_without_the_selector() -> None:
    """The first arm's non-empty proposal is the step's draft, drafted once; its reward comes
    from the first scorer and no selector update follows."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [2]), 4, selectable=False), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, first=0, draw_ahead=False)
    plan, drafter, reward = _step(policy, [0, 1, 2], [1, 2, 0])
    assert plan.arm == 0 and plan.choice is None and plan.by_first and plan.draft is not None
    assert drafter is arms[0]
    assert log == [("propose", "lookup", 4), ("rollback", "lookup", [1, 2, 0]), ("first", 2, (1, 2, 0), 6, 0.01)]
    assert reward == 0.25  # the first scorer's value, not the selector's


def test_first_arm_without_a_match_is_rolled_back_and_the_selector_chooses() -> None:
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [0]), 4, selectable=False), Arm("d", FakeProvider("d", log), 3),
            Arm("plain", FakeProvider("plain", log, [0]), 0)]
    policy = _policy(log, arms, picks=[1], first=0, draw_ahead=False)
    plan, drafter, reward = _step(policy, [0, 2], [0, 0, 0])
    assert plan.arm == 2 and plan.choice == 1 and not plan.by_first and plan.draft is None and drafter is arms[2]
    assert log == [
        ("propose", "lookup", 4),
        ("rollback", "lookup", [0, 0, 0]),  # at once: none of its tokens entered the sequences
        ("select", 1),
        ("propose", "plain", 0),
        ("rollback", "plain", [0, 0, 0]),
        ("main", 0, (0, 0), 2, 0.01),
        ("update", 1, 0.5),
    ]
    assert reward == 0.5


def test_the_first_arm_chosen_again_keeps_its_empty_proposal() -> None:
    """A selector that picks the first arm itself gets a plain step without a second search."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [0]), 4), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, picks=[0], first=0, draw_ahead=False)
    plan, drafter, _ = _step(policy, [0], [0, 0, 0])
    assert plan.arm == 0 and plan.choice == 0 and plan.draft is not None and plan.draft.tokens.shape[1] == 0
    assert drafter is arms[0]
    assert _kinds(log, "propose", "rollback") == [("propose", "lookup", 4), ("rollback", "lookup", [0, 0, 0]),
                                                 ("rollback", "lookup", [0, 0, 0])]
    assert _kinds(log, "main", "first", "update") == [("main", 0, (0,), 1, 0.01), ("update", 0, 0.5)]


def test_an_empty_proposal_falls_back_and_both_providers_are_rolled_back() -> None:
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [0, 2]), 3, fallback=1), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, picks=[0], draw_ahead=False)
    plan, drafter, _ = _step(policy, [0, 1, 2], [3, 1, 0])
    assert plan.arm == 0 and drafter is arms[1]
    assert _kinds(log, "propose", "rollback", "main") == [
        ("propose", "lookup", 3),
        ("propose", "d", 3),
        ("rollback", "d", [3, 1, 0]),
        ("rollback", "lookup", [0, 0, 0]),  # the arm proposed nothing: it keeps none of the accepted tokens
        ("main", 3, (3, 1, 0), 7, 0.01),
    ]
    log.clear()
    plan, drafter, _ = _step(policy, [0, 1, 2], [2, 2, 1])  # now the lookup matches: no fallback
    assert drafter is arms[0]
    assert _kinds(log, "propose", "rollback") == [("propose", "lookup", 3), ("rollback", "lookup", [2, 2, 1])]


@pytest.mark.parametrize("mode", ["late", "early", "deferred"])
def test_draw_ahead_feeds_back_one_step_late(mode: str) -> None:
    """Model-free: select() for step t + 1 comes before update() for step t, and every played
    choice is the draw made one step earlier; drawn early (before the sync), left to learn()
    (a replay), or with the update deferred to the next step's settle() (as the pipeline does,
    while the device runs that step), the selector hears the same calls in the same order."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm(n, FakeProvider(n, log), 3) for n in ("a", "b", "c")]
    policy = _policy(log, arms, picks=[0, 1, 2, 1], draw_ahead=True)
    played = []
    for _ in range(4):
        plan = policy.choose([0])
        if mode != "late":
            policy.settle()
            policy.draw_next()
        heard = len(_kinds(log, "update"))
        policy.learn(plan, 3, [1], 0.01, defer=mode == "deferred")
        assert len(_kinds(log, "update")) == heard + (mode != "deferred")  # deferred: held back until settle()
        played.append(plan.choice)
    policy.settle()
    calls = _kinds(log, "select", "update")
    assert [c[:2] for c in calls] == [("select", 0), ("select", 1), ("update", 0), ("select", 2), ("update", 1),
                                      ("select", 1), ("update", 2), ("select", 0), ("update", 1)]
    assert played == [0, 1, 2, 1]


def test_without_draw_ahead_each_reward_comes_before_the_next_draw() -> None:
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm(n, FakeProvider(n, log), 3) for n in ("a", "b")], picks=[0, 1], draw_ahead=False)
    for _ in range(3):
        plan = policy.choose([0, 1])
        policy.draw_next()  # nothing is due
        policy.learn(plan, 3, [1, 2], 0.01)
    assert [c[:2] for c in _kinds(log, "select", "update")] == [("select", 0), ("update", 0), ("select", 1),
                                                                ("update", 1), ("select", 0), ("update", 0)]


def test_a_deferred_update_reaches_the_selector_before_its_next_choice_or_request() -> None:
    """learn(defer=True) holds the selector's update back; a choice asked fresh (no draw ahead)
    and a new request both apply it first, so every choice sees what it would have seen."""
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm(n, FakeProvider(n, log), 3) for n in ("a", "b")], picks=[0, 1], draw_ahead=False)
    for _ in range(2):
        plan = policy.choose([0, 1])
        policy.learn(plan, 3, [1, 2], 0.01, defer=True)
    assert [c[:2] for c in _kinds(log, "select", "update")] == [("select", 0), ("update", 0), ("select", 1)]
    policy.begin(2)
    assert [c[:2] for c in _kinds(log, "select", "update")][-1] == ("update", 1)


def test_a_drawn_choice_is_dropped_where_the_first_arm_proposes_or_a_request_begins() -> None:
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log), 3, selectable=False), Arm("d", FakeProvider("d", log), 3),
            Arm("e", FakeProvider("e", log), 3)]
    policy = StepPolicy(arms, AwareSelector(2, log, [0, 1]), FakeReward(log), PolicySettings(first=0))
    policy.begin(1)
    plan = policy.choose([0])  # selector draws 0 and plays it; draws 1 ahead
    policy.learn(plan, 3, [3], 0.01)
    plan = policy.choose([0], first_proposes=True)  # the draw of 1 is dropped; 0 is drawn ahead
    policy.learn(plan, 3, [3], 0.01)
    assert plan.by_first and plan.arm == 0
    plan = policy.choose([0])  # plays the draw made at the first arm's step
    assert plan.choice == 0
    policy.learn(plan, 3, [3], 0.01)  # draws 1 ahead
    policy.begin(1)  # ... which the next request does not play
    plan = policy.choose([0])
    assert plan.choice == 0
    assert [c[:2] for c in _kinds(log, "begin", "select", "update", "reset")] == [
        ("reset", "lookup"), ("reset", "d"), ("reset", "e"), ("begin", 1),
        ("select", 0), ("select", 1), ("update", 0),
        ("select", 0),  # drawn ahead at the first arm's step, no update there
        ("select", 1), ("update", 0),
        ("reset", "lookup"), ("reset", "d"), ("reset", "e"), ("begin", 1),
        ("select", 0),
    ]


def test_a_drawn_choice_is_dropped_where_the_batch_limit_plays() -> None:
    """Model-free callers may grow the batch (the engine's rows only finish): a choice drawn
    before a step the batch limit plays is never played later."""
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm(n, FakeProvider(n, log), 3) for n in ("a", "b")], picks=[0, 1], speculate_max_batch=1)
    policy.learn(policy.choose([0]), 3, [1], 0.01)  # plays 0, draws 1 ahead
    policy.learn(policy.choose([0, 1]), 0, [0, 0], 0.01)  # limited: the draw of 1 is dropped, none made
    assert policy.choose([0]).choice == 0  # a fresh draw
    assert [c[:2] for c in _kinds(log, "select", "update")] == [("select", 0), ("select", 1), ("update", 0),
                                                                ("select", 0)]


def test_rewards_go_to_the_right_scorer_and_the_first_scale_stays_apart() -> None:
    """With the throughput reward, the first arm's fast steps set only the first scorer's
    running maximum: the selector's next reward is judged on its own arms' scale."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log), 4, selectable=False), Arm("d", FakeProvider("d", log), 3)]
    policy = StepPolicy(arms, FakeSelector(1, log), make_reward("throughput"), PolicySettings(first=0, draw_ahead=False))
    assert policy.learn(policy.choose([0]), 3, [1], 0.01) == 1.0  # 2 tokens / 10 ms: the selector's best yet
    assert policy.learn(policy.choose([0], first_proposes=True), 4, [4], 0.001) == 1.0  # 5000 tok/s, first scale
    assert policy.learn(policy.choose([0]), 3, [0], 0.01) == pytest.approx(0.5)  # 100 / 200 tok/s, not / 5000
    assert [c[:2] for c in _kinds(log, "update")] == [("update", 0), ("update", 0)]


def test_learn_takes_the_emitted_count_of_a_replay() -> None:
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm("d", FakeProvider("d", log), 3)], draw_ahead=False)
    policy.learn(policy.choose([0, 1]), 3, [3, 1], 0.02, emitted=4)  # the step stopped rows early
    policy.learn(policy.choose([0, 1]), 3, [3, 1], 0.0)
    assert _kinds(log, "main") == [("main", 3, (3, 1), 4, 0.02), ("main", 3, (3, 1), 6, 1e-9)]


def test_the_model_free_half_replays_the_steps_of_the_provider_half() -> None:
    """choose/learn fed each step's widths and accepted counts make the same selector calls
    and rewards as plan/propose/commit over providers that propose those widths."""
    rows = [[0, 1, 2]] + [[0, 1]] * 3 + [[1]] * 3  # the first step is over the batch limit
    widths = [None, 2, 0, 0, 3, 0, 1]  # what the first arm proposes (None: not asked)
    accepted = [[0, 0, 0], [2, 1, 0], [0, 3, 0], [1, 1, 0], [3, 3, 0], [0, 2, 0], [0, 1, 0]]
    logs: list[list[tuple[Any, ...]]] = [[], []]

    def make(log: list[tuple[Any, ...]]) -> StepPolicy:
        match = FakeProvider("m", log, [w for w in widths if w is not None])
        arms = [Arm("m", match, 3, selectable=False), Arm("d", FakeProvider("d", log), 3),
                Arm("n", FakeProvider("n", log, [0]), 0)]
        return StepPolicy(arms, FakeSelector(2, log, [1, 0, 0, 1]), make_reward("throughput"),
                          PolicySettings(first=0, speculate_max_batch=2))

    engine, replay = make(logs[0]), make(logs[1])
    got, want = [], []
    for t, (live, width, acc) in enumerate(zip(rows, widths, accepted, strict=True)):
        if t in (0, 4):  # two requests
            engine.begin(len(live))
            replay.begin(len(live))
        step_s = 0.01 + t * 1e-3
        got.append(_step(engine, live, acc, step_s)[2])
        plan = replay.choose(live, first_proposes=bool(width))
        arm = replay.played(plan)  # the first arm, unless its gate sent a proposal to the selector
        drafted = width if arm.name == "m" else arm.gamma
        want.append(replay.learn(plan, drafted, [acc[b] for b in live], step_s))
    assert got == want
    assert _kinds(logs[0], "select", "update") == _kinds(logs[1], "select", "update")
    assert len(_kinds(logs[0], "update")) == widths.count(0) + 1  # and the proposal the gate sent to the selector


def test_settings_and_arms_that_do_not_fit_are_clear_errors() -> None:
    log: list[tuple[Any, ...]] = []
    arms = [Arm("a", FakeProvider("a", log), 3), Arm("b", FakeProvider("b", log), 3, fallback=5)]
    with pytest.raises(ValueError, match="arm 'b': fallback 5 is not an arm index"):
        StepPolicy(arms, FakeSelector(2, log), FakeReward(log))
    with pytest.raises(ValueError, match="first = 2 is not an arm index"):
        StepPolicy(arms[:1], FakeSelector(1, log), FakeReward(log), PolicySettings(first=2))
    with pytest.raises(ValueError, match="chooses between 3 arms, but 1 arms are selectable"):
        StepPolicy(arms[:1], FakeSelector(3, log), FakeReward(log))
    with pytest.raises(ValueError, match="speculate_max_batch"):
        PolicySettings(speculate_max_batch=0)
    with pytest.raises(TypeError, match="draw_ahead"):
        PolicySettings(draw_ahead="yes")  # type: ignore[arg-type]
    policy = StepPolicy(arms[:1], FakeSelector(1, log), FakeReward(log))
    with pytest.raises(ValueError, match="no first arm"):
        policy.choose([0], first_proposes=True)


def test_a_proposal_wider_than_gamma_names_the_arm() -> None:
    log: list[tuple[Any, ...]] = []
    wide = FakeProvider("wide", log, [5])
    wide.propose = lambda tokens, lengths, gamma, sampling, generator: Draft(  # type: ignore[method-assign]
        tokens=torch.ones((len(lengths), gamma + 1), dtype=torch.long), probs=None)
    policy = _policy(log, [Arm("wide", wide, 2)])
    with pytest.raises(RuntimeError, match=r"arm 'wide'.*gamma = 2"):
        _step(policy, [0], [0, 0, 0])


# ---------------------------------------------------------------------- batch buckets


class _Scale:
    """A throughput-like scorer that logs which instance scored a step."""

    def __init__(self, log: list[tuple[Any, ...]], name: str = "r0") -> None:
        self.log, self.name, self.copies = log, name, 0

    def __deepcopy__(self, memo: dict[int, Any]) -> _Scale:
        self.copies += 1
        return _Scale(self.log, f"{self.name}.{self.copies}")

    def __call__(self, gamma: int, accepted: Sequence[int], emitted: int, step_s: float) -> float:
        self.log.append(("score", self.name, len(accepted)))
        return 0.5


def _bucketed(buckets: tuple[int, ...], picks: Sequence[int] = (0,), **settings: Any
              ) -> tuple[StepPolicy, list[list[tuple[Any, ...]]], list[tuple[Any, ...]]]:
    """A policy over arms a, b with one FakeSelector per bucket, each logging to its own list."""
    logs: list[list[tuple[Any, ...]]] = []
    shared: list[tuple[Any, ...]] = []

    def make() -> FakeSelector:
        logs.append([])
        return FakeSelector(2, logs[-1], picks)

    arms = [Arm(n, FakeProvider(n, shared), 3) for n in ("a", "b")]
    policy = StepPolicy(arms, make(), _Scale(shared), PolicySettings(batch_buckets=buckets, **settings), make)
    return policy, logs, shared


def test_each_bucket_asks_scores_and_updates_its_own_selector() -> None:
    policy, logs, shared = _bucketed((1, 2, 4), draw_ahead=False)
    assert len(logs) == 3 and len(policy.selectors) == len(policy.rewards) == len(policy.first_rewards) == 3
    for rows, bucket in (([0], 0), ([0, 1, 2], 1), ([0, 1], 1), (list(range(9)), 2), ([0], 0)):
        plan = policy.choose(rows)
        assert plan.bucket == bucket == policy.settings.bucket(len(rows))
        policy.learn(plan, 3, [1] * len(rows), 0.01)
    assert [len(log) for log in logs] == [4, 4, 2]  # a select and an update per step of the bucket
    assert [e[1] for e in shared if e[0] == "score"] == ["r0", "r0.1", "r0.1", "r0.2", "r0"]


def test_a_choice_drawn_ahead_for_another_bucket_is_dropped_unused() -> None:
    """The draw made during a step comes from that step's bucket; where rows finish and the
    next step falls into a smaller bucket, the draw is dropped (that bucket's selector never
    gets an update for it) and the next step's own bucket draws fresh."""
    policy, logs, _ = _bucketed((1, 4), picks=[1, 0])
    plan = policy.choose(list(range(5)))  # bucket 1 plays 1, and draws 0 ahead during the step
    policy.learn(plan, 3, [0] * 5, 0.01)
    assert logs[1] == [("select", 1), ("select", 0), ("update", 1, 0.5)]
    plan = policy.choose([0, 3])  # two rows left: bucket 0; the draw of bucket 1 is dropped
    assert plan.bucket == 0 and plan.choice == 1  # bucket 0's own first pick
    policy.learn(plan, 3, [0, 0], 0.01)
    assert logs[1] == [("select", 1), ("select", 0), ("update", 1, 0.5)]  # no update for the dropped draw
    assert logs[0] == [("select", 1), ("select", 0), ("update", 1, 0.5)]
    plan = policy.choose([0, 3])  # same bucket: plays the draw made ahead
    assert plan.choice == 0 and len(logs[0]) == 3
    policy.learn(plan, 3, [0, 0], 0.01)
    assert logs[0][3:] == [("select", 1), ("update", 0, 0.5)]


def test_a_replay_that_knows_the_next_rows_draws_from_their_bucket() -> None:
    policy, logs, _ = _bucketed((1, 4), picks=[1, 0])
    plan = policy.choose(list(range(5)))
    policy.draw_next(rows=2)  # the replay knows three rows finish in this step
    policy.learn(plan, 3, [0] * 5, 0.01)
    assert policy.choose([0, 1]).choice == 1 and logs[0] == [("select", 1)]  # drawn ahead from bucket 0
    assert logs[1] == [("select", 1), ("update", 1, 0.5)]


def test_one_bucket_is_one_selector_and_assignment_spreads_copies() -> None:
    """The default, one bucket, keeps one selector and scorer for every batch; a selector or
    reward assigned (the bench harness swaps systems) goes to the first bucket and a copy of
    it to each other one; settings with other buckets spread the first bucket's."""
    log: list[tuple[Any, ...]] = []
    policy = _policy(log, [Arm("a", FakeProvider("a", log), 3)])
    assert policy.settings.batch_buckets == (1,) and policy.settings.bucket(1000) == 0
    assert len(policy.selectors) == 1 and policy.choose(list(range(64))).bucket == 0
    policy.settings = PolicySettings(batch_buckets=[1, 8])
    assert len(policy.selectors) == len(policy.rewards) == len(policy.first_rewards) == 2
    other = FakeSelector(1, log)
    policy.selector = other
    assert policy.selector is other and policy.selectors[1] is not other
    assert isinstance(policy.selectors[1], FakeSelector)


@pytest.mark.parametrize("buckets", [[], [0, 1], [2, 4], [1, 4, 2], [1, 1], [1, 2.5], [1, True], "1,2", None])
def test_bad_batch_buckets_are_clear_errors(buckets: Any) -> None:
    with pytest.raises(ValueError, match="batch_buckets"):
        PolicySettings(batch_buckets=buckets)


def _cost_model(rows: int, gamma: int, rng: random.Random) -> tuple[list[int], float]:
    """Accepted counts and step seconds of a fake engine where drafting pays at batch 1 and
    loses at batch 8: each drafted token is accepted w.p. 0.8 (until the first rejection);
    a plain step costs 10 ms + 0.25 ms per row, a drafting step 16 ms + 4 ms per row after
    the first (b1: ~185 against ~98 tokens/s; b8: ~535 against ~665)."""
    accepted = []
    for _ in range(rows):
        n = 0
        while n < gamma and rng.random() < 0.8:
            n += 1
        accepted.append(n)
    base = 0.010 + 0.00025 * rows if gamma == 0 else 0.016 + 0.004 * (rows - 1)
    return accepted, base * rng.uniform(0.95, 1.05)


def _draft_share(buckets: tuple[int, ...], seed: int) -> dict[int, float]:
    """Requests alternate between 1 and 8 rows, 40 steps each, through the model-free half;
    returns the share of the draft arm at each batch size over the second half of the run."""
    make = lambda: Thompson(ThompsonConfig(seed=seed), 2)  # noqa: E731
    arms = [Arm("draft", NoDraft(), 3), Arm("none", NoDraft(), 0)]
    policy = StepPolicy(arms, make(), make_reward("throughput"), PolicySettings(batch_buckets=buckets), make)
    rng = random.Random(seed)
    played: dict[int, list[bool]] = {1: [], 8: []}
    for request in range(40):
        rows = 1 if request % 2 == 0 else 8
        policy.begin(rows)
        for _ in range(40):
            plan = policy.choose(list(range(rows)))
            gamma = policy.played(plan).gamma
            accepted, step_s = _cost_model(rows, gamma, rng)
            policy.learn(plan, gamma, accepted, step_s)
            if request >= 20:
                played[rows].append(plan.arm == 0)
    return {rows: sum(p) / len(p) for rows, p in played.items()}


@pytest.mark.parametrize("seed", [0, 1])
def test_per_bucket_selectors_learn_where_drafting_pays(seed: int) -> None:
    """With a bucket per batch size, the selector of batch 1 settles on the draft and that of
    batch 8 on no draft; one shared selector (on one throughput scale) cannot tell the
    batches apart and plays the same arm at both."""
    bucketed = _draft_share((1, 2, 4, 8), seed)
    assert bucketed[1] > 0.9 and bucketed[8] < 0.1, bucketed
    shared = _draft_share((1,), seed)
    assert not (shared[1] > 0.9 and shared[8] < 0.1), shared
    assert abs(shared[1] - shared[8]) < 0.2, shared


def test_first_gate_learns_both_sides_first_then_prefers_the_faster_exploring_one_in_explore() -> None:
    from flashspec_core.policy import FirstGate

    gate = FirstGate(explore=4, least=2)
    assert gate.plays() and gate.plays()  # nothing observed yet: the first arm plays
    gate.observe(True, 100.0)
    assert not gate.plays()  # the side with fewer steps goes: the selector's
    gate.observe(False, 300.0)
    assert gate.plays()  # tied again: the first arm
    gate.observe(True, 100.0)
    assert not gate.plays()  # the selector's side is one short of least
    gate.observe(False, 300.0)
    assert gate.seen == {0: 5}
    gate.seen = {}  # count the explorations from here; the selector's side was faster
    assert [gate.plays() for _ in range(8)] == [False, False, False, True] * 2  # skip, but every 4th plays
    for _ in range(10):
        gate.observe(True, 1000.0)  # the first arm's steps got faster: its mean passes the other side's
    assert [gate.plays() for _ in range(4)] == [True, True, True, False]
    assert all(FirstGate(explore=0).plays() for _ in range(20))  # 0: the gate is off


def test_first_gate_keeps_each_class_of_live_rows_apart() -> None:
    """Lookup steps over one row are slower in tokens/s than skipped steps over 32 rows only
    because they serve fewer rows: pooled, the gate would skip lookup at batch 1 too. Per row
    class, lookup keeps playing at one row and is skipped at 32, where it is the slower side."""
    from flashspec_core.policy import FirstGate

    gate = FirstGate(explore=4, least=2)
    for _ in range(3):
        gate.observe(True, 300.0, rows=1)  # lookup at one row: beats plain's 200 tokens/s there
        gate.observe(False, 200.0, rows=1)
        gate.observe(True, 5000.0, rows=32)  # lookup at 32 rows: one matched row widens them all
        gate.observe(False, 8000.0, rows=32)
        gate.observe(False, 8000.0, rows=40)  # 40 rows: the same class as 32
    assert FirstGate.row_class(1) == 0 and FirstGate.row_class(3) == 1 and FirstGate.row_class(32) == FirstGate.row_class(63) == 5
    assert [gate.plays(1) for _ in range(4)] == [True, True, True, False]
    assert [gate.plays(32) for _ in range(4)] == [False, False, False, True]
    assert gate.plays(8)  # a class with no steps yet: the first arm plays
    assert gate.steps(played=True) == 6 and gate.steps(played=False) == 9


def test_a_gated_first_proposal_is_rolled_back_and_the_selector_chooses_and_both_sides_teach_the_gate() -> None:
    """Where the gate skips the first arm, its non-empty proposal is rolled back at once (none of
    its tokens entered the sequences), the selector chooses and learns as usual, and the step's
    tokens/s goes to the gate's other side."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [2]), 4, selectable=False), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, first=0, draw_ahead=False, first_explore=2)
    plan, drafter, _ = _step(policy, [0, 1, 2], [1, 2, 0])  # the gate's first proposal: plays
    assert plan.by_first and not plan.first_skipped and drafter is arms[0]
    log.clear()
    plan, drafter, _ = _step(policy, [0, 1, 2], [1, 0, 2], step_s=0.02)  # its second: the side not yet seen goes
    assert plan.first_skipped and not plan.by_first and plan.arm == 1 and plan.choice == 0 and drafter is arms[1]
    assert log == [("propose", "lookup", 4), ("select", 0), ("rollback", "lookup", [0, 0, 0]), ("propose", "d", 3),
                   ("rollback", "d", [1, 0, 2]), ("main", 3, (1, 0, 2), 6, 0.02), ("update", 0, 0.5)]
    assert policy.first_gates[0].played == {1: [1, 6 / 0.01]} and policy.first_gates[0].skipped == {1: [1, 6 / 0.02]}  # 3 rows: class 1


def test_first_tokens_caps_the_first_arms_proposal_by_the_batch_size() -> None:
    """first_tokens = 12 over the 3-row batch: at most 12 // 3 - 1 = 3 tokens a row (the arm's
    gamma 8 asked no more), 1 at least however many rows; None asks the arm's own gamma."""
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [8]), 8, selectable=False), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, first=0, draw_ahead=False, first_explore=0, first_tokens=12)
    assert [policy.first_gamma(b) for b in (1, 2, 3, 4, 6, 64)] == [8, 5, 3, 2, 1, 1]
    plan, drafter, _ = _step(policy, [0, 1, 2], [3, 0, 1])
    assert plan.by_first and drafter is arms[0] and plan.draft is not None and plan.draft.tokens.shape == (3, 3)
    assert log[0] == ("propose", "lookup", 3) and ("main", 3, (3, 0, 1), 7, 0.01) not in log
    assert ("first", 3, (3, 0, 1), 7, 0.01) in log  # scored at the width it played
    policy.settings = attrs.evolve(policy.settings, first_tokens=None)
    assert policy.first_gamma(3) == 8
    with pytest.raises(ValueError, match="no first arm"):
        _policy(log, arms[1:], draw_ahead=False).first_gamma(3)


def test_each_bucket_has_a_first_gate_of_its_own() -> None:
    log: list[tuple[Any, ...]] = []
    arms = [Arm("lookup", FakeProvider("lookup", log, [2]), 4, selectable=False), Arm("d", FakeProvider("d", log), 3)]
    policy = _policy(log, arms, first=0, draw_ahead=False, batch_buckets=(1, 2))
    _step(policy, [0, 1, 2], [1, 2, 0])
    assert [g.seen for g in policy.first_gates] == [{}, {1: 1}] and policy.first_gates[1].steps(played=True) == 1
    _step(policy, [1], [0, 1, 0])  # one live row: bucket 0
    assert [g.seen for g in policy.first_gates] == [{0: 1}, {1: 1}]
    policy.settings = attrs.evolve(policy.settings, first_explore=0)  # another gate setting: fresh gates
    assert [g.seen for g in policy.first_gates] == [{}, {}] and policy.first_gates[0].explore == 0
def test_observes_steps_is_told_apart_by_class() -> None:
    class Plain:
        num_arms = 2

        def select(self) -> int:
            return 0

        def update(self, arm: int, reward: float) -> None:
            pass

    class Watching(Plain):
        def see_rows(self, rows: int) -> None:
            pass

        def observe(self, arm: int, rows: int, width: int, accepted: list[int], step_s: float) -> None:
            pass

    for _ in range(2):  # the second answer comes from the per-class cache
        assert not observes_steps(Plain()) and observes_steps(Watching())


def test_a_selector_that_sees_row_ids_is_told_the_rows_of_each_choice_and_observation() -> None:
    class Rows:
        num_arms = 2

        def __init__(self) -> None:
            self.calls: list[tuple[Any, ...]] = []
            self.ids: tuple[int, ...] = ()

        def select(self) -> int:
            return 1

        def update(self, arm: int, reward: float) -> None:
            pass

        def see_row_ids(self, rows: Sequence[int]) -> None:
            self.ids = tuple(rows)

        def see_rows(self, rows: int) -> None:
            self.calls.append(("see_rows", self.ids, rows))

        def observe(self, arm: int, rows: int, width: int, accepted: list[int], step_s: float) -> None:
            self.calls.append(("observe", self.ids, list(accepted)))

    arms = [Arm("none", NoDraft(), 0), Arm("d", NoDraft(), 3)]
    selector = Rows()
    policy = StepPolicy(arms, selector, make_reward("throughput"), PolicySettings(draw_ahead=False))
    policy.begin(3)
    plan = policy.choose([0, 2])  # row 1 finished
    policy.learn(plan, 3, [3, 0], 1e-3)
    assert selector.calls == [("see_rows", (0, 2), 2), ("observe", (0, 2), [3, 0])]
