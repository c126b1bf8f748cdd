"""Draft provider backed by any Hugging Face causal LM sharing the target's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from flashspec_core import Draft, SamplingParams
from flashspec_core.ragged import fit_vocab
from flashspec_core.sampling import filter_logits, probs_from_logits, sample
from flashspec_hf.lm import CachedLM


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

    def __init__(self, model: Any, vocab: int) -> None:
        self.lm = CachedLM(model)
        self.vocab = vocab
        self._fed = 0  # draft tokens of the last proposal that went through the model
        self._lengths: list[int] = []

    def reset(self) -> None:
        self.lm.reset(0)

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
        if gamma == 0:  # an empty proposal feeds nothing: the rollback after it keeps the cache as it is
            self._fed, self._lengths = 0, list(self.lm.seen)
            return Draft(tokens=torch.zeros((len(lengths), 0), dtype=torch.long), probs=None)
        logits = self.lm.catch_up(tokens, lengths)[:, -1]  # [B, Vd]
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

    def rollback(self, num_accepted: Sequence[int]) -> None:
        kept = [min(n, self._fed) for n in num_accepted]
        self.lm.drop_last([self._fed - k for k in kept])
        self.lm.seen = [length + k for length, k in zip(self._lengths, kept, strict=True)]
