"""Value types and protocols that components exchange.

Drafting and verifying meet only through :class:`Draft` and :class:`Verdict`; the
decode loop talks to each component through the protocols below, never through a
pluggy call (hooks are for discovery and observation only).

A component may also offer an optional *capability*: a small runtime-checkable
protocol below (:class:`RequestAware`, :class:`ObservesSteps`, :class:`SeesRowIds`, :class:`DeclaresExactness`,
:class:`VerifiesWithNoise`, :class:`HasTokenizer`, :class:`Prewarmable`,
:class:`CapturesGraphs`, :class:`NamesModel`, :class:`VerifiesRows`, :class:`HasContext`,
:class:`ForgetsRequests`, :class:`PrefillsRows`, :class:`ResetsRows`, :class:`NarrowsArms`, and for draft trees :class:`ProposesTrees`, :class:`ScoresTrees`, :class:`VerifiesTrees`, :class:`LimitsTreeNodes`; :class:`LimitsChainTokens`). Code that uses a capability tests
``isinstance(component, Capability)``, never ``hasattr``, so every capability a caller
relies on is declared and documented here.

Vocabulary (Leviathan et al. 2023; Chen et al. 2023):

* *drafted* tokens ``x_1..x_gamma`` come from a draft distribution ``q``;
* an *accepted* token is a drafted token that passed ``u * q(x) < p(x)``;
* the *recovered* token is sampled from ``norm(max(0, p - q))`` at the first rejection;
* the *bonus* token is sampled from ``p`` at position ``gamma + 1`` when all were accepted.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import attrs
import torch

if TYPE_CHECKING:
    from flashspec_core.sampling import Noise
    from flashspec_core.tree import TreeVerdict

ComponentKind = Literal["target", "draft", "verifier", "selector"]
T = TypeVar("T")


def _non_negative(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number >= 0, got {value!r}")


def _top_p_range(_inst: object, attr: attrs.Attribute[Any], value: float) -> None:
    if not (0.0 < value <= 1.0):
        raise ValueError(f"{attr.name} must be in (0, 1], got {value!r}")


# Temperatures below this act as greedy: dividing float32 logits by less overflows them to
# inf (softmax then gives NaN), and long before that the draw is an argmax in all but exact
# ties. vLLM treats temperatures under the same 1e-5 as greedy.
GREEDY_BELOW = 1e-5


@attrs.frozen
class SamplingParams:
    """How tokens are drawn. ``temperature == 0`` means greedy, and so does any temperature
    below :data:`GREEDY_BELOW`; ``top_k == 0`` and ``top_p == 1`` mean no filtering. The
    same params apply to ``p`` and ``q``."""

    temperature: float = attrs.field(default=1.0, converter=float, validator=_non_negative)
    top_k: int = attrs.field(default=0, converter=int, validator=_non_negative)
    top_p: float = attrs.field(default=1.0, converter=float, validator=_top_p_range)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0


def _as_tuple(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(values)


def _check_rows(inst: RowSampling, attr: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    if attr.name == "params" and not value:
        raise ValueError("RowSampling.params needs one SamplingParams per row, got none")
    if attr.name != "params" and value and len(value) != len(inst.params):
        raise ValueError(f"RowSampling.{attr.name} has {len(value)} entries for {len(inst.params)} rows")


@attrs.frozen
class RowSampling:
    """Sampling settings per row of a batch: rows with other temperatures, top-k or top-p
    (and seeds) decode together.

    A verifier declaring :class:`VerifiesRows` takes it in place of one
    :class:`SamplingParams` (:func:`flashspec_core.sampling.verify_rows`). ``seeds[b]``
    (None: unseeded) makes row ``b``'s tokens a function of its seed and its sequence alone,
    whatever else is in the batch: its token at sequence index ``t`` is the Gumbel-max
    sample ``argmax(warped logits + G(seed, t))`` (docs/exactness.md, "Seeded rows").
    ``starts[b]`` is the sequence index of the token row ``b``'s first slot emits this step
    (its length); the pipeline fills it in each step.
    """

    params: tuple[SamplingParams, ...] = attrs.field(converter=_as_tuple, validator=_check_rows)
    seeds: tuple[int | None, ...] = attrs.field(default=(), converter=_as_tuple, validator=_check_rows)
    starts: tuple[int, ...] = attrs.field(default=(), converter=_as_tuple, validator=_check_rows)

    @property
    def uniform(self) -> SamplingParams | None:
        """The one setting of every row, where all rows share it and none is seeded; else None."""
        first = self.params[0]
        if self.seeded or any(p != first for p in self.params):
            return None
        return first

    @property
    def seeded(self) -> bool:
        return any(s is not None for s in self.seeds)

    @property
    def draft_params(self) -> SamplingParams:
        """What the draft providers draw with: the rows' most common setting (the first on a tie).

        Any one setting keeps the output exact, since each row's tokens are verified against
        the ``q`` the draft reports; a common one keeps acceptance high for most rows.
        """
        counts: dict[SamplingParams, int] = {}
        for p in self.params:
            counts[p] = counts.get(p, 0) + 1
        return max(counts, key=counts.__getitem__)


def _check_tree_parents(draft: Draft, _attr: attrs.Attribute[Any], parents: torch.Tensor | None) -> None:
    if parents is None:
        return
    if parents.dim() != 1 or parents.dtype != torch.int64 or parents.device.type != "cpu":
        raise ValueError(f"Draft.parents must be a [g] int64 CPU tensor, got {tuple(parents.shape)} "
                         f"{parents.dtype} on {parents.device}")
    if parents.shape[0] != draft.tokens.shape[-1]:
        raise ValueError(f"Draft.parents has {parents.shape[0]} nodes, but tokens are {tuple(draft.tokens.shape)}")
    for node, parent in enumerate(parents.tolist()):
        if not -1 <= parent < node:
            raise ValueError(f"Draft.parents[{node}] = {parent}: must be -1 (the root) or an earlier node")


@attrs.frozen
class Draft:
    """What a draft provider proposes for one step: a chain, or a tree (``parents``).

    A tree's nodes are in topological order and its shape is shared by the batch; node
    ``n``'s token is ``tokens[:, n]`` and ``probs[:, n]`` the distribution it was drawn
    from (with replacement, see :mod:`flashspec_core.tree`); ``probs = None`` makes every
    node deterministic (one-hot ``q``). A chain is the tree ``parents = [-1, 0, 1, ...]``,
    but is proposed with ``parents = None``, and only providers declaring
    :class:`ProposesTrees` may propose trees.
    """

    tokens: torch.Tensor  # [B, g] int64, g <= the arm's gamma (nodes of a tree)
    probs: torch.Tensor | None  # [B, g, Vd] float32: q each token was sampled from; None = one-hot
    parents: torch.Tensor | None = attrs.field(  # [g] int64 CPU, -1 = a child of the root; None = a chain
        default=None, validator=_check_tree_parents)


@attrs.frozen
class Verdict:
    """What a verifier decides for one step.

    Row ``b`` emits ``tokens[b, : num_accepted[b] + 1]``: the accepted draft tokens
    followed by one recovered or bonus token; the rest of the row is ``-1``.
    """

    tokens: torch.Tensor  # [B, gamma+1] int64, padded with -1
    num_accepted: torch.Tensor  # [B] int64 in [0, gamma]
    # [B] int32 or int64, 0 = fine: a verifier that checks its inputs on the device without a
    # host sync sets :class:`Broken` bits (any nonzero value: an input it found broken) here;
    # the pipeline reads them with the step's one copy and raises ContractViolation. None: not checked.
    flags: torch.Tensor | None = None


class Broken(enum.IntFlag):
    """What a step's checks found broken, as bits of a per-row flag (0 = nothing).

    The pipeline computes them on the device and reads them with the step's one host
    copy; a verifier may report the bits it finds in its inputs in :attr:`Verdict.flags`.
    """

    DRAFT_TOKENS = 1  # a draft token id outside [0, V)
    DRAFT_PROBS = 2  # q not a distribution: NaN, inf, negative, or rows not summing to 1
    TARGET_LOGITS = 4  # a target logit NaN or +inf, or a position whose logits are all -inf
    VERDICT_COUNT = 8  # num_accepted outside [0, width]
    VERDICT_TOKENS = 16  # an emitted token outside [0, V)
    VERDICT_PATH = 32  # a tree's accepted path naming a node outside [-1, N)

    def describe(self) -> str:
        """What broke, in words (one clause per bit set)."""
        return "; ".join(_BROKEN_WORDS[bit] for bit in Broken if bit in self) or "nothing"


_BROKEN_WORDS = {
    Broken.DRAFT_TOKENS: "draft token ids outside [0, vocab)",
    Broken.DRAFT_PROBS: "draft probabilities that are not a distribution (NaN, inf, negative, or not summing to 1)",
    Broken.TARGET_LOGITS: "target logits that are NaN or +inf, or all -inf at a position",
    Broken.VERDICT_COUNT: "num_accepted outside [0, draft width]",
    Broken.VERDICT_TOKENS: "emitted tokens outside [0, vocab)",
    Broken.VERDICT_PATH: "an accepted path naming a node outside the tree",
}


class ContractViolation(RuntimeError):
    """A component broke its contract at run time: the message names the component (arm,
    plugin and distribution where the registry knows them) and what broke.

    Raised by the pipeline after a step's one host copy, and by the built-in checks of a
    verifier that is handed inputs outside its contract.
    """

    def __init__(self, component: str, broke: str, rows: Sequence[int] = ()) -> None:
        where = f" (rows {list(rows)})" if rows else ""
        super().__init__(f"{component} broke its contract: {broke}{where}")
        self.component, self.broke, self.rows = component, broke, tuple(rows)


class VerifierInputError(ValueError):
    """A verifier was called with inputs outside its contract: ``argument`` names which one
    (``target_logits``, ``draft_tokens``, ``draft_probs``), ``flag`` the :class:`Broken` bit."""

    def __init__(self, argument: str, flag: Broken, detail: str) -> None:
        super().__init__(f"{argument}: {detail}")
        self.argument, self.flag = argument, flag


@attrs.frozen
class StepRecord:
    """One decode step, as logged and handed to ``flashspec_step_end``."""

    step: int
    arm: int  # index into the pipeline's arms; -1: the batch limit ran the step without drafting
    arm_name: str
    gamma: int  # tokens proposed this step (the arm's gamma, or fewer: see DraftProvider)
    batch_size: int  # rows still generating
    accepted: tuple[int, ...]  # per active row
    emitted: int  # tokens emitted over active rows
    reward: float
    draft_ms: float
    target_ms: float
    verify_ms: float
    step_ms: float
    # The step's target or a draft captured a CUDA graph (a graph cache missed): its time
    # holds that one-off setup, not the arm's cost, so the policy does not learn from it.
    captured: bool = False


@attrs.frozen
class ComponentSpec(Generic[T]):
    """A component a plugin offers: ``factory(config, context) -> component``.

    ``config_cls`` is a (frozen attrs) class built from the component's TOML keys;
    ``None`` means the component takes no keys.
    """

    name: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_\-]*$"))
    kind: ComponentKind
    factory: Callable[..., T]
    config_cls: type | None = None
    description: str = ""

    def default_config(self) -> Any:
        """The config with every key at its default: what a table with only ``use`` gives."""
        return self.config_cls() if self.config_cls is not None else None


@runtime_checkable
class Target(Protocol):
    """The model whose distribution the output follows.

    Rows are ragged: ``tokens[b, : lengths[b]]`` is row ``b``'s sequence so far.
    """

    @property
    def vocab(self) -> int:
        """Width of the logits (may exceed the tokenizer's size: padded embeddings)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def eos_token_ids(self) -> set[int]: ...

    def encode(self, prompt: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def prefill(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Start a new batch: process every prompt but its last token."""

    def score(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor) -> torch.Tensor:
        """Logits after each sequence and after each draft token: [B, gamma+1, V].

        tokens: [B, L] int64; draft_tokens: [B, gamma] int64 (gamma may be 0).
        """

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Keep only the accepted draft tokens of the last :meth:`score` (B ints)."""


@attrs.frozen
class DraftContext:
    """What a draft factory may know about the pipeline it joins."""

    target: Target
    vocab: int  # the target's logits width; drafts must emit probs of this width
    device: torch.device


@runtime_checkable
class Verifier(Protocol):
    """Decides which drafted tokens to keep; must not sync with the host."""

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V] raw target logits
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None (one-hot draft)
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict: ...


@runtime_checkable
class DraftProvider(Protocol):
    """Proposes up to ``gamma`` tokens per row given the current sequences.

    A proposal may be narrower than ``gamma`` (all rows alike; even 0 tokens, a plain
    decoding step) when its width is a function of the sequences alone, as for prompt
    lookup finding no match: then it is part of the arm's deterministic choice and the
    output law is unchanged. It must never depend on the step's random draws.

    ``tokens[b, : lengths[b]]`` is row ``b``'s whole sequence so far (prompt and
    emitted tokens). Sequences only grow between calls, except that a proposal's
    rejected tokens never enter them, so a provider with a cache keeps what it
    has seen and catches up on the rest. Providers that are not picked for a
    step are not called; they catch up on their next turn. Arms with equal draft
    tables share one provider (``flashspec_core.build``), so ``gamma`` comes with each
    call and the state a provider keeps is about the sequences only. ``gamma = 0``
    gives an empty proposal. Every proposal is followed by a :meth:`rollback` before the
    next call (after an empty one, the rollback of zeros may come twice: the first arm's
    empty proposal played as a plain step). :mod:`flashspec_core.testing.draft_contract`
    checks all of this.
    """

    def reset(self) -> None:
        """Forget every sequence (called before a new batch of prompts)."""

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64, right-padded
        lengths: Sequence[int],  # B ints
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft: ...

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Keep only the accepted prefix of the last proposal (B ints in [0, gamma])."""


@runtime_checkable
class ArmSelector(Protocol):
    """Picks the draft arm for the next step from past rewards only.

    ``select()`` returns an arm index in ``[0, num_arms)``; ``update(arm, reward)`` is
    called after each step that played a selected arm, with its reward in ``[0, 1]``,
    except a step that captured a CUDA graph (``StepRecord.captured``).
    With ``[selector] draw_ahead`` (the default) the pipeline calls ``select()`` for the
    next step while the device still runs this one, so before this step's ``update()``
    (feedback one step late), and drops a drawn choice that goes unplayed (the first arm
    proposed, or the request ended): ``select()`` should have no effect beyond its random
    draws. A selector may also define the optional hook of :class:`RequestAware`;
    selectors without it keep working unchanged.
    """

    num_arms: int

    def select(self) -> int: ...

    def update(self, arm: int, reward: float) -> None: ...


# ------------------------------------------------------------------ optional capabilities


@runtime_checkable
class RequestAware(Protocol):
    """Optional extra of an :class:`ArmSelector`: told when a request starts.

    The pipeline calls ``begin_request(rows)`` once at the start of each
    ``generate()`` call, before its first ``select()``, if the selector has the
    method. A selector can then keep statistics per request (every step after the
    call, until the next call, serves the same rows), still using only rewards of
    finished steps, so the output law stays the target's.
    """

    def begin_request(self, rows: int) -> None:
        """A new request of ``rows`` prompts (decoded together) starts now.

        :param rows: number of prompts in the ``generate()`` call, >= 1.
        """


@runtime_checkable
class ObservesSteps(Protocol):
    """Optional extra of an :class:`ArmSelector`: sees each step's shape, not only its reward.

    Before each ``select()`` the policy calls ``see_rows(rows)`` with the live rows of the
    step being chosen (with draw-ahead: of the step in flight, since rows only finish).
    After each step the selector chose, before ``update()``, it calls ``observe`` with the
    step's live rows, draft width, accepted tokens per row and wall time. All of it comes
    from finished steps, so the law is unchanged.
    """

    def see_rows(self, rows: int) -> None:
        """The next ``select()`` chooses for a step over ``rows`` live rows (>= 1)."""

    def observe(self, arm: int, rows: int, width: int, accepted: Sequence[int], step_s: float) -> None:
        """A finished step of ``arm`` over ``rows`` rows that proposed ``width`` tokens per
        row, accepted ``accepted`` (``rows`` ints) and took ``step_s`` seconds."""


@runtime_checkable
class SeesRowIds(Protocol):
    """Optional extra of an :class:`ObservesSteps` selector: which of the request's rows a step serves.

    The policy calls ``see_row_ids(rows)`` before each ``see_rows()`` with the rows of the step
    being chosen (with draw-ahead: of the step in flight), and before each ``observe()`` with
    the observed step's rows, whose accepted counts ``observe`` lists in that order. A
    selector can then keep statistics per row: in a fixed batch the rows that accept most
    finish first, and a request's mean over every row it decoded then overrates the rows
    still live. Rows finish by their sequences, never by a step's draws, so the law is
    unchanged.
    """

    def see_row_ids(self, rows: Sequence[int]) -> None:
        """The next ``see_rows()`` or ``observe()`` concerns the request's rows ``rows`` (batch
        indices from 0, ascending; their count is the live rows)."""


@runtime_checkable
class SeesWidths(Protocol):
    """Optional extra of an :class:`ArmSelector`: told how wide each arm drafts.

    The policy calls ``see_widths(widths)`` at the start of every request, before its first
    ``select()``, with each of the selector's arms' most tokens proposed per row (its
    ``gamma``, or its fallback's where that is wider; 0 for an arm that never drafts). A
    selector can then tell plain decoding from the drafts, and price a draft it has not
    played yet, before any step. Widths are config, not draws, so the law is unchanged.
    """

    def see_widths(self, widths: Sequence[int]) -> None:
        """Arm ``k`` of the selector proposes at most ``widths[k]`` tokens per row (ints >= 0)."""


@runtime_checkable
class PricesDrafts(Protocol):
    """Optional extra of a :class:`DraftProvider`: what drafting costs, known from its structure.

    ``draft_cost`` is the share of one target forward that drafting one token of one row costs
    (a draft of the target's first 8 of 28 layers: about 8/28; a host-side search: leave it out).
    A :class:`SeesCosts` selector reads it to price an arm before it has timed a step of it.
    It is config, not a draw, so the law is unchanged.
    """

    draft_cost: float


@runtime_checkable
class SeesCosts(Protocol):
    """Optional extra of an :class:`ArmSelector`: told each arm's prior cost of drafting.

    The policy calls ``see_costs(costs)`` at the start of every request, after ``see_widths``,
    with each of the selector's arms' :attr:`PricesDrafts.draft_cost` (its fallback's where
    that is dearer; 0.0 for an arm whose provider does not declare one). A selector can then
    hold back an arm its cost already rules out instead of paying for steps that show it.
    """

    def see_costs(self, costs: Sequence[float]) -> None:
        """Drafting one token of one row on arm ``k`` costs ``costs[k]`` of a target forward (>= 0)."""


@runtime_checkable
class DeclaresExactness(Protocol):
    """Optional extra of a :class:`Verifier`: whether it samples from the target's law.

    A verifier without the attribute is exact. ``exact = False`` (a class attribute)
    marks a timing stand-in such as the ``synthetic`` verifier: the contract suite skips
    its exactness checks, and its numbers must be labelled synthetic.
    """

    exact: bool


@runtime_checkable
class VerifiesWithNoise(Protocol):
    """Optional extra of a :class:`Verifier`: verify with the noise given, not drawn.

    Given the same :class:`flashspec_core.sampling.Noise`, every implementation emits
    exactly the tokens of :func:`flashspec_core.sampling.verify_random` (of
    :func:`~flashspec_core.sampling.verify_greedy` when greedy): tests and benchmarks
    compare verifiers token for token through it.
    """

    def verify_with_noise(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V] raw target logits
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None (one-hot draft)
        sampling: SamplingParams,
        noise: Noise,
    ) -> Verdict: ...


@runtime_checkable
class HasTokenizer(Protocol):
    """Optional extra of a :class:`Target`: the tokenizer behind ``encode``/``decode``.

    A Hugging Face draft refuses a target whose tokenizer maps tokens to other ids than
    its own. ``None`` means the target has no tokenizer (prompts are token ids).
    """

    tokenizer: Any  # a transformers tokenizer (get_vocab(), len()), or None


@runtime_checkable
class Prewarmable(Protocol):
    """Optional extra of a :class:`DraftProvider`: do its one-off setup before serving.

    ``prewarm(batch, gamma, sampling)`` captures (or compiles) now whatever a step at
    that batch size, gamma and sampling would otherwise set up inside a timed request;
    it is called between requests, never inside one, and returns how many graphs it
    asked for (0 where there is nothing to capture, e.g. without CUDA graphs).
    ``off_gpu`` runs the capture path without CUDA (tests only). ``longest`` (tokens)
    bounds it to the steps of sequences of up to that many tokens (None: every length
    the provider's cache holds), so a bounded warm-up stays short.
    """

    def prewarm(self, batch: int, gamma: int, sampling: SamplingParams, off_gpu: bool = False,
                longest: int | None = None) -> int: ...


@runtime_checkable
class ForgetsRequests(Protocol):
    """Optional extra of a :class:`DraftProvider` whose proposals depend on earlier requests.

    :meth:`DraftProvider.reset` only ends the current batch; a provider that learns from
    the sequences of finished requests (``suffix``: its corpus) keeps them. A benchmark
    timing the same prompts more than once calls ``forget_requests()`` so that a timed
    run never predicts outputs it has already seen.
    """

    def forget_requests(self) -> None:
        """Drop everything learned from earlier requests and the current batch: the
        provider proposes as it did when it was built. Called between requests."""


@runtime_checkable
class GraphCounter(Protocol):
    """What :class:`CapturesGraphs` exposes of a graph cache."""

    captures: int  # graphs captured so far, kept across clears
    captured: Sequence[Hashable]  # the key of each of those captures, in order (a key again after a clear)


@runtime_checkable
class CapturesGraphs(Protocol):
    """Optional extra of a :class:`Target` or :class:`DraftProvider` that replays CUDA graphs.

    ``graphs.captures`` counts the graphs captured so far, so a benchmark can report a
    capture that fell inside a timed run (setup work timed as decoding). Components that
    share a cache expose the same object; count each once.
    """

    @property
    def graphs(self) -> GraphCounter: ...


@runtime_checkable
class NamesModel(Protocol):
    """Optional extra of a component's config class: the checkpoint it loads.

    ``model`` (a directory or a known model name) names the component in progress
    lines and in default arm names (``<model dir name>-g<gamma>``).
    """

    model: str


@runtime_checkable
class ProposesTrees(Protocol):
    """Optional extra of a :class:`DraftProvider`: its proposals may be trees (``Draft.parents``).

    ``proposes_trees`` says whether this instance (as configured) does: the pipeline then
    refuses, when it is built, a target without :class:`ScoresTrees` or a verifier without
    :class:`VerifiesTrees`. After a tree proposal the pipeline calls ``rollback_path(paths)``
    instead of :meth:`DraftProvider.rollback`.
    """

    proposes_trees: bool

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Keep only the accepted path of the last (tree) proposal.

        :param paths: ``[B, D]`` int64 CPU, row ``b``'s accepted node at depth ``d + 1``,
            ``-1`` from its accepted count on (:attr:`flashspec_core.tree.TreeVerdict.path`).
        """


@runtime_checkable
class ScoresTrees(Protocol):
    """Optional extra of a :class:`Target`: score a draft tree in one forward.

    ``score_tree`` replaces :meth:`Target.score` for a tree step: each node sees the
    sequence, its ancestors and itself (:func:`flashspec_core.tree.tree_attention_mask`)
    at the position of its depth (:func:`flashspec_core.tree.tree_positions`), so its
    logits are those a chain forward of its path would give. ``commit_path`` replaces
    :meth:`Target.rollback`: the cache keeps exactly the accepted path's entries, as if
    a chain of those tokens had been scored; nothing of a rejected branch stays.
    """

    def score_tree(
        self,
        tokens: torch.Tensor,  # [B, L] int64
        lengths: Sequence[int],  # B ints
        draft_tokens: torch.Tensor,  # [B, N] int64, the nodes
        parents: torch.Tensor,  # [N] int64 CPU, -1 = a child of the root
    ) -> torch.Tensor:
        """Logits after each sequence and after each node: [B, N + 1, V]."""

    def commit_path(self, paths: torch.Tensor) -> None:
        """Keep the accepted path of the last :meth:`score_tree`: ``paths`` [B, D] int64 CPU,
        the accepted node at depth ``d + 1``, -1 padded."""


@runtime_checkable
class VerifiesTrees(Protocol):
    """Optional extra of a :class:`Verifier`: verify a draft tree (:mod:`flashspec_core.tree`).

    Given a generator, the noise is drawn as for a chain of ``N`` tokens
    (:meth:`flashspec_core.sampling.Noise.draw` with ``gamma = N``), so a width-1 tree gives
    the chain's tokens.
    """

    def verify_tree(
        self,
        target_logits: torch.Tensor,  # [B, N+1, V] raw target logits (root, then each node)
        draft_tokens: torch.Tensor,  # [B, N] int64
        parents: torch.Tensor,  # [N] int64 CPU, -1 = a child of the root
        draft_probs: torch.Tensor | None,  # [B, N, V] or None (every node deterministic)
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> TreeVerdict: ...


@runtime_checkable
class LimitsTreeNodes(Protocol):
    """Optional extra of a :class:`Target` with :class:`ScoresTrees` or a :class:`Verifier` with
    :class:`VerifiesTrees`: the most nodes a tree it scores or verifies may have.

    An arm's ``gamma`` bounds its trees' nodes (a proposal is ``[B, <= gamma]``), so the pipeline
    refuses, when it is built, a tree arm whose ``gamma`` is above the target's or the verifier's
    ``max_tree_nodes``, naming the arm and the limit, rather than failing at its first step.
    Without it a component takes trees of any size.
    """

    max_tree_nodes: int


@runtime_checkable
class LimitsChainTokens(Protocol):
    """Optional extra of a :class:`Verifier`: the most draft tokens of a chain it verifies.

    An arm's ``gamma`` bounds its chains' length, so the pipeline refuses, when it is built, a
    chain arm whose ``gamma`` is above the verifier's ``max_chain_tokens``, naming the arm and the
    limit, rather than failing at its first step. Without it a verifier takes chains of any length.
    """

    max_chain_tokens: int


@runtime_checkable
class VerifiesRows(Protocol):
    """Optional extra of a :class:`Verifier`: per-row sampling settings and seeds in one batch.

    ``verify_rows`` takes a :class:`RowSampling` where :meth:`Verifier.verify` takes one
    :class:`SamplingParams`; :func:`flashspec_core.sampling.verify_rows` implements it over
    any exact ``verify`` (a uniform, unseeded ``RowSampling`` is ``verify`` itself). The
    pipeline refuses a batch of mixed settings for a verifier without it.
    """

    def verify_rows(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V] raw target logits
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None (one-hot draft)
        rows: RowSampling,
        generator: torch.Generator | None,
    ) -> Verdict: ...


@runtime_checkable
class HasContext(Protocol):
    """Optional extra of a :class:`Target` or a :class:`DraftProvider`: the longest sequence it
    can score, or draft after.

    ``max_context`` counts tokens: prompt, generated tokens and a step's draft slots
    together (fast: its cache's ``max_len - 1``, one slot being scratch; hf: the model's
    ``max_position_embeddings``). The pipeline's context is the least of its target's and its
    arms' providers' (a fast draft's cache may be shorter than its target's): the server answers
    400 to a prompt that leaves no room in it, and the pipeline refuses one before it prefills.
    """

    max_context: int


@runtime_checkable
class PrefillsRows(Protocol):
    """Optional extra of a :class:`Target`: start some rows of the running batch afresh.

    The server seats a request that joins the running batch in the slot of a finished row
    and prefills that row alone, instead of re-prefilling every live row
    (:meth:`Target.prefill` of a new batch). Every other row's cache stays exactly as it
    was, so its next :meth:`Target.score` gives the logits it would have given without the
    join; the batch keeps its size and nothing is reallocated (captured graphs stay valid).
    """

    def prefill_rows(self, tokens: torch.Tensor, lengths: Sequence[int], rows: Sequence[int]) -> None:
        """Forget what the cache holds for ``rows`` and process each one's new sequence
        ``tokens[b, : lengths[b]]`` but its last token, as :meth:`Target.prefill` does.

        :param tokens: ``[B, L]`` int64, the whole batch (B as at the last prefill).
        :param lengths: B ints; only those of ``rows`` are read.
        :param rows: distinct row indices in ``[0, B)``.
        """


@runtime_checkable
class ResetsRows(Protocol):
    """Optional extra of a :class:`DraftProvider`: forget some rows' sequences only.

    Called between steps, after the rollbacks, when new sequences take over ``rows`` of
    the running batch (:class:`PrefillsRows`): the provider drops what it keeps for those
    rows and catches up on their new sequences at its next proposal, as after
    :meth:`DraftProvider.reset`, keeping every other row's state. A provider with no
    per-row state does nothing. The server joins rows one by one only where every arm's
    provider declares it.
    """

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Forget the sequences of rows ``rows`` (distinct indices into the batch)."""


@runtime_checkable
class CatchesUp(Protocol):
    """Optional extra of a :class:`DraftProvider`: take the sequences in before the first proposal.

    Called once per request, right after the target's prefill is queued and before the
    host waits for it, so host-side indexing of the prompts (a suffix tree's, an n-gram
    table's) runs while the device prefills instead of inside the first step; and during
    each step's device work where the provider did not propose in the step, with the
    sequences the step started from, so an arm played rarely does not index everything
    decoded since its last play inside its next step. The provider must then propose
    exactly what it would have proposed without the calls:
    :meth:`DraftProvider.propose` still catches up on whatever it has not seen.
    """

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Take in each row's sequence ``tokens[b, : lengths[b]]`` (``[B, L]`` int64, CPU)."""


@runtime_checkable
class NarrowsArms(Protocol):
    """Optional extra of an :class:`ArmSelector`: which arms it may play next, before it chooses.

    The policy asks ``likely_arms(rows)`` when a request begins, to catch up
    (:class:`CatchesUp`) only the providers of arms the selector may play over ``rows``
    live rows: a selector that has learnt that only plain decoding pays at 32 rows spares
    every batch of 32 the indexing of its prompts by arms it will not play (up to 80 ms
    per batch on the H100's host). An arm left out that is played after all (rows finish,
    the selector learns) catches up inside its first proposal, as without the call. It is
    a question, not a draw: answering it consumes no randomness and changes no state the
    choices depend on, so the law is unchanged.
    """

    def likely_arms(self, rows: int) -> Sequence[int]:
        """The selector's arms (indices) it may play over ``rows`` live rows, as it stands."""


@runtime_checkable
class SeesRefills(Protocol):
    """Optional extra of an :class:`ArmSelector`: told whether rows that finish are replaced.

    A fixed batch (``generate``) runs until its slowest row ends, so a selector may score a
    draft by its least-accepting live row; a serving engine seats new requests in finished
    rows' slots, where the mean row is the right score. The engine calls it once, before its
    first step; without the call a selector assumes a fixed batch.
    """

    def rows_refilled(self, refilled: bool) -> None:
        """Whether finished rows are replaced by new requests from now on."""


# Every optional capability (docs/plugins.md documents each; a test checks it).
CAPABILITIES: tuple[type, ...] = (
    RequestAware,
    ObservesSteps,
    SeesRowIds,
    SeesWidths,
    PricesDrafts,
    SeesCosts,
    DeclaresExactness,
    VerifiesWithNoise,
    HasTokenizer,
    Prewarmable,
    CapturesGraphs,
    NamesModel,
    ProposesTrees,
    ScoresTrees,
    VerifiesTrees,
    LimitsTreeNodes,
    LimitsChainTokens,
    VerifiesRows,
    HasContext,
    ForgetsRequests,
    PrefillsRows,
    ResetsRows,
    CatchesUp,
    NarrowsArms,
    SeesRefills,
)


def check_arm(arm: int, num_arms: int) -> None:
    if not 0 <= arm < num_arms:
        raise ValueError(f"arm {arm} out of range for {num_arms} arms")


def names(specs: Sequence[ComponentSpec[Any]]) -> list[str]:
    return [s.name for s in specs]
