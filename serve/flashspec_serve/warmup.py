"""The engine's warm-up: the graph captures and compiles of serving, made before it serves.

A fast back-end captures a CUDA graph the first time it meets a shape (the draft loop per
batch, gamma and span; the target's verify forward per batch, width and span; its prefill
per batch, width and span) and compiles its fused ops per input layout. Met inside a
request, each costs 0.05-0.6 s of that request's latency. So before the server accepts a
request the engine runs, at every slot count its slot policy can produce (largest first,
so caches are allocated once):

* each draft's own ``prewarm`` (:class:`~flashspec_core.contracts.Prewarmable`) at every
  gamma it drafts with, for greedy requests and for requests of the config's ``[generation]``
  settings (:func:`warm_samplings`; a draft captures its loop per sampling setting, so a
  request of other settings still captures its own);
* a dummy batch at a ladder of lengths (``2^k + 1``: every span up to the context), decoded one step by every arm in turn (its own provider, no
  fallback, no first arm), then one step at each draft width ``0..max gamma`` with a
  one-hot draft (what a lookup proposes), split over as many dummy batches of that length as
  the room above it takes (:func:`chunks`: so the ladder's top length, whose steps meet the
  widest span, fits however many steps a length has), at those settings, and where they are all greedy
  sampled too (the verifier's kernels for sampled rows); where an arm proposes trees, a
  second dummy batch of one step at each node count ``1..its gamma`` with a one-hot tree
  (a lookup tree's partial matches: the target's tree forward and the verifier capture a
  graph per node count, whatever the shape), likewise; and, where rows join one by
  one, one row and then two re-seated and prefilled alone (``prefill_rows``: its compiled
  ops specialize one row apart from several), each join followed by a step;
* prefills alone, and runs of 1, 2, 4, ... rows re-seated (:func:`join_sizes`: a fast
  target captures a join's forward per run of rows), at every prefill width up to the longest
  sequence warmed (:func:`prefill_lengths`): a rebuild re-prefills every live row, so its
  widths reach past the dummy batches' lengths, which keep room to grow.

That is the ``full`` level. Its cost is slot counts x spans x widths: for ``max_batch`` 64
and ``configs/gpu.toml`` 895 captures (105 per slot count, from the draft's prewarm over
every span of the cache and the target's verify at every span and width, and
160 forwards over joining rows whatever the slot count; ``benchmarks/warmup_keys.py``). The ``basic`` level (the server's default) keeps every slot
count, draft width and sampling setting but warms only sequences of up to
:data:`BASIC_LONGEST` tokens: dummy batches and prefills up to that length, and the drafts'
prewarm bounded to it (``longest``). That is 526 captures for the same config and batch,
and a replay of serve_bench's load after it asks for 0 keys it missed; a request
that grows past the bound captures its graphs then (counted by
``flashspec:graph_captures_while_serving``, logged with the cache and key). ``off`` warms
nothing.

The selectors and reward scorers never see these steps (a one-arm selector and copies of
the scorers play them), and neither do the pipeline's logger and step observers. One log
line per slot count (``engine_warm_up_progress``) says how far it is.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator, Sequence

import attrs
import structlog
import torch

from flashspec_core.config import GenerationDefaults
from flashspec_core.contracts import (
    CapturesGraphs,
    Draft,
    DraftProvider,
    GraphCounter,
    PrefillsRows,
    Prewarmable,
    ResetsRows,
    RowSampling,
    SamplingParams,
)
from flashspec_core.pipeline import Pipeline
from flashspec_core.policy import Arm, StepPolicy, proposes_trees

log = structlog.get_logger("flashspec_serve")

PATTERN = 6  # dummy sequences repeat tokens 1..PATTERN, so a lookup finds matches in them
JOINS = 2  # per-row joins per dummy batch: one row, then two
SAMPLED = SamplingParams(temperature=1.0)  # a sampled setting, for the verifier's sampling path
# basic's longest sequence: a 256-token prompt and the 256 new tokens of configs/gpu.toml's
# [generation]; it reaches spans of 128..512 slots, 3 of a 2,048-slot cache's 5
BASIC_LONGEST = 512


@attrs.frozen
class Level:
    """How much a warm-up covers (module docstring)."""

    name: str
    longest: int | None  # longest sequence warmed, tokens: dummy batches and the drafts' prewarm (None: all)

    def limit(self, context: int | None) -> int | None:
        """The longest dummy sequence in a ``context``-token model (None: unknown, see :func:`warm_lengths`)."""
        if self.longest is None or context is None:
            return context if self.longest is None else self.longest
        return min(context, self.longest)


LEVELS = {level.name: level for level in (Level("full", longest=None), Level("basic", longest=BASIC_LONGEST))}


@attrs.frozen
class Warmup:
    """What a warm-up did."""

    seconds: float
    captures: int  # CUDA graphs captured meanwhile (the CapturesGraphs counters)
    prewarmed: int  # graph keys the drafts' prewarm asked for
    steps: int  # decode steps run on dummy batches
    sizes: tuple[int, ...]  # slot counts warmed, largest first
    lengths: tuple[int, ...]  # dummy sequence lengths warmed at each slot count
    level: str = "full"


def slot_sizes(max_batch: int, per_row: bool) -> list[int]:
    """The slot counts a batch rebuild can make (engine module docstring): with per-row joins
    the next power of two of the live rows, capped at ``max_batch``; without, any count."""
    if not per_row:
        return list(range(1, max_batch + 1))
    return sorted({min(max_batch, 1 << k) for k in range(max_batch.bit_length() + 1)})


def warm_lengths(context: int | None, growth: int) -> list[int]:
    """Dummy sequence lengths ``2^k + 1`` (prefill widths ``2^k``) that leave ``growth`` tokens
    of room in ``context``; without a known context, up to 65."""
    limit = context if context is not None else 65 + growth
    lengths, k = [], 0
    while (1 << k) + 1 + growth <= limit:
        lengths.append((1 << k) + 1)
        k += 1
    return lengths


def graph_counters(pipeline: Pipeline) -> list[GraphCounter]:
    """The graph caches of the target, the verifier and every arm's provider, each once."""
    return list(graph_caches(pipeline).values())


