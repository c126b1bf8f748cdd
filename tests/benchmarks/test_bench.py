"""Smoke test of ``flashspec bench`` on tiny models, with the HF baselines that run on CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import flashspec_bench.harness as bench
from flashspec_bench.harness import Tour, main, prewarm_drafts
from flashspec_bench.runs import batches, first_divergence, graph_captures, summarize_run
from flashspec_core.cli import main as cli_main
from flashspec_core.testing.tiny import perturbed_lm, tiny_lm
from flashspec_fast.graphs import GraphCache


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bench")
    target = tiny_lm(root / "target", vocab=16, seed=0, scale=8.0)
    draft = perturbed_lm(target, root / "draft", noise=0.05, seed=1)
    workload = root / "w.jsonl"
    workload.write_text("\n".join(json.dumps(r) for r in (
        {"prompt": "t1 t2 t3 t4 t1 t2", "domain": "code"},
        {"prompt": "t5 t6", "domain": "prose"},
        {"prompt": "t7 t8 t9 t1 t2 t3", "domain": "code"},
    )))
    config = root / "c.toml"
    config.write_text(f"""
[target]
use = "fast"
model = "{target}"
dtype = "float32"
chat_template = false
max_len = 128

[[arm]]
use = "fast"
model = "{draft}"
dtype = "float32"
max_len = 128
gamma = 3
name = "draft-g3"

[[arm]]
use = "prompt_lookup"
gamma = 4
name = "lookup"

[[arm]]
use = "none"
name = "none"

[verifier]
use = "reference"

