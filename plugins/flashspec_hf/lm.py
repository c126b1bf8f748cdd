"""A causal LM with a KV cache shared by ragged rows.

Every forward appends the same number of *slots* to every row; a slot holds a real
token only where it is marked valid. Left padding, catch-up padding and rejected
draft tokens are invalid slots: no query attends to them, so rolling back a
rejected suffix costs no copy, only a mask update (and a crop of the slots that
are invalid in every row, which keeps batch 1 free of holes).

The mask is an additive 4-D mask ``[B, 1, n, S]`` in which an invalid query slot
still sees itself, so no softmax row is empty (eager attention would turn an
empty row into NaN and spread it through the values).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from flashspec_core.ragged import additive_mask, causal_mask, next_positions, right_align


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

    def _mask(self, n: int) -> torch.Tensor:
        """The last ``n`` slots as queries: causal over slots, valid keys only, and each query
        sees itself. [B, 1, n, S]"""
        slots = self.valid.shape[1]
        q = torch.arange(slots - n, slots, device=self.device)[None]  # [1, n]
        itself = torch.arange(slots, device=self.device)[None, None, :] == q[:, :, None]  # [1, n, S]
        allowed = (causal_mask(q, slots) & self.valid[:, None, :]) | itself
        return additive_mask(allowed, self.mask_dtype, torch.finfo(self.mask_dtype).min)[:, None]

    @property
    def mask_dtype(self) -> torch.dtype:
        return self.dtype if self.dtype.is_floating_point else torch.float32

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Append slots and return their logits. ids/valid: [B, n] -> [B, n, V]."""
        ids = ids.to(self.device)
        valid = valid.to(self.device)
        pos = next_positions(self.next_pos, valid)
        self.valid = torch.cat([self.valid, valid], dim=1)
        kwargs = {self._kwarg: self.cache}
        out = self.model(
            input_ids=ids, attention_mask=self._mask(ids.shape[1]), position_ids=pos, use_cache=True, **kwargs
        )
        self.next_pos += valid.long().sum(1)
        return out.logits

    def catch_up(self, tokens: torch.Tensor, lengths: Sequence[int], extra: torch.Tensor | None = None) -> torch.Tensor:
        """Feed each row's unseen tokens, right-aligned, then ``extra`` ([B, m], all valid).

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
        return self.forward(ids, valid)[:, -(1 + m) :]

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