def graph_caches(pipeline: Pipeline) -> dict[str, GraphCounter]:
    """The graph caches of :func:`graph_counters` by name: ``"target"``, ``"verifier"``, or the
    names of the arms whose providers share it, joined by commas (``"draft-g1,draft-g2"``)."""
    parts = [("target", pipeline.target), ("verifier", pipeline.verifier),
             *((a.name, a.provider) for a in pipeline.policy.arms)]
    names: dict[int, list[str]] = {}
    caches: dict[int, GraphCounter] = {}
    for name, part in parts:
        if isinstance(part, CapturesGraphs):
            names.setdefault(id(part.graphs), []).append(name)
            caches[id(part.graphs)] = part.graphs
    return {",".join(names[i]): cache for i, cache in caches.items()}


def graph_captures(counters: Sequence[GraphCounter]) -> int:
    return sum(int(c.captures) for c in counters)


def warm_samplings(pipeline: Pipeline) -> list[SamplingParams]:
    """Greedy, and the config's ``[generation]`` settings (what a request that names none gets)."""
    gen = pipeline.config.generation if pipeline.config is not None else GenerationDefaults()
    default = SamplingParams(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p)
    greedy = SamplingParams(temperature=0.0)
    return [greedy] if default.greedy else [greedy, default]


def warm_up(pipeline: Pipeline, sizes: Sequence[int], context: int | None, per_row: bool,
            samplings: Sequence[SamplingParams] | None = None, level: str = "full") -> Warmup:
    """Run the warm-up (module docstring) at slot counts ``sizes``, ``samplings`` (default:
    :func:`warm_samplings`) and ``level`` (a key of :data:`LEVELS`), logging its progress after
    each slot count; the batch is left for the engine's next rebuild to replace."""
    plan = LEVELS[level]
    samplings = list(samplings) if samplings is not None else warm_samplings(pipeline)
    counters, t0 = graph_counters(pipeline), time.perf_counter()
    before = graph_captures(counters)
    own = list(pipeline.policy.arms)
    schedule, trees = plays(own, samplings), tree_plays(own, samplings)
    gamma = max(a.gamma for a, _ in schedule + trees)
    limit = plan.limit(context)
    lengths = warm_lengths(limit, _room(1, gamma))  # each length's steps split to fit (chunks)
    # a sequence keeps gamma + 1 slots for the step that scores it (Engine.room): the longest prefilled
    longest = plan.limit(context - gamma - 1 if context is not None else None)
    # every prefill length, the dummy batches' too: those batches re-seat one row and then two, and
    # a join of more rows meets a rows-forward of its own (join_sizes)
    prefills = prefill_lengths(longest)
    prewarmed = steps = 0
    order = tuple(sorted(set(sizes), reverse=True))  # the largest allocates every cache once
    with _quiet(pipeline), _forced(pipeline.policy) as force:
        for done, size in enumerate(order, 1):
            prewarmed += prewarm_drafts(own, size, samplings, plan.longest)
            for length in lengths:
                for k, part in enumerate(chunks(schedule, length, limit, gamma)):
                    steps += _warm_batch(pipeline, force, part, size, length, per_row and k == 0)
                for part in chunks(trees, length, limit, gamma):
                    steps += _warm_batch(pipeline, force, part, size, length, per_row=False)
            for length in prefills:
                _warm_prefill(pipeline, own, size, length, per_row)
            seconds = time.perf_counter() - t0
            log.info("engine_warm_up_progress", level=level, size=size, sizes_done=done, sizes=len(order),
                     seconds=round(seconds, 3), captures=graph_captures(counters) - before,
                     remaining_s=round(remaining(seconds, done, len(order)), 1))
    return Warmup(time.perf_counter() - t0, graph_captures(counters) - before, prewarmed, steps, order,
                  tuple(lengths), level)


