"""Draft provider backed by any Hugging Face causal LM sharing the target's tokenizer.

With ``tree_width = [w1, w2, ...]`` it proposes a draft tree instead of a chain: the
root's ``w1`` children, each node's ``w2`` children, and so on (cut to ``gamma`` nodes in
level order), one forward per level with tree attention inside the draft. By default
(``tree_children = "topk"``) the children are the top-k tokens of the draft's (filtered)
distribution, a deterministic function of the context, so they are reported as one-hot
``q`` (``probs = None``), which keeps the output law the target's under sampling too
(``docs/exactness-tree.md``). With ``tree_children = "sample"`` a sampling step draws each
node's children without replacement from the draft's ``q`` instead
(:func:`~flashspec_core.tree.sample_children`) and reports each child's law given its
elder siblings; greedy steps keep the top-k.

With ``tree_depth = D`` and ``tree_expand = k`` it grows a dynamic tree instead
(:func:`~flashspec_core.tree.grow_tree`): per level one forward over the ``k`` most likely
frontier nodes, each proposing its top ``k`` tokens, then the ``gamma`` candidates with the
most likely paths, parents first. Its children are top-k tokens, so sampling steps stay exact
as for ``tree_children = "topk"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.ragged import fit_vocab
from flashspec_core.sampling import filter_logits, probs_from_logits, sample
from flashspec_core.tree import Feed, grow_tree, node_depths, sample_children, tree_candidates, tree_shape
from flashspec_hf.keys import DraftOptions as DraftOptions  # defined without torch, for the config check
from flashspec_hf.lm import CachedLM

_TINY = torch.finfo(torch.float32).tiny


class TokenizerMismatch(ValueError):
    """The draft's tokenizer differs from the target's."""


def check_same_tokenizer(draft_tok: Any, target_tok: Any, draft_name: str) -> None:
    """Refuse a draft whose vocabulary (token -> id) differs from the target's."""
    if draft_tok is None or target_tok is None:
        return
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        differ = sorted(set(dv.items()) ^ set(tv.items()))[:3]
        raise TokenizerMismatch(
            f"draft {draft_name!r} does not share the target's tokenizer "
            f"(vocab sizes {len(dv)} vs {len(tv)}; first differing entries {differ}); "
            "speculative decoding needs identical token ids"
        )


