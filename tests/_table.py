"""A bigram test target: the logits after a sequence are a fixed table's row of its last token."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

VOCAB = 8


class TableTarget:
    """Stateless, on the CPU, ``VOCAB`` tokens (the last one is EOS); prompts are
    space-separated ids. ``spoil`` may break the logits in place before they are returned."""

    vocab = VOCAB
    device = torch.device("cpu")
    eos_token_ids = {VOCAB - 1}

    def __init__(self, spoil: Callable[[torch.Tensor], None] = lambda logits: None) -> None:
        self.table = 4 * torch.randn((VOCAB, VOCAB), generator=torch.Generator().manual_seed(0))
        self.spoil = spoil

    def encode(self, prompt: str) -> list[int]:
        return [int(word) for word in prompt.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(i) for i in ids)

    def prefill(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Stateless."""

    def score(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor) -> torch.Tensor:
        last = torch.tensor([int(tokens[b, n - 1]) for b, n in enumerate(lengths)])
        # Out-of-range draft ids (a broken draft under test) index a valid row; the checks see the ids.
        logits = self.table[torch.cat([last[:, None], draft_tokens.cpu().clamp(0, VOCAB - 1)], dim=1)]
        self.spoil(logits)
        return logits  # [B, gamma+1, V]

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""
