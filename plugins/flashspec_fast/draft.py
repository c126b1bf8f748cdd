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
row more than :data:`FUSED_CATCH_UP` tokens behind catches up in a separate forward first:
over those rows alone where they are few (rows that joined a running batch), else over
the whole batch (:meth:`FastDraft._catch_up`).

With ``tree_width = [w1, w2, ...]`` (:class:`FastDraftOptions`) it proposes a draft tree
instead, as the ``hf`` draft does: the root's ``w1`` children, each node's ``w2``, and so
on, cut to ``gamma`` nodes in level order. The first forward is the same; then one forward
per level but the last feeds that level's nodes with tree attention
(:class:`~flashspec_core.tree.TreeBlock`: node ``n`` at slot ``lengths[b] + n``,
positioned by its depth), the whole tree one graph replay per shape. By default
(``tree_children = "topk"``) the children are the top-k tokens of the draft's filtered
distribution, a deterministic function of the context, so they are reported as one-hot
``q`` (``probs = None``) under sampling too, which keeps the output law the target's. With
``tree_children = "sample"`` a sampling step draws each sibling group without replacement
from the draft's ``q`` (:func:`~flashspec_core.tree.sample_children`, on exponential noise
drawn outside the graph) and reports each child's law given its elder siblings; greedy
steps keep the top-k.

With ``tree_depth = D`` and ``tree_expand = k`` it grows a dynamic tree
(:func:`~flashspec_core.tree.grow_tree`) in one graph replay: the same first forward, then
``D - 1`` forwards of the ``k`` most likely frontier nodes (a fixed width, fed with tree
attention at slots ``lengths[b] + j`` of a block of ``(D - 1) k``), each proposing its top
``k`` tokens; the ``gamma`` candidates with the most likely paths are the draft, parents
first. Its shape (parents and fed slots, ``2 N`` integers) is read back to the host once per
step, since the verifier and the target take a tree's shape on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.contracts import DraftContext
from flashspec_core.ragged import fit_vocab
from flashspec_core.sampling import filter_logits, probs_from_logits, race
from flashspec_core.tree import (
    MAX_MASK_NODES,
    ROOT,
    Feed,
    TreeBlock,
    grow_tree,
    sample_children,
    tree_candidates,
    tree_shape,
)
from flashspec_fast.graphs import GraphCache, reach
from flashspec_fast.keys import FastDraftOptions as FastDraftOptions  # defined without torch, for the config check
from flashspec_fast.model import Transformer
from flashspec_fast.options import FastOptions, build_model
from flashspec_fast.target import (
    HostInputs,
    bucket,
    catch_up_width,
    check_room,
    forward_rows,
    join_chunks,
    kept_counts,
    move_path,
    ragged_forward,
    ragged_inputs,
    run_sizes,
    tree_inputs,
)

_TINY = torch.finfo(torch.float32).tiny
FUSED_CATCH_UP = 16  # widest first forward of the draft loop (tokens per row)


def tree_levels(parents: Sequence[int]) -> list[list[tuple[int, int, int]]]:
    """Per depth, its nodes as ``(parent, first, stop)`` sibling groups in order: the shapes
    :func:`~flashspec_core.tree.tree_shape` gives are in level order, each group contiguous."""
    levels: list[list[tuple[int, int, int]]] = []
    depth = {ROOT: 0}
    for node, parent in enumerate(parents):
        depth[node] = depth[parent] + 1
        if depth[node] > len(levels):
            levels.append([])
        groups = levels[depth[node] - 1]
        if groups and groups[-1][0] == parent and groups[-1][2] == node:
            groups[-1] = (parent, groups[-1][1], node + 1)
        else:
            groups.append((parent, node, node + 1))
    return levels


