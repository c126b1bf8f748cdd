"""The self-speculative draft ``self``: the fast target's first ``layers`` layers draft.

Layer skipping in its simplest training-free form (Draft & Verify, Zhang et al. 2024;
SWIFT, Xia et al. 2024): the target's first ``k`` decoder layers, then its final norm and
LM head, draft ``gamma`` tokens with the target's own weights and its own KV cache. There
is no second model, no second copy of a weight and no cache of the draft's own; arms with
different ``layers`` let the selector choose among depths.

Sharing the cache is safe because of where each side writes. A proposal feeds the row's
last token and its first ``gamma - 1`` drafted tokens, so it writes layers ``< k`` at slots
``lengths[b] - 1 .. lengths[b] + gamma - 2`` only, at or above the target's ``cached[b]``
(``= lengths[b] - 1`` in a pipeline), and reads the slots below, which hold the target's
own keys and values. The target's verify forward then writes every layer at slots
``lengths[b] - 1 .. lengths[b] - 1 + gamma`` before its attention reads any of them (see
:mod:`flashspec_fast.model`), so it never reads a slot the draft wrote, and its logits are
bit for bit those it computes after any other draft of the same tokens. Rollback is the
target's: its ``cached`` advances over the accepted tokens, which the verify forward wrote.

The drafting loop is one CUDA graph per (batch, gamma, sampling, span), in a graph cache of
its own: in the target's, the verify graph's replay could overwrite the draft's output
before the verifier reads it (see :class:`~flashspec_fast.graphs.GraphCache`). Those graphs
read the target's cache tensors, so they are dropped when the target allocates new ones.

Rows the target has not cached (a provider driven without its target, as the contract
suite does, or one reset since the target's last prefill) catch up first through the
draft's layers, eagerly: that never happens inside a pipeline, whose target prefills
every request after the providers' reset and scores every step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.contracts import DraftContext
from flashspec_core.sampling import filter_logits, probs_from_logits, race
from flashspec_fast.graphs import GraphCache, reach
from flashspec_fast.keys import SelfOptions as SelfOptions  # defined without torch, for the config check
from flashspec_fast.target import FastTarget, HostInputs, catch_up_width, check_room, ragged_inputs

_TINY = torch.finfo(torch.float32).tiny


def check_depth(use: str, layers: int, have: int) -> None:
    """``layers`` of draft ``use`` must be within the target's ``have`` decoder layers."""
    if not 1 <= layers <= have:
        raise ValueError(f"draft {use!r}: layers = {layers}, but the target has {have} decoder layers "
                         f"(layers must be in 1..{have})")


