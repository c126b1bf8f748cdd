"""End to end on tiny random models: greedy identity, sampled first-token law, stopping."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _tiny import pipeline_dict, tiny_family
from scipy import stats
from structlog.testing import capture_logs
from transformers import AutoModelForCausalLM

from flashspec_core import ComponentSpec, hookimpl
from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError
from flashspec_core.pipeline import Arm, NoDraft, Pipeline
from flashspec_core.policy import StepPolicy
from flashspec_core.registry import build_registry
from flashspec_core.rewards import make_reward
from flashspec_lookup.lookup import LookupConfig, PromptLookupDraft
from flashspec_reference.plugin import ReferenceVerifier
from flashspec_selectors.selectors import FixedConfig, FixedSelector


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_family(tmp_path_factory.mktemp("tiny"))


def _greedy_target(path: Path, prompt: list[int], n: int, eos: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    ids, out = torch.tensor([prompt]), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11]]


@pytest.mark.parametrize("selector", ["fixed", "ucb1", "thompson"])
def test_greedy_speculative_equals_greedy_target(models: dict[str, Path], selector: str) -> None:
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"], models["far"]], selector))
    used = set()
    for batch in ([PROMPTS[0]], PROMPTS):
        result = pipe.generate(batch, max_new_tokens=24, temperature=0.0)
        for prompt, got in zip(batch, result.token_ids, strict=True):
            assert got == _greedy_target(models["target"], prompt, 24, eos=15)
        used |= {r.arm_name for r in result.steps}
    # UCB1 tries every arm first, so arms switch in the middle of a sequence.
    assert selector != "ucb1" or used == {"d0", "d1", "lookup", "lookup-match", "lookup-or-d0"}


def test_ragged_batch_rows_equal_rows_alone(models: dict[str, Path]) -> None:
    """Greedy: each row of a ragged batch gets exactly what it gets alone."""
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "ucb1"))
    together = pipe.generate(PROMPTS, max_new_tokens=16).token_ids
    alone = [pipe.generate([p], max_new_tokens=16).token_ids[0] for p in PROMPTS]
    assert together == alone


def test_first_token_law_matches_target(models: dict[str, Path]) -> None:
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "fixed"))
    prompt = [1, 2, 3]
    n = 12_000
    result = pipe.generate([prompt] * n, max_new_tokens=1, temperature=1.0, seed=3)
    counts = np.bincount([ids[0] for ids in result.token_ids], minlength=16)
    model = AutoModelForCausalLM.from_pretrained(models["target"], dtype=torch.float64).eval()
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([prompt])).logits[0, -1], -1).numpy()
    assert p.min() * n >= 5  # every bin is big enough for the chi-square approximation
    assert stats.chisquare(counts, p / p.sum() * n).pvalue > 1e-3


def test_stops_at_eos_and_max_tokens(models: dict[str, Path]) -> None:
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "fixed"))
    result = pipe.generate(PROMPTS, max_new_tokens=5, temperature=1.0, seed=1)
    for ids in result.token_ids:
        assert 1 <= len(ids) <= 5
        assert 15 not in ids[:-1]
    assert result.summary["new_tokens"] == sum(len(i) for i in result.token_ids)


def test_one_log_line_per_step_with_run_id(models: dict[str, Path]) -> None:
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "thompson"))
    with capture_logs() as lines:
        result = pipe.generate([PROMPTS[0]], max_new_tokens=12)
    steps = [line for line in lines if line["event"] == "step"]
    assert len(steps) == len(result.steps)
    assert {"step", "arm", "gamma", "accepted", "emitted", "reward", "draft_ms", "verify_ms", "run_id"} <= set(steps[0])
    assert len({line["run_id"] for line in lines}) == 1
    assert [line["event"] for line in lines].count("summary") == 1


def test_summary_counts(models: dict[str, Path]) -> None:
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "fixed"))
    s = pipe.generate(PROMPTS, max_new_tokens=10).summary
    arm = s["arms"]["d0"]
    assert arm["steps"] == s["steps"]
    assert 0.0 <= arm["acceptance_rate"] <= 1.0
    assert len(arm["acceptance_by_position"]) == 3
    assert s["mean_accepted_length"] >= 1.0


class _Observer:
    def __init__(self) -> None:
        self.built: list[object] = []
        self.records: list[object] = []

    @hookimpl
    def flashspec_pipeline_built(self, pipeline: object) -> None:
        self.built.append(pipeline)

    @hookimpl
    def flashspec_step_end(self, record: object) -> None:
        self.records.append(record)


def test_observer_hooks_see_build_and_every_step(models: dict[str, Path]) -> None:
    observer = _Observer()
    registry = build_registry(extra_plugins=[observer])
    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]], "ucb1"), registry)
    assert observer.built == [pipe]
    result = pipe.generate(PROMPTS, max_new_tokens=8)
    assert observer.records == result.steps


class _Acme:
    """A third-party style plugin offering every component kind through its hooks."""

    @hookimpl
    def flashspec_targets(self):
        return []

    @hookimpl
    def flashspec_draft_providers(self):
        return [ComponentSpec("acme_lookup", "draft", lambda config, context: PromptLookupDraft(LookupConfig()))]

    @hookimpl
    def flashspec_verifiers(self):
        return [ComponentSpec("acme_ref", "verifier", lambda config, device: ReferenceVerifier())]

    @hookimpl
    def flashspec_arm_selectors(self):
        return []


def test_third_party_components_run_in_a_pipeline(models: dict[str, Path]) -> None:
    registry = build_registry(extra_plugins=[_Acme()])
    config = pipeline_dict(models["target"], [], "fixed")
    config["arm"] = [{"use": "acme_lookup", "gamma": 3}]
    config["verifier"] = {"use": "acme_ref"}
    result = build_pipeline(config, registry).generate([PROMPTS[0]], max_new_tokens=6)
    assert result.token_ids[0] == _greedy_target(models["target"], PROMPTS[0], 6, eos=15)


class _Slow:
    """A draft plugin whose load takes a while and prints nothing."""

    @hookimpl
    def flashspec_draft_providers(self):
        def make(config, context):
            import time

            time.sleep(0.9)
            return PromptLookupDraft(LookupConfig())

        return [ComponentSpec("slow_lookup", "draft", make)]


def test_a_silent_load_says_it_still_runs(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A load that prints nothing (gigabytes of weights read) gets a line after each heartbeat
    of silence, so a first run has no silent minute; without progress, nothing is said."""
    import flashspec_core.build as build

    monkeypatch.setattr(build, "HEARTBEAT_S", 0.25)
    registry = build_registry(extra_plugins=[_Slow()])
    config = pipeline_dict(models["target"], [], "fixed")
    config["arm"] = [{"use": "slow_lookup", "gamma": 3, "name": "slow"}]
    lines: list[str] = []
    build_pipeline(config, registry, progress=lines.append)
    beats = [line for line in lines if line.startswith("still loading arm slow: ")]
    assert beats and len(beats) <= 4, lines
    assert lines.index(beats[0]) > lines.index("loading arm slow (slow_lookup, gamma=3)")
    build_pipeline(config, registry)  # no progress: no heartbeat thread