def prefill_lengths(limit: int | None) -> list[int]:
    """Prompt lengths whose prefills meet every prefill width ``2^k`` of sequences of up to
    ``limit`` tokens: ``2^k + 1`` and, for the widest, ``limit`` itself (without a known limit,
    up to 65). A rebuild re-prefills every live row, so its widths reach the longest sequence,
    past the dummy batches' lengths, which keep room to grow."""
    limit = limit if limit is not None else 65
    out, k = [], 0
    while True:
        out.append(min((1 << k) + 1, limit))
        if (1 << k) >= limit - 1:  # this width holds the longest prefill (limit - 1 tokens)
            return out
        k += 1


def remaining(seconds: float, done: int, total: int) -> float:
    """Seconds the slot counts left should take at the mean pace so far: an over-estimate, since
    the largest counts, the slowest steps, come first."""
    return seconds / done * (total - done) if done else 0.0


def plays(arms: Sequence[Arm], samplings: Sequence[SamplingParams]) -> list[tuple[Arm, SamplingParams]]:
    """The steps of a dummy batch: at each of ``samplings``, each arm on its own (no fallback:
    its provider proposes), then one one-hot arm per draft width ``0..max gamma`` (the widths a
    lookup's partial matches reach); where ``samplings`` are all greedy, the widths once more
    sampled, so the verifier's sampling path is ready too."""
    alone = [attrs.evolve(a, fallback=None, selectable=True) for a in arms]
    top = max(a.gamma for a in arms)
    widths = [Arm(name=f"warmup-width-{w}", provider=OneHot(), gamma=w) for w in range(top + 1)]
    return _at(alone, widths, samplings)


def tree_plays(arms: Sequence[Arm], samplings: Sequence[SamplingParams]) -> list[tuple[Arm, SamplingParams]]:
    """The steps of a second dummy batch where an arm proposes trees: one one-hot tree per node
    count (:func:`tree_widths`) at each of ``samplings``, and sampled too where they are all
    greedy; none without a tree arm. A batch of their own, so the first keeps its room (and
    the spans its lengths reach)."""
    return _at([], tree_widths(arms), samplings)


def _at(alone: Sequence[Arm], widths: Sequence[Arm], samplings: Sequence[SamplingParams]
        ) -> list[tuple[Arm, SamplingParams]]:
    """Each of ``alone`` then ``widths`` at each of ``samplings``; where those are all greedy,
    ``widths`` once more sampled (:data:`SAMPLED`)."""
    out = [(arm, sampling) for sampling in samplings for arm in [*alone, *widths]]
    if all(s.greedy for s in samplings):
        out += [(arm, SAMPLED) for arm in widths]
    return out


def tree_widths(arms: Sequence[Arm]) -> list[Arm]:
    """One-hot tree arms of every node count ``1..g``, ``g`` the largest gamma of the arms that
    propose trees (none without one): a tree's node count varies with what its provider finds
    (a lookup tree's matches), and the target's tree forward, the verifier and the path commit
    are each captured per node count or depth, whatever the shape; a chain-shaped tree of
    ``n`` nodes meets node count ``n`` and depth ``n``."""
    top = max((a.gamma for a in arms if proposes_trees(a.provider)), default=0)
    return [Arm(name=f"warmup-tree-{n}", provider=OneHotTree(), gamma=n) for n in range(1, top + 1)]


