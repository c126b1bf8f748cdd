"""SuffixDecoding (Oliaro et al. 2024): draft from what followed the current suffix before.

One :class:`~flashspec_suffix.tree.SuffixTree` per provider holds the prompts and outputs
of every request it served (the corpus, kept within ``max_tokens`` by evicting the oldest
requests' sequences) and, live, the rows of the current batch. Each step a row proposes
the most frequent continuation of its longest suffix found there (up to ``max_match``
tokens, at least ``min_match``), token by token, while the product of the continuations'
count ratios (the score) stays at or above ``min_score``; so a row with little evidence
proposes fewer tokens or none.

With ``branches = k > 1`` a row proposes a tree instead, a *fan*
(:func:`flashspec_core.tree.fan_depths`, :meth:`SuffixTree.propose_fan`): one chain per
most frequent continuation of its suffix, up to ``k``, each going on as the chain does
and held to ``min_score``; the first chain gets the nodes the others leave over, the
others ``gamma // k`` each. The batch's tree is the first ``j`` chains of the fan, ``j``
the most any row has, so an arm proposes at most ``k`` tree shapes (a target capturing a
CUDA graph per shape captures those few, not one per step).

Deterministic and weightless: the proposal is a function of the sequences this provider
has seen (the batch's and earlier requests'), never of the step's random draws, so its
``q`` is one-hot and the verifier accepts ``x`` with probability ``p(x)``: the output
law stays the target's, for a tree too (deterministic siblings, ``docs/exactness-tree.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.tree import fan_depths, fan_draft
from flashspec_suffix.keys import SuffixConfig as SuffixConfig  # defined without torch, for the config check
from flashspec_suffix.tree import Row, SuffixTree


class SuffixDraft:
    """Draft provider proposing corpus continuations; see the module docstring.

    Each row of the batch is a live sequence of the tree, fed only the tokens added
    since the provider last saw it (the sequences passed to :meth:`propose` are the
    truth: rejected tokens never enter them, and steps other arms played are caught up
    on), so :meth:`rollback` has nothing to undo. All rows catch up before any row
    proposes, so rows of a batch read each other's sequences as of this step. A row's
    sequence enters the corpus for good when the request ends (:meth:`reset`, or a
    batch of another size): up to the last tokens this provider saw of it, so tokens
    emitted after its last proposal are not kept. :meth:`forget_requests` empties the corpus.
    """

    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self.tree = SuffixTree(config.max_match + 1)
        self.proposes_trees = config.branches > 1
        self._rows: list[Row] = []

    def reset(self) -> None:
        for row in self._rows:
            self.tree.close(row)
        self._rows = []
        self.tree.evict(self.config.max_tokens)

    def reset_rows(self, rows: Sequence[int]) -> None:
        """End the requests of ``rows`` (their sequences enter the corpus, as at :meth:`reset`)
        and open fresh sequences there (:class:`~flashspec_core.contracts.ResetsRows`)."""
        for b in rows:
            if b < len(self._rows):
                self.tree.close(self._rows[b])
                self._rows[b] = self.tree.open()

    def forget_requests(self) -> None:
        """An empty corpus (:class:`flashspec_core.contracts.ForgetsRequests`)."""
        self.tree = SuffixTree(self.config.max_match + 1)
        self._rows = []

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64, right-padded
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        self._catch_up(tokens, lengths)
        cfg, last = self.config, [row.ids[-1] if row.ids else 0 for row in self._rows]
        if self.proposes_trees:
            depths = fan_depths(gamma, cfg.branches)
            fans = [self.tree.propose_fan(row, depths, cfg.min_match, cfg.min_score) for row in self._rows]
            return fan_draft(fans, last, depths)
        rows = [self.tree.propose(row, gamma, cfg.min_match, cfg.min_score) for row in self._rows]
        width = max((len(r) for r in rows), default=0)
        if width == 0:  # no row has a continuation it trusts: a plain step
            return Draft(tokens=torch.empty((len(rows), 0), dtype=torch.long), probs=None)
        # Rows alike: a shorter proposal repeats its last token (or the row's last one). A
        # padded token is drafted one-hot like any other, so the verifier keeps the law exact.
        padded = [r + [r[-1] if r else t] * (width - len(r)) for r, t in zip(rows, last, strict=True)]
        return Draft(tokens=torch.tensor(padded, dtype=torch.long), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to undo: proposals never enter the tree, accepted tokens enter it from
        the sequences at the next :meth:`propose`."""

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Nothing to undo after a tree either."""

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Index the prompts while the target prefills (:class:`~flashspec_core.contracts.CatchesUp`):
        a request's first proposal otherwise pays for its whole prompt (32 prompts of 1-2k tokens:
        ~0.2 s of host time on the CPU)."""
        self._catch_up(tokens, lengths)

    def _catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Feed each row the tokens it gained; a row whose sequence is not the one it had
        (shorter, or another last token) is finished and starts over."""
        if len(self._rows) != len(lengths):
            self.reset()
            self._rows = [self.tree.open() for _ in lengths]
        ids = tokens.cpu().numpy()  # a view of the CPU ids: slicing it costs far less host time than the tensor's
        for b, n in enumerate(lengths):
            row = self._rows[b]
            have = len(row.ids)
            if n < have or (have and int(ids[b, have - 1]) != row.ids[-1]):
                self.tree.close(row)
                row = self._rows[b] = self.tree.open()
                have = 0
            if n > have:
                self.tree.append(row, ids[b, have:n].tolist())
        self.tree.evict(self.config.max_tokens)


def make(config: SuffixConfig, context: Any) -> SuffixDraft:
    return SuffixDraft(config)
