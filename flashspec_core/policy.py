"""Which arm drafts each decode step, and what the selector learns from it.

:class:`StepPolicy` is the one place where a step's arm is chosen. The decode loop
(:mod:`flashspec_core.pipeline`) asks it three things per step::

    plan = policy.plan(rows, tokens, lengths, sampling, generator)     # which arm
    draft, drafter = policy.propose(plan, tokens, lengths, sampling, generator)
    ...  # the target scores the draft, the verifier decides (queued on the device)
    policy.draw_next()                                                # optional: see draw-ahead
    reward = policy.commit(plan, accepted, step_s, drafter, width)    # rollbacks, learning

and ``policy.begin(rows)`` once per request. The learning half runs without a model:
:meth:`StepPolicy.choose` and :meth:`StepPolicy.learn` take only row counts, whether
the first arm proposed, accepted counts and step times, so a replay of recorded
acceptance traces drives the same choices, draws and updates as the engine.

Vocabulary:

* *arm* -- a draft provider with a ``gamma`` (tokens it proposes per row), an optional
  *fallback* arm and a ``selectable`` flag (:class:`Arm`). Arms are indexed by their
  position; index ``-1`` (:data:`BATCH_LIMIT_ARM`) is the batch limit's plain step.
* *choice* -- the selector's own arm index ``k``, which plays ``arms[choices[k]]``: the
  selector sees only the selectable arms.
* *plan* -- what a step plays, decided before it drafts (:class:`Plan`).
* *batch limit* -- ``speculate_max_batch`` (off unless set): with more live rows than this
  a step decodes without drafting, and the selector is neither asked nor updated (vLLM's
  ``disable_by_batch_size``), a fixed rule for where drafting is known not to pay; the
  learned alternative is the buckets below.
* *bucket* -- ``batch_buckets``, the smallest live-row count of each bucket (``(1, 2, 4)``:
  1, 2-3, 4 and more). The policy keeps one selector, one reward scorer and one first
  scorer per bucket, and a step asks, scores and updates those of its live-row count's
  bucket: whether drafting pays, and how many tokens per second a step emits, depend on
  the batch, so with a ``none`` arm the selector of each bucket learns where speculation
  pays. The bucket is a function of the sequences (rows finish at EOS or the token
  limit), never of a step's draws, so the output law stays the target's. One bucket
  (the default) is one selector for every batch.
* *first arm* -- ``first`` (``[selector] first``): proposes before the selector is asked.
  Where its proposal is non-empty it plays and the selector is neither asked nor
  updated; where it is empty (a lookup without a match) its provider is rolled back at
  once and the selector chooses, so the selector's rewards compare its arms where the
  choice made a difference. Its steps are scored on a scale of their own (*first
  scorer*): a matched lookup step emits up to gamma + 1 tokens for one target forward,
  and on the selector's running scale it would squeeze the selector's rewards toward 0.
  A non-empty proposal plays where its bucket's :class:`FirstGate` says so: the gate
  learns, from the emitted tokens per second of past steps, whether in that bucket the
  first arm's proposals beat the selector's choice (over many rows one matched row
  widens every row's verify forward); ``first_explore`` (default 8; 0: always play).
  ``first_tokens`` caps the first arm's proposal by the batch: at most
  ``max(1, first_tokens // B - 1)`` tokens per row over ``B`` rows (:meth:`StepPolicy.first_gamma`),
  so its verify forward scores at most about ``first_tokens`` positions: over 32 rows on the
  H200 a forward of 4 positions a row costs about one of 1, one of 9 (a lookup of gamma 8)
  well more, so a short lookup still pays where a long one costs. The cap is a function of
  the batch size alone, so the law stays the target's.
* *fallback* -- where an arm proposes nothing, its fallback arm proposes instead; the
  switch depends on the sequences alone, never on the step's random draws, so it is
  part of a deterministic arm and keeps the output law.
* *drafter* -- the arm whose proposal a step verifies: the planned arm or its fallback.
* *draw-ahead* -- ``draw_ahead``: the next step's choice is drawn while the device runs
  this step (:meth:`StepPolicy.draw_next`), off the host's critical path (a Thompson
  draw cost ~0.1 ms of a 2 ms step on the H200's host). It then misses this step's
  reward (feedback one step late), and is dropped unused where the first arm proposes,
  a request ends or the next step's rows fall into another bucket (the draw comes from
  this step's bucket; rows only finish, so the next step's bucket is not known yet);
  every played choice is still updated once, by the bucket it was drawn from. The
  pipeline also defers the selector's update of a step (``learn(defer=True)``) to the next
  step's :meth:`StepPolicy.settle`, run while the device computes that step and always before
  the selector is asked again, so each draw sees the same past steps as without deferring.
* *reward* -- a number in ``[0, 1]`` from :mod:`flashspec_core.rewards`, computed after
  the step from its width, accepted counts, emitted tokens and step time.
"""

