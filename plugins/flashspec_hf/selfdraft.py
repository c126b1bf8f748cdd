"""The self-speculative draft ``hf-self``: the hf target's first ``layers`` layers draft.

Layer skipping in its simplest training-free form (Draft & Verify, Zhang et al. 2024;
SWIFT, Xia et al. 2024): the target's first ``k`` decoder layers, then its final norm and
LM head, draft ``gamma`` tokens with the target's own weights and its own KV cache. The
draft runs :func:`early_exit`, a view of the loaded model whose decoder holds only its
first ``k`` layers (the same modules: no weight is copied).

The cache of :mod:`flashspec_hf.lm` appends slots to every layer and marks which are
valid, so a draft forward of ``k`` layers leaves layers ``< k`` longer than the others,
out of step with the target's slot mask. A proposal therefore works on the target's
cache object through a mask and positions of its own, and when it is done crops the slots
it appended to layers ``< k``: the target's cache (keys, values, mask, positions) is then
what it was before the proposal, value for value, and the target's verify forward computes
every layer at the drafted positions itself. Rollback is the target's alone.

Rows the target has not prefilled (a provider driven without its target, as the contract
suite does, or one reset since the target's last prefill) get a cache of their own for
the proposal, fed from each row's first token.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicLayer

from flashspec_core import Draft, SamplingParams
from flashspec_core.contracts import DraftContext
from flashspec_hf.draft import HFDraft
from flashspec_hf.keys import SelfOptions as SelfOptions  # defined without torch, for the config check
from flashspec_hf.lm import CachedLM
from flashspec_hf.target import HFTarget


def decoder_layers(model: Any) -> nn.ModuleList:
    """The decoder layers of a Llama-style causal LM (``model.model.layers``)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"draft 'hf-self' needs a decoder whose layers are model.model.layers (Llama, Qwen2, "
                         f"Mistral...); {type(model).__name__} has none")
    return layers


def early_exit(model: Any, layers: int) -> Any:
    """``model`` running only its first ``layers`` decoder layers, then its final norm and LM head.

    Shallow copies of the causal LM and of its decoder whose module tables differ only in
    the decoder's layer list, a new list of the same first ``layers`` modules: every
    parameter, buffer and config is shared with ``model``, and the layers keep their own
    indices into the cache.
    """
    decoder = copy.copy(model.model)
    decoder._modules = {**model.model._modules, "layers": decoder_layers(model)[:layers]}
    view = copy.copy(model)
    view._modules = {**model._modules, "model": decoder}
    return view


class HFSelfDraft(HFDraft):
    """Drafts with the first ``depth`` layers of an :class:`~flashspec_hf.target.HFTarget`:
    :class:`~flashspec_hf.draft.HFDraft`'s loop over the target's cache."""

    def __init__(self, target: HFTarget, depth: int, vocab: int) -> None:
        super().__init__(early_exit(target.model, depth), vocab)
        self.target, self.depth = target, depth
        # PricesDrafts: a drafted token runs depth of the target's layers (and its LM head)
        self.draft_cost = depth / len(decoder_layers(target.model))
        self._since = target.prefills  # the target's cache serves this draft's rows after its next prefill

    def reset(self) -> None:
        self._since = self.target.prefills

    def reset_rows(self, rows: Sequence[int]) -> None:
        """Nothing to forget (:class:`~flashspec_core.contracts.ResetsRows`): a proposal works on
        the target's cache, whose rows :meth:`~flashspec_hf.target.HFTarget.prefill_rows` starts over."""

    def propose(
        self,
        tokens: torch.Tensor,  # [B, L] int64
        lengths: Sequence[int],
        gamma: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        slots = self._attach(len(lengths))
        try:
            return super().propose(tokens, lengths, gamma, sampling, generator)
        finally:
            self._detach(slots)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to do: a proposal leaves the target's cache as it found it."""

    def _attach(self, batch: int) -> int | None:
        """Point the draft's LM at the target's cache and state (copies of its mask, positions and
        counts); returns the cache's slot count, or None where the target has not prefilled these
        rows (then the draft's LM starts a cache of its own)."""
        own: CachedLM = self.target.lm
        if self.target.prefills <= self._since or len(own.seen) != batch:
            self.lm.reset(batch)
            return None
        lm = self.lm
        lm.cache, lm.valid, lm.next_pos, lm.seen = own.cache, own.valid, own.next_pos.clone(), list(own.seen)
        return int(own.valid.shape[1])

    def _detach(self, slots: int | None) -> None:
        """Crop the slots the proposal appended to layers < depth of the target's cache."""
        added = int(self.lm.valid.shape[1]) - (slots or 0)
        if slots is not None and added:
            for i, layer in enumerate(self.lm.cache.layers[: self.depth]):
                if not isinstance(layer, DynamicLayer):  # what flashspec_hf.lm's DynamicCache() makes
                    raise TypeError(f"hf-self: cache layer {i} is a {type(layer).__name__}, not a DynamicLayer")
                layer.crop(-added)
        self.lm.reset(0)  # hold no reference to the target's cache


def make_self_draft(config: SelfOptions, context: DraftContext) -> HFSelfDraft:
    target = context.target
    if not isinstance(target, HFTarget):
        raise ValueError(f"draft 'hf-self' drafts with the hf target's own layers and cache, but the target is "
                         f"{type(target).__name__} (with the fast target, use = \"self\")")
    have = len(decoder_layers(target.model))
    if not 1 <= config.layers <= have:
        raise ValueError(f"draft 'hf-self': layers = {config.layers}, but the target has {have} decoder layers "
                         f"(layers must be in 1..{have})")
    return HFSelfDraft(target, config.layers, context.vocab)
