"""The engine's memory stays flat over 1,000 requests: RSS, KV rows and live request objects."""

from __future__ import annotations

import asyncio
import gc
import os
from pathlib import Path

import pytest
from conftest import make_pipeline

from flashspec_core.contracts import SamplingParams
from flashspec_serve.engine import Engine, Handle, Job

REQUESTS, WAVE, MAX_BATCH = 1000, 100, 16
PROMPTS = [(1, 2, 3), (3, 4), (7, 8, 9, 1, 2), (5,), (2, 2, 6), (9, 8, 7, 6), (11, 3, 5, 1), (4, 12)]
SETTINGS = [SamplingParams(0.0), SamplingParams(0.8, top_p=0.9), SamplingParams(1.2, top_k=4)]
# Allocator noise over the waves after the first two (measured: under 1 MB); a leak of one
# KV cache row or token buffer per request would be over 10x this by the last wave.
RSS_GROWTH_MB = 24.0


def _jobs(wave: int) -> list[Job]:
    return [Job(PROMPTS[i % len(PROMPTS)], 3 + i % 6, SETTINGS[i % len(SETTINGS)], seed=i if i % 4 == 0 else None)
            for i in range(wave * WAVE, (wave + 1) * WAVE)]


def _rss_mb() -> float:
    """This process's resident memory now (Linux's /proc; the peak would hide a late leak)."""
    statm = Path("/proc/self/statm")
    if not statm.exists():
        pytest.skip("needs /proc/self/statm (Linux)")
    return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _cache_rows(pipeline: object) -> int:
    """Rows of the hf target's KV cache (0 before its first prefill)."""
    layers = pipeline.target.lm.cache.layers  # type: ignore[attr-defined]
    keys = getattr(layers[0], "keys", None) if layers else None
    return 0 if keys is None else int(keys.shape[0])


@pytest.mark.slow  # about 20 s on an idle CPU: 1,000 requests, each join re-prefilling the batch
def test_a_thousand_requests_leave_memory_flat(tiny_models: dict[str, Path]) -> None:
    pipeline = make_pipeline(tiny_models)
    engine = Engine(pipeline, max_batch=MAX_BATCH, max_waiting=WAVE)
    rows: list[int] = []
    pipeline.on_step = lambda record: rows.append(max(_cache_rows(pipeline), engine._tokens.shape[0]))
    rss: list[float] = []
    engine.start()

    async def wave(jobs: list[Job]) -> list[str | None]:
        loop = asyncio.get_running_loop()
        handles = [engine.submit(j, loop) for j in jobs]
        finishes = []
        for h in handles:
            async for event in h.events():
                last = event
            finishes.append(last.finish)
        return finishes

    try:
        for w in range(REQUESTS // WAVE):
            finishes = asyncio.run(wave(_jobs(w)))
            assert set(finishes) <= {"stop", "length"}, finishes
            gc.collect()
            rss.append(_rss_mb())
    finally:
        engine.stop()
    assert len(rows) >= REQUESTS // MAX_BATCH and max(rows) <= MAX_BATCH, f"KV rows per step up to {max(rows)}"
    growth = max(rss[2:]) - rss[1]
    assert growth < RSS_GROWTH_MB, f"RSS per wave (MB): {[round(r, 1) for r in rss]}"
    live = [o for o in gc.get_objects() if type(o) is Handle]
    assert len(live) <= MAX_BATCH, f"{len(live)} request handles still alive after every request finished"
