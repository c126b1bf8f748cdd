"""The engine under load: the queue limit, disconnects, sampling groups, shutdown, 200 concurrent streams."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import MODEL, Server, make_pipeline, serve

from flashspec_core.contracts import RowSampling, SamplingParams
from flashspec_core.pipeline import Pipeline
from flashspec_serve.engine import Engine, Event, Job

PROMPTS = ["t1 t2 t3", "t3 t4", "t7 t8 t9 t1 t2", "t5", "t2 t2 t6", "t9 t8 t7 t6", "t11 t3 t5 t1", "t4 t12"]
LONGEST = 24


@pytest.fixture(scope="module")
def alone(tiny_models: dict[str, Path]) -> Pipeline:
    return make_pipeline(tiny_models)


@pytest.fixture(scope="module")
def expected(alone: Pipeline) -> dict[str, list[int]]:
    """Each prompt's greedy continuation when it runs alone."""
    return {p: alone.generate([p], max_new_tokens=LONGEST, temperature=0.0).token_ids[0] for p in PROMPTS}


@pytest.fixture()
def slow(tiny_models: dict[str, Path]) -> Iterator[Server]:
    """One row at a time, one waiting, 20 ms a step: a long request is still running when the test looks."""
    pipeline = make_pipeline(tiny_models)
    pipeline.on_step = lambda _record: time.sleep(0.02)
    srv = serve(pipeline, max_batch=1, max_waiting=1)
    yield srv
    srv.stop()


async def _lines(r: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in r.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


def _body(prompt: str, max_tokens: int, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream, **extra}


async def _wait_for(client: httpx.AsyncClient, **state: int) -> None:
    for _ in range(400):
        health = (await client.get("/health")).json()
        if all(health[k] == v for k, v in state.items()):
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"the server never reached {state}: {health}")


def test_a_full_queue_is_429_with_retry_after(slow: Server) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=slow.url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=_body("t1 t2", 400)) as first:
                chunks = _lines(first)  # held: a dropped generator would close the stream
                await anext(chunks)  # running: the batch is full
                second = asyncio.create_task(client.post("/v1/completions", json=_body("t3", 4, stream=False)))
                await _wait_for(client, waiting=1)
                third = await client.post("/v1/completions", json=_body("t3", 4, stream=False))
                assert third.status_code == 429 and third.headers["retry-after"] == "1"
                assert third.json()["error"]["type"] == "rate_limit_error"
                await chunks.aclose()
            assert (await second).status_code == 200  # the first stream's close freed the row

    asyncio.run(run())


def test_a_client_that_disconnects_frees_its_row(slow: Server) -> None:
    async def run() -> None:
        async with httpx.AsyncClient(base_url=slow.url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=_body("t1 t2", 400)) as r:
                chunks = _lines(r)
                await anext(chunks)
                await anext(chunks)
            await _wait_for(client, running=0)
            with pytest.raises(httpx.ReadTimeout):  # non-streaming: the server polls the connection
                await client.post("/v1/completions", json=_body("t1 t2", 400, stream=False), timeout=0.3)
            await _wait_for(client, running=0)
            metrics = (await client.get("/metrics")).text
        made = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("flashspec:generation_tokens_total"))
        assert made < 400  # neither request ran to its end (20 ms a step: 400 tokens take over 2 s)

    asyncio.run(run())


def test_mixed_sampling_settings_share_the_batch(server: Server, expected: dict[str, list[int]],
                                                alone: Pipeline) -> None:
    """Greedy, sampled and seeded requests decode together: greedy rows get their continuation
    alone, the seeded one its tokens alone (same seed), and the batch held all three at once."""
    seeded = RowSampling([SamplingParams(temperature=1.3, top_k=5)], seeds=[7])
    want = alone.generate([PROMPTS[1]], max_new_tokens=8, rows=seeded).texts[0]
    sizes: list[int] = []
    server.engine.pipeline.on_step = lambda record: sizes.append(record.batch_size)

    async def run() -> list[Any]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            calls = [client.post("/v1/completions", json=_body(PROMPTS[0], LONGEST, stream=False)),
                     client.post("/v1/completions", json=_body(PROMPTS[1], 8, stream=False, temperature=1.3,
                                                               top_k=5, seed=7)),
                     client.post("/v1/completions", json=_body(PROMPTS[3], 8, stream=False, temperature=0.7,
                                                               top_p=0.9)),
                     client.post("/v1/completions", json=_body(PROMPTS[2], LONGEST, stream=False))]
            return [r.json() for r in await asyncio.gather(*calls)]

    try:
        greedy0, sampled, other, greedy2 = asyncio.run(run())
    finally:
        server.engine.pipeline.on_step = None
    assert greedy0["choices"][0]["text"] == alone.target.decode(expected[PROMPTS[0]])
    assert greedy2["choices"][0]["text"] == alone.target.decode(expected[PROMPTS[2]])
    assert sampled["choices"][0]["text"] == want
    assert other["usage"]["completion_tokens"] == 8 or other["choices"][0]["finish_reason"] == "stop"
    assert max(sizes) >= 3  # they ran together