from __future__ import annotations

import bisect
import copy
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeGuard, TypeVar

import attrs
import torch

from flashspec_core.config import batch_buckets_problem
from flashspec_core.contracts import (
    ArmSelector,
    CatchesUp,
    Draft,
    DraftProvider,
    NarrowsArms,
    ObservesSteps,
    PricesDrafts,
    ProposesTrees,
    RequestAware,
    SamplingParams,
    SeesCosts,
    SeesRowIds,
    SeesWidths,
)
from flashspec_core.rewards import StepReward

BATCH_LIMIT = "batch_limit"  # the arm name of steps that the batch limit ran without drafting
BATCH_LIMIT_ARM = -1  # the arm index of those steps
# Tokens a live row, on average, that a CatchesUp provider sits out before a step hands it the
# sequences (StepPolicy.catch_up_idle): its next proposal then indexes at most about this many
# a row, and each call's walk over the rows is paid once in as many steps.
IDLE_CATCH_UP_TOKENS = 8
T = TypeVar("T")


def _buckets(value: Any) -> Any:
    """A list or tuple of bucket starts as a tuple; anything else is left for the validator."""
    return tuple(value) if isinstance(value, list | tuple) else value


def _check_buckets(_instance: Any, _attribute: Any, value: Any) -> None:
    problem = batch_buckets_problem(value)
    if problem is not None:
        raise ValueError(f"batch_buckets {problem}, got {value!r}")


@attrs.frozen
class Arm:
    name: str
    provider: DraftProvider
    gamma: int
    fallback: int | None = None  # index of the arm that proposes when this one's proposal is empty
    selectable: bool = True  # False: only another arm's fallback; the selector never picks it
    # The draft component behind it, as errors name it: "draft 'hf' (plugin flashspec_hf.plugin,
    # flashspec-engine 0.1)"; empty for an arm assembled by hand (its provider's class is named).
    origin: str = ""

    def describe(self) -> str:
        """The arm as a ContractViolation names it: its name and its draft component."""
        return f"arm {self.name!r} ({self.origin or type(self.provider).__name__})"


@attrs.frozen
class PolicySettings:
    """The ``[selector]`` keys that shape the policy; ``first`` names its arm by index."""

    speculate_max_batch: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.instance_of(int), attrs.validators.ge(1)]))
    first: int | None = attrs.field(  # an index into the arms
        default=None, validator=attrs.validators.optional([attrs.validators.instance_of(int), attrs.validators.ge(0)]))
    draw_ahead: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    # The first arm's gate (FirstGate): one of every ``first_explore`` non-empty proposals goes the
    # way the gate does not prefer; 0 turns the gate off (a non-empty proposal always plays).
    first_explore: int = attrs.field(default=8, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    # Positions a first-arm step verifies over the batch, about (StepPolicy.first_gamma); None: the arm's gamma.
    first_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([attrs.validators.instance_of(int), attrs.validators.ge(2)]))
    # The smallest live-row count of each bucket: (1,) is one bucket for every batch.
    batch_buckets: tuple[int, ...] = attrs.field(default=(1,), converter=_buckets, validator=_check_buckets)

    def bucket(self, rows: int) -> int:
        """The index of the bucket of ``rows`` live rows (the last bucket start <= ``rows``)."""
        return max(bisect.bisect_right(self.batch_buckets, rows) - 1, 0)