class _Greedy:
    """A draft plugin whose proposals are wider than the arm's gamma (a bug)."""

    @hookimpl
    def flashspec_draft_providers(self):
        class TooWide(PromptLookupDraft):
            def propose(self, tokens, lengths, gamma, sampling, generator):  # type: ignore[no-untyped-def]
                draft = super().propose(tokens, lengths, gamma + 1, sampling, generator)
                return draft

        return [ComponentSpec("too_wide", "draft", lambda config, context: TooWide(LookupConfig()))]


def test_match_only_lookup_steps_record_their_width(models: dict[str, Path]) -> None:
    config = pipeline_dict(models["target"], [], "fixed")
    config["arm"] = [{"use": "prompt_lookup", "gamma": 4, "min_ngram": 2, "fill": False}]
    result = build_pipeline(config).generate([[1, 2, 3, 4, 5, 1, 2], [9, 8, 7]], max_new_tokens=12)
    widths = {r.gamma for r in result.steps}
    assert widths <= set(range(5)) and len(widths) > 1  # some steps matched, some did not
    assert all(max(r.accepted) <= r.gamma for r in result.steps)


def test_a_draft_wider_than_gamma_is_a_clear_error(models: dict[str, Path]) -> None:
    config = pipeline_dict(models["target"], [], "fixed")
    config["arm"] = [{"use": "too_wide", "gamma": 2, "name": "wide"}]
    pipe = build_pipeline(config, build_registry(extra_plugins=[_Greedy()]))
    with pytest.raises(RuntimeError, match=r"arm 'wide'.*gamma = 2"):
        pipe.generate([PROMPTS[0]], max_new_tokens=4)


