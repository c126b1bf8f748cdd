"""Ragged batches as plain tensors: rows of different lengths fed through one forward.

Row ``b``'s sequence is ``tokens[b, : lengths[b]]`` (:class:`flashspec_core.contracts.Target`).
A forward feeds each row a slice ``tokens[b, starts[b] : stops[b]]``, *right-aligned* in a
``[B, W]`` block: each row's last token sits in the last column, the columns before its
first token are padding. A token's *position* is its index in its row's sequence; a query
at position ``p`` may see the keys at positions ``0..p`` of its own row.

Pure tensor math, no model code: both target back-ends and the attention kernel's reference
build their inputs and masks from these functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["additive_mask", "causal_mask", "fit_vocab", "next_positions", "right_align"]


def right_align(
    tokens: torch.Tensor, starts: Sequence[int], stops: Sequence[int], width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens[b, starts[b] : stops[b]]`` right-aligned in ``width`` columns, on the host.

    :param tokens: ``[B, L]`` int64, the rows' sequences.
    :param width: columns of the block, at least the longest slice.
    :returns: ids ``[B, width]`` int64 (0 in padding) and positions ``[B, width]`` int64
        (the tokens' indices in their rows; -1 in padding, so ``positions >= 0`` marks the
        real tokens).
    """
    batch = len(starts)
    ids = torch.zeros((batch, width), dtype=torch.long)
    pos = torch.full((batch, width), -1, dtype=torch.long)
    for b, (s, e) in enumerate(zip(starts, stops, strict=True)):
        if e - s > width:
            raise ValueError(f"right_align: row {b} feeds {e - s} tokens ({s}..{e}), more than width {width}")
        if e > s:
            ids[b, width - (e - s) :] = tokens[b, s:e]
            pos[b, width - (e - s) :] = torch.arange(s, e)
    return ids, pos


def next_positions(next_pos: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Positions of the slots of a right-aligned block, counted on the device.

    :param next_pos: ``[B]`` int64, the position each row's next real token takes.
    :param valid: ``[B, n]`` bool, which slots hold real tokens.
    :returns: ``[B, n]`` int64: consecutive positions from ``next_pos`` over the valid
        slots; a padding slot gets its row's last position before it (0 at the start).
    """
    return (next_pos[:, None] + valid.long().cumsum(1) - 1).clamp_min(0)


def causal_mask(pos: torch.Tensor, keys: int) -> torch.Tensor:
    """``[B, T, keys]`` bool: whether a query at ``pos[b, t]`` may see key ``k`` (``k <= pos``).

    :param pos: ``[B, T]`` int64 query positions (or cache slots), on the mask's device.
    :param keys: key slots ``0..keys-1`` of each row.
    """
    return torch.arange(keys, device=pos.device)[None, None, :] <= pos[:, :, None]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype, fill: float = float("-inf")) -> torch.Tensor:
    """An additive attention mask of ``allowed``'s shape: 0 where allowed, ``fill`` elsewhere."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(allowed.logical_not(), fill)


def fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Cut or pad (with -inf) the last dim to ``vocab``: a draft's logits to the target's width,
    which may differ by padded embedding rows."""
    have = logits.shape[-1]
    if have == vocab:
        return logits
    if have > vocab:
        return logits[..., :vocab]
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], vocab - have), float("-inf"))], dim=-1)