@attrs.frozen
class Plan:
    """What one step plays, decided before it drafts."""

    rows: tuple[int, ...]  # the live rows the step serves
    arm: int  # index into the policy's arms; BATCH_LIMIT_ARM: the batch limit's plain step
    choice: int | None = None  # the selector's arm where it chose (arm == choices[choice]); else None
    # The first arm's proposal, made while planning, where that arm plays: its non-empty
    # proposal, or its empty one when the selector picks the first arm again (a plain step).
    draft: Draft | None = attrs.field(default=None, eq=False)
    bucket: int = 0  # index into settings.batch_buckets: the bucket of len(rows)
    first_skipped: bool = False  # the first arm proposed, and its bucket's gate had the selector choose instead

    @property
    def limited(self) -> bool:
        """The batch limit runs this step without drafting."""
        return self.arm == BATCH_LIMIT_ARM

    @property
    def by_first(self) -> bool:
        """The first arm proposed, so the selector was not asked."""
        return self.choice is None and not self.limited


@attrs.define
class FirstGate:
    """Whether the first arm's non-empty proposal plays, in one bucket of live rows.

    A matched lookup pays at batch 1, where a verify forward of nine positions costs about
    one of one position, but over many rows one matched row widens the whole batch's verify
    forward while the other rows gain nothing. The gate compares the emitted tokens per
    second of the steps where the first arm proposed and played against those where it
    proposed and the selector chose instead, and prefers the faster; one of every
    ``explore`` proposals goes the other way, so both means stay current. Until each side has
    ``least`` steps in a class, the side with fewer steps goes (ties: the first arm plays), so
    a class is known after about ``2 * least`` proposals, not the ``least * explore`` it would
    take with the first arm playing all but one in ``explore`` of them (64 steps at 32 rows of
    a serving run's few hundred, most of them a slower lookup). It keeps both sides per class
    of live rows (1, 2-3, 4-7, 8-15, ...): a step over 32 rows emits many times the tokens per
    second of one over a single row, so means pooled across batch sizes would compare the
    batch mix of each side, not the arms (a bucket of the selector may span every batch size). The decision reads past steps only (counts, emitted
    tokens, step times), so the output law stays the target's."""

    explore: int = 8
    least: int = 8
    # row class -> [steps, summed tokens/s]; the class of r live rows is r.bit_length() - 1
    played: dict[int, list[float]] = attrs.field(factory=dict)
    skipped: dict[int, list[float]] = attrs.field(factory=dict)
    seen: dict[int, int] = attrs.field(factory=dict)  # non-empty proposals so far, per row class

    @staticmethod
    def row_class(rows: int) -> int:
        """The class of ``rows`` live rows: 0 for one, 1 for 2-3, 2 for 4-7, ..."""
        return max(rows, 1).bit_length() - 1

    def plays(self, rows: int = 1) -> bool:
        """Whether the next non-empty proposal over ``rows`` live rows plays (counts it)."""
        if self.explore <= 0:
            return True
        rc = self.row_class(rows)
        self.seen[rc] = self.seen.get(rc, 0) + 1
        played, skipped = self.played.get(rc, [0, 0.0]), self.skipped.get(rc, [0, 0.0])
        if played[0] < self.least or skipped[0] < self.least:  # learn both sides first
            return played[0] <= skipped[0]
        other_way = self.seen[rc] % self.explore == 0
        return (played[1] / played[0] >= skipped[1] / skipped[0]) != other_way

    def observe(self, played: bool, tokens_per_s: float, rows: int = 1) -> None:
        side = (self.played if played else self.skipped).setdefault(self.row_class(rows), [0, 0.0])
        side[0] += 1
        side[1] += tokens_per_s

    def steps(self, played: bool) -> int:
        """Steps observed on one side, over every row class."""
        return int(sum(n for n, _ in (self.played if played else self.skipped).values()))