def test_an_arm_without_a_match_falls_back(models: dict[str, Path]) -> None:
    """Steps of the composite arm are lookup steps where the context has a bigram match and
    draft steps elsewhere; greedy output is still the target's."""
    config = pipeline_dict(models["target"], [models["close"]], "fixed")
    config["arm"] = [config["arm"][-1], config["arm"][0]]  # lookup-or-d0 first, so "fixed" plays it
    pipe = build_pipeline(config)
    prompt = [1, 2, 3, 4, 5, 1, 2]
    result = pipe.generate([prompt], max_new_tokens=16)
    assert result.token_ids[0] == _greedy_target(models["target"], prompt, 16, eos=15)
    assert {r.arm_name for r in result.steps} == {"lookup-or-d0"}
    assert len({r.gamma for r in result.steps}) > 1  # matched widths and the draft's gamma 3


@pytest.mark.parametrize(
    ("fallback", "match"),
    [("nope", "must name another arm"), ("lookup-or-d0", "must name another arm"), ("chained", "do not chain")],
)
def test_bad_fallback_is_a_clear_error(models: dict[str, Path], fallback: str, match: str) -> None:
    config = pipeline_dict(models["target"], [models["close"]], "fixed")
    config["arm"][-1]["fallback"] = fallback
    config["arm"].append({"use": "prompt_lookup", "gamma": 2, "fallback": "d0", "name": "chained"})
    with pytest.raises(ConfigError, match=match):
        build_pipeline(config)


def test_a_fallback_only_arm_is_never_selected(models: dict[str, Path]) -> None:
    """select = false: the selector chooses between the other arms alone (its arm k is the
    k-th selectable arm), and the fallback still proposes where the lookup finds nothing."""
    config = pipeline_dict(models["target"], [models["close"]], "ucb1")
    config["arm"] = [{**config["arm"][0], "select": False}, *config["arm"][1:]]  # d0 only as lookup-or-d0's fallback
    pipe = build_pipeline(config)
    assert pipe.choices == [1, 2, 3] and pipe.selector.num_arms == 3
    prompts = [[1, 2, 3, 4, 5, 1, 2], [9, 8, 7, 6]]
    result = pipe.generate(prompts, max_new_tokens=24)
    for prompt, out in zip(prompts, result.token_ids, strict=True):
        assert out == _greedy_target(models["target"], prompt, 24, eos=15)
    assert "d0" not in {r.arm_name for r in result.steps}
    assert {r.arm_name for r in result.steps} == {"lookup", "lookup-match", "lookup-or-d0"}  # UCB1 tries each


@pytest.mark.parametrize(
    ("change", "match"),
    [("all", "every arm has select = false"), ("type", "must be true or false")],
)
def test_bad_select_is_a_clear_error(models: dict[str, Path], change: str, match: str) -> None:
    config = pipeline_dict(models["target"], [models["close"]], "fixed")
    if change == "all":
        config["arm"] = [{**a, "select": False} for a in config["arm"]]
    else:
        config["arm"][0]["select"] = "no"
    with pytest.raises(ConfigError, match=match):
        build_pipeline(config)