[selector]
use = "ucb1"
reward = "throughput"
""")
    return {"workload": workload, "config": config, "root": root}


def test_bench_writes_json(setup: dict[str, Path]) -> None:
    out = setup["root"] / "out"
    rc = main([
        "--workload", str(setup["workload"]), "--config", str(setup["config"]), "--out", str(out),
        "--max-new-tokens", "12", "--systems", "flashspec,target_only,hf_eager,hf_assisted,hf_lookup",
        "--exactness", "2",
    ])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    s = data["summaries"]
    assert {"target_only", "fixed:draft-g3", "fixed:lookup", "hf_eager", "hf_assisted", "hf_lookup"} <= set(s)
    assert any(k.startswith("bandit:") for k in s)
    assert all(v.get("tokens_per_s", 0) > 0 for v in s.values()), s
    assert data["exactness"]["greedy_identical"] is True
    assert data["draft_prewarm"]["ran"] is True  # off the GPU nothing is captured
    # Greedy: every FlashSpec system and HF's own greedy baselines emit the same tokens.
    want = {r["prompt"]: r["tokens"] for r in data["runs"]["target_only"]["requests"]}
    for name in ("fixed:draft-g3", "fixed:lookup", "hf_eager", "hf_assisted", "hf_lookup"):
        assert {r["prompt"]: r["tokens"] for r in data["runs"][name]["requests"]} == want, name
    summary = data["summary"]
    assert summary["speedup_vs_hf_generate"] > 0 and "mean_accepted_length" in summary
    steps = data["runs"]["fixed:draft-g3"]["steps"]
    assert steps and {"draft_ms", "target_ms", "verify_ms", "host_ms", "accepted"} <= set(steps[0])
    assert len(s["fixed:draft-g3"]["arms"]["draft-g3"]["acceptance_by_position"]) == 3


def test_cli_has_bench_with_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["bench", "--", "--help"])  # the core CLI passes on what follows "--"
    assert exc.value.code == 0
    assert "--workload" in capsys.readouterr().out


def test_helpers() -> None:
    assert batches(5, 2) == [[0, 1], [2, 3], [4, 0]]
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2 and first_divergence([1], [1]) is None
    run = {"requests": [{"prompt": 0, "domain": "x", "new_tokens": 10, "wall_s": 2.0, "batch": [0, 1], "batch_id": 7},
                        {"prompt": 1, "domain": "x", "new_tokens": 6, "wall_s": 2.0, "batch": [0, 1], "batch_id": 7}]}
    assert summarize_run(run)["tokens_per_s"] == 8.0 and "graph_captures" not in summarize_run(run)
    for r, n in zip(run["requests"], (3, 3), strict=True):
        r["graph_captures"] = n  # the batch's count, on each of its requests
    assert summarize_run(run)["graph_captures"] == 3


def test_tour_plays_every_arm_in_runs_of_one_to_four() -> None:
    tour, played = Tour(3), []
    for _ in range(3 * (1 + 2 + 3 + 4) + 3):
        played.append(tour.select())
        tour.update(played[-1], 0.5)
    assert played == [0, 1, 2, 0, 0, 1, 1, 2, 2, 0, 0, 0, 1, 1, 1, 2, 2, 2, *[0] * 4, *[1] * 4, *[2] * 4, 0, 1, 2]


def test_graph_captures_counts_each_cache_once() -> None:
    """The target's, the verifier's and the drafts' graph caches; two arms sharing a provider
    count it once; the count survives clear() (a reallocated cache captures again)."""

    class Part:
        def __init__(self, captures: int) -> None:
            self.graphs = GraphCache(torch.device("cpu"), enabled=False)
            self.graphs.captures = captures

    class Arm:
        def __init__(self, provider: object) -> None:
            self.provider = provider

    target, verifier, draft = Part(4), Part(2), Part(3)
    pipe = type("P", (), {"target": target, "verifier": verifier, "arms": [Arm(draft), Arm(draft), Arm(object())]})()
    assert graph_captures(pipe) == 9
    draft.graphs.clear()
    assert graph_captures(pipe) == 9


def test_warm_up_runs_every_batch_and_leaves_the_selector_untrained(
    setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default warm-up covers every batch (no capture lands in a timed run), on copies:
    each timed repeat's selector starts untrained and sees exactly that repeat's steps;
    rows carry their repeat, and the summary gives tokens/s per repeat."""
    from flashspec_core.build import build_pipeline

    assert bench.warm_groups([[0], [1], [2]], -1) == [[0], [1], [2]] and bench.warm_groups([[0], [1]], 1) == [[0]]
    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(setup["config"]),
                                      "--out", str(setup["root"] / "o2"), "--max-new-tokens", "8",
                                      "--no-fixed-arms", "--systems", "flashspec", "--repeats", "2"])
    assert args.warmup == -1
    args.systems = ["flashspec"]
    pipe = build_pipeline(bench.load_config_dict(args.config, args.dtype, args.fuse, args.quantization))
    prompts = [pipe.target.encode(p) for p in ("t1 t2 t3 t4 t1 t2", "t5 t6", "t7 t8 t9 t1 t2 t3")]
    real, seen = bench.run_pipeline, []

    def spy(pipeline: Any, *a: Any) -> dict[str, Any]:
        before = pipeline.selector.t
        run = real(pipeline, *a)
        seen.append((before, pipeline.selector.t, len(run["steps"])))
        arms.append((type(pipeline.selector).__name__, {s["arm_name"] for s in run["steps"]}))
        return run

    arms: list[tuple[str, set[str]]] = []

    monkeypatch.setattr(bench, "run_pipeline", spy)
    runs: dict[str, dict] = {}
    bench.flashspec_runs(pipe, prompts, batches(3, 1), args, ["code", "prose", "code"],
                         lambda n, r: runs.__setitem__(n, r))
    (name,) = runs
    assert len(seen) == 1 + 2 * 3  # the warm-up over all three batches, then two repeats batch by batch
    warm, timed = seen[0], seen[1:]
    assert warm[0] == 0 and warm[1] == warm[2] > 0
    assert arms[0] == ("Tour", {a.name for a in pipe.arms if a.selectable})  # the warm-up toured every arm
    assert {kind for kind, _ in arms[1:]} == {type(pipe.selector).__name__}
    for rep in (timed[:3], timed[3:]):  # UCB1's step count: its own repeat's alone, carried from batch to batch
        assert rep[0][0] == 0
        for (_, after, _), (before, _, _) in zip(rep, rep[1:], strict=False):
            assert before == after
        assert all(after - before == steps > 0 for before, after, steps in rep)
    assert [r["repeat"] for r in runs[name]["requests"]] == [0, 0, 0, 1, 1, 1]
    assert {s["repeat"] for s in runs[name]["steps"]} == {0, 1}
    assert len(bench.summarize_run(runs[name])["tokens_per_s_by_repeat"]) == 2


