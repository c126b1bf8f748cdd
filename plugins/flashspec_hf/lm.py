"""A causal LM with a KV cache shared by ragged rows.

Every forward appends the same number of *slots* to every row; a slot holds a real
token only where it is marked valid. Left padding, catch-up padding and rejected
draft tokens are invalid slots: no query attends to them, so rolling back a
rejected suffix costs no copy, only a mask update (and a crop of the slots that
are invalid in every row, which keeps batch 1 free of holes).

The mask is an additive 4-D mask ``[B, 1, n, S]`` in which an invalid query slot
still sees itself, so no softmax row is empty (eager attention would turn an
empty row into NaN and spread it through the values).

A forward may end with a draft *tree* (``tree = parents``): its nodes see the slots
before the tree block, their ancestors and themselves, at the position of their depth
(:func:`flashspec_core.tree.tree_attention_mask`, :func:`~flashspec_core.tree.tree_positions`).
:meth:`CachedLM.keep_path` then compacts the block to the accepted path, so the cache
holds what a chain forward of the accepted tokens would have written.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from flashspec_core.ragged import additive_mask, causal_mask, next_positions, right_align
from flashspec_core.tree import ancestor_matrix, node_depths


def _cache_kwarg(model: PreTrainedModel) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class CachedLM:
    """One model, one batch of rows, one KV cache."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self._kwarg = _cache_kwarg(model)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.reset(0)

    def reset(self, batch: int) -> None:
        self.cache = DynamicCache()
        self.valid = torch.zeros((batch, 0), dtype=torch.bool, device=self.device)  # [B, S]
        self.next_pos = torch.zeros(batch, dtype=torch.long, device=self.device)  # [B]
        self.seen = [0] * batch  # real tokens fed, per row
        self.tree_start: int | None = None  # first slot of the last forward's tree block

    def _mask(self, n: int, tree: Sequence[int] | None = None, nodes: int = 0) -> torch.Tensor:
        """The last ``n`` slots as queries: causal over slots, valid keys only, and each query
        sees itself; the last ``nodes`` queries, the last nodes of the tree block ``tree``
        (the cache's last ``len(tree)`` slots), see only their ancestors and themselves in it.
        [B, 1, n, S]"""
        slots = self.valid.shape[1]
        q = torch.arange(slots - n, slots, device=self.device)[None]  # [1, n]
        itself = torch.arange(slots, device=self.device)[None, None, :] == q[:, :, None]  # [1, n, S]
        allowed = (causal_mask(q, slots) & self.valid[:, None, :]) | itself
        if tree and nodes:
            allowed[:, -nodes:, -len(tree) :] = ancestor_matrix(tree, self.device)[-nodes:][None]
        return additive_mask(allowed, self.mask_dtype, torch.finfo(self.mask_dtype).min)[:, None]

    @property
    def mask_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype.is_floating_point else torch.float32

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, valid: torch.Tensor, tree: Sequence[int] | None = None,
                nodes: int | None = None) -> torch.Tensor:
        """Append slots and return their logits. ids/valid: [B, n] -> [B, n, V].

        ``tree``: the parents of the draft tree block (-1: a child of the last slot before
        it), every node so far; this forward's last ``nodes`` slots (all valid; default
        ``len(tree)``, which starts the block) are its last nodes. ``next_pos`` stays before
        the block until :meth:`keep_path`.
        """
        ids = ids.to(self.device)
        valid = valid.to(self.device)
        pos = next_positions(self.next_pos, valid)
        m = (len(tree) if nodes is None else nodes) if tree else 0
        if tree and m:
            start = self.next_pos + valid[:, : valid.shape[1] - m].long().sum(1)  # [B]
            depths = torch.tensor(node_depths(tree)[len(tree) - m :], dtype=torch.long, device=self.device)
            pos[:, -m:] = start[:, None] + depths[None] - 1
            if self.tree_start is None:
                self.tree_start = self.valid.shape[1] + valid.shape[1] - len(tree)
        self.valid = torch.cat([self.valid, valid], dim=1)
        kwargs = {self._kwarg: self.cache}
        out = self.model(
            input_ids=ids, attention_mask=self._mask(ids.shape[1], tree, m), position_ids=pos, use_cache=True, **kwargs
        )
        self.next_pos += valid[:, : valid.shape[1] - m].long().sum(1)
        return out.logits

    def keep_path(self, slots: torch.Tensor) -> list[int]:
        """Compact the tree block of the last forward to each row's accepted path.

        :param slots: ``[B, D]`` int64, row ``b``'s accepted nodes in path order as offsets
            into the tree block, -1 padded (nothing after the first -1 counts).
        :returns: the tokens kept per row. The block's other slots (rejected branches) are
            dropped from the cache, and the kept ones move to the block's first slots.
        """
        if self.tree_start is None:
            raise RuntimeError("keep_path: the last forward scored no tree")
        start, self.tree_start = self.tree_start, None
        slots = slots.to(self.device)
        kept = ((slots >= 0).long().cumprod(1)).sum(1)  # [B]
        width = int(kept.max()) if kept.numel() else 0  # host arithmetic: slots come from the host
        index = torch.where(slots[:, :width] >= 0, slots[:, :width] + start, start)  # [B, width]
        for layer in self.cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel():
                layer.keys, layer.values = _gather_slots(keys, start, index), _gather_slots(values, start, index)  # type: ignore[union-attr]
        cols = torch.arange(width, device=self.device)[None]
        self.valid = torch.cat([self.valid[:, :start], cols < kept[:, None]], dim=1)
        self.next_pos += kept
        return [int(k) for k in kept.tolist()]

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int], extra: torch.Tensor | None = None,
                 tree: Sequence[int] | None = None) -> torch.Tensor:
        """Feed each row's unseen tokens, right-aligned, then ``extra`` ([B, m], all valid;
        a draft tree with parents ``tree`` if given, see :meth:`forward`).

        Returns the logits of the last ``1 + m`` slots: the next-token logits after
        each row's sequence, then after each extra token. [B, 1+m, V].
        """
        new = [max(length - seen, 0) for length, seen in zip(lengths, self.seen, strict=True)]
        starts = [length - k for length, k in zip(lengths, new, strict=True)]
        ids, pos = right_align(tokens.cpu(), starts, lengths, max(max(new), 1))
        valid = pos >= 0
        self.seen = [s + k for s, k in zip(self.seen, new, strict=True)]
        if extra is not None and extra.shape[1]:
            ids = torch.cat([ids, extra.cpu()], dim=1)
            valid = torch.cat([valid, torch.ones(extra.shape, dtype=torch.bool)], dim=1)
        m = 0 if extra is None else extra.shape[1]
        return self.forward(ids, valid, tree if m else None)[:, -(1 + m) :]

    def forget_rows(self, rows: Sequence[int]) -> None:
        """Invalidate every slot of ``rows`` and start their positions and counts over: the
        next :meth:`catch_up` feeds those rows from their first token, and no other row's keys,
        values or positions change. The invalid slots stay until :meth:`compact`."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.device)
        self.valid[index] = False
        self.next_pos[index] = 0
        for b in rows:
            self.seen[b] = 0

    def compact(self) -> None:
        """Drop the invalid slots, each row's valid ones right-aligned (left padding) in as many
        slots as the fullest row holds: the holes that forgotten rows leave would otherwise
        widen the cache, and every forward's attention, with each row that joins. Exact: every
        valid slot keeps its keys, values and position, and no query sees an invalid one."""
        if self.tree_start is not None:
            raise RuntimeError("compact: the last forward's tree block is not committed yet")
        slots, width = self.valid.shape[1], int(self.valid.sum(1).max()) if self.valid.numel() else 0
        if width == slots:
            return
        # a stable sort of the flags puts each row's invalid slots first and keeps the valid ones in order
        index = torch.sort(self.valid.to(torch.uint8), dim=1, stable=True).indices[:, slots - width :]  # [B, width]
        for layer in self.cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor) and keys.numel():
                layer.keys, layer.values = _gather_slots(keys, 0, index), _gather_slots(values, 0, index)  # type: ignore[union-attr]
        self.valid = self.valid.gather(1, index)

    def drop_tree(self) -> None:
        """Drop the whole tree block of the last forwards (no node kept)."""
        if self.tree_start is not None:
            self.keep_path(torch.full((self.valid.shape[0], 0), -1, dtype=torch.long))

    def drop_last(self, count: Sequence[int]) -> None:
        """Invalidate each row's last ``count[b]`` slots (a rejected suffix of the last forward)."""
        if not any(count):
            return
        k = torch.tensor(list(count), dtype=torch.long, device=self.device)
        cols = torch.arange(self.valid.shape[1], device=self.device)
        self.valid &= cols[None, :] < (self.valid.shape[1] - k)[:, None]
        self.next_pos -= k
        # The last min(count) slots are invalid in every row: crop them (host-side
        # arithmetic only, so batch 1 never accumulates holes).
        keep = self.valid.shape[1] - min(count)
        if keep < self.valid.shape[1]:
            self.cache.crop(keep - self.valid.shape[1])  # negative: drop that many slots
            self.valid = self.valid[:, :keep]


def _gather_slots(x: torch.Tensor, start: int, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, S, D] cut to its first ``start`` slots, then the slots ``index`` [B, w] per row."""
    picked = x.gather(2, index[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))
    return torch.cat([x[:, :, :start], picked], dim=2)