class FastSelfDraft:
    """Drafts with the first ``depth`` layers of a :class:`~flashspec_fast.target.FastTarget`."""

    def __init__(self, target: FastTarget, depth: int) -> None:
        self.target, self.depth = target, depth
        # PricesDrafts: a drafted token runs depth of the target's layers (and its LM head)
        self.draft_cost = depth / target.model.args.layers
        self.model = target.model
        self.vocab = target.vocab
        self.graphs = GraphCache(self.model.device, target.graphs.enabled)
        self._over = target.allocations  # the target's cache the graphs were captured over
        self._stage = HostInputs(self.model.device)  # own pinned buffers: the target stages its inputs in the same step
        self._since = target.prefills  # the target's cache serves this draft's rows after its next prefill

    def reset(self) -> None:
        self._since = self.target.prefills

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Nothing to forget (:class:`~flashspec_core.contracts.ResetsRows`): a row's slots are the
        target's, which :meth:`~flashspec_fast.target.FastTarget.prefill_rows` rewrites."""

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64 (CPU)
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        batch = len(lengths)
        if gamma == 0:
            return Draft(tokens=torch.zeros((batch, 0), dtype=torch.long), probs=None)
        self._fit(batch)
        check_room(self.model, max(lengths) + gamma, "self draft")
        self._catch_up(tokens, lengths)
        last = torch.tensor(lengths, dtype=torch.long) - 1
        host = torch.stack([tokens.gather(1, last[:, None]).squeeze(1), last])  # [2, B]: last token, its position
        out_tokens, out_probs = self._draft(self._stage(host), gamma, sampling, self.model.span_for(max(lengths) + gamma),
                                            generator)
        return Draft(tokens=out_tokens, probs=None if sampling.greedy else out_probs)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to do: the target's rollback advances ``cached`` over what its verify forward wrote."""

    def _fit(self, batch: int) -> None:
        """The target's cache holds ``batch`` rows; graphs captured over an older one are dropped."""
        self.target.fit(batch)
        if self.target.allocations != self._over:
            self.graphs.clear()
            self._over = self.target.allocations

    def _cached(self, batch: int) -> list[int]:
        """Slots of each row the target holds, or none where it has not prefilled these rows."""
        cached = self.target.cached
        return list(cached) if self.target.prefills > self._since and len(cached) == batch else [0] * batch

    def _catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Feed the tokens before each row's last that the target has not cached, through the draft's layers."""
        stops = [n - 1 for n in lengths]
        starts = [min(c, e) for c, e in zip(self._cached(len(lengths)), stops, strict=True)]
        need = max(e - s for s, e in zip(starts, stops, strict=True))
        if need == 0:
            return
        scratch = self.model.scratch
        dev = self._stage(ragged_inputs(tokens, starts, stops, catch_up_width(need, scratch), scratch))
        self.model.forward(dev[0], dev[1], dev[2], last_only=True, span=self.model.span_for(max(stops)), depth=self.depth)

    def _draft(
        self, host: torch.Tensor, gamma: int, sampling: SamplingParams, span: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``gamma``-token loop through the graph of its key. host: [2, B] on the device."""
        noise = torch.empty(0, device=self.model.device)
        if not sampling.greedy:
            batch = host.shape[1]
            noise = torch.empty((gamma, batch, self.vocab), device=self.model.device).exponential_(generator=generator)
            noise.clamp_min_(_TINY)
        key = ("self", self.depth, host.shape[1], gamma, sampling, span)
        loop = lambda h, e: self._loop(h, e, gamma, sampling, span)  # noqa: E731
        return self.graphs(key, loop, host, noise)  # type: ignore[no-any-return]

    def _loop(
        self, host: torch.Tensor, noise: torch.Tensor, gamma: int, sampling: SamplingParams, span: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """host: [2, B] (last token, its position); noise: [gamma, B, V] Exp(1) -> tokens [B, gamma],
        probs [B, gamma, V] (the tokens again when greedy: a graph returns tensors only)."""
        ids, pos = host[0][:, None], host[1][:, None]  # [B, 1]
        drafted, probs = [], []
        for i in range(gamma):
            logits = self.model.forward(ids, pos, pos, span=span, depth=self.depth)[:, -1]
            if sampling.greedy:
                x = torch.argmax(filter_logits(logits, sampling), dim=-1)
            else:
                q = probs_from_logits(logits, sampling)
                x = race(q, noise[i])
                probs.append(q)
            drafted.append(x)
            ids, pos = x[:, None], pos + 1
        tokens = torch.stack(drafted, dim=1)
        return tokens, torch.stack(probs, dim=1) if probs else tokens

    def prewarm(self, batch: int, gamma: int, sampling: SamplingParams, off_gpu: bool = False,
                longest: int | None = None) -> int:
        """Capture the drafting loop at every span a step at this ``batch``, ``gamma`` and
        ``sampling`` of sequences of up to ``longest`` tokens (None: up to the cache's end)
        can ask for, so none is captured while serving. It writes dummy keys and
        values into the target's cache: call it between requests, never inside one (the next
        prefill rewrites every slot the target reads). Returns the number of keys it asked for;
        0 at once without CUDA graphs unless ``off_gpu`` (the tests' check of the keys)."""
        if batch < 1 or gamma < 1:
            raise ValueError(f"prewarm: batch {batch} and gamma {gamma} must be >= 1")
        if not (self.graphs.enabled or off_gpu):
            return 0
        model, top = self.model, self.model.scratch
        self._fit(batch)
        before = len(self.graphs.keys)
        gen = torch.Generator(device=model.device).manual_seed(0)  # the noise is drawn on the device
        for span in sorted({model.span_for(n) for n in range(1, reach(top, longest) + 1)}):
            end = min(span, top - 1)  # the furthest a step reaches under `span`
            length = end - gamma  # the rows' length that makes this step's span `span`
            if length < 1 or model.span_for(end) != span:
                continue
            host = torch.stack([torch.zeros(batch, dtype=torch.long), torch.full((batch,), length - 1)])
            self._draft(self._stage(host), gamma, sampling, span, gen)
        return len(self.graphs.keys) - before


def make_self_draft(opts: SelfOptions, context: DraftContext) -> FastSelfDraft:
    target = context.target
    if not isinstance(target, FastTarget):
        raise ValueError(f"draft 'self' drafts with the fast target's own layers and cache, but the target is "
                         f"{type(target).__name__} (with the hf target, use = \"hf-self\")")
    check_depth("self", opts.layers, target.model.args.layers)
    return FastSelfDraft(target, opts.layers)
