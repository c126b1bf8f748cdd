"""The engine's warm-up: every arm at every slot count before the first request, the server
closed until it ends, its levels (``--warmup``, ``--no-warmup``) and progress lines, and graph
captures after it counted as a metric."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import torch
from _tiny import pipeline_dict
from conftest import MODEL, Server, make_pipeline
from structlog.testing import capture_logs

from flashspec_core.build import build_pipeline
from flashspec_core.contracts import Prewarmable, SamplingParams
from flashspec_core.pipeline import Pipeline
from flashspec_serve import cli, warmup
from flashspec_serve.app import ServeSettings, create_app
from flashspec_serve.engine import Engine, Job

GREEDY = SamplingParams(temperature=0.0)
# Room for the tiny pipeline's warm-up at lengths 2, 3 and 5 only: (4 arms + widths 0..4, greedy, + widths
# 0..4 sampled + 2 joins + 1) steps of up to 5 tokens
CONTEXT = 90


def _fast_pipeline(models: dict[str, Path]) -> Pipeline:
    config = pipeline_dict(models["target"], [models["close"]], "fixed", dtype="float32")
    config["target"] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
    config["arm"][0] |= {"use": "fast", "device": "cpu", "max_len": 128, "compile": False}
    return build_pipeline(config)


def _spy(obj: Any, name: str, log: list[Any], what: Callable[..., Any]) -> None:
    """Record ``what(*args)`` on each call of ``obj.name``, then call it."""
    real = getattr(obj, name)

    def spy(*args: Any) -> Any:
        log.append(what(*args))
        return real(*args)

    setattr(obj, name, spy)


@contextlib.contextmanager
def _warmed(pipeline: Pipeline, max_batch: int) -> Iterator[tuple[Engine, warmup.Warmup | None]]:
    """An engine of ``pipeline`` started with its warm-up, and the warm-up's record once it has
    ended; the engine stops on leaving."""
    engine = Engine(pipeline, max_batch=max_batch, context=CONTEXT)
    engine.start(warmup=True)
    try:
        yield engine, engine.wait_ready()
    finally:
        engine.stop(0.0)


class FakeGraphs:
    """A graph cache's counter (CapturesGraphs): ``captures`` goes up, with a key, as the test says."""

    def __init__(self) -> None:
        self.captures = 0
        self.captured: list[tuple[str, int, int]] = []
        self.keeps_keys = True  # False: a counter whose captured stops growing


def _capture_at_every_score(pipeline: Pipeline) -> FakeGraphs:
    """Give the target a graph counter that goes up at each of its scores, as if each captured
    one, keyed ``("score", call number, draft width)``."""
    graphs = FakeGraphs()
    pipeline.target.graphs = graphs  # type: ignore[attr-defined]
    real = pipeline.target.score

    def score(tokens: torch.Tensor, lengths: Sequence[int], draft: torch.Tensor) -> torch.Tensor:
        graphs.captures += 1
        if graphs.keeps_keys:
            graphs.captured.append(("score", graphs.captures, draft.shape[1]))
        return real(tokens, lengths, draft)

    pipeline.target.score = score  # type: ignore[method-assign,assignment]
    return graphs


def _unstarted_server(models: dict[str, Path]) -> Server:
    """A server of the tiny pipeline at the default warm-up level, its thread not yet started."""
    return Server(create_app(make_pipeline(models), ServeSettings(model_name=MODEL)))


def _decode(engine: Engine, job: Job) -> list[int]:
    async def main() -> list[int]:
        handle = engine.submit(job, asyncio.get_running_loop())
        events = [e async for e in handle.events()]
        assert events[-1].finish in ("stop", "length"), events[-1]
        return [t for e in events for t in e.token_ids]

    return asyncio.run(asyncio.wait_for(main(), 60))


