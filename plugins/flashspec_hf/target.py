"""The target model: scores a proposal's slots in one forward pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashspec_hf.lm import CachedLM
from flashspec_models.tokenizer import decode_ids, encode_prompt


class HFTarget:
    """Target LM with a KV cache over ragged rows (see :mod:`flashspec_hf.lm`).

    ``prefills`` counts the requests it started: the self-speculative draft
    (:mod:`flashspec_hf.selfdraft`) drafts on this cache once the target holds its rows.
    """

    def __init__(self, model: Any, tokenizer: Any, chat_template: bool = True) -> None:
        self.lm = CachedLM(model)
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.vocab = int(model.get_output_embeddings().weight.shape[0])
        self.device = self.lm.device
        self._lengths: list[int] = []
        self._gamma = 0
        self.prefills = 0

    @property
    def max_context(self) -> int:
        """The longest sequence it scores (HasContext): the model's ``max_position_embeddings``
        (``1 << 30`` for a model that does not say)."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        return int(limit) if isinstance(limit, int) else 1 << 30

    @property
    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.tokenizer):
            eos = getattr(src, "eos_token_id", None)
            if isinstance(eos, int):
                ids.add(eos)
            elif eos is not None:
                ids.update(int(e) for e in eos)
        return ids

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def prefill(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Feed every prompt but its last token (which the first step feeds)."""
        self.lm.reset(len(lengths))
        self.lm.catch_up(tokens, [n - 1 for n in lengths])
        self.prefills += 1

    def prefill_rows(self, tokens: torch.Tensor, lengths: Sequence[int], rows: Sequence[int]) -> None:
        """Feed the sequences of ``rows`` but their last tokens, after forgetting those rows
        (:class:`~flashspec_core.contracts.PrefillsRows`): one forward in which only their slots
        are valid, so every other row keeps its keys, values and positions; then the slots
        the forgotten rows held are dropped (:meth:`~flashspec_hf.lm.CachedLM.compact`)."""
        picked = [int(b) for b in rows]
        batch = len(self.lm.seen)
        if not picked or len(set(picked)) != len(picked) or not all(0 <= b < batch for b in picked):
            raise ValueError(f"prefill_rows: rows must be distinct indices in [0, {batch}), got {picked}")
        self.lm.forget_rows(picked)
        stops = list(self.lm.seen)  # the other rows: nothing new
        for b in picked:
            stops[b] = lengths[b] - 1
        if any(stops[b] for b in picked):
            self.lm.catch_up(tokens, stops)
        self.lm.compact()

    def score(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor) -> torch.Tensor:
        """Logits at the gamma draft positions and the bonus position: [B, gamma+1, V]."""
        self._lengths = list(lengths)
        self._gamma = draft_tokens.shape[1]
        return self.lm.catch_up(tokens, lengths, extra=draft_tokens)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        self.lm.drop_last([self._gamma - n for n in num_accepted])
        self.lm.seen = [length + n for length, n in zip(self._lengths, num_accepted, strict=True)]

    def score_tree(
        self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor, parents: torch.Tensor
    ) -> torch.Tensor:
        """Logits after each sequence and after each tree node: [B, N+1, V] (tree attention mask,
        positions by depth; see :mod:`flashspec_hf.lm`)."""
        self._lengths = list(lengths)
        return self.lm.catch_up(tokens, lengths, extra=draft_tokens, tree=[int(a) for a in parents.tolist()])

    def commit_path(self, paths: torch.Tensor) -> None:
        """Keep the accepted path's KV entries of the last :meth:`score_tree` ([B, D] node ids, -1 padded)."""
        kept = self.lm.keep_path(paths)  # the tree block holds node n at offset n
        self.lm.seen = [length + k for length, k in zip(self._lengths, kept, strict=True)]