class HFDraft:
    """Autoregressive drafting with its own KV cache, rolled back to the accepted prefix."""

    def __init__(self, model: Any, vocab: int, tree_width: Sequence[int] = (), tree_children: str = "topk",
                 tree_depth: int = 0, tree_expand: int = 0) -> None:
        self.lm = CachedLM(model)
        self.vocab = vocab
        self.tree_width = tuple(tree_width)
        self.tree_children = tree_children
        self.tree_depth, self.tree_expand = tree_depth, tree_expand
        self.proposes_trees = any(w > 1 for w in self.tree_width) or tree_depth > 0
        self._slots: list[int] | None = None  # a dynamic tree's node -> fed block slot (-1: not fed)
        self._fed = 0  # draft tokens of the last proposal that went through the model
        self._lengths: list[int] = []

    def reset(self) -> None:
        self.lm.reset(0)

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Forget ``rows``' sequences (:class:`~flashspec_core.contracts.ResetsRows`): their slots
        are dropped and the next proposal feeds them from their first token."""
        kept = [b for b in rows if b < len(self.lm.seen)]
        if kept:
            self.lm.forget_rows(kept)
            self.lm.compact()

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        if len(self.lm.seen) != len(lengths):
            self.lm.reset(len(lengths))
        self._slots = None
        if gamma == 0:  # an empty proposal feeds nothing: the rollback after it keeps the cache as it is
            self._fed, self._lengths = 0, list(self.lm.seen)
            return Draft(tokens=torch.zeros((len(lengths), 0), dtype=torch.long), probs=None)
        logits = self.lm.catch_up(tokens, lengths)[:, -1]  # [B, Vd]
        self._lengths = list(lengths)
        if self.tree_depth:
            return self._grow_tree(fit_vocab(logits, self.vocab), gamma, sampling)
        if self.proposes_trees:
            return self._propose_tree(fit_vocab(logits, self.vocab), tree_shape(self.tree_width, gamma), sampling,
                                      generator)
        drafted: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        for i in range(gamma):
            x, q = self._draw(fit_vocab(logits, self.vocab), sampling, generator)
            drafted.append(x)
            if q is not None:
                probs.append(q)
            if i + 1 < gamma:
                logits = self.lm.forward(x[:, None], torch.ones_like(x[:, None], dtype=torch.bool))[:, -1]
        self._fed = gamma - 1
        self._lengths = list(lengths)
        return Draft(
            tokens=torch.stack(drafted, dim=1),
            probs=torch.stack(probs, dim=1) if probs else None,
        )

    @staticmethod
    def _draw(
        logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if sampling.greedy:
            return torch.argmax(filter_logits(logits, sampling), dim=-1), None
        q = probs_from_logits(logits, sampling)
        return sample(q, generator), q

    def _propose_tree(self, root: torch.Tensor, parents: list[int], sampling: SamplingParams,
                      generator: torch.Generator | None) -> Draft:
        """Each node's children: the top-k tokens after it, or (``tree_children = "sample"`` on a
        sampling step) a draw without replacement with each child's law in ``probs``; one forward
        per level feeds the nodes that have children. root: [B, V] logits after each sequence."""
        batch, vocab = root.shape
        nodes = torch.zeros((batch, len(parents)), dtype=torch.long, device=root.device)
        sampled = self.tree_children == "sample" and not sampling.greedy
        probs = torch.zeros((batch, len(parents), vocab), device=root.device) if sampled else None  # [B, N, V]
        depths = node_depths(parents)
        levels = [[n for n, d in enumerate(depths) if d == k + 1] for k in range(max(depths, default=0))]
        after, self._fed = {-1: root}, 0  # node -> the draft's logits after it [B, V]
        for k, level in enumerate(levels):
            for parent in dict.fromkeys(parents[n] for n in level):
                kids = [n for n in level if parents[n] == parent]
                if probs is None:
                    nodes[:, kids] = torch.topk(filter_logits(after[parent], sampling), len(kids), dim=-1).indices
                    continue
                q = probs_from_logits(after[parent], sampling)
                expo = torch.empty_like(q).exponential_(generator=generator).clamp_min_(_TINY)
                nodes[:, kids], probs[:, kids] = sample_children(q, len(kids), expo)
            if k + 1 < len(levels):  # the next level needs this one's logits: feed it (nodes in level order)
                ones = torch.ones_like(nodes[:, level], dtype=torch.bool)
                fed = self.lm.forward(nodes[:, level], ones, parents[: level[-1] + 1], nodes=len(level))
                after = {n: fit_vocab(fed[:, i], self.vocab) for i, n in enumerate(level)}
                self._fed = level[-1] + 1
        chain = parents == list(range(-1, len(parents) - 1))
        return Draft(tokens=nodes, probs=probs, parents=None if chain else torch.tensor(parents, dtype=torch.long))

    def _grow_tree(self, root: torch.Tensor, gamma: int, sampling: SamplingParams) -> Draft:
        """A dynamic tree of ``gamma`` nodes (fewer if there are fewer candidates); root: [B, V]
        logits after each sequence. Each level's fed nodes go to the cache as a tree block."""
        block: list[int] = []  # the fed block's parents, slot by slot

        def feed(level: Feed) -> torch.Tensor:
            block.extend(level.parents.tolist())
            ones = torch.ones_like(level.tokens, dtype=torch.bool)
            out = self.lm.forward(level.tokens, ones, block, nodes=level.tokens.shape[1])
            return torch.log_softmax(filter_logits(fit_vocab(out, self.vocab), sampling), dim=-1)

        budget = min(gamma, tree_candidates(self.tree_expand, self.tree_depth))
        scores = torch.log_softmax(filter_logits(root, sampling), dim=-1)
        tree = grow_tree(scores, feed, self.tree_expand, self.tree_depth, budget)
        self._fed, self._slots = len(block), tree.fed.tolist()
        return Draft(tokens=tree.tokens, probs=None, parents=tree.parents.cpu())

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Keep the accepted nodes the draft fed (those with children), compacted in its cache."""
        if self._slots is not None:  # a dynamic tree: its nodes sit at their fed block slots
            slots = torch.tensor([-1, *self._slots], dtype=torch.long)[paths + 1]
            paths, self._slots = slots, None
        if self._fed == 0:
            kept = [0] * paths.shape[0]
        else:
            kept = self.lm.keep_path(torch.where(paths < self._fed, paths, -1))
        self._fed = 0
        self.lm.seen = [length + k for length, k in zip(self._lengths, kept, strict=True)]

    def rollback(self, num_accepted: Sequence[int]) -> None:
        if self.lm.tree_start is not None:  # a tree proposed as a chain: its nodes are re-fed when accepted
            self.rollback_path(torch.full((len(num_accepted), 0), -1, dtype=torch.long))
            return
        kept = [min(n, self._fed) for n in num_accepted]
        self.lm.drop_last([self._fed - k for k in kept])
        self.lm.seen = [length + k for length, k in zip(self._lengths, kept, strict=True)]
