"""Registers the ``reference`` verifier: plain torch, no host sync inside a step."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from flashspec_core import ComponentSpec, SamplingParams, Verdict, Verifier, hookimpl
from flashspec_core.sampling import Noise, verify_greedy, verify_random


class ReferenceVerifier:
    """Rejection sampling in plain torch (see :mod:`flashspec_core.sampling`)."""

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        if sampling.greedy:
            return verify_greedy(target_logits, draft_tokens, sampling)
        batch, gamma = draft_tokens.shape
        noise = Noise.draw(batch, gamma, target_logits.shape[-1], generator, target_logits.device)
        return verify_random(target_logits, draft_tokens, draft_probs, sampling, noise)

    def verify_with_noise(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        noise: Noise,
    ) -> Verdict:
        """Same as :meth:`verify` with the noise given (for token-exact comparisons)."""
        if sampling.greedy:
            return verify_greedy(target_logits, draft_tokens, sampling)
        return verify_random(target_logits, draft_tokens, draft_probs, sampling, noise)


def _make(config: object, device: torch.device) -> Verifier:
    return ReferenceVerifier()


@hookimpl
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    return [ComponentSpec(name="reference", kind="verifier", factory=_make, description="plain-torch rejection sampler")]
