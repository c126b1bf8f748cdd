"""Prompt-lookup drafting (Saxena 2023): copy what followed the last n-gram before.

Deterministic and weightless: the proposal is a function of the context alone, so
its ``q`` is one-hot and the verifier accepts ``x`` with probability ``p(x)``.

With ``branches = k > 1`` it proposes a draft tree, a *fan* (:func:`flashspec_core.tree.fan_depths`):
the continuations of up to ``k`` earlier matches (longest n-gram first, most recent match
first) that begin with different tokens, one chain from the root each; the first is cut to
the nodes the others leave over, the others to ``gamma // k`` tokens. A match whose
continuation begins like an earlier one's adds nothing there (its sibling could never be
accepted after the first was rejected) and is passed over. The batch's tree is the first
``j`` chains of the fan, ``j`` the most any row has, so an arm proposes at most ``k`` tree
shapes (a target capturing a CUDA graph per shape captures those few, not one per step);
a row fills a slot it lacks with its parent's token. Every node stays deterministic, so
the tree verifies as one-hot siblings and the output law is the target's
(``docs/exactness-tree.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.pipeline import NoDraft
from flashspec_core.tree import fan_depths, fan_draft
from flashspec_lookup.keys import LookupConfig as LookupConfig  # defined without torch, for the config check


def lookup(seq: torch.Tensor, gamma: int, cfg: LookupConfig) -> list[int]:
    """Continuation of the most recent earlier match of the longest suffix n-gram.

    seq: [L] int64 (CPU). Returns ``gamma`` tokens; where the match is shorter than
    ``gamma`` or there is none, the proposal repeats its last token (the verifier
    rejects what does not fit, so filling cannot change the output law). With
    ``cfg.fill`` false it returns only the match's continuation (maybe empty).
    """
    if gamma == 0:
        return []
    seq = seq[-cfg.window :]
    length = seq.shape[0]
    for n in range(min(cfg.max_ngram, length - 1), cfg.min_ngram - 1, -1):
        suffix = seq[length - n :]
        windows = seq[: length - 1].unfold(0, n, 1)  # [L-n, n]: every earlier n-gram
        hits = (windows == suffix).all(dim=1).nonzero().squeeze(1)
        hits = hits[hits + n < length]
        if hits.numel():
            start = int(hits[-1]) + n
            return _fit(seq[start : start + gamma].tolist(), gamma, cfg)
    return _fit([int(seq[-1])] if length else [0], gamma, cfg) if cfg.fill else []


def lookup_branches(seq: torch.Tensor, gamma: int, cfg: LookupConfig) -> list[list[int]]:
    """Continuations of up to ``cfg.branches`` earlier matches, by a full scan (the reference of
    :meth:`NgramIndex.propose_branches`): longest suffix n-gram first, most recent match first,
    each beginning with another token than those before it, chain ``i`` cut to
    ``fan_depths(gamma, branches)[i]`` tokens (padded as :func:`lookup` pads).
    """
    if gamma == 0:
        return []
    seq = seq[-cfg.window :]
    length, cuts = seq.shape[0], fan_depths(gamma, cfg.branches)
    found: list[list[int]] = []
    for n in range(min(cfg.max_ngram, length - 1), cfg.min_ngram - 1, -1):
        windows = seq[: length - 1].unfold(0, n, 1)
        hits = (windows == seq[length - n :]).all(dim=1).nonzero().squeeze(1)
        for start in reversed(hits[hits + n < length].tolist()):
            if len(found) == len(cuts):
                break
            cut = cuts[len(found)]
            _add(found, _fit(seq[start + n : start + n + cut].tolist(), cut, cfg))
    if not found and cfg.fill:
        found.append(_fit([int(seq[-1])] if length else [0], cuts[0], cfg))
    return found


def _add(found: list[list[int]], branch: list[int]) -> None:
    """A branch opens a new chain only with a first token no chain has: after a rejected
    sibling its token has no probability left, so a second chain behind it is never accepted."""
    if all(f[0] != branch[0] for f in found):
        found.append(branch)


def _fit(found: list[int], gamma: int, cfg: LookupConfig) -> list[int]:
    """``found`` (non-empty), padded to ``gamma`` by repeating its last token if ``cfg.fill``."""
    return found + [found[-1]] * (gamma - len(found)) if cfg.fill else found


class NgramIndex:
    """One row's sequence with the latest start of every n-gram (``min_ngram..max_ngram``)
    that ends before its last token: :func:`lookup`'s answer in O(new tokens) per call
    instead of a scan of the whole window."""

    def __init__(self, cfg: LookupConfig) -> None:
        self.cfg = cfg
        self.seq: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}  # n-gram -> its latest start
        self.recent: dict[tuple[int, ...], list[int]] = {}  # with branches > 1: its latest starts, oldest first
        self._indexed = 0  # n-grams ending before this position are in ``latest``

    def extend(self, new: list[int]) -> None:
        """Index the n-grams that end at the new positions (never at the last token).

        One ``dict.update`` per n over the n-grams zipped from shifted slices, oldest first so
        the latest start wins: the same index as a loop over each end and n, at a fraction of
        its host time (a prompt is indexed while the target prefills, every row of a batch).
        """
        seq = self.seq
        seq.extend(new)
        stop = len(seq) - 1  # n-grams end before the last token
        for n in range(self.cfg.min_ngram, self.cfg.max_ngram + 1):
            first = max(self._indexed, n - 1)  # the first end not indexed yet that has n tokens before it
            if first >= stop:
                continue
            part = seq[first - n + 1 : stop]
            grams = zip(*(part[k:] for k in range(n)), strict=False)  # shifted slices: the shortest ends it
            pairs = list(zip(grams, range(first - n + 1, stop - n + 1), strict=True))
            self.latest.update(pairs)
            if self.cfg.branches > 1:
                recent = self.recent
                for gram, start in pairs:
                    starts = recent.get(gram)
                    if starts is None:
                        recent[gram] = [start]
                    else:
                        starts.append(start)
        self._indexed = max(self._indexed, stop)

    def propose(self, gamma: int) -> list[int]:
        seq, cfg, length = self.seq, self.cfg, len(self.seq)
        if gamma == 0:
            return []
        first = length - cfg.window  # lookup() searches the last ``window`` tokens only
        for n in range(min(cfg.max_ngram, length - 1), cfg.min_ngram - 1, -1):
            start = self.latest.get(tuple(seq[length - n :]))
            if start is not None and start >= first:
                return _fit(seq[start + n : start + n + gamma], gamma, cfg)
        return _fit([seq[-1]] if length else [0], gamma, cfg) if cfg.fill else []

    def propose_branches(self, gamma: int) -> list[list[int]]:
        """:func:`lookup_branches` of the sequence, from the index."""
        seq, cfg, length = self.seq, self.cfg, len(self.seq)
        if gamma == 0:
            return []
        first, cuts = length - cfg.window, fan_depths(gamma, cfg.branches)
        found: list[list[int]] = []
        for n in range(min(cfg.max_ngram, length - 1), cfg.min_ngram - 1, -1):
            for start in reversed(self.recent.get(tuple(seq[length - n :]), [])):
                if start < first or len(found) == len(cuts):
                    break
                cut = cuts[len(found)]
                _add(found, _fit(seq[start + n : start + n + cut], cut, cfg))
        if not found and cfg.fill:
            found.append(_fit([seq[-1]] if length else [0], cuts[0], cfg))
        return found


class PromptLookupDraft:
    """Draft provider copying n-gram continuations from each row's own context.

    Each row keeps an :class:`NgramIndex` fed only with the tokens added since the
    provider last saw the row (sequences only grow within a batch; :meth:`reset` starts
    over), so a proposal costs a few dictionary lookups rather than a scan of up to
    ``window`` tokens; it equals :func:`lookup` on the same sequence (tested).
    """

    def __init__(self, config: LookupConfig) -> None:
        self.config = config
        self.proposes_trees = config.branches > 1
        self._rows: list[NgramIndex] = []

    def reset(self) -> None:
        self._rows = []

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Start ``rows``' indexes over (:class:`~flashspec_core.contracts.ResetsRows`): a new
        sequence in a row need not be shorter than the one it replaces."""
        for b in rows:
            if b < len(self._rows):
                self._rows[b] = NgramIndex(self.config)

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        ids = self._catch_up(tokens, lengths)
        if self.proposes_trees:
            branches = [index.propose_branches(gamma) for index in self._rows]
            return fan_draft(branches, [int(ids[b, n - 1]) for b, n in enumerate(lengths)],
                             fan_depths(gamma, self.config.branches))
        rows = [index.propose(gamma) for index in self._rows]
        width = max(len(r) for r in rows)  # rows alike: shorter matches repeat their last token
        if width == 0:  # no row matched: a plain step (this runs before every step a lookup gates)
            return Draft(tokens=torch.empty((len(rows), 0), dtype=torch.long), probs=None)
        rows = [r + [r[-1] if r else int(ids[b, lengths[b] - 1])] * (width - len(r)) if len(r) < width else r
                for b, r in enumerate(rows)]
        return Draft(tokens=torch.tensor(rows, dtype=torch.long), probs=None)

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Index the prompts while the target prefills (:class:`~flashspec_core.contracts.CatchesUp`):
        a row's first proposal otherwise indexes its whole prompt inside the step (a row that
        joins a running batch too)."""
        self._catch_up(tokens, lengths)

    def _catch_up(self, tokens: torch.Tensor, lengths: Sequence[int]) -> Any:
        """Feed each row's index the tokens it has not seen (a shorter sequence starts it over);
        the ids as a numpy view."""
        if len(self._rows) != len(lengths):
            self._rows = [NgramIndex(self.config) for _ in lengths]
        ids = tokens.cpu().numpy()  # a view of the CPU ids: slicing it costs far less host time than the tensor's
        for b, n in enumerate(lengths):
            index = self._rows[b]
            if n < len(index.seq):  # not the sequence this row had: start over
                index = self._rows[b] = NgramIndex(self.config)
            if n > len(index.seq):
                index.extend(ids[b, len(index.seq) : n].tolist())
        return ids

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to undo: rejected tokens never enter the sequences it indexes."""

    def rollback_path(self, paths: torch.Tensor) -> None:
        """Nothing to undo after a tree either."""


def make(config: LookupConfig, context: Any) -> PromptLookupDraft:
    return PromptLookupDraft(config)


def make_none(config: None, context: Any) -> NoDraft:
    return NoDraft()