def _bandit_and_target_only(setup: dict[str, Path], out: str, repeats: int) -> tuple[Any, Any, Any]:
    """The harness module, its args (target-only and the config's bandit, no fixed arms) and the pipeline."""
    from flashspec_core.build import build_pipeline

    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(setup["config"]),
                                      "--out", str(setup["root"] / out), "--no-fixed-arms", "--repeats", str(repeats)])
    args.systems = ["target_only", "flashspec"]
    return bench, args, build_pipeline(bench.load_config_dict(args.config, args.dtype, args.fuse, args.quantization))


def test_every_system_warms_up_first_and_repeats_alternate_the_order(
    setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Warm-ups of all systems come before any timed run, and with one batch the timed runs go
    A B, B A, A B (a drift over the run weighs on every system alike); each repeat is recorded."""
    bench, args, pipe = _bandit_and_target_only(setup, "o3", repeats=3)
    calls: list[tuple[str, bool]] = []

    def fake_run(pipeline: Any, prompts: Any, groups: Any, args: Any, domains: Any) -> dict[str, Any]:
        calls.append((pipeline.arms[0].name if len(pipeline.arms) == 1 else "bandit", groups == ["warm"]))
        return {"requests": [{"new_tokens": 1}], "steps": []}

    monkeypatch.setattr(bench, "run_pipeline", fake_run)
    monkeypatch.setattr(bench, "warm_groups", lambda groups, warmup: ["warm"])
    recorded: dict[str, int] = {}
    bench.flashspec_runs(pipe, [[1]], [[0]], args, ["code"], lambda n, r: recorded.__setitem__(n, len(r["requests"])))
    assert calls == [("none", True), ("bandit", True),
                     ("none", False), ("bandit", False), ("bandit", False), ("none", False), ("none", False), ("bandit", False)]
    assert recorded == {"target_only": 3, "bandit:UCB1": 3}


def test_first_arm_runs_in_every_system_but_target_only(
    setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """[selector] first stays on for the fixed arms and the bandits (a fixed arm is then "the
    first arm, else this one") and is off for target-only, whose one arm is plain decoding."""
    from flashspec_core.build import build_pipeline

    text = setup["config"].read_text().replace('name = "lookup"\n', 'name = "lookup"\nmin_ngram = 2\nfill = false\n'
                                                'select = false\n')
    gated = setup["root"] / "gated.toml"
    gated.write_text(text.replace('reward = "throughput"\n', 'reward = "throughput"\nfirst = "lookup"\n'))
    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(gated),
                                      "--out", str(setup["root"] / "o4"), "--max-new-tokens", "8", "--warmup", "0"])
    args.systems = ["target_only", "flashspec"]
    pipe = build_pipeline(bench.load_config_dict(args.config, args.dtype, args.fuse, args.quantization))
    assert pipe.first == 1 and pipe.choices == [0, 2]
    real, firsts = bench.run_pipeline, {}

    def spy(pipeline: Any, *a: Any) -> dict[str, Any]:
        run = real(pipeline, *a)
        firsts[tuple(sorted({s["arm_name"] for s in run["steps"]}))] = pipeline.first
        return run

    monkeypatch.setattr(bench, "run_pipeline", spy)
    runs: dict[str, dict] = {}
    prompts = [pipe.target.encode(p) for p in ("t1 t2 t3 t4 t1 t2", "t5 t6", "t7 t8 t9 t1 t2 t3")]
    bench.flashspec_runs(pipe, prompts, batches(3, 1), args, ["code", "prose", "code"],
                         lambda n, r: runs.__setitem__(n, r))
    assert set(runs) == {"target_only", "fixed:draft-g3", "fixed:lookup", "bandit:UCB1"}
    arms = {n: {s["arm_name"] for s in r["steps"]} for n, r in runs.items()}
    assert arms["target_only"] == {"none"}
    assert arms["fixed:draft-g3"] == {"lookup", "draft-g3"}  # matched lookup steps, the draft elsewhere
    assert arms["fixed:lookup"] == {"lookup"}  # the first arm, else the same arm again: nothing, a plain step
    assert "lookup" in arms["bandit:UCB1"] and pipe.first == 1
    assert firsts[("none",)] is None and firsts[("draft-g3", "lookup")] == 1