@pytest.mark.parametrize("draw_ahead", [True, False])
def test_batch_limit_decodes_plainly_above_it_and_resumes_below(models: dict[str, Path], draw_ahead: bool) -> None:
    """speculate_max_batch: with more live rows than the limit a step drafts nothing and the
    selector is neither asked nor updated; once rows finish, speculation resumes. Greedy
    output is the target's either way. Drawing ahead, each speculating step also draws the
    next step's choice, so the last one's draw goes unused."""
    config = pipeline_dict(models["target"], [models["close"]], "ucb1", draw_ahead=draw_ahead)
    config["selector"]["speculate_max_batch"] = 1
    pipe = build_pipeline(config)
    calls = {"select": 0, "update": 0}
    select, update = pipe.selector.select, pipe.selector.update

    def counted_select() -> int:
        calls["select"] += 1
        return select()

    def counted_update(arm: int, reward: float) -> None:
        calls["update"] += 1
        update(arm, reward)

    pipe.selector.select, pipe.selector.update = counted_select, counted_update  # type: ignore[method-assign]
    prompts = [[1, 2, 3, 4, 5, 1, 2], [2, 2, 2]]  # the second row stops at EOS after 4 tokens
    steps: list = []
    pipe.on_step = steps.append
    out = pipe.generate(prompts, max_new_tokens=24)
    for prompt, got in zip(prompts, out.token_ids, strict=True):
        assert got == _greedy_target(models["target"], prompt, 24, eos=15)
    limited = [r for r in steps if r.arm_name == "batch_limit"]
    assert limited and all(r.batch_size == 2 and r.gamma == 0 and r.arm == -1 for r in limited)
    spec = [r for r in steps if r.arm_name != "batch_limit"]
    assert spec and all(r.batch_size == 1 for r in spec)
    assert calls == {"select": len(spec) + draw_ahead, "update": len(spec)}
    assert out.summary["arms"]["batch_limit"]["steps"] == len(limited)


PROMPTS_8 = [*PROMPTS, [2, 2, 2], [5, 6, 5, 6, 5], [9, 8, 7, 6], [4, 4, 1, 2], [12, 3, 12, 3, 12, 3]]


@pytest.mark.parametrize("selector", ["ucb1", "thompson"])
def test_batch_buckets_keep_greedy_output_at_batch_1_and_8(models: dict[str, Path], selector: str) -> None:
    """One selector per bucket of live rows, with a ``none`` arm among its arms: greedy output
    in float32 is target-only decoding's at batch 1 and at batch 8, and each step's log line
    names the bucket of its live-row count (rows finish at different steps, so buckets change)."""
    config = pipeline_dict(models["target"], [models["close"], models["far"]], selector, dtype="float32",
                           batch_buckets=[1, 2, 4, 8])
    config["arm"].append({"use": "none", "name": "plain"})
    pipe = build_pipeline(config)
    plain = pipeline_dict(models["target"], [], "fixed", dtype="float32")
    plain["arm"] = [{"use": "none", "name": "plain"}]
    target_only = build_pipeline(plain)
    assert len(pipe.policy.selectors) == 4 and pipe.policy.selectors[0] is not pipe.policy.selectors[3]
    for batch in ([PROMPTS_8[0]], PROMPTS_8):
        want = target_only.generate(batch, max_new_tokens=24).token_ids
        with capture_logs() as lines:
            got = pipe.generate(batch, max_new_tokens=24)
        assert got.token_ids == want
        logged = [(line["batch_size"], line["batch_bucket"]) for line in lines if line["event"] == "step"]
        assert logged == [(r.batch_size, max(b for b in (1, 2, 4, 8) if b <= r.batch_size)) for r in got.steps]
    assert len({bucket for _, bucket in logged}) > 1


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "4"])
def test_bad_batch_limit_is_a_clear_error(models: dict[str, Path], value: object) -> None:
    config = pipeline_dict(models["target"], [models["close"]], "fixed")
    config["selector"]["speculate_max_batch"] = value
    with pytest.raises(ConfigError, match=r"\[selector\] key 'speculate_max_batch': must be an integer >= 1"):
        build_pipeline(config)


def _gated(models: dict[str, Path], selector: str = "ucb1") -> dict:
    """Match-only lookup as the first arm; the selector chooses between d0 and no draft."""
    config = pipeline_dict(models["target"], [models["close"]], selector)
    match = next(a for a in config["arm"] if a["name"] == "lookup-match")
    config["arm"] = [{**match, "select": False}, config["arm"][0], {"use": "none", "name": "plain"}]
    config["selector"]["first"] = "lookup-match"
    return config