def test_slot_sizes_are_those_a_rebuild_makes() -> None:
    assert warmup.slot_sizes(32, per_row=True) == [1, 2, 4, 8, 16, 32]
    assert warmup.slot_sizes(6, per_row=True) == [1, 2, 4, 6]
    assert warmup.slot_sizes(3, per_row=False) == [1, 2, 3]
    assert warmup.warm_lengths(65, 60) == [2, 3, 5]
    assert warmup.warm_lengths(2047, 270) == [2, 3, 5, 9, 17, 33, 65, 129, 257, 513, 1025]


def test_prefill_lengths_meet_every_prefill_width_up_to_the_limit() -> None:
    """A prefill of n tokens feeds n - 1 (the last is scored): every width 2^k up to the longest
    prefill, limit - 1 tokens, is met once, the widest by a prompt of the limit itself."""
    assert warmup.prefill_lengths(512) == [2, 3, 5, 9, 17, 33, 65, 129, 257, 512]
    assert warmup.prefill_lengths(90) == [2, 3, 5, 9, 17, 33, 65, 90]
    assert warmup.prefill_lengths(65) == warmup.prefill_lengths(None) == [2, 3, 5, 9, 17, 33, 65]
    for limit in (2, 3, 90, 512, 2047):
        widths = {1 << (n - 2).bit_length() for n in warmup.prefill_lengths(limit)}  # the next power of two of n - 1
        assert widths == {1 << (n - 2).bit_length() for n in range(2, limit + 1)}, limit
        assert max(warmup.prefill_lengths(limit)) == limit


def test_warm_up_plays_every_arm_and_width_at_every_slot_count(tiny_models: dict[str, Path]) -> None:
    """Each arm's own provider proposes at each slot count, the target scores every draft width
    0..max gamma at each, one row and then two join alone at each count with free slots (and at each
    prefill length every run of rows a join can bring, :func:`join_sizes`); the UCB1 selector
    learns nothing from it, and the policy gets its own arms back."""
    pipeline = make_pipeline(tiny_models, "ucb1")
    arms = list(pipeline.policy.arms)
    proposed: dict[str, list[int]] = {a.name: [] for a in arms}
    for arm in arms:
        _spy(arm.provider, "propose", proposed[arm.name], lambda _t, lengths, *_: len(lengths))
    scored: list[tuple[int, int]] = []
    _spy(pipeline.target, "score", scored, lambda _t, _l, draft: tuple(draft.shape))
    joined: list[tuple[int, tuple[int, ...]]] = []
    _spy(pipeline.target, "prefill_rows", joined, lambda tokens, _l, rows: (tokens.shape[0], tuple(rows)))
    with _warmed(pipeline, max_batch=4) as (_engine, done):
        # every 2^k + 1 with room for one step of the widest arm and the joins' (chunks)
        assert done is not None and done.sizes == (4, 2, 1) and done.lengths == (2, 3, 5, 9, 17, 33, 65)
    assert done.steps == 7 * ((14 + 2) + (14 + 1) + 14)  # per length: 9 greedy plays, 5 sampled, the joins
    for name, sizes in proposed.items():
        assert set(sizes) == {1, 2, 4}, name
    top = max(a.gamma for a in arms)
    assert {(b, w) for b, w in scored} >= {(b, w) for b in (1, 2, 4) for w in range(top + 1)}
    # the joins of _rejoin (one row, then two) and of the prefills (1, 2, then 3 rows of 4: join_sizes)
    assert {(size, rows) for size, rows in joined} == {(4, (3,)), (4, (2, 3)), (4, (1, 2, 3)), (2, (1,))}
    assert pipeline.policy.arms == arms
    assert all(sum(cast(Any, s).counts) == 0 for s in pipeline.policy.selectors)


@pytest.mark.parametrize("target", ["hf", "fast"])
def test_a_warmed_engine_decodes_as_alone(tiny_models: dict[str, Path], target: str) -> None:
    """The warm-up leaves no trace in the tokens: a request after it gets exactly its greedy
    continuation alone."""
    pipeline = _fast_pipeline(tiny_models) if target == "fast" else make_pipeline(tiny_models)
    job = Job((1, 2, 3), 12, GREEDY)
    want = pipeline.generate([list(job.prompt)], max_new_tokens=job.max_tokens, temperature=0.0).token_ids[0]
    with _warmed(pipeline, max_batch=2) as (engine, done):
        assert done is not None
        assert _decode(engine, job) == want