def test_systems_take_turns_batch_by_batch(setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a repeat the systems alternate per batch, and who goes first rotates with the
    batch and the repeat, so each system goes first equally often over an even number of turns."""
    bench, args, pipe = _bandit_and_target_only(setup, "o5", repeats=2)
    calls: list[tuple[str, list]] = []

    def fake_run(pipeline: Any, prompts: Any, groups: Any, args: Any, domains: Any) -> dict[str, Any]:
        calls.append(("A" if len(pipeline.arms) == 1 else "B", groups))
        return {"requests": [{"new_tokens": 1, "prompt": g[0]} for g in groups], "steps": []}

    monkeypatch.setattr(bench, "run_pipeline", fake_run)
    monkeypatch.setattr(bench, "warm_groups", lambda groups, warmup: ["warm"])
    recorded: dict[str, list] = {}
    bench.flashspec_runs(pipe, [[1], [2]], [[0], [1]], args, ["code", "prose"],
                         lambda n, r: recorded.__setitem__(n, [(x["repeat"], x["prompt"]) for x in r["requests"]]))
    timed = [(who, g[0][0]) for who, g in calls[2:]]
    assert timed == [("A", 0), ("B", 0), ("B", 1), ("A", 1),  # repeat 0: A first, then B first
                     ("B", 0), ("A", 0), ("A", 1), ("B", 1)]  # repeat 1: the other way round
    assert recorded["target_only"] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_prewarm_drafts_asks_every_draft_arm_largest_batch_first_unless_told_not_to() -> None:
    from types import SimpleNamespace

    calls: list[tuple[str, int, int]] = []

    class Provider:
        def __init__(self, name: str) -> None:
            self.name = name

        def prewarm(self, batch: int, gamma: int, sampling: object, off_gpu: bool = False,
                    longest: int | None = None) -> int:  # Prewarmable's signature
            calls.append((self.name, batch, gamma))
            return 2

    arms = [SimpleNamespace(provider=Provider("d"), gamma=3), SimpleNamespace(provider=object(), gamma=4),
            SimpleNamespace(provider=Provider("none"), gamma=0)]
    pipe = SimpleNamespace(arms=arms)
    args = SimpleNamespace(no_prewarm=False, temperature=0.0)
    got = prewarm_drafts(pipe, [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9]], args)
    assert calls == [("d", 4, 3), ("d", 2, 3)] and got["ran"] and got["keys"] == 4
    calls.clear()
    assert prewarm_drafts(pipe, [[0]], SimpleNamespace(no_prewarm=True, temperature=0.0)) == {"ran": False}
    assert calls == []


def test_every_bucket_keeps_its_selector_and_scorers_between_batches(
    setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With batch buckets, a system keeps each bucket's selector, reward scorer and first
    scorer from batch to batch within a repeat (its own, not another system's), every repeat
    starts them untrained, and the pipeline gets its own lists back at the end."""
    from flashspec_core.build import build_pipeline
    from flashspec_core.policy import Plan

    config = setup["root"] / "buckets.toml"
    config.write_text(setup["config"].read_text().replace('reward = "throughput"\n',
                                                          'reward = "throughput"\nbatch_buckets = [1, 2]\n'))
    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(config),
                                      "--out", str(setup["root"] / "o6"), "--no-fixed-arms", "--repeats", "2"])
    args.systems = ["target_only", "flashspec"]
    pipe = build_pipeline(bench.load_config_dict(args.config, args.dtype, args.fuse, args.quantization))
    policy = pipe.policy

    class Counting:  # a reward scorer that counts the steps it scored
        steps = 0

        def __call__(self, width: int, accepted: Any, emitted: int, step_s: float) -> float:
            self.steps += 1
            return 0.5

    policy.reward, policy.first_rewards = Counting(), [Counting(), Counting()]
    own = (list(policy.selectors), list(policy.rewards), list(policy.first_rewards))
    assert len(own[0]) == 2
    seen: list[tuple[str, int, int, int]] = []

    def fake_run(pipeline: Any, prompts: Any, groups: Any, args: Any, domains: Any) -> dict[str, Any]:
        p = pipeline.policy
        name = "plain" if len(p.arms) == 1 else "bandit"
        # one step in bucket 0, two in bucket 1, one by the first arm (its own scale) in bucket 1
        for rows, n in (((0,), 1), ((0, 1), 2)):
            for _ in range(n):
                p.learn(p.choose(rows), 1, [1] * len(rows), 0.01)
        p.learn(Plan((0, 1), 0, bucket=1), 1, [1, 1], 0.01)
        if groups != ["warm"]:
            seen.append((name, p.selectors[1].t if name == "bandit" else -1, p.rewards[1].steps,
                         p.first_rewards[1].steps))
        return {"requests": [{"new_tokens": 1, "prompt": g[0]} for g in groups], "steps": []}

    monkeypatch.setattr(bench, "run_pipeline", fake_run)
    monkeypatch.setattr(bench, "warm_groups", lambda groups, warmup: ["warm"])
    bench.flashspec_runs(pipe, [[1], [2], [3]], [[0], [1], [2]], args, ["code"] * 3, lambda n, r: None)
    for rep in range(2):
        timed = seen[6 * rep: 6 * rep + 6]
        bandit = [x for x in timed if x[0] == "bandit"]
        plain = [x for x in timed if x[0] == "plain"]
        # bucket 1's selector: 2 updates a batch, carried over (a reset to bucket 0's copy would give 2, 3, 4)
        assert [x[1] for x in bandit] == [2, 4, 6]
        assert [x[2:] for x in bandit] == [x[2:] for x in plain] == [(2, 1), (4, 2), (6, 3)]
    assert (policy.selectors, policy.rewards, policy.first_rewards) == own
    assert policy.selectors[1].t == 0 and policy.first_rewards[1].steps == 0


