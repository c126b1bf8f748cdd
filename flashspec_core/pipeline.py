"""The decode loop: plan, propose, score, verify, commit, repeat.

Each step asks the step policy (:mod:`flashspec_core.policy`) which arm drafts, has the
target score the draft and the verifier decide, and hands the accepted counts back to
the policy, which rolls the draft providers back and updates the selector. A draft tree
(``Draft.parents``) is scored with ``score_tree``, verified with ``verify_tree`` and its
accepted path committed with ``commit_path`` (:class:`~flashspec_core.contracts.ScoresTrees`,
:class:`~flashspec_core.contracts.VerifiesTrees`); the pipeline refuses a tree arm on a
target or verifier without them, or whose ``gamma`` is above either's node limit
(:class:`~flashspec_core.contracts.LimitsTreeNodes`), and a chain arm whose ``gamma`` is above
the verifier's (:class:`~flashspec_core.contracts.LimitsChainTokens`), when it is built.

One host read per step: the verdict (``num_accepted`` and the emitted tokens) is
copied to the host once, because the loop must know what was emitted to stop rows
at EOS or ``max_new_tokens`` and to size the next step. Everything else in the step
(drafting, the target forward, verification) is queued on the device without a
sync; step timings use CUDA events on a GPU and are read after that one copy.

No component is trusted blindly: each step checks the draft (token ids in ``[0, V)``,
``q`` a distribution), the target's logits (finite) and the verdict (``num_accepted``
in ``[0, width]``, emitted tokens in range) on the device (:mod:`flashspec_core.checks`),
as one flag per row that rides in the same copy; a nonzero flag raises
:class:`~flashspec_core.contracts.ContractViolation` naming the component.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import attrs
import torch

from flashspec_core.checks import Names, blame, check_shapes, checked_by_caller, step_flags
from flashspec_core.config import check_generation, check_prompt_text
from flashspec_core.contracts import (
    ArmSelector,
    Broken,
    CapturesGraphs,
    ContractViolation,
    Draft,
    GraphCounter,
    HasContext,
    LimitsChainTokens,
    LimitsTreeNodes,
    RowSampling,
    SamplingParams,
    ScoresTrees,
    StepRecord,
    Target,
    Verdict,
    Verifier,
    VerifierInputError,
    VerifiesRows,
    VerifiesTrees,
)
from flashspec_core.cudagraph import to_device
from flashspec_core.policy import BATCH_LIMIT, Arm, NoDraft, PolicySettings, StepPolicy, proposes_trees
from flashspec_core.sampling import UNIT, warp_logits
from flashspec_core.stats import summarize

__all__ = ["BATCH_LIMIT", "Arm", "GenerationResult", "NoDraft", "OnTokens", "Pipeline"]

OnTokens = Callable[[int, list[int]], None]


@attrs.frozen
class GenerationResult:
    texts: list[str]
    token_ids: list[list[int]]
    steps: list[StepRecord]
    summary: dict[str, Any]


def _prompt_list(prompts: object) -> list[Any]:
    """``generate``'s prompts as a list: a bare string is one prompt (not one per character);
    a flat list of token ids and an empty list are refused by name."""
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of prompts (strings or lists of token ids), got {prompts!r}")
    if any(isinstance(p, int) for p in prompts):
        raise ValueError("prompts is a list of token ids, not of prompts: pass [ids] for one prompt of ids")
    return list(prompts)


def _token_ids(prompt: object) -> list[int]:
    """A prompt given as token ids, each an integer: int() would read 1.5 as 1 and True as 1,
    and bytes (a sequence of ints) as one token per byte."""
    if isinstance(prompt, bytes | bytearray):
        raise ValueError("a prompt is bytes: decode it to a string (its bytes would be read as token ids)")
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if not isinstance(prompt, Iterable):
        raise ValueError(f"a prompt must be a string or a list of token ids, got {prompt!r}")
    ids = list(prompt)
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"prompt token ids must be integers, got {t!r} at position {i}")
    return [int(t) for t in ids]


def wait_device(device: torch.device) -> None:
    """Let the work queued on ``device`` finish (CUDA; elsewhere work is synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def ms(self, i: int, j: int) -> float:
        a, b = self.marks[i], self.marks[j]
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3


class Pipeline:
    """Target + verifier + step policy, assembled by :func:`flashspec_core.build.build_pipeline`.

    The policy (:class:`~flashspec_core.policy.StepPolicy`) owns the arms, the selector,
    the rewards and the ``[selector]`` settings; ``logger`` and ``on_step`` observe each
    step's record.
    """

    def __init__(
        self,
        target: Target,
        verifier: Verifier,
        policy: StepPolicy,
        config: Any = None,  # the PipelineConfig it was built from (None: assembled by hand)
        logger: Any = None,
        on_step: Callable[[StepRecord], None] | None = None,
        origins: dict[str, str] | None = None,  # "target", "verifier": the components as errors name them
    ) -> None:
        self.target, self.verifier, self.policy, self.config = target, verifier, policy, config
        self.logger, self.on_step = logger, on_step
        origins = origins or {}
        self._target_name = origins.get("target") or f"target {type(target).__name__}"
        self._verifier_name = origins.get("verifier") or f"verifier {type(verifier).__name__}"
        self._step = 0
        self._counters: tuple[tuple[int, ...], list[GraphCounter]] = ((), [])
        self._check_trees()

    # The policy's parts, for callers that inspect them, or swap arms and selector between requests.

    @property
    def arms(self) -> list[Arm]:
        return self.policy.arms

    @arms.setter
    def arms(self, arms: Sequence[Arm]) -> None:
        self.policy.arms = list(arms)
        self._check_trees()

    @property
    def selector(self) -> ArmSelector:
        return self.policy.selector

    @selector.setter
    def selector(self, selector: ArmSelector) -> None:
        self.policy.selector = selector

    @property
    def settings(self) -> PolicySettings:
        return self.policy.settings

    @property
    def first(self) -> int | None:
        return self.policy.settings.first

    @property
    def draw_ahead(self) -> bool:
        return self.policy.settings.draw_ahead

    @property
    def choices(self) -> list[int]:
        """Indices of the arms the selector chooses between (its arm ``k`` is ``arms[choices[k]]``)."""
        return self.policy.choices

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        on_tokens: OnTokens | None = None,
        rows: RowSampling | None = None,
    ) -> GenerationResult:
        """Decode ``prompts`` together (strings or lists of token ids; a bare string is one
        prompt). ``rows`` (one setting per prompt, and seeds) replaces
        ``temperature``, ``top_k`` and ``top_p`` where given; ``seed`` seeds the unseeded rows' draws."""
        prompts = _prompt_list(prompts)
        ok = check_generation(  # the bounds the CLI and a config's [generation] table check too
            {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
        )
        sampling: SamplingParams | RowSampling = SamplingParams(
            temperature=ok["temperature"], top_k=ok["top_k"], top_p=ok["top_p"])
        if rows is not None:
            if len(rows.params) != len(prompts):
                raise ValueError(f"rows has {len(rows.params)} settings for {len(prompts)} prompts")
            sampling = rows
        ids = [self._encode(p) for p in prompts]
        generator = torch.Generator(device=self.target.device).manual_seed(ok["seed"])
        start = time.perf_counter()
        out, steps = self._decode(ids, max_new_tokens, sampling, generator, on_tokens)
        wall = time.perf_counter() - start
        texts = [self.target.decode(o) for o in out]
        summary = summarize(steps, [a.name for a in self.policy.arms], [len(o) for o in out], wall)
        if self.logger is not None:
            self.logger.info("summary", **{k: v for k, v in summary.items() if not isinstance(v, dict | list)})
        return GenerationResult(texts=texts, token_ids=out, steps=steps, summary=summary)

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            check_prompt_text(prompt, "prompt")
        ids = self.target.encode(prompt) if isinstance(prompt, str) else _token_ids(prompt)
        if not ids:
            raise ValueError("empty prompt: at least one token is needed")
        if min(ids) < 0 or max(ids) >= self.target.vocab:
            raise ValueError(f"prompt token ids must be in [0, {self.target.vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _decode(
        self,
        prompts: list[list[int]],
        max_new: int,
        sampling: SamplingParams | RowSampling,
        generator: torch.Generator,
        on_tokens: OnTokens | None,
    ) -> tuple[list[list[int]], list[StepRecord]]:
        batch = len(prompts)
        self.check_context(max(len(p) for p in prompts), max_new)
        longest = max(len(p) for p in prompts) + max_new + max(a.gamma for a in self.policy.arms) + 1
        tokens = torch.zeros((batch, longest), dtype=torch.long)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.tensor(p)
        lengths = [len(p) for p in prompts]
        out: list[list[int]] = [[] for _ in prompts]
        active = [True] * batch
        self.policy.begin(batch)
        self.target.prefill(tokens, lengths)
        self.policy.catch_up(tokens, lengths)  # host-side indexing while the device prefills
        # The prefill is queued on the device; without this wait the first step's wall time (and
        # its host share, the wall time its device marks do not cover) would hold the prefill's:
        # at batch 32 on the H200, 21.8 ms of a 2.2 ms step, once per batch.
        wait_device(self.target.device)
        eos = self.target.eos_token_ids
        steps: list[StepRecord] = []
        while any(active):
            record, emitted = self.step(tokens, lengths, active, sampling, generator)
            where: tuple[list[int], list[int], list[int]] = ([], [], [])  # rows, columns, ids: one write per step
            for b, new in enumerate(emitted):
                if not active[b]:
                    continue
                new = new[: max_new - len(out[b])]
                stop = next((i for i, t in enumerate(new) if t in eos), None)
                if stop is not None:
                    new = new[: stop + 1]
                where[0].extend([b] * len(new))
                where[1].extend(range(lengths[b], lengths[b] + len(new)))
                where[2].extend(new)
                lengths[b] += len(new)
                out[b].extend(new)
                if on_tokens is not None and new:
                    on_tokens(b, new)
                if stop is not None or len(out[b]) >= max_new:
                    active[b] = False
            if where[0]:
                tokens[where[0], where[1]] = torch.tensor(where[2], dtype=torch.long)
            steps.append(record)
        self.policy.settle()  # the selector has seen every step once generate returns
        return out, steps

    @property
    def max_context(self) -> int | None:
        """The longest sequence every part holds: the least :class:`HasContext` ``max_context`` of
        the target and the arms' providers (a draft over its own static cache holds fewer tokens
        than its target where its ``max_len`` is smaller); None where none declares one."""
        limits = [limit for _, limit in self._contexts()]
        return min(limits) if limits else None

    def _contexts(self) -> list[tuple[str, int]]:
        """Each part with a :class:`HasContext`, as errors name it, and its ``max_context``."""
        parts: list[tuple[str, object]] = [("the target's context", self.target)]
        parts += [(f"the context of arm {a.name!r}'s draft", a.provider) for a in self.policy.arms]
        return [(who, int(part.max_context)) for who, part in parts if isinstance(part, HasContext)]

    def check_context(self, prompt_len: int, max_new: int) -> None:
        """A clear error where a prompt of ``prompt_len`` tokens and ``max_new`` new ones (plus the
        widest arm's draft slots) would outrun the target's or a draft's :class:`HasContext`
        ``max_context``, before anything is prefilled."""
        gamma = max(a.gamma for a in self.policy.arms)
        for who, limit in self._contexts():
            if prompt_len + max_new + gamma > limit:
                raise ValueError(f"a prompt of {prompt_len} tokens plus max_new_tokens = {max_new} plus {gamma} "
                                 f"draft slots exceeds {who} of {limit} tokens")

    def step(
        self,
        tokens: torch.Tensor,
        lengths: list[int],
        active: list[bool],
        sampling: SamplingParams | RowSampling,
        generator: torch.Generator,
        on_queued: Callable[[], None] | None = None,
    ) -> tuple[StepRecord, list[list[int]]]:
        """One decode step (plan, propose, score, verify, commit) over the ``active`` rows.

        The caller owns the batch: the target was prefilled with it (``target.prefill``) and the
        policy began it (``policy.begin``); after the step the caller appends each row's emitted
        tokens to ``tokens`` and ``lengths`` (cut at EOS or its budget, as :meth:`generate` does)
        and marks finished rows inactive. The step is logged and observed like :meth:`generate`'s.

        :param tokens: ``[B, L]`` int64 CPU, row ``b``'s sequence in ``tokens[b, : lengths[b]]``,
            with room for ``max gamma + 1`` more tokens.
        :param sampling: one setting for every row, or a :class:`RowSampling` (one per row, seeds);
            a mixed one needs a verifier with :class:`VerifiesRows`.
        :param on_queued: called once the step's device work is queued, before the step waits
            for it: host work of the caller's (a server hands the last step's text to its clients)
            that then runs while the device computes. Its time counts in the step's record; the
            selector learns the step's time without the part of it, and of its own update, that
            the step waited for (:func:`arm_seconds`).
        :returns: the step's record, and per row of the batch its emitted tokens (the accepted
            drafts and one more; rows that are not active emit too and are to be ignored).
        """
        rows = [b for b in range(len(active)) if active[b]]
        clock = _Clock(self.target.device)
        t0 = time.perf_counter()
        captures = self._captures()
        clock.mark()
        sampling = _per_step(sampling, lengths)
        drafting = sampling.draft_params if isinstance(sampling, RowSampling) else sampling
        plan = self.policy.plan(rows, tokens, lengths, drafting, generator)
        draft, drafter = self.policy.propose(plan, tokens, lengths, drafting, generator)
        draft = self._on_device(draft)
        clock.mark()
        names = self._names(drafter)
        logits = self._score(tokens, lengths, draft)
        clock.mark()
        verdict, path = self._verify(logits, draft, sampling, generator, names)
        clock.mark()
        captured = self._captures() != captures  # captures run on the host, so they are all counted by now
        side = time.perf_counter()
        self.policy.settle()  # the last step's selector update (learn(defer=True)), while the device runs this step
        self.policy.draw_next()  # likewise
        if on_queued is not None:
            on_queued()
        self.policy.catch_up_idle(plan, drafter, tokens, lengths)  # host-side indexing, likewise
        side = time.perf_counter() - side
        check_shapes(draft, logits, verdict, names)
        flags = step_flags(draft, logits, verdict, path if draft.parents is not None else None)
        host = torch.cat([verdict.num_accepted[:, None], verdict.tokens, path, flags[:, None]], dim=1)
        host = host.cpu()  # the one sync
        step_s = time.perf_counter() - t0
        blame(host[:, -1].tolist(), rows, names)
        accepted = host[:, 0].tolist()
        paths = host[:, 1 + verdict.tokens.shape[1] : -1] if draft.parents is not None else None
        self._commit(accepted, paths)
        width = int(draft.tokens.shape[1])  # the arm's gamma, or fewer (a lookup without a match)
        # The selector's update waits for the next step's settle (above, one step later), which runs
        # while the device computes that step: at 32 rows its observe costs a few hundred
        # microseconds of host time that would otherwise separate two steps.
        draft_ms, target_ms, verify_ms = clock.ms(0, 1), clock.ms(1, 2), clock.ms(2, 3)
        learned_s = arm_seconds(step_s, (draft_ms + target_ms + verify_ms) / 1e3, side)
        reward = self.policy.commit(plan, accepted, learned_s, drafter, width, paths, captured=captured, defer=True)
        acc = tuple(accepted[b] for b in rows)
        record = StepRecord(
            step=self._step,
            arm=plan.arm,
            arm_name=self.policy.played(plan).name,
            gamma=width,
            batch_size=len(rows),
            accepted=acc,
            emitted=sum(n + 1 for n in acc),
            reward=reward,
            draft_ms=draft_ms,
            target_ms=target_ms,
            verify_ms=verify_ms,
            step_ms=step_s * 1e3,
            captured=captured,
        )
        self._step += 1
        self._observe(record, self.policy.settings.batch_buckets[plan.bucket])
        ids = host[:, 1 : 2 + max(accepted, default=0)].tolist()  # one read of the emitted ids, sliced per row
        return record, [row[: n + 1] for row, n in zip(ids, accepted, strict=True)]

    def _captures(self) -> int:
        """CUDA graphs the target, the verifier and the arms' providers have captured so far
        (:class:`CapturesGraphs`; a cache shared by several counts once)."""
        parts = (self.target, self.verifier, *(a.provider for a in self.policy.arms))
        key = tuple(map(id, parts))
        if key != self._counters[0]:  # arms may be swapped between requests: find the caches again
            caches = {id(x.graphs): x.graphs for x in parts if isinstance(x, CapturesGraphs)}
            self._counters = (key, list(caches.values()))
        return sum(g.captures for g in self._counters[1])

    def _on_device(self, draft: Draft) -> Draft:
        """The draft with its tokens on the target's device, copied once and without a host sync.

        A host-side drafter (prompt lookup, suffix) proposes CPU tokens; copied to the GPU with a
        plain ``.to()`` where the step needs them on the device (scoring, verifying, the step's
        checks), each copy waited for the kernels queued before it: the host stalled behind the
        target's forward and then launched the verify kernels onto an idle device."""
        device = torch.device(self.target.device)
        if device.type == "cpu" or draft.tokens.device.type != "cpu" or draft.tokens.numel() == 0:
            return draft
        return attrs.evolve(draft, tokens=to_device(draft.tokens, device))

    def _score(self, tokens: torch.Tensor, lengths: list[int], draft: Draft) -> torch.Tensor:
        """The target's logits of the draft: [B, g + 1, V] (a tree: one row per node, after the root's)."""
        # Clamped so a draft id outside the vocabulary cannot index the target's embedding
        # (an IndexError on the CPU, a device assert on CUDA) before the step's check names the draft.
        ids = draft.tokens.to(self.target.device).clamp(0, self.target.vocab - 1)
        if draft.parents is None:
            return self.target.score(tokens, lengths, ids)
        return cast(ScoresTrees, self.target).score_tree(tokens, lengths, ids, draft.parents)

    def _verify(self, logits: torch.Tensor, draft: Draft, sampling: SamplingParams | RowSampling,
                generator: torch.Generator, names: Names) -> tuple[Verdict, torch.Tensor]:
        """The verdict and the accepted path ([B, D] node ids, -1 padded; [B, 0] for a chain).

        A verifier that refuses its inputs (a :class:`VerifierInputError`, where it can tell
        without a sync) is answered with the ContractViolation of the component that made them.
        """
        ids = draft.tokens.to(logits.device)
        if isinstance(sampling, RowSampling) and draft.parents is not None:
            # Trees verify warped logits under UNIT: each row keeps its law; seeded rows are
            # sampled, not coupled, so their tokens may depend on the batch there.
            logits, sampling = warp_logits(logits, sampling.params), UNIT
        try:
            with checked_by_caller():  # step_flags reads the logits and q once, for every verifier
                if isinstance(sampling, RowSampling):
                    verdict = self._verify_rows(logits, ids, draft.probs, sampling, generator)
                    return verdict, verdict.num_accepted.new_zeros((ids.shape[0], 0))
                if draft.parents is None:
                    verdict = self.verifier.verify(logits, ids, draft.probs, sampling, generator)
                    return verdict, verdict.num_accepted.new_zeros((ids.shape[0], 0))
                tree = cast(VerifiesTrees, self.verifier).verify_tree(logits, ids, draft.parents, draft.probs,
                                                                      sampling, generator)
        except VerifierInputError as exc:
            culprit = names.target if exc.flag & Broken.TARGET_LOGITS else names.drafter
            raise ContractViolation(culprit, f"{names.verifier} refused its {exc}") from exc  # exc: the argument, why
        return tree.as_verdict(), tree.path

    def _verify_rows(self, logits: torch.Tensor, ids: torch.Tensor, probs: torch.Tensor | None, rows: RowSampling,
                     generator: torch.Generator) -> Verdict:
        if not isinstance(self.verifier, VerifiesRows):
            raise ValueError(f"{self._verifier_name} cannot verify rows with different sampling settings or seeds "
                             "(it lacks VerifiesRows): use verifier 'reference' or 'triton'")
        return self.verifier.verify_rows(logits, ids, probs, rows, generator)

    def _names(self, drafter: Arm) -> Names:
        """The step's components as a ContractViolation names them."""
        return Names(drafter=drafter.describe(), target=self._target_name, verifier=self._verifier_name)

    def _commit(self, accepted: list[int], paths: torch.Tensor | None) -> None:
        """The target keeps the accepted tokens: a prefix of a chain, or a tree's accepted path."""
        if paths is None:
            self.target.rollback(accepted)
        else:
            cast(ScoresTrees, self.target).commit_path(paths)

    def _check_trees(self) -> None:
        """A tree arm needs a target that scores trees and a verifier that verifies them, each
        taking trees of its ``gamma`` nodes (:class:`~flashspec_core.contracts.LimitsTreeNodes`);
        a chain arm, a verifier taking chains of its ``gamma`` tokens
        (:class:`~flashspec_core.contracts.LimitsChainTokens`)."""
        drafts = {a.name: a.draft.use for a in getattr(self.config, "arms", ())}
        target_use = getattr(getattr(self.config, "target", None), "use", type(self.target).__name__)
        verifier_use = getattr(getattr(self.config, "verifier", None), "use", type(self.verifier).__name__)
        for arm in self.policy.arms:
            label = f"arm {arm.name!r} ({drafts.get(arm.name, type(arm.provider).__name__)})"
            if not proposes_trees(arm.provider):
                limit = self.verifier.max_chain_tokens if isinstance(self.verifier, LimitsChainTokens) else None
                if limit is not None and arm.gamma > limit:
                    raise ValueError(f"{label} proposes up to gamma = {arm.gamma} draft tokens, but verifier "
                                     f"{verifier_use!r} takes chains of at most {limit}: set the arm's gamma to at "
                                     f"most {limit}, or use verifier 'reference'")
                continue
            who = f"{label} proposes draft trees"
            if not isinstance(self.target, ScoresTrees):
                raise ValueError(f"{who}, but target {target_use!r} ({type(self.target).__name__}) cannot score "
                                 "them (it lacks ScoresTrees): use the fast or hf target, or a chain arm")
            if not isinstance(self.verifier, VerifiesTrees):
                raise ValueError(f"{who}, but verifier {verifier_use!r} ({type(self.verifier).__name__}) cannot "
                                 "verify them (it lacks VerifiesTrees): use verifier 'reference', or a chain arm")
            for part, use, component in (("target", target_use, self.target), ("verifier", verifier_use, self.verifier)):
                if isinstance(component, LimitsTreeNodes) and arm.gamma > component.max_tree_nodes:
                    raise ValueError(f"{who} of up to gamma = {arm.gamma} nodes, but {part} {use!r} takes trees of "
                                     f"at most {component.max_tree_nodes} nodes: set the arm's gamma to at most "
                                     f"{component.max_tree_nodes}")

    def _observe(self, record: StepRecord, bucket: int = 1) -> None:
        """Log the step (with its batch bucket's smallest row count) and hand it to ``on_step``."""
        if self.logger is not None:
            fields = attrs.asdict(record)
            fields["accepted"] = list(record.accepted)
            fields["batch_bucket"] = bucket
            self.logger.info("step", **fields)
        if self.on_step is not None:
            self.on_step(record)


def arm_seconds(step_s: float, span_s: float, side_s: float) -> float:
    """What a step cost its arm: its wall time ``step_s`` less the part of ``side_s`` it waited for.

    ``side_s`` is host work that is neither the arm's nor the step's (the selector's deferred
    update, which refits now and then, and the caller's ``on_queued``). It runs once the step's
    device work is queued, so it costs the step only where it outlasts that work: at most the
    step's time outside its device span ``span_s`` (propose to verified, on the device's clock;
    the host's off the GPU). In the H200 serving run, plain decoding, played on the first steps
    of each class of live rows (``plain_per_class``) while clients were starting and the
    selector refit after every step, averaged 3.18 ms a step at 32 clients against 2.22 ms in
    the server without speculation, and the selector then kept to a draft that emitted less
    per millisecond than plain decoding did there."""
    return step_s - min(side_s, max(step_s - span_s, 0.0))


def _per_step(sampling: SamplingParams | RowSampling, lengths: list[int]) -> SamplingParams | RowSampling:
    """A uniform unseeded :class:`RowSampling` as its one setting (today's path, at no extra
    cost); a seeded one with this step's ``starts`` (each row's length) to key its noise."""
    if not isinstance(sampling, RowSampling):
        return sampling
    plain = sampling.uniform
    if plain is not None:
        return plain
    return attrs.evolve(sampling, starts=[int(n) for n in lengths]) if sampling.seeded else sampling
