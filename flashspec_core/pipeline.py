"""The decode loop: select an arm, draft, score, verify, roll back, repeat.

One host read per step: the verdict (``num_accepted`` and the emitted tokens) is
copied to the host once, because the loop must know what was emitted to stop rows
at EOS or ``max_new_tokens`` and to size the next step. Everything else in the step
(drafting, the target forward, verification) is queued on the device without a
sync; step timings use CUDA events on a GPU and are read after that one copy.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

from flashspec_core.contracts import (
    ArmSelector,
    Draft,
    DraftProvider,
    RequestAware,
    SamplingParams,
    StepRecord,
    Target,
    Verifier,
)
from flashspec_core.rewards import StepReward
from flashspec_core.stats import summarize

OnTokens = Callable[[int, list[int]], None]
BATCH_LIMIT = "batch_limit"  # the arm name of steps that the batch limit ran without drafting


@attrs.frozen
class Arm:
    name: str
    provider: DraftProvider
    gamma: int
    fallback: int | None = None  # index of the arm that proposes when this one's proposal is empty
    selectable: bool = True  # False: only another arm's fallback; the selector never picks it


@attrs.frozen
class GenerationResult:
    texts: list[str]
    token_ids: list[list[int]]
    steps: list[StepRecord]
    summary: dict[str, Any]


def _wait(device: torch.device) -> None:
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
    """Target + draft arms + verifier + selector, assembled by :func:`build_pipeline`."""

    def __init__(
        self,
        target: Target,
        arms: Sequence[Arm],
        verifier: Verifier,
        selector: ArmSelector,
        reward: StepReward,
        logger: Any = None,
        on_step: Callable[[StepRecord], None] | None = None,
        config: Any = None,
        speculate_max_batch: int | None = None,
        first: int | None = None,
        draw_ahead: bool = True,
    ) -> None:
        self.target, self.arms, self.verifier, self.selector = target, list(arms), verifier, selector
        self.reward, self.logger, self.on_step, self.config = reward, logger, on_step, config
        # Above this many live rows a step decodes without drafting and the selector is neither
        # asked nor updated (vLLM's disable_by_batch_size): at large batches the target forward
        # is no longer much cheaper per token than a draft's, so speculation costs throughput.
        self.speculate_max_batch = speculate_max_batch
        # The first arm (``[selector] first``) proposes before the selector is asked; the selector
        # chooses, and learns, only at the steps where it proposes nothing (a lookup without a
        # match): its rewards then compare its arms where the choice made a difference.
        self.first = first
        # The next step's choice is drawn while the device runs this step, off the host's critical
        # path (a Thompson draw cost ~0.1 ms of a 2 ms step on the H200's host at da0f97c). It
        # then misses this step's reward (feedback one step late), and is dropped unused where
        # the first arm proposes or a request ends; every played choice is still updated once.
        self.draw_ahead = draw_ahead
        self._ahead: int | None = None
        self._first_reward = copy.deepcopy(reward)
        self._step = 0
        self._plain = Arm(name=BATCH_LIMIT, provider=NoDraft(), gamma=0, selectable=False)

    def generate(
        self,
        prompts: Sequence[str] | Sequence[Sequence[int]],
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        on_tokens: OnTokens | None = None,
    ) -> GenerationResult:
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        ids = [self._encode(p) for p in prompts]
        generator = torch.Generator(device=self.target.device).manual_seed(seed)
        start = time.perf_counter()
        out, steps = self._decode(ids, max_new_tokens, sampling, generator, on_tokens)
        wall = time.perf_counter() - start
        texts = [self.target.decode(o) for o in out]
        summary = summarize(steps, [a.name for a in self.arms], [len(o) for o in out], wall)
        if self.logger is not None:
            self.logger.info("summary", **{k: v for k, v in summary.items() if not isinstance(v, dict | list)})
        return GenerationResult(texts=texts, token_ids=out, steps=steps, summary=summary)

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        ids = self.target.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: at least one token is needed")
        if min(ids) < 0 or max(ids) >= self.target.vocab:
            raise ValueError(f"prompt token ids must be in [0, {self.target.vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _decode(
        self,
        prompts: list[list[int]],
        max_new: int,
        sampling: SamplingParams,
        generator: torch.Generator,
        on_tokens: OnTokens | None,
    ) -> tuple[list[list[int]], list[StepRecord]]:
        batch = len(prompts)
        longest = max(len(p) for p in prompts) + max_new + max(a.gamma for a in self.arms) + 1
        tokens = torch.zeros((batch, longest), dtype=torch.long)
        for b, p in enumerate(prompts):
            tokens[b, : len(p)] = torch.tensor(p)
        lengths = [len(p) for p in prompts]
        out: list[list[int]] = [[] for _ in prompts]
        active = [True] * batch
        for arm in self.arms:
            arm.provider.reset()
        self._ahead = None  # a choice drawn at the end of the last request is not this one's
        if isinstance(self.selector, RequestAware):  # before the first select(), so it may keep per-request stats
            self.selector.begin_request(batch)
        self.target.prefill(tokens, lengths)
        # The prefill is queued on the device; without this wait the first step's wall time (and
        # its host share, the wall time its device marks do not cover) would hold the prefill's:
        # at batch 32 on the H200, 21.8 ms of a 2.2 ms step, once per batch.
        _wait(self.target.device)
        eos = self.target.eos_token_ids
        steps: list[StepRecord] = []
        while any(active):
            record, emitted = self._step_once(tokens, lengths, active, sampling, generator)
            for b, new in enumerate(emitted):
                if not active[b]:
                    continue
                new = new[: max_new - len(out[b])]
                stop = next((i for i, t in enumerate(new) if t in eos), None)
                if stop is not None:
                    new = new[: stop + 1]
                tokens[b, lengths[b] : lengths[b] + len(new)] = torch.tensor(new, dtype=torch.long)
                lengths[b] += len(new)
                out[b].extend(new)
                if on_tokens is not None and new:
                    on_tokens(b, new)
                if stop is not None or len(out[b]) >= max_new:
                    active[b] = False
            steps.append(record)
        return out, steps

    def _step_once(
        self,
        tokens: torch.Tensor,
        lengths: list[int],
        active: list[bool],
        sampling: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[StepRecord, list[list[int]]]:
        rows = [b for b in range(len(active)) if active[b]]
        limit = self.speculate_max_batch
        clock = _Clock(self.target.device)
        t0 = time.perf_counter()
        clock.mark()
        choice, draft = None, None
        ahead, self._ahead = self._ahead, None
        if limit is not None and len(rows) > limit:
            index, arm = -1, self._plain
        elif self.first is not None and not _empty(draft := self._first_proposal(tokens, lengths, sampling, generator)):
            index, arm = self.first, self.arms[self.first]
        else:
            choice = self.selector.select() if ahead is None else ahead
            index = self.choices[choice]
            arm = self.arms[index]
            if index != self.first:  # the first arm chosen again keeps its empty proposal: a plain step
                draft = None
        if draft is not None:
            drafter = arm
        else:
            draft, drafter = self._propose(arm, tokens, lengths, sampling, generator)
        clock.mark()
        logits = self.target.score(tokens, lengths, draft.tokens.to(self.target.device))
        clock.mark()
        verdict = self.verifier.verify(logits, draft.tokens.to(logits.device), draft.probs, sampling, generator)
        clock.mark()
        if self.draw_ahead and (limit is None or len(rows) <= limit):  # rows only finish, so the limit holds
            self._ahead = self.selector.select()
        host = torch.cat([verdict.num_accepted[:, None], verdict.tokens], dim=1).cpu()  # the one sync
        step_s = time.perf_counter() - t0
        accepted = host[:, 0].tolist()
        self.target.rollback(accepted)
        drafter.provider.rollback(accepted)
        if drafter.provider is not arm.provider:  # the arm proposed nothing: none of its tokens entered the sequences
            arm.provider.rollback([0] * len(accepted))
        emitted = [host[b, 1 : 2 + n].tolist() for b, n in enumerate(accepted)]
        acc = tuple(accepted[b] for b in rows)
        width = int(draft.tokens.shape[1])  # the arm's gamma, or fewer (a lookup without a match)
        # The first arm's steps are scored on a scale of their own: a matched lookup step emits up
        # to gamma + 1 tokens for one target forward, and on the selector's running scale it would
        # squeeze the rewards of the steps the selector does choose toward 0.
        scorer = self._first_reward if choice is None and index >= 0 else self.reward
        reward = scorer(width, acc, sum(n + 1 for n in acc), max(step_s, 1e-9))
        if choice is not None:
            self.selector.update(choice, reward)
        record = StepRecord(
            step=self._step,
            arm=index,
            arm_name=arm.name,
            gamma=width,
            batch_size=len(rows),
            accepted=acc,
            emitted=sum(n + 1 for n in acc),
            reward=reward,
            draft_ms=clock.ms(0, 1),
            target_ms=clock.ms(1, 2),
            verify_ms=clock.ms(2, 3),
            step_ms=step_s * 1e3,
        )
        self._step += 1
        self._observe(record)
        return record, emitted

    @property
    def choices(self) -> list[int]:
        """Indices of the arms the selector chooses between (its arm ``k`` is ``arms[choices[k]]``)."""
        return [i for i, a in enumerate(self.arms) if a.selectable]

    def _first_proposal(self, tokens: torch.Tensor, lengths: list[int], sampling: SamplingParams,
                        generator: torch.Generator) -> Draft:
        """The first arm's proposal; when it is empty, its provider is rolled back at once (it
        proposed nothing, so nothing of it entered the sequences) and the selector's arm drafts."""
        gate = self.arms[self.first]  # type: ignore[index]
        draft = _checked(gate.provider.propose(tokens, lengths, gate.gamma, sampling, generator), gate)
        if _empty(draft):
            gate.provider.rollback([0] * len(lengths))
        return draft

    def _propose(
        self, arm: Arm, tokens: torch.Tensor, lengths: list[int], sampling: SamplingParams, generator: torch.Generator
    ) -> tuple[Draft, Arm]:
        """The arm's proposal, or its fallback arm's when the arm's is empty (a lookup
        without a match): the switch depends on the sequences alone, never on this step's
        random draws, so it is part of a deterministic arm and keeps the output law."""
        draft, drafter = arm.provider.propose(tokens, lengths, arm.gamma, sampling, generator), arm
        if _empty(draft) and arm.fallback is not None:
            drafter = self.arms[arm.fallback]
            draft = drafter.provider.propose(tokens, lengths, drafter.gamma, sampling, generator)
        return _checked(draft, drafter), drafter

    def _observe(self, record: StepRecord) -> None:
        if self.logger is not None:
            fields = attrs.asdict(record)
            fields["accepted"] = list(record.accepted)
            self.logger.info("step", **fields)
        if self.on_step is not None:
            self.on_step(record)


def _checked(draft: Draft, arm: Arm) -> Draft:
    """The draft, if its tokens are ``[B, <= arm.gamma]``; a clear error naming the arm if not."""
    if draft.tokens.dim() != 2 or draft.tokens.shape[1] > arm.gamma:
        raise RuntimeError(f"arm {arm.name!r}: the draft proposed tokens of shape {tuple(draft.tokens.shape)}, "
                           f"not [B, <= gamma = {arm.gamma}]")
    return draft


def _empty(draft: Draft) -> bool:
    """A proposal of no tokens (a lookup without a match, the ``none`` arm)."""
    return draft.tokens.dim() == 2 and draft.tokens.shape[1] == 0


class NoDraft:
    """No proposal: plain target decoding (the gamma = 0 arm, and the batch limit's steps)."""

    def reset(self) -> None:
        """Stateless."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        return Draft(tokens=torch.zeros((len(lengths), 0), dtype=torch.long), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""
