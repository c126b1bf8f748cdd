"""Tree verifiers in the tree gate's calling convention (p, draft, generator, greedy -> verdict).

The gate hands a verifier the target's filtered probabilities; a component that takes raw
logits (:class:`~flashspec_core.contracts.VerifiesTrees`) gets ``log p`` at temperature 1 (or
0 when greedy), which gives back ``p`` (to rounding) and its zeros as ``-inf``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.tree import TreeDraft, TreeVerdict

# The triton verifier's noise modes: philox (in-kernel draws, the default) and exact (the
# reference's noise, so the reference's tokens).
TRITON_CONFIGS = {"triton-philox": {"noise": "philox"}, "triton-exact": {"noise": "exact"}}


@attrs.frozen
class ComponentTreeVerify:
    """A :class:`~flashspec_core.contracts.VerifiesTrees` component as a gate verifier;
    ``bug`` plants one of the triton kernels' mutants (None: the product)."""

    verifier: Any
    bug: str | None = None

    def __call__(self, p: torch.Tensor, draft: TreeDraft, generator: torch.Generator, greedy: bool) -> TreeVerdict:
        logits = p.float().log()
        sampling = SamplingParams(temperature=0.0 if greedy else 1.0)
        if self.bug is None:
            return self.verifier.verify_tree(logits, draft.tokens, draft.parents, draft.q, sampling, generator,
                                             without_replacement=draft.without_replacement)  # fmt: skip
        from flashspec_core.sampling import Noise
        from flashspec_kernels.verify_tree import verify_tree_triton

        noise = None if greedy else Noise.draw(p.shape[0], draft.num_nodes, p.shape[2], generator, p.device)
        return verify_tree_triton(logits, draft.tokens, draft.parents, draft.q, sampling, noise=noise,
                                  without_replacement=draft.without_replacement, bug=self.bug)  # type: ignore[arg-type]


def triton_tree_verify(name: str, bug: str | None = None) -> ComponentTreeVerify:
    """The triton verifier in noise mode ``TRITON_CONFIGS[name]``, or a skip without triton."""
    pytest.importorskip("triton")
    from flashspec_triton.plugin import TritonVerifier, TritonVerifierConfig

    return ComponentTreeVerify(TritonVerifier(TritonVerifierConfig(**TRITON_CONFIGS[name]), "cpu"), bug)
