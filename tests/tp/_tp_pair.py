"""The one-process and the two-process pipeline that tests/tp compares, on the CPU (gloo) or
on GPUs (NCCL, CUDA graphs): the same tiny float32 models, prompts and two arms."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flashspec_core.build import build_pipeline
from flashspec_core.pipeline import Pipeline
from flashspec_fast.tp import TensorParallelTarget
from flashspec_selectors import FixedConfig, FixedSelector

PROMPTS = [[1, 2, 3, 4, 5], [3, 4, 5, 6, 7, 8, 9], [12, 13], [7, 7, 2, 9, 4, 11]]
ARMS = ("chain", "tree")


def config(family: dict[str, Path], tp: int, device: str) -> dict[str, Any]:
    # CUDA graphs wherever there is CUDA: on GPUs the NCCL all-reduces must replay inside them.
    common = {"use": "fast", "dtype": "float32", "device": device, "compile": device != "cpu", "chat_template": False}
    draft = {**common, "model": str(family["close"])}
    return {
        "target": {**common, "model": str(family["target"]), "max_len": 256, "tensor_parallel": tp},
        "arm": [{**draft, "gamma": 3, "name": "chain"}, {**draft, "gamma": 6, "tree_width": [2, 2], "name": "tree"}],
        "verifier": {"use": "reference"},
        "selector": {"use": "fixed"},
    }


@contextlib.contextmanager
def one_and_two(family: dict[str, Path], device: str) -> Iterator[tuple[Pipeline, Pipeline]]:
    """The pipeline of ``tensor_parallel = 1`` and that of 2; the second's worker ends on exit."""
    one, two = build_pipeline(config(family, 1, device)), build_pipeline(config(family, 2, device))
    assert isinstance(two.target, TensorParallelTarget)
    try:
        yield one, two
    finally:
        two.target.close()


def play(pipe: Pipeline, arm: str) -> Pipeline:
    """``pipe`` with its selector fixed on ``arm``."""
    pipe.selector = FixedSelector(FixedConfig(arm=ARMS.index(arm)), len(ARMS))
    return pipe
