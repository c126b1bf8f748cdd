"""Registers the ``reference`` verifier: plain torch, no host sync inside a step.

It verifies chains (:mod:`flashspec_core.sampling`) and draft trees
(:mod:`flashspec_core.tree`), with the same noise conventions: one uniform per drafted
token (per node) and one Exp(1) vector per row, drawn in that order from the generator.

It refuses inputs outside its contract, since third parties call it directly: wrong
shapes or dtypes are a ``ValueError`` naming the argument, at once. Values (token ids
outside ``[0, V)``, a ``q`` that is not a distribution, NaN or inf logits) are checked
by :func:`flashspec_core.checks.verifier_inputs`: inputs in host memory are refused with
a :class:`~flashspec_core.contracts.VerifierInputError` naming the argument and the rows;
on an accelerator, where reading the check would cost a host sync, a chain's checks are
returned in :attr:`Verdict.flags <flashspec_core.contracts.Verdict.flags>` instead (the
pipeline reads them with its one copy) and a tree's are left to the pipeline's own checks.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from flashspec_core import ComponentSpec, SamplingParams, Verdict, Verifier, hookimpl
from flashspec_core.checks import flagged, verifier_inputs
from flashspec_core.sampling import (
    Noise,
    RowsOverVerify,
    filter_logits,
    probs_from_logits,
    verify_greedy,
    verify_random,
)
from flashspec_core.tree import TreeDraft, TreeVerdict, verify_tree_greedy, verify_tree_random
from flashspec_reference.keys import COMPONENTS


class ReferenceVerifier(RowsOverVerify):
    """Rejection sampling in plain torch (see :mod:`flashspec_core.sampling`)."""

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        flags = verifier_inputs(target_logits, draft_tokens, draft_probs)
        if sampling.greedy:
            return flagged(verify_greedy(target_logits, draft_tokens, sampling), flags)
        batch, gamma = draft_tokens.shape
        noise = Noise.draw(batch, gamma, target_logits.shape[-1], generator, target_logits.device)
        return flagged(verify_random(target_logits, draft_tokens, draft_probs, sampling, noise), flags)

    def verify_with_noise(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        noise: Noise,
    ) -> Verdict:
        """Same as :meth:`verify` with the noise given (for token-exact comparisons)."""
        flags = verifier_inputs(target_logits, draft_tokens, draft_probs)
        if sampling.greedy:
            return flagged(verify_greedy(target_logits, draft_tokens, sampling), flags)
        return flagged(verify_random(target_logits, draft_tokens, draft_probs, sampling, noise), flags)

    def verify_tree(
        self,
        target_logits: torch.Tensor,  # [B, N+1, V]
        draft_tokens: torch.Tensor,  # [B, N] int64
        parents: torch.Tensor,  # [N] int64 CPU
        draft_probs: torch.Tensor | None,  # [B, N, V] or None (deterministic nodes)
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> TreeVerdict:
        """Multi-draft rejection sampling over the tree (greedy descent at temperature 0)."""
        batch, nodes = draft_tokens.shape
        noise = None
        if not sampling.greedy:
            noise = Noise.draw(batch, nodes, target_logits.shape[-1], generator, target_logits.device)
        return self.verify_tree_with_noise(target_logits, draft_tokens, parents, draft_probs, sampling, noise)

    def verify_tree_with_noise(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        parents: torch.Tensor,
        draft_probs: torch.Tensor | None,
        sampling: SamplingParams,
        noise: Noise | None,  # None only when greedy
    ) -> TreeVerdict:
        """Same as :meth:`verify_tree` with the noise given (for token-exact comparisons)."""
        verifier_inputs(target_logits, draft_tokens, draft_probs)
        q = None if draft_probs is None else draft_probs.float()
        tree = TreeDraft(draft_tokens, parents, q)
        if sampling.greedy:
            return verify_tree_greedy(filter_logits(target_logits, sampling), tree)
        if noise is None:
            raise ValueError("verify_tree_with_noise: sampling is not greedy, so noise is required")
        return verify_tree_random(probs_from_logits(target_logits, sampling), tree, noise)


def _make(config: object, device: torch.device) -> Verifier:
    return ReferenceVerifier()


@hookimpl
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    return [ComponentSpec(k.name, "verifier", _make, k.config_cls, k.description) for k in COMPONENTS]