def warm_widths(pipeline: Pipeline, widths: Sequence[Arm], sizes: Sequence[int], lengths: Sequence[int],
                sampling: SamplingParams) -> int:
    """One step of each of ``widths`` (:func:`tree_widths`, one-hot chains) at ``sampling`` on a
    dummy batch of each of ``sizes`` rows and ``lengths`` tokens, largest batch first, with the
    pipeline's arms, selectors, scorers, logger and observers untouched (a benchmark's warm-up
    for the shapes its real prompts may not meet before the clock starts); returns the steps
    run. Each batch keeps room for the steps: a length past ``max_context`` less that room is cut."""
    if not widths:
        return 0
    schedule = [(arm, sampling) for arm in widths]
    context = pipeline.max_context
    room = _room(len(schedule), max(a.gamma for a in widths))
    steps = 0
    with _quiet(pipeline), _forced(pipeline.policy) as force:
        for size in sorted(set(sizes), reverse=True):  # the largest allocates every cache once
            for length in sorted({length if context is None else min(length, context - room) for length in lengths}):
                if length >= 1:
                    steps += _warm_batch(pipeline, force, schedule, size, length, per_row=False)
    return steps


def prewarm_drafts(arms: Sequence[Arm], size: int, samplings: Sequence[SamplingParams],
                   longest: int | None = None) -> int:
    """Each :class:`Prewarmable` provider's prewarm at ``size`` rows, per gamma and sampling,
    over sequences of up to ``longest`` tokens (None: every span of its cache)."""
    done: set[tuple[int, int]] = set()
    keys = 0
    for arm in arms:
        if arm.gamma < 1 or not isinstance(arm.provider, Prewarmable) or (id(arm.provider), arm.gamma) in done:
            continue
        done.add((id(arm.provider), arm.gamma))
        for sampling in samplings:
            keys += arm.provider.prewarm(size, arm.gamma, sampling, longest=longest)
    return keys