def test_captures_after_the_warm_up_are_counted_by_cache_and_logged_with_their_keys(
        tiny_models: dict[str, Path]) -> None:
    """The target "captures" a graph at every score: those of the warm-up are its record's, and
    those while serving the metric's under the target's cache, one for one, each logged with
    its cache and key (and none of the warm-up's)."""
    pipeline = make_pipeline(tiny_models)
    graphs = _capture_at_every_score(pipeline)
    with capture_logs() as logs, _warmed(pipeline, max_batch=2) as (engine, done):
        assert done is not None and done.captures == graphs.captures > 0
        before = graphs.captures
        _decode(engine, Job((1, 2, 3), 8, GREEDY))
        served = graphs.captured[before:]
    assert served
    value = engine.metrics.registry.get_sample_value("flashspec:graph_captures_while_serving_total",
                                                     {"cache": "target"})
    assert value == len(served)
    lines = [e for e in logs if e["event"] == "graph_captured_while_serving"]
    assert [(e["cache"], e["key"]) for e in lines] == [("target", str(key)) for key in served]
    assert all(e["log_level"] == "warning" and e["slots"] >= 1 for e in lines)


def test_a_counter_that_keeps_no_keys_still_counts_every_capture(tiny_models: dict[str, Path]) -> None:
    """A third-party cache whose ``captured`` falls behind its count: each capture is still counted
    and logged, the missing keys as None."""
    pipeline = make_pipeline(tiny_models)
    graphs = _capture_at_every_score(pipeline)
    # the engine logs a step's captures after the step, which may come after the job's last
    # token reached the test: count and read the log once the engine has stopped
    with capture_logs() as logs, _warmed(pipeline, max_batch=2) as (engine, _done):
        graphs.keeps_keys = False
        before = graphs.captures
        _decode(engine, Job((1, 2, 3), 8, GREEDY))
    served = graphs.captures - before
    lines = [e for e in logs if e["event"] == "graph_captured_while_serving"]
    assert served > 0 and len(lines) == served and {e["key"] for e in lines} == {"None"}
    assert engine.metrics.registry.get_sample_value("flashspec:graph_captures_while_serving_total",
                                                    {"cache": "target"}) == served


def _blocked_warm_up(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[str]]:
    """warm_up waits for the returned event; the list holds the level of each call."""
    release, calls = threading.Event(), []

    def warm_up(*_args: Any, level: str = "full", **_kw: Any) -> warmup.Warmup:
        calls.append(level)
        assert release.wait(30)
        return warmup.Warmup(0.5, 3, 0, 7, (1,), (2,), level)

    monkeypatch.setattr(warmup, "warm_up", warm_up)
    return release, calls