class StepPolicy:
    """Arm choice, fallback, provider rollbacks and learning for the decode loop.

    ``selector`` and ``reward`` are the first bucket's; each further bucket of
    ``settings.batch_buckets`` gets a selector from ``make_selector`` (a copy of
    ``selector`` without it) and a copy of ``reward``. ``arms``, ``selector``, ``reward``
    and ``settings`` may be swapped between requests (the bench harness times several
    systems on one pipeline): a selector or reward assigned goes to the first bucket and
    a copy of it to each other one, and settings with other buckets spread the first
    bucket's selector and scorers the same way; to keep every bucket's state across a
    swap, save and restore the lists ``selectors``, ``rewards``, ``first_rewards`` and ``first_gates``.
    The drawn-ahead choice and the plain arm stay with the policy.
    """

    def __init__(self, arms: Sequence[Arm], selector: ArmSelector, reward: StepReward,
                 settings: PolicySettings = PolicySettings(),
                 make_selector: Callable[[], ArmSelector] | None = None) -> None:
        self.arms, self._settings = list(arms), settings
        self.selectors = self._spread(selector, make_selector)  # one per bucket
        for each in self.selectors:
            _check(self.arms, each, settings)
        self.rewards = self._spread(reward)  # one per bucket: a bigger batch emits more tokens per step
        self.first_rewards = self._spread(copy.deepcopy(reward))  # the first arm's own scales (module docstring)
        self.first_gates = self.fresh_first_gates()  # whether the first arm's proposals play, per bucket
        self._plain = Arm(name=BATCH_LIMIT, provider=NoDraft(), gamma=0, selectable=False)
        self._ahead: tuple[int, int] | None = None  # (bucket, choice) drawn ahead for the next step
        self._due: int | None = None  # the bucket whose draw ahead is due for the step in flight
        self._rows = 1  # live rows of the step last chosen: a draw ahead's best guess of the next
        self._ids: tuple[int, ...] = (0,)  # which rows those are (SeesRowIds)
        # CatchesUp providers' id -> the sum of the sequences' lengths when they last took them in
        self._indexed: dict[int, int] = {}
        self._hosts: tuple[tuple[int, ...], dict[int, CatchesUp]] = ((), {})  # _host_providers' cache
        # A step's selector update held back by learn(defer=True): (selector, choice, rows, width, accepted,
        # step seconds, reward), applied by settle() before the selector is next asked or a request begins.
        self._pending: tuple[ArmSelector, int, tuple[int, ...], int, tuple[int, ...], float, float] | None = None

    @property
    def selector(self) -> ArmSelector:
        """The first bucket's selector (with one bucket: the selector)."""
        return self.selectors[0]

    @selector.setter
    def selector(self, selector: ArmSelector) -> None:
        self.selectors = self._spread(selector)

    @property
    def reward(self) -> StepReward:
        """The first bucket's reward scorer."""
        return self.rewards[0]

    @reward.setter
    def reward(self, reward: StepReward) -> None:
        self.rewards = self._spread(reward)

    @property
    def settings(self) -> PolicySettings:
        return self._settings

    @settings.setter
    def settings(self, settings: PolicySettings) -> None:
        old, self._settings = self._settings, settings
        if settings.batch_buckets != old.batch_buckets:
            self.selectors = self._spread(self.selectors[0])
            self.rewards = self._spread(self.rewards[0])
            self.first_rewards = self._spread(self.first_rewards[0])
        if settings.batch_buckets != old.batch_buckets or settings.first_explore != old.first_explore:
            self.first_gates = self.fresh_first_gates()

    def fresh_first_gates(self) -> list[FirstGate]:
        """Untrained first-arm gates, one per bucket."""
        return [FirstGate(explore=self._settings.first_explore) for _ in self._settings.batch_buckets]

    def _spread(self, first: T, make: Callable[[], T] | None = None) -> list[T]:
        """``first`` for the first bucket, and for each other one ``make()`` or a copy of ``first``."""
        more = len(self._settings.batch_buckets) - 1
        return [first] + [make() if make is not None else copy.deepcopy(first) for _ in range(more)]

    @property
    def choices(self) -> list[int]:
        """Indices of the arms the selector chooses between (its arm ``k`` is ``arms[choices[k]]``)."""
        return [i for i, a in enumerate(self.arms) if a.selectable]

    def played(self, plan: Plan) -> Arm:
        """The arm a plan plays (the batch limit's plain arm for ``BATCH_LIMIT_ARM``)."""
        return self._plain if plan.limited else self.arms[plan.arm]

    def limited(self, rows: int) -> bool:
        """Whether ``rows`` live rows exceed the batch limit."""
        limit = self.settings.speculate_max_batch
        return limit is not None and rows > limit

    # ------------------------------------------------------------------ the model-free half

    def begin(self, rows: int) -> None:
        """A new request of ``rows`` prompts: providers forget their sequences, a choice
        drawn at the end of the last request is dropped, a :class:`SeesWidths` selector is
        told its arms' widths (here, since arms may be swapped between requests), and a
        :class:`RequestAware` selector is told (before its first ``select()``, so it may
        keep per-request stats)."""
        self.settle()  # the last step of the request before belongs to it
        for arm in self.arms:
            arm.provider.reset()
        self._ahead, self._due = None, None
        self._indexed.clear()
        widths, costs = self.widths(), self.costs()
        for selector in self.selectors:
            if isinstance(selector, SeesWidths):
                selector.see_widths(widths)
            if isinstance(selector, SeesCosts):
                selector.see_costs(costs)
            if isinstance(selector, RequestAware):
                selector.begin_request(rows)

    def widths(self) -> list[int]:
        """Each choice's most tokens proposed per row: its arm's gamma, or its fallback's where
        that is wider (an empty proposal hands the step to the fallback, :meth:`propose`)."""
        return [int(w) for w in self._with_fallback(lambda arm: arm.gamma)]

    def costs(self) -> list[float]:
        """Each choice's prior cost of drafting one token of one row, as a share of a target
        forward (:class:`PricesDrafts`; 0.0 where undeclared): its arm's, or its fallback's where
        that is dearer (the fallback drafts the steps its arm hands over)."""
        return self._with_fallback(
            lambda arm: float(arm.provider.draft_cost) if isinstance(arm.provider, PricesDrafts) else 0.0)

    def _with_fallback(self, value: Callable[[Arm], float]) -> list[float]:
        """``value`` of each choice's arm, or of its fallback where that is larger (0 without one)."""
        choices = (self.arms[i] for i in self.choices)
        return [max(value(a), value(self.arms[a.fallback]) if a.fallback is not None else 0) for a in choices]

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int], rows: int | None = None,
                 skip: Collection[int] = ()) -> None:
        """Hand the sequences to every provider that indexes them ahead (:class:`CatchesUp`),
        once each, while the device works (the target's prefill, or a step: :meth:`catch_up_idle`):
        those of the arms that may play over ``rows`` live rows (default: ``len(lengths)``;
        :meth:`likely_providers`), less the providers whose ids are in ``skip``. A provider left
        out catches up inside its next proposal."""
        wanted = self.likely_providers(len(lengths) if rows is None else rows)
        total = sum(lengths)
        for key, provider in self._host_providers().items():
            if key in skip:
                continue
            self._indexed[key] = total  # considered here: not again for IDLE_CATCH_UP_TOKENS a row
            if wanted is None or key in wanted:
                provider.catch_up(tokens, lengths)

    def catch_up_idle(self, plan: Plan, drafter: Arm, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """During a step's device work: the sequences the step started from to the providers
        that did not propose in it and have sat out :data:`IDLE_CATCH_UP_TOKENS` tokens a live
        row since they were last handed the sequences (:meth:`catch_up`). A provider catches up
        inside its own proposal otherwise, so an arm played rarely would pay there for every
        token decoded since its last play (at batch 8 on the H200 a bandit's lookup steps took
        1.3 ms of host time against 0.5 ms for the same arm played every step) and its steps
        would be priced by that backlog, not by what a step of the arm costs. Handing over a
        few steps' tokens at once costs a fraction of a call per step (each call walks every row)."""
        hosts = self._host_providers()
        if not hosts:
            return
        total, rows = sum(lengths), len(plan.rows)
        proposed = {id(self.played(plan).provider), id(drafter.provider)}
        if self.settings.first is not None:
            proposed.add(id(self.arms[self.settings.first].provider))
        for key in proposed & hosts.keys():  # they took the sequences in to propose
            self._indexed[key] = total
        due = total - IDLE_CATCH_UP_TOKENS * rows
        skip = {key for key in hosts if self._indexed.get(key, due) > due}
        if len(skip) < len(hosts):
            self.catch_up(tokens, lengths, rows=rows, skip=skip)

    def _host_providers(self) -> dict[int, CatchesUp]:
        """The arms' :class:`CatchesUp` providers by id (found again where the arms changed:
        an isinstance check on a Protocol costs microseconds)."""
        key = tuple(id(a.provider) for a in self.arms)
        if self._hosts[0] != key:
            self._hosts = (key, {id(a.provider): a.provider for a in self.arms if isinstance(a.provider, CatchesUp)})
        return self._hosts[1]

    def likely_providers(self, rows: int) -> set[int] | None:
        """The ids of the providers that may propose over ``rows`` live rows (None: any may):
        none past the batch limit; else the first arm's, and those of the choices (and their
        fallbacks) that the bucket's selector may play (:class:`NarrowsArms`; any without it)."""
        if self.limited(rows):
            return set()
        selector = self.selectors[self.settings.bucket(rows)]
        if not isinstance(selector, NarrowsArms):
            return None
        picked = [self.arms[self.choices[k]] for k in selector.likely_arms(rows)]
        picked += [self.arms[a.fallback] for a in picked if a.fallback is not None]
        if self.settings.first is not None:
            picked.append(self.arms[self.settings.first])
        return {id(a.provider) for a in picked}

    def choose(self, rows: Sequence[int], first_proposes: bool = False) -> Plan:
        """The plan of a step over live ``rows``, given whether the first arm proposed.

        A first arm that proposed plays where the bucket's :class:`FirstGate` says so (else the
        plan has ``first_skipped``). Takes the choice drawn ahead for the bucket of ``len(rows)``
        if there is one, else asks that bucket's selector; a drawn choice that goes unplayed
        (batch limit, first arm, another bucket) is dropped.
        """
        first = self.settings.first
        if first_proposes and first is None:
            raise ValueError("first_proposes = True, but the policy has no first arm (settings.first is None)")
        bucket = self.settings.bucket(len(rows))
        self._rows, self._ids = len(rows), tuple(rows)
        ahead, self._ahead = self._ahead, None
        limited = self.limited(len(rows))
        # rows only finish, so the limit holds for the next step; its bucket is checked when it plays
        self._due = bucket if self.settings.draw_ahead and not limited else None
        if limited:
            return Plan(tuple(rows), BATCH_LIMIT_ARM, bucket=bucket)
        skipped = False
        if first_proposes and first is not None:
            if self.first_gates[bucket].plays(len(rows)):
                return Plan(tuple(rows), first, bucket=bucket)
            skipped = True  # the gate prefers the selector here
        choice = ahead[1] if ahead is not None and ahead[0] == bucket else self._ask(bucket, len(rows))
        return Plan(tuple(rows), self.choices[choice], choice, bucket=bucket, first_skipped=skipped)

    def draw_next(self, rows: int | None = None) -> None:
        """Draw the next step's choice now, if draw-ahead is on and this step has not drawn
        it yet. The pipeline calls it while the device runs the step; :meth:`learn` calls
        it too, so the selector hears ``select()`` for step t + 1 before ``update()`` for t.

        :param rows: the next step's live-row count where the caller knows it (a replay):
            the draw comes from its bucket. Default: this step's bucket, the pipeline's
            best guess before it reads which rows finished.
        """
        if self._due is not None:
            bucket = self._due if rows is None else self.settings.bucket(rows)
            self._due = None
            self._ahead = (bucket, self._ask(bucket, self._rows if rows is None else rows))

    def _ask(self, bucket: int, rows: int) -> int:
        """The choice of the bucket's selector for a step over ``rows`` live rows (after any
        update held back, so a choice sees every step that it would have seen without deferring)."""
        self.settle()
        selector = self.selectors[bucket]
        if observes_steps(selector):
            if sees_row_ids(selector):  # a count other than the last step's (a replay's draw ahead): its first rows
                selector.see_row_ids(self._ids if rows == len(self._ids) else self._ids[:rows])
            selector.see_rows(rows)
        return selector.select()

    def learn(self, plan: Plan, width: int, accepted: Sequence[int], step_s: float,
              emitted: int | None = None, captured: bool = False, defer: bool = False) -> float:
        """Score a finished step and update the selector where it chose; returns the reward.

        With ``defer`` the selector's update (its ``observe`` and ``update``, the costly part at
        many rows) is held back until :meth:`settle`, which runs before the selector is next
        asked for a choice (:meth:`draw_next`, :meth:`choose`) or a request begins: the pipeline
        defers it so that it runs while the device computes the next step instead of between two
        steps. Every choice still sees the same past steps as without deferring.

        :param width: tokens the step proposed per row (the drafter's gamma, or fewer).
        :param accepted: accepted draft tokens per live row (``plan.rows``' order).
        :param step_s: the step's wall time in seconds.
        :param emitted: tokens emitted over the live rows; default ``sum(n + 1)`` over ``accepted``.
        :param captured: the step captured a CUDA graph: it is scored, but the selector does not
            learn from it (its time holds one-off setup, not what the arm costs).
        """
        self.draw_next()
        acc = tuple(accepted)
        emitted = sum(n + 1 for n in acc) if emitted is None else emitted
        if (plan.by_first or plan.first_skipped) and not captured:
            self.first_gates[plan.bucket].observe(plan.by_first, emitted / max(step_s, 1e-9), len(plan.rows))
        scorer = (self.first_rewards if plan.by_first else self.rewards)[plan.bucket]
        reward = scorer(width, acc, emitted, max(step_s, 1e-9))
        if plan.choice is not None and not captured:
            self.settle()
            self._pending = (self.selectors[plan.bucket], plan.choice, tuple(plan.rows), width, acc,
                             max(step_s, 1e-9), reward)
            if not defer:
                self.settle()
        return reward

    def settle(self) -> None:
        """Apply the selector update that :meth:`learn` held back, if any."""
        if self._pending is None:
            return
        (selector, choice, rows, width, acc, step_s, reward), self._pending = self._pending, None
        if observes_steps(selector):
            if sees_row_ids(selector):
                selector.see_row_ids(rows)
            selector.observe(choice, len(acc), width, acc, step_s)
        selector.update(choice, reward)

    # ------------------------------------------------------------------ the half with providers

    def plan(self, rows: Sequence[int], tokens: torch.Tensor, lengths: Sequence[int], sampling: SamplingParams,
             generator: torch.Generator) -> Plan:
        """Choose the step's arm; the first arm (if any, and under the batch limit) proposes first."""
        first = self.settings.first
        if first is None or self.limited(len(rows)):
            return self.choose(rows)
        draft = self._first_proposal(first, tokens, lengths, sampling, generator)
        plan = self.choose(rows, first_proposes=not _empty(draft))
        if plan.first_skipped and plan.arm != first:
            # the gate preferred the selector, which chose another arm: nothing of the proposal enters the sequences
            self.arms[first].provider.rollback([0] * len(lengths))
            return plan
        # The first arm chosen by the selector keeps its proposal (an empty one: a plain step): no second search.
        return attrs.evolve(plan, draft=draft) if plan.arm == first else plan

    def propose(self, plan: Plan, tokens: torch.Tensor, lengths: Sequence[int], sampling: SamplingParams,
                generator: torch.Generator) -> tuple[Draft, Arm]:
        """The step's draft and the arm that drafted it: the planned arm, or its fallback
        where the arm's proposal is empty (a lookup without a match)."""
        arm = self.played(plan)
        if plan.draft is not None:
            return plan.draft, arm
        draft, drafter = arm.provider.propose(tokens, lengths, arm.gamma, sampling, generator), arm
        if _empty(draft) and arm.fallback is not None:
            drafter = self.arms[arm.fallback]
            draft = drafter.provider.propose(tokens, lengths, drafter.gamma, sampling, generator)
        return _checked(draft, drafter), drafter

    def commit(self, plan: Plan, accepted: Sequence[int], step_s: float, drafter: Arm, width: int,
               paths: torch.Tensor | None = None, captured: bool = False, defer: bool = False) -> float:
        """Roll the draft providers back to the accepted tokens, then :meth:`learn`.

        :param accepted: accepted draft tokens of every row of the batch (B ints; finished rows too).
        :param drafter: the arm :meth:`propose` returned; ``width`` its draft's width (nodes of a tree).
        :param paths: after a tree proposal, the accepted nodes ([B, D] int64 CPU, -1 padded):
            the drafter learns them through :meth:`~flashspec_core.contracts.ProposesTrees.rollback_path`.
        :param captured: the step captured a CUDA graph (see :meth:`learn`).
        :param defer: hold the selector's update back until :meth:`settle` (see :meth:`learn`).
        """
        arm = self.played(plan)
        if paths is not None and isinstance(drafter.provider, ProposesTrees):
            drafter.provider.rollback_path(paths)
        else:
            drafter.provider.rollback(accepted)
        if drafter.provider is not arm.provider:  # the arm proposed nothing: none of its tokens entered the sequences
            arm.provider.rollback([0] * len(accepted))
        return self.learn(plan, width, [accepted[b] for b in plan.rows], step_s, captured=captured, defer=defer)

    def first_gamma(self, batch: int) -> int:
        """Tokens per row the first arm may propose over a batch of ``batch`` rows: its gamma,
        capped at ``max(1, first_tokens // batch - 1)`` where ``first_tokens`` is set (the rows
        of the verify forward, finished ones too, not only the live rows: the forward computes them all)."""
        first, cap = self.settings.first, self.settings.first_tokens
        if first is None:
            raise ValueError("first_gamma: the policy has no first arm (settings.first is None)")
        gamma = self.arms[first].gamma
        return gamma if cap is None else max(1, min(gamma, cap // max(batch, 1) - 1))

    def _first_proposal(self, first: int, tokens: torch.Tensor, lengths: Sequence[int], sampling: SamplingParams,
                        generator: torch.Generator) -> Draft:
        """The first arm's proposal (at most :meth:`first_gamma` tokens a row); when it is empty,
        its provider is rolled back at once (it proposed nothing, so nothing of it entered the
        sequences) and the selector's arm drafts."""
        gate = self.arms[first]
        gamma = self.first_gamma(len(lengths))
        draft = _checked(gate.provider.propose(tokens, lengths, gamma, sampling, generator), gate)
        if _empty(draft):
            gate.provider.rollback([0] * len(lengths))
        return draft


def _check(arms: list[Arm], selector: ArmSelector, settings: PolicySettings) -> None:
    """Clear errors for arms, fallbacks, the first arm and the selector's width that do not fit."""
    if not arms:
        raise ValueError("a policy needs at least one arm")
    for arm in arms:
        if arm.fallback is not None and not 0 <= arm.fallback < len(arms):
            raise ValueError(f"arm {arm.name!r}: fallback {arm.fallback} is not an arm index (0..{len(arms) - 1})")
    if settings.first is not None and settings.first >= len(arms):
        raise ValueError(f"first = {settings.first} is not an arm index (0..{len(arms) - 1})")
    selectable = sum(a.selectable for a in arms)
    if selector.num_arms != selectable:
        raise ValueError(f"the selector chooses between {selector.num_arms} arms, "
                         f"but {selectable} arms are selectable ({[a.name for a in arms if a.selectable]})")


def _checked(draft: Draft, arm: Arm) -> Draft:
    """The draft, if its tokens are ``[B, <= arm.gamma]`` (and a tree only from a provider that
    declares :class:`ProposesTrees`); a clear error naming the arm if not."""
    if draft.tokens.dim() != 2 or draft.tokens.shape[1] > arm.gamma:
        raise RuntimeError(f"arm {arm.name!r}: the draft proposed tokens of shape {tuple(draft.tokens.shape)}, "
                           f"not [B, <= gamma = {arm.gamma}]")
    if draft.parents is not None and not proposes_trees(arm.provider):
        raise RuntimeError(f"arm {arm.name!r}: {type(arm.provider).__name__} proposed a tree (Draft.parents) "
                           "but does not declare ProposesTrees with proposes_trees = True")
    return draft


_CAPABLE: dict[tuple[type, type], bool] = {}  # (selector class, capability) -> whether it has the hooks


def _has(selector: object, capability: type) -> bool:
    """Whether ``selector`` has ``capability``'s hooks, decided once per class: a Protocol
    ``isinstance`` walks the protocol's members (30-60 us on Python 3.11 on the CPU of
    docs/benchmarks/bandit-host-cost-cpu.json), and the policy asks several times per step."""
    key = (type(selector), capability)
    known = _CAPABLE.get(key)
    if known is None:
        known = _CAPABLE[key] = isinstance(selector, capability)
    return known


def observes_steps(selector: ArmSelector) -> TypeGuard[ObservesSteps]:
    """Whether ``selector`` has :class:`ObservesSteps`' hooks (decided once per class)."""
    return _has(selector, ObservesSteps)


def sees_row_ids(selector: object) -> TypeGuard[SeesRowIds]:
    """Whether ``selector`` has :class:`SeesRowIds`' hook (decided once per class)."""
    return _has(selector, SeesRowIds)


def proposes_trees(provider: DraftProvider) -> bool:
    """Whether ``provider`` declares that its proposals may be trees."""
    return isinstance(provider, ProposesTrees) and bool(provider.proposes_trees)


def _empty(draft: Draft) -> bool:
    """A proposal of no tokens (a lookup without a match, the ``none`` arm)."""
    return draft.tokens.dim() == 2 and draft.tokens.shape[1] == 0


class NoDraft:
    """No proposal: plain target decoding (the gamma = 0 arm, and the batch limit's steps)."""

    def reset(self) -> None:
        """Stateless."""

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Stateless."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        return Draft(tokens=torch.zeros((len(lengths), 0), dtype=torch.long), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""
