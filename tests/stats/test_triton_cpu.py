"""The triton verifier's Philox mode under the statistical gate, in the CPU interpreter.

The full suite skips triton on the CPU (the interpreter runs every program of the
grid in Python, ~0.1 s per row); this one case of 10,000 trials keeps the in-kernel
noise of the fast mode under a statistical test in CI. Exact mode is covered token
for token against the reference in tests/kernels/.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.testing.exactness import GATE_ALPHA, MIN_TRIALS, Case, gate

pytestmark = pytest.mark.stats

CASE = Case("triton_cpu_v16_g2_t0.6_topk", 16, 2, SamplingParams(0.6, top_k=5))


def test_triton_philox_law_on_cpu() -> None:
    plugin = pytest.importorskip("flashspec_kernels.plugin")
    pytest.importorskip("triton")
    (spec,) = plugin.flashspec_verifiers()
    verifier = spec.factory(spec.config_cls(noise="philox"), torch.device("cpu"))
    assert CASE.trials >= MIN_TRIALS
    decision = gate(verifier, CASE, seed=7)
    assert not decision.rejected, f"rejected by {decision.failing} (Holm at {GATE_ALPHA})"