def test_the_server_takes_no_request_before_its_warm_up_ends(tiny_models: dict[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    release, calls = _blocked_warm_up(monkeypatch)
    srv = _unstarted_server(tiny_models)
    with capture_logs() as logs:
        srv.thread.start()
        try:
            time.sleep(0.5)
            assert calls == ["basic"] and not srv.server.started  # the server's default level
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{srv.url}/health", timeout=1.0)
            release.set()
            deadline = time.monotonic() + 30
            while not srv.server.started and time.monotonic() < deadline:
                time.sleep(0.01)
            assert httpx.get(f"{srv.url}/health", timeout=5.0).status_code == 200
        finally:
            release.set()
            srv.stop()
    line = next(e for e in logs if e["event"] == "engine_warmed_up")
    assert line["seconds"] == 0.5 and line["captures"] == 3 and line["steps"] == 7 and line["level"] == "basic"


def test_no_warmup_serves_at_once(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _release, calls = _blocked_warm_up(monkeypatch)
    srv = Server(create_app(make_pipeline(tiny_models), ServeSettings(model_name=MODEL, warmup=False))).start()
    try:
        assert httpx.get(f"{srv.url}/health", timeout=5.0).status_code == 200
        assert calls == [] and srv.engine.warmed is None
    finally:
        srv.stop()


def test_the_cli_picks_the_warm_up_level(tiny_models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """``--warmup`` takes each level, ``--no-warmup`` is ``off``, and the default is the bounded ``basic``."""
    import uvicorn

    import flashspec_core.build

    apps: list[Any] = []
    monkeypatch.setattr(flashspec_core.build, "load_pipeline", lambda *_a, **_k: make_pipeline(tiny_models))
    monkeypatch.setattr(uvicorn, "run", lambda app, **_kw: apps.append(app))
    for argv in (["--no-warmup"], [], ["--warmup", "full"], ["--warmup", "off"], ["--warmup", "basic"]):
        assert cli.main(argv) == 0
    assert [app.state.settings.warmup for app in apps] == ["off", "basic", "full", "off", "basic"]
    assert set(cli.WARMUP_LEVELS) == {*warmup.LEVELS, "off"}
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["--warmup", "most"])


def test_settings_take_a_level_or_a_switch() -> None:
    assert [ServeSettings(MODEL, warmup=w).warmup for w in (True, False, "full", "off")] == ["basic", "off", "full",
                                                                                             "off"]
    assert ServeSettings(MODEL).warmup == "basic"
    with pytest.raises(ValueError, match="most"):
        ServeSettings(MODEL, warmup="most")


def test_basic_bounds_the_dummy_lengths_and_full_does_not() -> None:
    full, basic = warmup.LEVELS["full"], warmup.LEVELS["basic"]
    assert full.limit(2047) == 2047 and full.limit(None) is None
    assert basic.limit(2047) == warmup.BASIC_LONGEST == basic.limit(None) and basic.limit(90) == 90
    assert max(warmup.warm_lengths(basic.limit(2047), 234)) == 257  # gpu.toml's growth: spans 128..512
    assert max(warmup.warm_lengths(full.limit(2047), 234)) == 1025


def test_a_length_s_steps_are_split_into_batches_that_have_room_for_them() -> None:
    """Near the limit a length's plays run in several dummy batches, each with room for its
    steps (up to gamma + 1 tokens each, and the joins' steps): the ladder's top length is warmed
    whatever the number of plays; without a known limit they run in one batch."""
    plays = [(object(), None)] * 25
    parts = warmup.chunks(plays, 129, 256, 8)  # type: ignore[arg-type]
    assert [len(p) for p in parts] == [11, 11, 3] and sum(parts, []) == plays
    for part in parts:
        assert 129 + warmup._room(len(part), 8) <= 256
    assert [len(p) for p in warmup.chunks(plays, 257, 2047, 8)] == [25]  # type: ignore[arg-type]
    assert [len(p) for p in warmup.chunks(plays, 129, None, 8)] == [25] and warmup.chunks([], 9, 256, 8) == []
    assert warmup.warm_lengths(256, warmup._room(1, 8))[-1] == 129  # the top length of a 256-slot cache


def _levels_run(tiny_models: dict[str, Path], level: str
                ) -> tuple[warmup.Warmup, list[tuple[int, int, int | None]], list[Any]]:
    """A warm-up at ``level`` of the fast pipeline at slot counts 2 and 1: its record, the drafts'
    prewarm calls (batch, gamma, longest) and its progress log lines."""
    pipeline = _fast_pipeline(tiny_models)
    prewarms: list[tuple[int, int, int | None]] = []
    for provider in {id(a.provider): a.provider for a in pipeline.policy.arms}.values():
        if isinstance(provider, Prewarmable):
            real = provider.prewarm

            def spy(batch: int, gamma: int, sampling: SamplingParams, off_gpu: bool = False,
                    longest: int | None = None, real: Any = real) -> int:
                prewarms.append((batch, gamma, longest))
                return int(real(batch, gamma, sampling, off_gpu=off_gpu, longest=longest))

            provider.prewarm = spy  # type: ignore[method-assign]
    with capture_logs() as logs:
        done = warmup.warm_up(pipeline, [1, 2], CONTEXT, per_row=True, level=level)
    return done, prewarms, [e for e in logs if e["event"] == "engine_warm_up_progress"]


def test_both_levels_run_the_drafts_prewarm_basic_bounded_to_its_longest(tiny_models: dict[str, Path]) -> None:
    """Below basic's bound both levels run the same dummy batches; both run the drafts' prewarm
    at every slot count, full over every span of the cache, basic over sequences of up to
    BASIC_LONGEST tokens."""
    full, full_prewarms, _ = _levels_run(tiny_models, "full")
    basic, basic_prewarms, _ = _levels_run(tiny_models, "basic")
    assert full.level == "full" and basic.level == "basic"
    assert sorted(set(full_prewarms)) == [(b, 3, None) for b in (1, 2)]
    assert sorted(set(basic_prewarms)) == [(b, 3, warmup.BASIC_LONGEST) for b in (1, 2)]
    assert basic.sizes == full.sizes == (2, 1) and basic.lengths == full.lengths == (2, 3, 5, 9, 17, 33, 65)
    assert basic.steps == full.steps > 0
    with pytest.raises(KeyError):
        warmup.warm_up(_fast_pipeline(tiny_models), [1], CONTEXT, per_row=True, level="off")


def test_a_progress_line_follows_each_slot_count(tiny_models: dict[str, Path]) -> None:
    """One line per slot count, largest first, with the captures and seconds so far and an estimate
    of the rest that reaches 0 at the last."""
    pipeline = make_pipeline(tiny_models)
    graphs = _capture_at_every_score(pipeline)
    with capture_logs() as logs:
        done = warmup.warm_up(pipeline, [1, 4, 2], CONTEXT, per_row=True, level="basic")
    lines = [e for e in logs if e["event"] == "engine_warm_up_progress"]
    assert [(e["size"], e["sizes_done"], e["sizes"]) for e in lines] == [(4, 1, 3), (2, 2, 3), (1, 3, 3)]
    captures = [e["captures"] for e in lines]
    assert captures == sorted(captures) and 0 < captures[0] < captures[-1] == done.captures == graphs.captures
    assert [e["seconds"] for e in lines] == sorted(e["seconds"] for e in lines) and lines[-1]["seconds"] <= round(done.seconds, 3)  # logged rounded to ms
    assert lines[0]["remaining_s"] > 0 and lines[-1]["remaining_s"] == 0 and all(e["level"] == "basic" for e in lines)


def test_remaining_is_the_mean_pace_times_the_counts_left() -> None:
    assert warmup.remaining(30.0, 2, 7) == 75.0
    assert warmup.remaining(30.0, 7, 7) == 0.0
    assert warmup.remaining(0.0, 0, 7) == 0.0


def test_a_failed_warm_up_keeps_the_server_from_starting(tiny_models: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def warm_up(*_args: Any, **_kw: Any) -> warmup.Warmup:
        raise RuntimeError("out of memory while capturing")

    monkeypatch.setattr(warmup, "warm_up", warm_up)
    srv = _unstarted_server(tiny_models)
    exits: list[object] = []

    def run() -> None:
        try:
            srv.server.run(sockets=[srv.sock])
        except SystemExit as exc:  # uvicorn's exit status for a failed startup
            exits.append(exc.code)

    thread = threading.Thread(target=run, daemon=True)
    with capture_logs() as logs:
        thread.start()
        thread.join(30)
    srv.sock.close()
    assert not thread.is_alive() and not srv.server.started and exits == [3]
    assert not srv.engine._thread.is_alive()
    assert any(e["event"] == "engine_warm_up_failed" for e in logs)
