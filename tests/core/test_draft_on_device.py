"""A host-side drafter's CPU tokens reach the device once per step, without a host sync."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.cudagraph import to_device

# Copies itself: the lookup arm matches from the first step on.
PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("tiny"))


def test_to_device_on_the_cpu_keeps_the_values() -> None:
    host = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = to_device(host, torch.device("cpu"))
    assert out.device.type == "cpu" and torch.equal(out, host)


@pytest.mark.gpu
def test_a_lookup_step_syncs_the_host_once(models: dict[str, Path]) -> None:
    """fast target with CUDA graphs, triton verifier, float32, greedy, one prompt-lookup arm:
    under CUDA's sync debug mode each step's one read (the verdict's copy to the host) warns
    once; the draft's CPU tokens added two more per step before they were staged through
    pinned memory (one waiting for the target's forward before the verify kernels were launched)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    common = {"dtype": "float32", "chat_template": False, "device": "cuda", "max_len": 128, "compile": True}
    pipe = build_pipeline({"target": {"use": "fast", "model": str(models["target"]), **common},
                           "arm": [{"use": "prompt_lookup", "gamma": 4, "min_ngram": 2, "fill": True}],
                           "verifier": {"use": "triton"}})
    for _ in range(2):  # graphs captured (the verifier's pinned ones on a shape's second sighting), kernels compiled
        pipe.generate([PROMPT], max_new_tokens=24, temperature=0.0)
    step, per_step = pipe.step, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = step(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        per_step.append((out[0].gamma, [str(w.message) for w in caught if "synchroniz" in str(w.message).lower()]))
        return out

    pipe.step = counted  # type: ignore[method-assign]
    pipe.generate([PROMPT], max_new_tokens=24, temperature=0.0)
    assert any(gamma > 0 for gamma, _ in per_step), "the lookup arm never proposed"
    assert all(len(syncs) == 1 for _, syncs in per_step), per_step