def test_a_short_budget_keeps_target_only_and_the_bandit_first_and_cuts_batches_evenly(
    setup: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of time: warm-ups go target-only, the config's bandit, then the fixed arms; those
    whose warm-up would start past the warm-ups' share are recorded as skipped, and the timed
    batches stop at the deadline for every system at the same batch, saying so."""
    from flashspec_core.build import build_pipeline

    hf = setup["root"] / "hf.toml"  # the pipeline is only the systems' arms here: the hf back-end builds faster
    hf.write_text(setup["config"].read_text().replace('use = "fast"', 'use = "hf"').replace("max_len = 128\n", ""))
    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(hf),
                                      "--out", str(setup["root"] / "o6"), "--repeats", "2", "--selectors", ""])
    args.systems = ["target_only", "flashspec"]
    pipe = build_pipeline(bench.load_config_dict(args.config, args.dtype, args.fuse, args.quantization))
    clock = iter(range(1000))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: float(next(clock)))
    warmed: list[str] = []

    def fake_run(pipeline: Any, prompts: Any, groups: Any, args: Any, domains: Any) -> dict[str, Any]:
        if groups == ["warm"]:
            warmed.append(pipeline.arms[0].name if len(pipeline.arms) == 1 else "bandit")
        return {"requests": [{"new_tokens": 1, "prompt": g[0], "batch_id": g[0], "wall_s": 1.0, "batch": g,
                              "domain": "code"} for g in groups if g != "warm"], "steps": []}

    monkeypatch.setattr(bench, "run_pipeline", fake_run)
    monkeypatch.setattr(bench, "prewarm_drafts", lambda *a: {"ran": False})
    monkeypatch.setattr(bench, "warm_groups", lambda groups, warmup: ["warm"])
    runs: dict[str, dict] = {}
    # the clock ticks once per read: warm-ups may start until 0 + 9 / 3 = 3, the timed batches until 9
    bench.flashspec_runs(pipe, [[1], [2], [3]], [[0], [1], [2]], args, ["code"] * 3, runs.__setitem__, deadline=9.0)
    assert warmed == ["none", "bandit"]  # two warm-ups started at 2 and 3; the fixed arms' at 4 and 5: skipped
    assert set(runs) == {"target_only", "bandit:UCB1", "fixed:draft-g3", "fixed:lookup"}
    assert runs["fixed:draft-g3"]["error"].startswith("out of budget") and not runs["fixed:lookup"]["requests"]
    kept = {n: [r["prompt"] for r in runs[n]["requests"]] for n in ("target_only", "bandit:UCB1")}
    assert kept["target_only"] == kept["bandit:UCB1"] and 0 < len(kept["target_only"]) < 6
    assert runs["target_only"]["stopped"]["why"] == "out of budget"


def test_a_suffix_arm_never_predicts_outputs_of_a_warm_up_another_system_or_an_earlier_repeat(
    setup: dict[str, Path],
) -> None:
    """The suffix arm learns from every request it serves, and the bench runs the same prompts
    in warm-ups, in every system and in every repeat: each timed pass must accept exactly what
    a never-used provider accepts in one pass over the prompts (its own earlier requests
    only), while a second pass on a provider that kept its corpus accepts more (what the
    check guards against)."""
    from flashspec_core.build import build_pipeline

    config = setup["root"] / "suffix.toml"
    config.write_text(f'[target]\nuse = "fast"\nmodel = "{setup["root"] / "target"}"\ndtype = "float32"\n'
                      'chat_template = false\nmax_len = 128\n[[arm]]\nuse = "suffix"\ngamma = 4\nname = "suffix"\n'
                      '[[arm]]\nuse = "none"\nname = "none"\n[verifier]\nuse = "reference"\n[selector]\nuse = "ucb1"\n')
    args = bench.parser().parse_args(["--workload", str(setup["workload"]), "--config", str(config),
                                      "--out", str(setup["root"] / "o_suffix"), "--max-new-tokens", "24",
                                      "--repeats", "2"])
    args.systems = ["flashspec", "target_only"]
    prompts, domains = [[1, 2, 3, 4, 1, 2], [5, 6], [7, 8, 9, 1, 2, 3]], ["code", "prose", "code"]

    def accepted(run: dict[str, Any]) -> list[list[int]]:
        return [s["accepted"] for s in run["steps"] if s["arm_name"] == "suffix"]

    def fresh() -> Any:
        pipe = build_pipeline(bench.load_config_dict(config, None, False))
        pipe.policy.selector = bench.Always(0, len(pipe.choices))
        return pipe

    pipe = fresh()
    cold = accepted(bench.run_pipeline(pipe, prompts, batches(3, 1), args, domains))
    again = accepted(bench.run_pipeline(pipe, prompts, batches(3, 1), args, domains))
    assert sum(map(sum, again)) > sum(map(sum, cold)) > 0  # a kept corpus has the outputs it predicts

    runs: dict[str, dict] = {}
    bench.flashspec_runs(fresh(), prompts, batches(3, 1), args, domains, runs.__setitem__)
    timed = runs["fixed:suffix"]["steps"]
    for rep in (0, 1):
        assert accepted({"steps": [s for s in timed if s["repeat"] == rep]}) == cold, rep


def test_timed_batches_run_with_the_cyclic_collector_paused_and_collected_before() -> None:
    import gc

    from flashspec_bench.harness import untimed_gc

    seen: list[tuple[bool, int]] = []
    assert untimed_gc(lambda x: seen.append((gc.isenabled(), x)) or x * 2, 21) == 42
    assert seen == [(False, 21)] and gc.isenabled()
    gc.disable()
    try:
        untimed_gc(lambda: None)
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