def chunks(plays: Sequence[tuple[Arm, SamplingParams]], length: int, limit: int | None,
           gamma: int) -> list[list[tuple[Arm, SamplingParams]]]:
    """``plays`` in runs that a dummy batch of ``length`` tokens has room for under ``limit``
    (:func:`_room`; None: one run): a run per batch, so a length near the limit, whose steps meet
    the widest span, is warmed whatever the number of plays (one batch of them all left the top
    span of a 256-slot cache unwarmed, and a served load captured the target's verify there)."""
    if not plays:
        return []
    fit = len(plays) if limit is None else max(1, (limit - length) // (gamma + 1) - JOINS - 1)
    return [list(plays[i : i + fit]) for i in range(0, len(plays), fit)]


def _room(plays: int, gamma: int) -> int:
    """Tokens a dummy batch grows by (each step emits up to gamma + 1), and one step's reserve."""
    return (plays + JOINS + 1) * (gamma + 1)


def _warm_batch(pipeline: Pipeline, force: Callable[[Arm], None], schedule: Sequence[tuple[Arm, SamplingParams]],
                size: int, length: int, per_row: bool) -> int:
    """Prefill ``size`` dummy rows of ``length`` tokens, run a step of each of ``schedule``, then
    (per-row joins) seat the last row anew alone and step, and the last two and step; returns
    the steps run."""
    target = pipeline.target
    plays, arms = list(schedule), [a for a, _ in schedule]
    gamma = max(a.gamma for a in arms)
    tokens = torch.zeros((size, length + _room(len(plays), gamma)), dtype=torch.long)
    tokens[:, :length] = dummy(length, target.vocab)
    lengths, active = [length] * size, [True] * size
    generator = torch.Generator(device=target.device).manual_seed(0)
    for provider in _providers(arms):  # a new batch: every provider forgets the last one (policy.begin)
        provider.reset()
    target.prefill(tokens, lengths)
    joins = [[size - 1], [size - 2, size - 1]][: min(size - 1, JOINS)] if per_row else []
    base = len(plays)
    drafter = next((a for a in arms if isinstance(a.provider, Prewarmable)), arms[0])
    plays += [(drafter, schedule[0][1])] * len(joins)  # the joined rows' first step: a draft catching up on them
    for k, (arm, sampling) in enumerate(plays):
        if k >= base:
            _rejoin(pipeline, arms, tokens, lengths, joins[k - base])
        force(arm)
        _, emitted = pipeline.step(tokens, lengths, active, RowSampling([sampling] * size, seeds=[None] * size),
                                   generator)
        for b, new in enumerate(emitted):
            tokens[b, lengths[b] : lengths[b] + len(new)] = torch.tensor(new, dtype=torch.long)
            lengths[b] += len(new)
    return len(plays)


def _warm_prefill(pipeline: Pipeline, arms: Sequence[Arm], size: int, length: int, per_row: bool) -> None:
    """Prefill ``size`` dummy rows of ``length`` tokens, and (per-row joins) 1, 2, 4, ... of them
    again alone (:func:`join_sizes`): the prefill shapes of a rebuild or a join of sequences that
    long, no step after."""
    target = pipeline.target
    tokens = dummy(length, target.vocab).expand(size, -1).contiguous()
    for provider in _providers(arms):
        provider.reset()
    target.prefill(tokens, [length] * size)
    if per_row and size > 1 and isinstance(target, PrefillsRows):  # one slot is never joined: it is rebuilt
        for rows in join_sizes(size):  # a fast target captures its rows-forward per run of rows (a power of two)
            target.prefill_rows(tokens, [length] * size, list(range(size - rows, size)))


def join_sizes(size: int) -> list[int]:
    """The rows a join into ``size`` slots prefills, as powers of two: 1, 2, 4, ... up to the
    first that holds ``size - 1`` (a join leaves at least one live row)."""
    out = [1]
    while out[-1] < size - 1:
        out.append(min(2 * out[-1], size - 1))
    return out


def _rejoin(pipeline: Pipeline, arms: Sequence[Arm], tokens: torch.Tensor, lengths: list[int],
            rows: list[int]) -> None:
    """Seat new dummy sequences in ``rows`` as joining requests are seated (engine ``_seat``)."""
    length = lengths[0] // 2 + 1  # another length than the batch's: a prefill shape of its own
    for row in rows:
        tokens[row] = 0
        tokens[row, :length] = dummy(length, pipeline.target.vocab)
        lengths[row] = length
    for provider in _providers(arms):
        if isinstance(provider, ResetsRows):
            provider.reset_rows(rows)
    if isinstance(pipeline.target, PrefillsRows):
        pipeline.target.prefill_rows(tokens, lengths, rows)


def _providers(arms: Sequence[Arm]) -> list[DraftProvider]:
    return list({id(a.provider): a.provider for a in arms}.values())


def dummy(length: int, vocab: int) -> torch.Tensor:
    """``length`` tokens repeating ``1..PATTERN`` (within the vocabulary): [length] int64."""
    return 1 + torch.arange(length, dtype=torch.long) % min(PATTERN, max(vocab - 1, 1))


class OneHot:
    """A warm-up draft of ``gamma`` copies of token 1, one-hot (``probs = None``, as a lookup's)."""

    def reset(self) -> None:
        """Stateless."""

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Stateless."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        return Draft(tokens=torch.ones((len(lengths), gamma), dtype=torch.long), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""


class OneHotTree(OneHot):
    """A warm-up draft tree of ``gamma`` one-hot nodes of token 1, each the child of the one
    before (a chain's shape, proposed as a tree: its depth is its node count)."""

    proposes_trees = True

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        return Draft(tokens=torch.ones((len(lengths), gamma), dtype=torch.long), probs=None,
                     parents=torch.arange(-1, gamma - 1, dtype=torch.long))

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Stateless."""


class _One:
    """The warm-up's selector: one arm, always played, learning nothing."""

    num_arms = 1

    def select(self) -> int:
        return 0

    def update(self, arm: int, reward: float) -> None:
        """Warm-up steps teach nothing."""


@contextlib.contextmanager
def _forced(policy: StepPolicy) -> Iterator[Callable[[Arm], None]]:
    """``force(arm)`` makes ``arm`` the policy's only arm, played by :class:`_One` with no first
    arm; the policy's own arms, settings, selectors and scorers come back untouched after."""
    arms, settings = policy.arms, policy.settings
    selectors, rewards, first_rewards = policy.selectors, policy.rewards, policy.first_rewards
    policy.settings = attrs.evolve(settings, first=None)  # the same buckets: nothing is re-spread
    policy.selectors = [_One() for _ in selectors]
    policy.rewards = [copy.deepcopy(r) for r in rewards]
    policy.first_rewards = [copy.deepcopy(r) for r in first_rewards]
    # Drops a choice drawn ahead by a generate() before the warm-up: an index into the
    # policy's own arms, which the forced single arm does not have.
    policy.begin(1)

    def force(arm: Arm) -> None:
        policy.arms = [arm]

    try:
        yield force
    finally:
        policy.settings = settings
        policy.arms, policy.selectors, policy.rewards, policy.first_rewards = arms, selectors, rewards, first_rewards


@contextlib.contextmanager
def _quiet(pipeline: Pipeline) -> Iterator[None]:
    """No step log lines and no step observers while warming up: its steps are no requests'."""
    logger, on_step = pipeline.logger, pipeline.on_step
    pipeline.logger, pipeline.on_step = None, None
    try:
        yield
    finally:
        pipeline.logger, pipeline.on_step = logger, on_step
