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
from _tp_pair import ARMS, PROMPTS, one_and_two, play

from flashspec_core.pipeline import Pipeline
from flashspec_fast.tp import TensorParallelTarget

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


@pytest.fixture(scope="module")
def pipes(family: dict[str, Path]) -> Iterator[tuple[Pipeline, Pipeline]]:
    with one_and_two(family, "cuda:0") as pair:
        yield pair


@pytest.mark.parametrize("arm", ARMS)
@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 3}], ids=["greedy", "sampled"])
def test_tokens_equal_one_gpu_with_graphs(pipes: tuple[Pipeline, Pipeline], arm: str, sampling: dict[str, Any]) -> None:
    want, got = (play(p, arm).generate(PROMPTS, max_new_tokens=24, **sampling) for p in pipes)
    assert got.token_ids == want.token_ids
    target = pipes[1].target
    assert isinstance(target, TensorParallelTarget) and target.graphs.captures > 0  # the NCCL all-reduces were captured
