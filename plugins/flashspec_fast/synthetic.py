"""Synthetic acceptance (as vLLM's synthetic rejection mode): for timing only.

Each draft token is accepted independently with probability ``acceptance`` (the
row's run of acceptances stops at the first rejection); the emitted last token is
the target's argmax there. The draft and target still do all their work, so step
times are real while the acceptance is a chosen number: results from this mode
must be labelled synthetic and never mixed with real-acceptance numbers.
"""

from __future__ import annotations

import torch

from flashspec_core import SamplingParams, Verdict
from flashspec_core.sampling import emit, first_rejection
from flashspec_fast.keys import SyntheticOptions as SyntheticOptions  # defined without torch, for the config check


class SyntheticVerifier:
    exact = False  # a timing stand-in: the contract suite skips its exactness checks

    def __init__(self, acceptance: float) -> None:
        self.acceptance = acceptance

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        batch, gamma = draft_tokens.shape
        u = torch.rand((batch, gamma), generator=generator, device=target_logits.device)
        num_accepted = first_rejection(u < self.acceptance)
        best = torch.argmax(target_logits, dim=-1)  # [B, gamma+1]
        return emit(draft_tokens, num_accepted, best.gather(1, num_accepted[:, None]).squeeze(1))


def make_synthetic(config: SyntheticOptions | None, device: torch.device) -> SyntheticVerifier:
    return SyntheticVerifier((config or SyntheticOptions()).acceptance)