def test_200_concurrent_streams_none_lost_duplicated_or_mixed(server: Server, expected: dict[str, list[int]],
                                                              alone: Pipeline) -> None:
    """Every stream gets exactly its prompt's greedy continuation alone; every tenth hangs up midway."""
    n = 200

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, str, str | None, set[str]]:
        prompt, max_tokens = PROMPTS[i % len(PROMPTS)], 4 + (i * 7) % (LONGEST - 3)
        text, finish, ids = "", None, set()
        async with client.stream("POST", "/v1/completions", json=_body(prompt, max_tokens)) as r:
            assert r.status_code == 200, await r.aread()
            async for chunk in _lines(r):
                ids.add(chunk["id"])
                text += chunk["choices"][0]["text"]
                finish = chunk["choices"][0]["finish_reason"]
                if i % 10 == 3 and text:
                    break  # hang up midway
        return i, text, finish, ids

    async def run() -> list[tuple[int, str, str | None, set[str]]]:
        limits = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            results = await asyncio.gather(*(one(client, i) for i in range(n)))
            await _wait_for(client, running=0, waiting=0)
        return results

    results = asyncio.run(run())
    seen: set[str] = set()
    for i, text, finish, ids in results:
        prompt, max_tokens = PROMPTS[i % len(PROMPTS)], 4 + (i * 7) % (LONGEST - 3)
        want = alone.target.decode(expected[prompt][:max_tokens])
        assert len(ids) == 1 and not ids & seen, f"request {i}: ids {ids}"
        seen |= ids
        if i % 10 == 3:
            assert want.startswith(text) and text, f"request {i}: {text!r} is not a prefix of {want!r}"
        else:
            assert (text, finish is not None) == (want, True), f"request {i}"


def _engine_run(pipeline: Pipeline, grace_s: float, max_tokens: int) -> list[Event]:
    """Two requests in flight when the engine stops with ``grace_s``; their last events."""
    engine = Engine(pipeline, max_batch=4)
    engine.start()

    async def run() -> list[Event]:
        loop = asyncio.get_running_loop()
        greedy = SamplingParams(temperature=0.0)
        handles = [engine.submit(Job((1, 2, 3), max_tokens, greedy), loop) for _ in range(2)]
        await handles[0].get()  # decoding has begun
        stopping = asyncio.create_task(asyncio.to_thread(engine.stop, grace_s))
        lasts = []
        for h in handles:
            async for event in h.events():
                last = event
            lasts.append(last)
        await stopping
        return lasts

    return asyncio.run(run())


def test_shutdown_finishes_running_requests_within_the_grace(alone: Pipeline) -> None:
    assert [e.finish for e in _engine_run(alone, 30.0, 40)] == ["length", "length"]


def test_shutdown_aborts_what_outlives_the_grace(alone: Pipeline) -> None:
    lasts = _engine_run(alone, 0.0, 400)
    assert [e.finish for e in lasts] == ["abort", "abort"]
    assert all(0 < e.completion_tokens < 400 for e in lasts)


def test_a_context_above_the_pipelines_is_refused_when_the_engine_is_made(alone: Pipeline) -> None:
    """``--max-model-len`` above what the caches hold would admit requests that fail inside a step,
    aborting every row of the batch: the engine refuses it when made, naming both lengths."""
    held = alone.max_context
    assert held is not None and Engine(alone).context == held and Engine(alone, context=held - 1).context == held - 1
    with pytest.raises(ValueError, match=rf"^--max-model-len {held + 1} is above the pipeline's context of {held} "
                                         rf"tokens .*: pass at most {held}"):
        Engine(alone, context=held + 1)
