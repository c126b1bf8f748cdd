"""Two GPUs (NCCL, CUDA graphs): the sharded target decodes as the one-GPU one does.

The CPU suite (gloo, no graphs) checks the replay logic; this one checks what only GPUs
have: NCCL collectives captured inside the target's graphs, the draft tokens broadcast on
the device, rank 1 on the second GPU. float32 tiny models, so the tokens must match."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Pipeline
from flashspec_fast.tp import TensorParallelTarget
from flashspec_selectors import FixedConfig, FixedSelector

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]

PROMPTS = [[1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8, 9], [12, 13], [7, 7, 2, 9, 4, 11]]
ARMS = ("chain", "tree")


def config(family: dict[str, Path], tp: int) -> dict[str, Any]:
    common = {"use": "fast", "dtype": "float32", "device": "cuda:0", "compile": True, "chat_template": False}
    draft = {**common, "model": str(family["close"])}
    return {
        "target": {**common, "model": str(family["target"]), "max_len": 256, "tensor_parallel": tp},
        "arm": [{**draft, "gamma": 3, "name": "chain"}, {**draft, "gamma": 6, "tree_width": [2, 2], "name": "tree"}],
        "verifier": {"use": "reference"},
        "selector": {"use": "fixed"},
    }


@pytest.fixture(scope="module")
def pipes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pipeline, Pipeline]]:
    family = tiny_family(tmp_path_factory.mktemp("tp_gpu"))
    one, two = build_pipeline(config(family, 1)), build_pipeline(config(family, 2))
    assert isinstance(two.target, TensorParallelTarget)
    yield one, two
    two.target.close()


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 3}], ids=["greedy", "sampled"])
def test_tokens_equal_one_gpu_with_graphs(pipes: tuple[Pipeline, Pipeline], arm: str, sampling: dict[str, Any]) -> None:
    for p in pipes:
        p.selector = FixedSelector(FixedConfig(arm=ARMS.index(arm)), len(ARMS))
    want, got = (p.generate(PROMPTS, max_new_tokens=24, **sampling) for p in pipes)
    assert got.token_ids == want.token_ids
    target = pipes[1].target
    assert isinstance(target, TensorParallelTarget) and target.graphs.captures > 0  # the NCCL all-reduces were captured