class FastDraft:
    """Draft LM over its own static KV cache; rollback is host bookkeeping only (a tree's
    accepted path: one graph replay of slot copies)."""

    def __init__(self, model: Transformer, vocab: int, opts: FastOptions, tree_width: Sequence[int] = (),
                 tree_children: str = "topk", tree_depth: int = 0, tree_expand: int = 0) -> None:
        if (tree_depth - 1) * tree_expand > MAX_MASK_NODES:
            raise ValueError(f"tree_depth {tree_depth} and tree_expand {tree_expand} feed {(tree_depth - 1) * tree_expand} "
                             f"nodes to the draft, more than a tree block holds ({MAX_MASK_NODES})")
        self.model = model
        self.vocab = vocab
        self.tree_width = tuple(tree_width)
        self.tree_children = tree_children
        self.tree_depth, self.tree_expand = tree_depth, tree_expand
        self.proposes_trees = any(w > 1 for w in self.tree_width) or tree_depth > 0
        self._slots = torch.zeros(0, dtype=torch.long)  # [N + 1] a dynamic tree's fed slot per node + 1, -1 first
        self.graphs = GraphCache(model.device, opts.compile)
        self._stage = HostInputs(model.device)
        self._stage_path = HostInputs(model.device)  # rollback_path's own: one copy per step
        self._root = torch.zeros(0, dtype=torch.long, device=model.device)  # [B]: the last tree's root slots
        self.seen: list[int] = []  # per row: slots 0..seen-1 hold the row's sequence
        self._lengths: list[int] = []
        self._fed = 0  # draft tokens the last proposal's loop fed through the model
        self._tree = False  # the last proposal's nodes sit at tree slots (a tree_width draft)

    @property
    def max_context(self) -> int:
        """The longest sequence it drafts after (:class:`~flashspec_core.contracts.HasContext`), as the
        fast target's: ``max_len`` slots, one of them scratch; a dynamic tree's fed block (``(D - 1) k``
        slots, where more than the arm's draft slots) takes the rest. The pipeline and the server keep
        a request within it, so that a draft whose ``max_len`` is below its target's refuses a long
        prompt before the prefill, rather than failing at the first step."""
        return int(self.model.max_len) - 1 - max(0, (self.tree_depth - 1) * self.tree_expand - 1)

    def reset(self) -> None:
        self.seen = []

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Forget ``rows``' sequences (:class:`~flashspec_core.contracts.ResetsRows`): they catch
        up from slot 0 at the next proposal, rewriting every slot they read."""
        for b in rows:
            if b < len(self.seen):
                self.seen[b] = 0

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
        self._tree = False
        if gamma == 0:  # an empty proposal feeds nothing: the rollback after it keeps the cache as it is
            self._lengths, self._fed = list(self.seen), 0
            return Draft(tokens=torch.zeros((batch, 0), dtype=torch.long), probs=None)
        parents = tree_shape(self.tree_width, gamma) if self.proposes_trees and not self.tree_depth else []
        gamma = len(parents) or gamma
        if self.tree_depth:
            gamma = min(gamma, tree_candidates(self.tree_expand, self.tree_depth))
        check_room(self.model, max(lengths) + max(gamma, (self.tree_depth - 1) * self.tree_expand), "draft")
        behind = [max(n - 2, 0) for n in lengths]
        starts = [min(s, e) for s, e in zip(self.seen, behind, strict=True)]  # first token the cache lacks
        width = bucket(max(n - s for s, n in zip(starts, lengths, strict=True)), least=2)
        if width > FUSED_CATCH_UP:  # far behind: a forward of its own first
            starts = self._catch_up(tokens, starts, behind)
            width = bucket(max(n - s for s, n in zip(starts, lengths, strict=True)), least=2)
        host = first_inputs(tokens, starts, lengths, width, self.model.scratch)
        if parents:
            return self._propose_tree(host, list(lengths), parents, sampling, generator)
        if self.tree_depth:
            return self._grow_tree(host, list(lengths), gamma, sampling)
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

    def _catch_up(self, tokens: torch.Tensor, starts: list[int], behind: list[int]) -> list[int]:
        """Feed the rows more than :data:`FUSED_CATCH_UP` tokens behind up to ``behind`` (their
        length less two); returns the new first tokens the cache lacks. Where those rows, padded
        to runs of a power of two (:func:`~flashspec_fast.target.join_chunks`), are fewer than
        the batch (rows that joined a running batch), it feeds them alone in captured
        rows-forwards (:func:`~flashspec_fast.target.forward_rows`); else every row in one
        ragged forward over the whole batch, a graph per shape. (Uncaptured, a forward over the
        far rows alone made the server's draft steps at 8-32 clients 1.7x as long on the H100.)"""
        far = [b for b, (s, e) in enumerate(zip(starts, behind, strict=True)) if e - s > FUSED_CATCH_UP - 2]
        if sum(rows for _, rows in join_chunks(far)) >= len(starts):
            ragged_forward(self.model, tokens, starts, behind, self._stage, self.graphs)
            return list(behind)
        need = max(behind[b] - starts[b] for b in far)
        forward_rows(self.model, tokens, far, [starts[b] for b in far], [behind[b] for b in far],
                     catch_up_width(need, self.model.scratch), self._stage, self.graphs)
        caught = list(starts)
        for b in far:
            caught[b] = behind[b]
        return caught

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

    def _propose_tree(self, host: torch.Tensor, lengths: list[int], parents: list[int], sampling: SamplingParams,
                      generator: torch.Generator | None) -> Draft:
        """The tree of shape ``parents`` after each row: one graph replay per (batch, shape,
        sampling, span, first width). host: [3, B, W] (see :func:`first_inputs`)."""
        batch, span = host.shape[1], self.model.span_for(max(lengths) + len(parents))
        sampled = self.tree_children == "sample" and not sampling.greedy
        key = ("tree", batch, tuple(parents), sampling, span, host.shape[2], sampled)
        levels = tree_levels(parents)
        groups = sum(len(level) for level in levels)
        noise = torch.empty(0, device=self.model.device)  # [groups, B, V] Exp(1) when sampled
        if sampled:
            noise = torch.empty((groups, batch, self.vocab), device=self.model.device).exponential_(generator=generator)
            noise.clamp_min_(_TINY)
        loop = lambda h, t, e: self._tree_loop(h, t, e, levels, sampling, span, sampled)  # noqa: E731
        dev = self._stage(torch.cat([host.flatten(), tree_inputs(parents).flatten()]))  # one staged copy
        split = host.numel()
        first = dev[:split].view(host.shape)
        out, probs = self.graphs(key, loop, first, dev[split:].view(2, -1), noise)
        self._root = first[1, :, -1]  # rollback_path's: each row's last position, already on the device
        # levels but the last were fed: their nodes' keys and values sit at slots lengths[b] + n
        self._lengths, self._fed, self._tree = lengths, levels[-1][0][1], True
        chain = parents == list(range(-1, len(parents) - 1))
        return Draft(tokens=out, probs=probs if sampled else None,
                     parents=None if chain else torch.tensor(parents, dtype=torch.long))

    def _tree_loop(self, host: torch.Tensor, shape: torch.Tensor, noise: torch.Tensor,
                   levels: list[list[tuple[int, int, int]]], sampling: SamplingParams, span: int, sampled: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """host: [3, B, W] the first forward; shape: [2, N + 1] (:func:`~flashspec_fast.target.tree_inputs`);
        noise: [groups, B, V] Exp(1), one vector per sibling group in level order, when ``sampled``
        -> the nodes [B, N] int64: each sibling group the top-k of its parent's filtered logits or
        (``sampled``) a draw without replacement from its q; and each node's law given its elder
        siblings [B, N, V] float32 (``sampled``; else the nodes again, unused)."""
        ids, pos, write = host[0], host[1], host[2]
        batch, last = ids.shape[0], pos[:, -1]  # the root's position [B]
        nodes = torch.zeros((batch, shape.shape[1] - 1), dtype=torch.long, device=ids.device)
        probs = torch.zeros((batch, nodes.shape[1], self.vocab), device=ids.device) if sampled else nodes
        after = self.model.forward(ids, pos, write, last_only=True, span=span)[:, -1:]  # [B, 1, V]: the root
        fed = [ROOT]  # the nodes whose logits `after` holds, in order
        group = 0  # the next sibling group's noise
        for k, groups in enumerate(levels):
            logits = fit_vocab(after, self.vocab)  # [B, len(fed), V]
            if sampled:
                q = probs_from_logits(logits, sampling)
                for parent, first, stop in groups:
                    nodes[:, first:stop], probs[:, first:stop] = sample_children(
                        q[:, fed.index(parent)], stop - first, noise[group])
                    group += 1
            else:
                top = torch.topk(filter_logits(logits, sampling), max(e - s for _, s, e in groups),
                                 dim=-1).indices  # [B, len(fed), w]
                for parent, first, stop in groups:
                    nodes[:, first:stop] = top[:, fed.index(parent), : stop - first]
            if k + 1 < len(levels):  # the next level needs this one's logits: feed it
                first, stop = groups[0][1], groups[-1][2]
                block = TreeBlock(start=last + 1, bits=shape[1, first + 1 : stop + 1][None].expand(batch, -1).contiguous(),
                                  nodes=stop)
                slots = last[:, None] + 1 + torch.arange(first, stop, device=ids.device)  # [B, level]
                after = self.model.forward(nodes[:, first:stop], last[:, None] + shape[0, first + 1 : stop + 1],
                                           slots, span=span, tree=block)
                fed = list(range(first, stop))
        return nodes, probs

    def _grow_tree(self, host: torch.Tensor, lengths: list[int], budget: int, sampling: SamplingParams) -> Draft:
        """A dynamic tree of ``budget`` nodes after each row: one graph replay per (batch, budget,
        sampling, span, first width). host: [3, B, W] (see :func:`first_inputs`)."""
        block = (self.tree_depth - 1) * self.tree_expand
        span = self.model.span_for(max(lengths) + max(budget, block))
        key = ("grow", host.shape[1], budget, sampling, span, host.shape[2])
        first = self._stage(host)
        tokens, shape = self.graphs(key, lambda h: self._grow_loop(h, budget, sampling, span), first)
        parents, fed = shape.cpu()  # the step's one read back: verifier and target take the shape on the host
        self._root = first[1, :, -1]  # rollback_path's: each row's last position, already on the device
        self._lengths, self._fed, self._tree = lengths, block, True
        self._slots = torch.cat([fed.new_full((1,), -1), fed])
        return Draft(tokens=tokens, probs=None, parents=parents)

    def _grow_loop(self, host: torch.Tensor, budget: int, sampling: SamplingParams, span: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """host: [3, B, W] the first forward -> the nodes [B, N] int64 and [2, N] int64: their
        parents and fed block slots (:class:`~flashspec_core.tree.GrownTree`)."""
        ids, pos, write = host[0], host[1], host[2]
        last = pos[:, -1]  # the root's position [B]
        width = self.tree_expand

        def feed(level: Feed) -> torch.Tensor:
            batch = level.tokens.shape[0]
            block = TreeBlock(start=last + 1, bits=level.bits[None].expand(batch, -1).contiguous(),
                              nodes=level.first + width)
            slots = last[:, None] + 1 + level.first + torch.arange(width, device=ids.device)  # [B, k]
            out = self.model.forward(level.tokens, (last + level.depth)[:, None].expand(-1, width).contiguous(),
                                     slots, span=span, tree=block)
            return torch.log_softmax(filter_logits(fit_vocab(out, self.vocab), sampling), dim=-1)

        root = fit_vocab(self.model.forward(ids, pos, write, last_only=True, span=span)[:, -1], self.vocab)
        scores = torch.log_softmax(filter_logits(root, sampling), dim=-1)
        tree = grow_tree(scores, feed, width, self.tree_depth, budget)
        return tree.tokens, torch.stack([tree.parents, tree.fed])

    def prewarm(self, batch: int, gamma: int, sampling: SamplingParams, off_gpu: bool = False,
                longest: int | None = None) -> int:
        """Capture now every graph a step at this ``batch``, ``gamma`` and ``sampling`` of
        sequences of up to ``longest`` tokens (None: up to the cache's end) can ask for, so
        none is captured while serving (each capture costs 0.05-0.6 s on the
        H200: the bench's tour warm-up left 16 inside timed runs at 57cf50c, every one a
        draft step after the draft sat out, catching up at a width or span it had not met).

        The drafting loop at each span and first-forward width (2 .. FUSED_CATCH_UP), and
        the separate catch-up forward at each span and wider width (over the whole batch,
        and over runs of 1, 2, 4, ... rows fewer than the batch); a tree draft's
        :meth:`rollback_path` too. It runs the graphs on
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
        spans = sorted({model.span_for(n) for n in range(1, reach(top, longest) + 1)})
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
            if self._tree:  # the accepted path's moves: one graph per batch and depth
                depth = self.tree_depth or len(tree_levels(tree_shape(self.tree_width, gamma)))
                self.rollback_path(torch.full((batch, depth), -1))
            # the catch-up forward feeds at least FUSED_CATCH_UP - 1 tokens (a first forward wider than
            # FUSED_CATCH_UP less the last two), at most `end`: the largest need of each width
            widest = {catch_up_width(n, top): n for n in range(FUSED_CATCH_UP - 1, end + 1)}
            for need in widest.values():
                ragged_forward(model, tokens, [end - need] * batch, [end] * batch, self._stage, self.graphs)
                # and over runs of fewer rows than the batch (_catch_up), whatever the batch
                for rows in (r for r in run_sizes() if r < batch):
                    forward_rows(model, tokens, list(range(rows)), [end - need] * rows, [end] * rows,
                                 catch_up_width(need, top), self._stage, self.graphs)
        self.seen = []
        return len(self.graphs.keys) - before

    def _fit(self, batch: int) -> None:
        """A cache for ``batch`` rows; graphs captured over a reallocated one are dropped."""
        if self.model.allocate(batch):
            self.graphs.clear()

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """The loop fed the row's last token and ``gamma - 1`` drafts: keep the accepted ones.
        A tree shape cut to a chain sits at the chain's slots, so the same holds for it."""
        self.seen = [n + min(k, self._fed) for n, k in zip(self._lengths, num_accepted, strict=True)]

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Keep the accepted nodes the last tree proposal fed (those of every level but the
        last), moved in the cache to the slots right after each row's last token: the moves are
        made on the device (:func:`~flashspec_fast.target.move_path`), the kept counts read
        from ``paths``, the pipeline's host copy, so nothing is read back from the device."""
        if not self._tree:  # an empty proposal, or a chain: paths hold nothing it fed
            self.rollback([0] * len(self._lengths))
            return
        if self.tree_depth:  # a dynamic tree's nodes sit at their fed block slots; one width, one graph
            paths = self._slots[paths + 1]
            paths = torch.cat([paths, paths.new_full((paths.shape[0], self.tree_depth - paths.shape[1]), -1)], dim=1)
        move_path(self.model, self.graphs, self._stage_path, paths, self._root, below=self._fed)
        self.seen = [n + k for n, k in zip(self._lengths, kept_counts(paths, below=self._fed), strict=True)]


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
    if opts.device == "auto":
        opts = attrs.evolve(opts, device=str(context.device))
    model, _path = build_model(opts)
    return FastDraft(model, context.vocab, opts, getattr(opts, "tree_width", ()), getattr(opts, "tree_children", "topk"),
                     getattr(opts, "tree_depth", 0), getattr(opts, "tree_expand", 0))
