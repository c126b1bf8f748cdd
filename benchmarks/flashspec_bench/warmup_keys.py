"""How many CUDA graphs the server's warm-up captures at each level, counted on the CPU.

A config's arms and target are rebuilt over the tiny random models (float32, CPU, the
config's ``max_len``): off the GPU a graph cache runs each function directly but still records
every key asked for, and the drafts' prewarm is run with ``off_gpu`` so its keys are recorded
too. The key set is a function of the shapes (slot counts, spans, widths, sampling), not of
the weights, so it is the set a GPU warm-up captures.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashspec_core.build import build_pipeline
from flashspec_core.testing.tiny import tiny_family
from flashspec_serve import warmup


def tiny_config(config: dict[str, Any], models: dict[str, Path]) -> dict[str, Any]:
    """``config`` with every model replaced by a tiny one (the target's by the tiny target) on the CPU."""
    out = dict(config)
    cpu = {"device": "cpu", "dtype": "float32", "compile": False}
    out["target"] = {**config["target"], "model": str(models["target"]), "chat_template": False, **cpu}
    out["arm"] = [{**a, "model": str(models["close"]), **cpu} if "model" in a else a for a in config["arm"]]
    return out


def count(config: dict[str, Any], max_batch: int, level: str) -> dict[str, Any]:
    """The graph keys a warm-up at ``level`` asks for at every slot count up to ``max_batch``."""
    from flashspec_fast.draft import FastDraft

    real = FastDraft.prewarm
    FastDraft.prewarm = lambda self, b, g, s, off_gpu=True: real(self, b, g, s, off_gpu=True)  # type: ignore[method-assign]
    try:
        pipeline = build_pipeline(config)
        parts = (pipeline.target, *(a.provider for a in pipeline.policy.arms))
        caches = list({id(p.graphs): p.graphs for p in parts if hasattr(p, "graphs")}.values())
        sizes = warmup.slot_sizes(max_batch, per_row=True)
        done = warmup.warm_up(pipeline, sizes, getattr(pipeline.target, "max_context", None), True, level=level)
    finally:
        FastDraft.prewarm = real  # type: ignore[method-assign]
    per_size = {b: sum(1 for c in caches for k in c.keys if _batch(k) == b) for b in sizes}
    return {"level": level, "max_batch": max_batch, "keys": sum(len(c.keys) for c in caches),
            "keys_per_slot_count": per_size, "lengths": list(done.lengths), "steps": done.steps}


def _batch(key: Any) -> int:
    """A key's batch size: its first item, or its second after a tag (``"ragged"``, ``"tree"``)."""
    return int(key[1] if isinstance(key[0], str) else key[0])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="flashspec_core/configs/gpu.toml")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--levels", default="basic,full")
    args = p.parse_args(argv)
    config = tomllib.loads(Path(args.config).read_text())
    config = tiny_config(config, tiny_family(Path(tempfile.mkdtemp())))
    rows = [count(config, args.max_batch, level) for level in args.levels.split(",")]
    print(json.dumps({"config": args.config, "rows": rows}, indent=1))
    return 0
