"""A built pipeline's long-lived objects are out of the cyclic collector's reach."""

from __future__ import annotations

import gc
from pathlib import Path

from _tiny import tiny_lm

from flashspec_core.build import build_pipeline


def test_build_freezes_what_the_pipeline_holds(tmp_path: Path) -> None:
    tiny_lm(tmp_path / "target", vocab=16, scale=4.0)
    config = {"target": {"model": str(tmp_path / "target"), "dtype": "float32"},
              "arm": [{"use": "prompt_lookup", "gamma": 3}], "selector": {"use": "fixed"}}
    gc.unfreeze()
    pipeline = build_pipeline(config)
    try:
        # Frozen objects are in the permanent generation: no collection of any generation walks them.
        tracked = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
        assert gc.get_freeze_count() > 0
        assert id(pipeline) not in tracked
        assert id(pipeline.policy) not in tracked
        # what a step allocates afterwards is collected as usual
        garbage: list[object] = []
        garbage.append(garbage)
        assert id(garbage) in {id(o) for o in gc.get_objects(0)}
    finally:
        gc.unfreeze()