def test_first_arm_proposes_before_the_selector(models: dict[str, Path]) -> None:
    """[selector] first: where the match-only lookup proposes, its step runs and the selector
    is neither asked nor updated; where it finds nothing, the selector picks (d0 or plain)
    and learns from that step alone. Greedy output is the target's. (Without drawing ahead,
    so that every select() is a played choice.)"""
    config = _gated(models)
    config["selector"]["draw_ahead"] = False
    pipe = build_pipeline(config)
    assert pipe.first == 0 and pipe.choices == [1, 2] and pipe.selector.num_arms == 2
    asked: list[int] = []
    updates: list[int] = []
    select, update = pipe.selector.select, pipe.selector.update

    def counted_select() -> int:
        asked.append(select())
        return asked[-1]

    def counted_update(arm: int, reward: float) -> None:
        updates.append(arm)
        update(arm, reward)

    pipe.selector.select, pipe.selector.update = counted_select, counted_update  # type: ignore[method-assign]
    prompts = [[1, 2, 3, 4, 5, 1, 2], [9, 8, 7, 6]]
    steps = []
    for prompt in prompts:
        result = pipe.generate([prompt], max_new_tokens=24)
        assert result.token_ids[0] == _greedy_target(models["target"], prompt, 24, eos=15)
        steps += result.steps
    gate = [r for r in steps if r.arm_name == "lookup-match"]
    chosen = [r for r in steps if r.arm_name != "lookup-match"]
    assert gate and all(r.gamma > 0 and r.arm == 0 for r in gate)  # matched: a proposal of 1..gamma tokens
    assert {r.arm_name for r in chosen} == {"d0", "plain"}  # UCB1 tries both
    assert asked == updates == [{"d0": 0, "plain": 1}[r.arm_name] for r in chosen]


class _Recorder:
    """A UCB1 whose calls are logged in order, told of each request."""

    def __init__(self, inner: object) -> None:
        self.inner, self.log = inner, []

    def begin_request(self, rows: int) -> None:
        self.log.append(("begin", None))

    def select(self) -> int:
        self.log.append(("select", self.inner.select()))
        return self.log[-1][1]

    def update(self, arm: int, reward: float) -> None:
        self.log.append(("update", arm))
        self.inner.update(arm, reward)


def test_draw_ahead_draws_the_next_choice_before_this_steps_reward(models: dict[str, Path]) -> None:
    """By default the next step's choice is drawn while the device runs this step: so the
    selector hears select() for step t + 1 before update() for step t, every played choice
    is the latest draw and is updated once, a draw made where the first arm then proposes
    is dropped, and a new request never plays a draw from the one before."""
    pipe = build_pipeline(_gated(models))
    assert pipe.draw_ahead
    rec = _Recorder(pipe.selector)
    pipe.selector = rec
    runs = [pipe.generate([prompt], max_new_tokens=24).steps for prompt in ([1, 2, 3, 4, 5, 1, 2], [9, 8, 7, 6])]
    steps = [r for run in runs for r in run]
    chosen = [r for r in steps if r.arm_name != "lookup-match"]
    updates = [arm for kind, arm in rec.log if kind == "update"]
    assert updates == [{"d0": 0, "plain": 1}[r.arm_name] for r in chosen]
    assert len(chosen) < len(steps)  # the lookup proposed somewhere: draws made before those steps were dropped
    # every step draws the next choice once, and a request whose first step the selector picks
    # draws that one fresh (nothing was drawn ahead for it: begin_request dropped the last)
    fresh = sum(r[0].arm_name != "lookup-match" for r in runs)
    assert sum(kind == "select" for kind, _ in rec.log) == len(steps) + fresh
    for i, (kind, arm) in enumerate(rec.log):
        if kind == "update":  # the played draw is the one before the draw this step made ahead
            draws = [a for k, a in rec.log[:i] if k == "select"]
            assert arm == draws[-2]
    assert [kind for kind, _ in rec.log].count("begin") == 2


def test_draw_ahead_must_be_true_or_false(models: dict[str, Path]) -> None:
    config = pipeline_dict(models["target"], [models["close"]], "ucb1", draw_ahead="yes")
    with pytest.raises(ConfigError, match=r"\[selector\] key 'draw_ahead': must be true or false"):
        build_pipeline(config)


@pytest.mark.parametrize(
    ("first", "match"),
    [("nope", "must name an arm"), (3, "must name an arm"), ("plain", "the 'none' arm"), ("lookup-or-d0", "has a fallback")],
)
def test_bad_first_arm_is_a_clear_error(models: dict[str, Path], first: object, match: str) -> None:
    config = _gated(models)
    config["arm"].append({"use": "prompt_lookup", "gamma": 3, "min_ngram": 2, "fill": False, "fallback": "d0",
                          "name": "lookup-or-d0"})
    config["selector"]["first"] = first
    with pytest.raises(ConfigError, match=r"\[selector\] key 'first': .*" + match):
        build_pipeline(config)


