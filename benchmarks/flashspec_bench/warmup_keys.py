"""How many CUDA graphs the server's warm-up captures at each level, counted on the CPU.

A config's arms and target are rebuilt over the tiny random models (float32, CPU, the
config's ``max_len``): off the GPU a graph cache runs each function directly but still records
every key asked for, and the drafts' prewarm is run with ``off_gpu`` so its keys are recorded
too. The key set is a function of the shapes (slot counts, spans, widths, sampling), not of
the weights, so it is the set a GPU warm-up captures. :func:`served` then replays a served
load (:class:`Load`, serve_bench's) through a warmed engine and lists, per cache, the keys its
requests asked for that the warm-up had not: each one a capture inside a request on the GPU.
:func:`report` writes the counts with their provenance to ``docs/benchmarks/warmup-keys.json``,
the numbers docs/serving.md quotes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from flashspec_bench.provenance import DOCS, logger, provenance, write_json
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import Prewarmable, SamplingParams
from flashspec_core.pipeline import Pipeline
from flashspec_core.testing.tiny import tiny_family
from flashspec_serve import warmup
from flashspec_serve.engine import Engine, Job

SCRIPT = "benchmarks/warmup_keys.py"
DEVICE = "cpu (counting only)"  # keys are counted, not captured: no time here says anything about a GPU
GREEDY = SamplingParams(temperature=0.0)  # serve-h200.json's sampling
say = logger("warmup_keys")


def tiny_config(config: dict[str, Any], models: dict[str, Path]) -> dict[str, Any]:
    """``config`` with every model replaced by a tiny one (the target's by the tiny target) on the CPU."""
    out = dict(config)
    cpu = {"device": "cpu", "dtype": "float32", "compile": False}
    out["target"] = {**config["target"], "model": str(models["target"]), "chat_template": False, **cpu}
    out["arm"] = [{**a, "model": str(models["close"]), **cpu} if "model" in a else a for a in config["arm"]]
    return out


def count(config: dict[str, Any], max_batch: int, level: str) -> dict[str, Any]:
    """The graph keys a warm-up at ``level`` asks for at every slot count up to ``max_batch``."""
    pipeline = counting(build_pipeline(config))
    caches: dict[str, Any] = warmup.graph_caches(pipeline)  # GraphCaches: keys counts every key asked for
    sizes = warmup.slot_sizes(max_batch, per_row=True)
    context = getattr(pipeline.target, "max_context", None)
    done = warmup.warm_up(pipeline, sizes, context, True, level=level)
    per_cache = {name: {b: sum(1 for k in c.keys if _batch(k) == b) for b in sizes} for name, c in caches.items()}
    per_size = {b: sum(n[b] for n in per_cache.values()) for b in sizes}
    shared = sum(1 for c in caches.values() for k in c.keys if _batch(k) is None)
    return {"level": level, "max_batch": max_batch, "context": context, "keys": sum(len(c.keys) for c in caches.values()),
            "keys_per_slot_count": per_size, "keys_any_slot_count": shared, "keys_per_cache_and_slot_count": per_cache,
            "lengths": list(done.lengths), "steps": done.steps, "prewarmed": done.prewarmed}


def counting(pipeline: Pipeline) -> Pipeline:
    """``pipeline`` with each :class:`Prewarmable` provider's prewarm run ``off_gpu``, so that
    on the CPU it records the keys it would capture (the pipeline is built for counting only)."""
    for provider in {id(a.provider): a.provider for a in pipeline.policy.arms}.values():
        if isinstance(provider, Prewarmable):
            provider.prewarm = functools.partial(provider.prewarm, off_gpu=True)  # type: ignore[method-assign]
    return pipeline


@attrs.frozen
class Load:
    """A served load like ``benchmarks/serve_bench.py``'s: at each concurrency in turn, that many
    closed-loop clients each send ``per_client`` greedy requests of ``max_tokens`` new tokens, the
    prompts' lengths taken in turn from ``prompt_lengths``."""

    concurrency: tuple[int, ...] = (1, 8, 32, 64)
    per_client: int = 4
    max_tokens: int = 128  # serve-h200.json's
    # Prompt lengths from a one-line question to a long code file: with 128 new tokens the longest
    # request is 428 tokens, inside basic's bound (warmup.BASIC_LONGEST).
    prompt_lengths: tuple[int, ...] = (12, 24, 40, 48, 56, 64, 100, 300)
    # Distinct tokens a prompt draws from (0: the vocabulary's): few make prompts that repeat
    # short runs, where a lookup finds matches of many lengths, as in code edits
    alphabet: int = 0

    def prompts(self, vocab: int) -> list[tuple[int, ...]]:
        """Seeded random prompts (tokens ``1 .. vocab - 2``: neither padding nor the tiny models' EOS)."""
        gen = torch.Generator().manual_seed(0)
        top = max(vocab - 1, 2) if self.alphabet <= 0 else min(max(vocab - 1, 2), self.alphabet + 1)
        return [tuple(torch.randint(1, top, (n,), generator=gen).tolist()) for n in self.prompt_lengths]


def served(config: dict[str, Any], max_batch: int, level: str, load: Load) -> dict[str, Any]:
    """Replay ``load`` through a server's engine warmed up at ``level``: the graph keys the served
    requests asked for that the warm-up had not, per cache, at each concurrency (every one a
    capture inside a request on the GPU). Requests run to ``max_tokens`` (EOS is ignored), as
    the real pair's did in serve-h200.json."""
    pipeline = counting(build_pipeline(config))
    pipeline.target.eos_token_ids = set()  # type: ignore[misc]  # every request runs its full length
    caches: dict[str, Any] = warmup.graph_caches(pipeline)  # GraphCaches: keys counts every key asked for
    engine = Engine(pipeline, max_batch=max_batch)
    engine.start(warmup=True, level=level)
    try:
        engine.wait_ready()
        warmed = {name: set(c.keys) for name, c in caches.items()}
        prompts = load.prompts(pipeline.target.vocab)
        missed: dict[str, dict[str, list[str]]] = {}
        for clients in load.concurrency:
            tokens = asyncio.run(_clients(engine, prompts, clients, load))
            new = {name: sorted(map(str, set(c.keys) - warmed[name])) for name, c in caches.items()}
            missed[f"c{clients}"] = {name: keys for name, keys in new.items() if keys}
            say(f"{level}: {clients} clients, {tokens} tokens, {sum(map(len, missed[f'c{clients}'].values()))} keys missed")
            for name, c in caches.items():  # each level reports what it met first
                warmed[name] |= c.keys
    finally:
        engine.stop(0.0)
    total = sum(len(keys) for per in missed.values() for keys in per.values())
    return {"level": level, "max_batch": max_batch, "load": attrs.asdict(load), "missed": total,
            "missed_per_concurrency": {c: sum(map(len, per.values())) for c, per in missed.items()},
            "missed_keys": missed}


async def _clients(engine: Engine, prompts: Sequence[tuple[int, ...]], clients: int, load: Load) -> int:
    """``clients`` closed-loop clients of ``load.per_client`` requests each; the tokens they got."""
    loop = asyncio.get_running_loop()

    async def client(c: int) -> int:
        got = 0
        for k in range(load.per_client):
            prompt = prompts[(c * load.per_client + k) % len(prompts)]
            handle = engine.submit(Job(prompt, load.max_tokens, GREEDY), loop)
            async for event in handle.events():
                if event.finish is not None and event.finish not in ("stop", "length"):
                    raise RuntimeError(f"a served request ended with {event.finish}: {event.error}")
                got += len(event.token_ids)
        return got

    return sum(await asyncio.gather(*(client(c) for c in range(clients))))


def _batch(key: Any) -> int | None:
    """A key's batch size: its first item, or its second after a tag (``"ragged"``, ``"tree"``);
    None for a rows-forward (``"rows"``: a run of joining rows, whatever the slot count)."""
    if key[0] == "rows":
        return None
    return int(key[1] if isinstance(key[0], str) else key[0])


def report(config: dict[str, Any], config_file: str, max_batches: Sequence[int], levels: Sequence[str],
           models: dict[str, Path], load: Load | None = None, served_levels: Sequence[str] = ("basic",)
           ) -> dict[str, Any]:
    """The result record: provenance (device :data:`DEVICE`), the config as read, one
    :func:`count` row per ``max_batch`` and level, counted over the tiny ``models``, and with
    ``load`` one :func:`served` row per level of ``served_levels`` at the largest ``max_batch``."""
    tiny = tiny_config(config, models)
    rows = [count(tiny, b, level) for b in max_batches for level in levels]
    out = {**provenance(SCRIPT), "device": DEVICE, "cuda": None,
           "config": {"file": config_file, "tables": config, "max_batch": list(max_batches), "levels": list(levels)},
           "rows": rows}
    if load is not None:
        out["config"]["served_levels"] = list(served_levels)
        out["served"] = [served(tiny, max(max_batches), level, load) for level in served_levels]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="flashspec_core/configs/gpu.toml")
    p.add_argument("--max-batch", default="64", help="comma-separated: one set of rows per value")
    p.add_argument("--levels", default="basic,full")
    p.add_argument("--served-levels", default="basic",
                   help="levels to replay a served load after ('' : none; the server's default is basic)")
    p.add_argument("--out", type=Path, default=DOCS / "warmup-keys.json", help="the result JSON ('-': print it only)")
    args = p.parse_args(argv)
    config = tomllib.loads(Path(args.config).read_text())
    max_batches = [int(b) for b in args.max_batch.split(",")]
    data = report(config, args.config, max_batches, args.levels.split(","), tiny_family(Path(tempfile.mkdtemp())),
                  Load() if args.served_levels else None, [v for v in args.served_levels.split(",") if v])
    if str(args.out) == "-":
        print(json.dumps(data, indent=1))
    else:
        print(write_json(args.out, data))
    return 0
