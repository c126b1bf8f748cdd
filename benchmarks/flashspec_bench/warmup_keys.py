"""How many CUDA graphs the server's warm-up captures at each level, counted on the CPU.

A config's arms and target are rebuilt over the tiny random models (float32, CPU, the
config's ``max_len``): off the GPU a graph cache runs each function directly but still records
every key asked for, and the drafts' prewarm is run with ``off_gpu`` so its keys are recorded
too. The key set is a function of the shapes (slot counts, spans, widths, sampling), not of
the weights, so it is the set a GPU warm-up captures. :func:`report` writes the counts with
their provenance to ``docs/benchmarks/warmup-keys.json``, the numbers docs/serving.md quotes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_core.build import build_pipeline
from flashspec_core.testing.tiny import tiny_family
from flashspec_serve import warmup

SCRIPT = "benchmarks/warmup_keys.py"
DEVICE = "cpu (counting only)"  # keys are counted, not captured: no time here says anything about a GPU


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
        caches = _caches(pipeline)
        sizes = warmup.slot_sizes(max_batch, per_row=True)
        context = getattr(pipeline.target, "max_context", None)
        done = warmup.warm_up(pipeline, sizes, context, True, level=level)
    finally:
        FastDraft.prewarm = real  # type: ignore[method-assign]
    per_cache = {name: {b: sum(1 for k in c.keys if _batch(k) == b) for b in sizes} for name, c in caches.items()}
    per_size = {b: sum(n[b] for n in per_cache.values()) for b in sizes}
    return {"level": level, "max_batch": max_batch, "context": context, "keys": sum(len(c.keys) for c in caches.values()),
            "keys_per_slot_count": per_size, "keys_per_cache_and_slot_count": per_cache,
            "lengths": list(done.lengths), "steps": done.steps}


def _caches(pipeline: Any) -> dict[str, Any]:
    """The pipeline's graph caches, each once, under the names of the parts that share it
    (``"target"``, or the arms' names joined by commas)."""
    parts = [("target", pipeline.target), *((a.name, a.provider) for a in pipeline.policy.arms)]
    names: dict[int, list[str]] = {}
    caches: dict[int, Any] = {}
    for name, part in parts:
        if hasattr(part, "graphs"):
            names.setdefault(id(part.graphs), []).append(name)
            caches[id(part.graphs)] = part.graphs
    return {",".join(names[i]): c for i, c in caches.items()}


def _batch(key: Any) -> int:
    """A key's batch size: its first item, or its second after a tag (``"ragged"``, ``"tree"``)."""
    return int(key[1] if isinstance(key[0], str) else key[0])


def report(config: dict[str, Any], config_file: str, max_batches: Sequence[int], levels: Sequence[str],
           models: dict[str, Path]) -> dict[str, Any]:
    """The result record: provenance (device :data:`DEVICE`), the config as read, and one
    :func:`count` row per ``max_batch`` and level, counted over the tiny ``models``."""
    tiny = tiny_config(config, models)
    rows = [count(tiny, b, level) for b in max_batches for level in levels]
    return {**provenance(SCRIPT), "device": DEVICE, "cuda": None,
            "config": {"file": config_file, "tables": config, "max_batch": list(max_batches), "levels": list(levels)},
            "rows": rows}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="flashspec_core/configs/gpu.toml")
    p.add_argument("--max-batch", default="64", help="comma-separated: one set of rows per value")
    p.add_argument("--levels", default="basic,full")
    p.add_argument("--out", type=Path, default=DOCS / "warmup-keys.json", help="the result JSON ('-': print it only)")
    args = p.parse_args(argv)
    config = tomllib.loads(Path(args.config).read_text())
    max_batches = [int(b) for b in args.max_batch.split(",")]
    data = report(config, args.config, max_batches, args.levels.split(","), tiny_family(Path(tempfile.mkdtemp())))
    if str(args.out) == "-":
        print(json.dumps(data, indent=1))
    else:
        print(write_json(args.out, data))
    return 0