def test_a_select_false_arm_nothing_runs_is_only_timed_alone(models: dict[str, Path]) -> None:
    """An arm with select = false that is neither a fallback nor first: the build says generate
    never runs it, the selector chooses between the other arms alone, and the bench still times
    it as a fixed arm (how the batch sweep keeps lone arms out of its bandit)."""
    import argparse

    from flashspec_bench.harness import plan_systems

    config = _gated(models)
    del config["selector"]["first"]
    said: list[str] = []
    pipe = build_pipeline(config, progress=said.append)
    assert any("lookup-match has select = false and is neither a fallback nor [selector] first" in m for m in said)
    assert pipe.selector.num_arms == 2
    result = pipe.generate([[1, 2, 3, 4, 5, 1, 2, 3, 4]], max_new_tokens=16)
    assert result.token_ids[0] == _greedy_target(models["target"], [1, 2, 3, 4, 5, 1, 2, 3, 4], 16, eos=15)
    assert "lookup-match" not in {r.arm_name for r in result.steps}
    args = argparse.Namespace(systems=("target_only", "flashspec"), no_fixed_arms=False, selectors=())
    names = [name for name, _, _ in plan_systems(pipe, args)]
    assert "fixed:lookup-match" in names and "fixed:d0" in names


def test_first_arm_is_searched_once_per_step(models: dict[str, Path]) -> None:
    """A selector that picks the first arm itself (the bench's fixed "lookup, else plain")
    reuses its empty proposal instead of searching the context a second time."""
    config = _gated(models, "fixed")
    config["arm"][0]["select"] = True  # the first arm is also the fixed selector's arm 0
    pipe = build_pipeline(config)
    calls = []
    gate = pipe.arms[0].provider
    propose = gate.propose

    def counted(*a: object, **k: object) -> object:
        calls.append(1)
        return propose(*a, **k)

    gate.propose = counted  # type: ignore[method-assign]
    result = pipe.generate([[1, 2, 3, 4, 5, 1, 2]], max_new_tokens=16)
    assert result.token_ids[0] == _greedy_target(models["target"], [1, 2, 3, 4, 5, 1, 2], 16, eos=15)
    assert len(calls) == len(result.steps) and {r.arm_name for r in result.steps} == {"lookup-match"}
    assert {r.gamma for r in result.steps} >= {0} and max(r.gamma for r in result.steps) > 0


def test_the_prefill_is_waited_for_before_the_first_step(models: dict[str, Path],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The first step's wall time must not hold the queued prefill (on the H200 it did: the
    first step of each batch of 32 showed 21.8 ms of host time)."""
    import flashspec_core.pipeline as pl

    pipe = build_pipeline(pipeline_dict(models["target"], [models["close"]]))
    order: list[str] = []
    prefill, score = pipe.target.prefill, pipe.target.score
    monkeypatch.setattr(pipe.target, "prefill", lambda *a, **k: (order.append("prefill"), prefill(*a, **k))[1])
    monkeypatch.setattr(pipe.target, "score", lambda *a, **k: (order.append("score"), score(*a, **k))[1])
    monkeypatch.setattr(pl, "wait_device", lambda device: order.append(f"wait {device.type}"))
    pipe.generate([[1, 2, 3]], max_new_tokens=3)
    assert order[:3] == ["prefill", "wait cpu", "score"]
    synced: list[torch.device] = []
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    pl.wait_device(torch.device("cpu"))
    pl.wait_device(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


def test_a_pipeline_assembled_by_hand(models: dict[str, Path]) -> None:
    """Target, verifier and a step policy are all a pipeline needs (the benchmarks' synthetic
    runs assemble theirs so): plain decoding is then the greedy target's output."""
    built = build_pipeline(pipeline_dict(models["target"], [models["close"]]))
    policy = StepPolicy([Arm("none", NoDraft(), 0)], FixedSelector(FixedConfig(), 1), make_reward("acceptance"))
    pipe = Pipeline(built.target, ReferenceVerifier(), policy)
    result = pipe.generate([PROMPTS[0]], max_new_tokens=8)
    assert result.token_ids[0] == _greedy_target(models["target"], PROMPTS[0], 8, eos=15)
    assert {r.arm_name for r in result.steps} == {"none"} and pipe.choices == [0] and pipe.first is None
