"""The fast draft: a whole ``gamma``-token proposal is one graph replay.

Inside the graph: a first forward over each row's tokens from the first one the
cache lacks to the last (at least the last two: the second to last is usually in the
cache already, and rewriting it with the same token keeps the shape fixed whether the
previous step accepted everything or not), then ``gamma - 1`` one-token forwards, each
followed by greedy argmax or an exponential race on noise drawn outside the graph (so
the graph is a deterministic function of its inputs). The first forward's width is a
power of two (rows right-aligned, padding written to the scratch slot), graph-captured
per width: a row that fell behind because another arm ran meanwhile catches up in the
same forward that drafts its first token, instead of in a forward of its own. Only a
row more than :data:`FUSED_CATCH_UP` tokens behind catches up with a separate ragged
forward first.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.contracts import DraftContext
from flashspec_core.ragged import fit_vocab
from flashspec_core.sampling import filter_logits, probs_from_logits, race
from flashspec_fast.graphs import GraphCache
from flashspec_fast.model import Transformer
from flashspec_fast.options import FastOptions, build_model
from flashspec_fast.target import HostInputs, bucket, catch_up_width, check_room, ragged_forward, ragged_inputs

_TINY = torch.finfo(torch.float32).tiny
FUSED_CATCH_UP = 16  # widest first forward of the draft loop (tokens per row)


class FastDraft:
    """Draft LM over its own static KV cache; rollback is host bookkeeping only."""

    def __init__(self, model: Transformer, vocab: int, opts: FastOptions) -> None:
        self.model = model
        self.vocab = vocab
        self.graphs = GraphCache(model.device, opts.compile)
        self._stage = HostInputs(model.device)
        self.seen: list[int] = []  # per row: slots 0..seen-1 hold the row's sequence
        self._lengths: list[int] = []
        self._fed = 0  # draft tokens the last proposal's loop fed through the model

    def reset(self) -> None:
        self.seen = []

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64 (CPU)
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        batch = len(lengths)
        if len(self.seen) != batch:
            self._fit(batch)
            self.seen = [0] * batch
        if gamma == 0:  # an empty proposal feeds nothing: the rollback after it keeps the cache as it is
            self._lengths, self._fed = list(self.seen), 0
            return Draft(tokens=torch.zeros((batch, 0), dtype=torch.long), probs=None)
        check_room(self.model, max(lengths) + gamma, "draft")
        behind = [max(n - 2, 0) for n in lengths]
        starts = [min(s, e) for s, e in zip(self.seen, behind, strict=True)]  # first token the cache lacks
        width = bucket(max(n - s for s, n in zip(starts, lengths, strict=True)), least=2)
        if width > FUSED_CATCH_UP:  # far behind: a ragged forward of its own first
            ragged_forward(self.model, tokens, starts, behind, self._stage, self.graphs)
            starts, width = behind, 2
        host = first_inputs(tokens, starts, lengths, width, self.model.scratch)
        noise = torch.empty(0, device=self.model.device)
        if not sampling.greedy:
            noise = torch.empty((gamma, batch, self.vocab), device=self.model.device).exponential_(generator=generator)
            noise.clamp_min_(_TINY)
        span = self.model.span_for(max(lengths) + gamma)
        key = (batch, gamma, sampling, span, width)
        loop = lambda h, e: self._loop(h, e, gamma, sampling, span)  # noqa: E731
        out_tokens, out_probs = self.graphs(key, loop, self._stage(host), noise)
        self._lengths, self._fed = list(lengths), gamma - 1
        return Draft(tokens=out_tokens, probs=None if sampling.greedy else out_probs)

    def _loop(
        self, host: torch.Tensor, noise: torch.Tensor, gamma: int, sampling: SamplingParams, span: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """host: [3, B, W] (see :func:`first_inputs`); noise: [gamma, B, V] Exp(1)."""
        ids, pos, write = host[0], host[1], host[2]
        drafted, probs = [], []
        for i in range(gamma):
            logits = fit_vocab(self.model.forward(ids, pos, write, last_only=True, span=span)[:, -1], self.vocab)
            if sampling.greedy:
                x = torch.argmax(filter_logits(logits, sampling), dim=-1)
            else:
                q = probs_from_logits(logits, sampling)
                x = race(q, noise[i])
                probs.append(q)
            drafted.append(x)
            ids, pos = x[:, None], pos[:, -1:] + 1
            write = pos
        tokens = torch.stack(drafted, dim=1)  # [B, gamma]
        return tokens, torch.stack(probs, dim=1) if probs else tokens

    def prewarm(self, batch: int, gamma: int, sampling: SamplingParams, off_gpu: bool = False) -> int:
        """Capture now every graph a step at this ``batch``, ``gamma`` and ``sampling`` can
        ask for, so none is captured while serving (each capture costs 0.05-0.6 s on the
        H200: the bench's tour warm-up left 16 inside timed runs at 57cf50c, every one a
        draft step after the draft sat out, catching up at a width or span it had not met).

        The drafting loop at each span and first-forward width (2 .. FUSED_CATCH_UP), and
        the separate catch-up forward at each span and wider width. It runs the graphs on
        dummy tokens, writing the draft's cache from slot 0: call it between requests,
        never inside one (the next request's catch-up rewrites every slot it reads).
        Returns the number of keys it asked for. Without CUDA graphs there is nothing to
        capture, so it returns 0 at once unless ``off_gpu`` (the tests' check of the keys)."""
        if batch < 1 or gamma < 1:
            raise ValueError(f"prewarm: batch {batch} and gamma {gamma} must be >= 1")
        if not (self.graphs.enabled or off_gpu):
            return 0
        model, top = self.model, self.model.scratch
        self._fit(batch)
        spans = sorted({model.span_for(n) for n in range(1, top + 1)})
        before = len(self.graphs.keys)
        gen = torch.Generator(device=model.device).manual_seed(0)  # the noise is drawn on the device
        for span in spans:
            end = min(span, top - 1)  # the furthest a step (rows + gamma) or a catch-up reaches under `span`
            length = end - gamma  # the rows' length that makes this step's span `span`
            if length < 2 or model.span_for(end) != span:
                continue
            tokens = torch.zeros((batch, end + 1), dtype=torch.long)
            for width in (w for w in (2, 4, 8, 16) if w <= min(FUSED_CATCH_UP, length)):
                self.seen = [length - width] * batch  # first token the cache lacks: `width` behind
                self.propose(tokens, [length] * batch, gamma, sampling, gen)
            # the catch-up forward feeds at least FUSED_CATCH_UP - 1 tokens (a first forward wider than
            # FUSED_CATCH_UP less the last two), at most `end`: the largest need of each width
            widest = {catch_up_width(n, top): n for n in range(FUSED_CATCH_UP - 1, end + 1)}
            for need in widest.values():
                ragged_forward(model, tokens, [end - need] * batch, [end] * batch, self._stage, self.graphs)
        self.seen = []
        return len(self.graphs.keys) - before

    def _fit(self, batch: int) -> None:
        """A cache for ``batch`` rows; graphs captured over a reallocated one are dropped."""
        if self.model.allocate(batch):
            self.graphs.clear()

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """The loop fed the row's last token and ``gamma - 1`` drafts: keep the accepted ones."""
        self.seen = [n + min(k, self._fed) for n, k in zip(self._lengths, num_accepted, strict=True)]


def first_inputs(tokens: torch.Tensor, starts: Sequence[int], lengths: Sequence[int], width: int, scratch: int
                 ) -> torch.Tensor:
    """The loop's first forward: :func:`~flashspec_fast.target.ragged_inputs` of each row's
    tokens ``starts[b]:lengths[b]`` (at least its last two). A one-token row repeats its
    token at position 0 (the same write twice), so every row feeds at least two tokens."""
    starts = [min(s, max(n - 2, 0)) for s, n in zip(starts, lengths, strict=True)]
    host = ragged_inputs(tokens, starts, lengths, width, scratch)
    for b, (s, n) in enumerate(zip(starts, lengths, strict=True)):
        if n - s == 1:  # the second write wins; both are the same
            host[:, b, width - 2] = host[:, b, width - 1]
    return host


def make_draft(opts: FastOptions, context: DraftContext) -> FastDraft:
    import attrs

    if opts.device == "auto":
        opts = attrs.evolve(opts, device=str(context.device))
    model, _path = build_model(opts)
    return FastDraft(model, context.vocab, opts)
