"""flashspec_bench.analysis on a tiny hand-made raw file (no GPU, no models)."""

from __future__ import annotations

import gzip
import json
import statistics
from typing import Any

import pytest

from flashspec_bench import analysis as ea


def _step(arm: str, gamma: int, accepted: int, step_ms: float, draft_ms: float = 0.05) -> dict[str, Any]:
    return {"arm_name": arm, "gamma": gamma, "batch_size": 1, "accepted": [accepted], "emitted": accepted + 1,
            "draft_ms": draft_ms, "target_ms": 1.8, "verify_ms": 0.02, "step_ms": step_ms,
            "host_ms": max(step_ms - draft_ms - 1.8 - 0.02, 0.0)}  # as flashspec_bench.runs.step_rows writes it


def _request(prompt: int, domain: str, new_tokens: int, wall_ms: float) -> dict[str, Any]:
    return {"prompt": prompt, "domain": domain, "new_tokens": new_tokens, "wall_s": wall_ms / 1e3,
            "batch": [prompt], "batch_id": hash((prompt, wall_ms)), "tokens": list(range(new_tokens))}


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    """What flashspec_bench.runs.summarize_run gives for these fields."""
    steps, n = run["steps"], len(run["steps"])

    def mean(key: str) -> float:
        return sum(s[key] for s in steps) / n

    host = mean("step_ms") - mean("draft_ms") - mean("target_ms") - mean("verify_ms")
    return {"tokens_per_s": sum(r["new_tokens"] for r in run["requests"]) / sum(r["wall_s"] for r in run["requests"]),
            "step_ms_p50": statistics.median(s["step_ms"] for s in steps),
            "mean_accepted_length": sum(s["emitted"] for s in steps) / n,
            "breakdown_ms": {"draft_ms": mean("draft_ms"), "target_ms": mean("target_ms"),
                             "verify_ms": mean("verify_ms"), "host_ms": host},
            "host_fraction": host / mean("step_ms"), "arms": {s["arm_name"]: {"gamma": s["gamma"]} for s in steps}}


RUNS = {
    # prompt 0: 3 steps of 2 ms in 10 ms (4 ms outside); prompt 1: 4 ms of steps in 200 ms, a pause
    "target_only": {"requests": [_request(0, "code", 3, 10.0), _request(1, "prose", 2, 200.0)],
                    "steps": [_step("none", 0, 0, 2.0)] * 5},
    # prompt 0: one step emits 4 tokens where 3 are kept (the cap), so it alone is the request
    "fixed:draft0.5b-g3": {"requests": [_request(0, "code", 3, 10.0), _request(1, "prose", 2, 20.0)],
                           "steps": [_step("draft0.5b-g3", 3, 3, 6.0, 4.0), _step("draft0.5b-g3", 3, 0, 5.0, 3.0),
                                     _step("draft0.5b-g3", 3, 1, 5.0, 3.0)]},
    # prompt 0: none, then the draft after another arm (a catch-up); prompt 1: the draft twice,
    # its first step the batch's first (no class), its second after itself
    "bandit:Thompson": {"requests": [_request(0, "code", 4, 12.0), _request(1, "prose", 2, 15.0)],
                        "steps": [_step("none", 0, 0, 2.0), _step("draft0.5b-g3", 3, 2, 8.0, 6.0),
                                  _step("draft0.5b-g3", 3, 0, 6.0, 4.0), _step("draft0.5b-g3", 3, 0, 6.2, 4.2)]},
}
SECTION = {
    "environment": {"gpu": "test"}, "args": {"batch_size": 1, "warmup": -1}, "config": "", "runs": RUNS,
    "summaries": {n: _summary(r) for n, r in RUNS.items()},
    "bandwidth_bytes_per_s": 1e12,  # 1e9 bytes a target forward: 1 ms; a draft forward 0.3 ms
    "floor": {"target_forward_bytes": 1e9, "arms": {"draft0.5b-g3": {"draft_forward_bytes": 3e8}}},
    "bf16_divergence": {"fixed:draft0.5b-g3": [
        {"prompt": 0, "first_divergence": 2, "top2_gap": 0.125, "bf16_spacing": 0.125},
        {"prompt": 1, "first_divergence": None, "top2_gap": None, "bf16_spacing": None}]},
}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("e2e")
    raw = tmp / "raw.json.gz"
    with gzip.open(raw, "wt") as f:
        json.dump({"summary": {"measured_at_commit": "abc1234"}, "sections": {"b1_greedy": SECTION, "skipped": None}}, f)
    out = tmp / "analysis.json"
    assert ea.main(["--raw", str(raw), "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_source_and_groups(result: dict[str, Any]) -> None:
    assert result["source"] == {"raw": "raw.json.gz", "measured_at_commit": "abc1234"}
    assert result["script"] == "benchmarks/e2e_analysis.py" and "commit" in result and "date" in result
    assert "b8_greedy" not in result  # inputs absent: left out
    assert all("how" in g for k, g in result.items() if isinstance(g, dict) and k != "source")


def test_step_economics_and_floor(result: dict[str, Any]) -> None:
    b1 = result["b1_greedy"]
    eco = b1["step_economics"]["arms"]["fixed:draft0.5b-g3"]
    assert eco["draft_ms_per_token"] == pytest.approx(10 / 3 / 3, abs=1e-4)  # mean draft ms 10/3 over gamma 3
    assert eco["step_p50_over_target_only_p50"] == pytest.approx(2.5)  # 5 ms against 2 ms
    assert eco["tokens_per_step"] == pytest.approx(7 / 3, abs=1e-4)
    rows = {r["config"]: r for r in b1["floor"]["rows"]}
    assert rows["fixed:draft0.5b-g3"]["floor_step_ms"] == pytest.approx(1.9)  # 1 + 3 x 0.3


def test_misaligned_steps_are_an_error() -> None:
    run = {"requests": [_request(0, "code", 3, 10.0)], "steps": [_step("none", 0, 0, 2.0)] * 4}
    with pytest.raises(ValueError, match="left over"):
        ea.split_batches(run)
    with pytest.raises(ValueError, match="does not line up"):
        ea.split_batches({"requests": run["requests"], "steps": run["steps"][:2]})


def test_repeats_gives_each_repeat_its_own_rate() -> None:
    """Request rows tagged with their repeat: tokens/s per repeat, over target-only's same
    repeat, and the spread; sections timed once are left out."""

    def run(rates: list[float]) -> dict[str, Any]:
        reqs = []
        for k, rate in enumerate(rates):
            for p, dom in ((0, "code"), (1, "prose")):
                r = _request(p, dom, 100, 100 / rate * 1e3)
                r["batch_id"], r["repeat"] = (k, p, rate), k
                reqs.append(r)
        return {"requests": reqs, "steps": [_step("none", 0, 0, 2.0)]}

    sec = {"runs": {"target_only": run([400.0, 500.0]), "bandit:ucb1": run([600.0, 500.0])}}
    once = {"runs": {"target_only": {"requests": [_request(0, "code", 10, 20.0)], "steps": [_step("none", 0, 0, 2.0)]}}}
    out = ea.repeats({"workload_adaptive": sec, "b8_greedy": once})
    assert list(out["sections"]) == ["workload_adaptive"]
    got = out["sections"]["workload_adaptive"]["systems"]
    assert got["bandit:ucb1"]["tokens_per_s"] == pytest.approx([600.0, 500.0])
    assert got["bandit:ucb1"]["vs_target_only"] == pytest.approx([1.5, 1.0])
    assert got["target_only"]["spread"] == pytest.approx(100 / 450)
    assert got["bandit:ucb1"]["per_domain"][0] == pytest.approx({"code": 600.0, "prose": 600.0})
    assert ea.repeats({"b8_greedy": once}) is None


def test_arm_rates_by_domain_split_each_runs_steps_by_request_domain_and_arm(result: dict[str, Any]) -> None:
    runs = result["b1_greedy"]["arm_rates_by_domain"]["runs"]
    # Thompson: prompt 0 (code) a `none` step then a draft step; prompt 1 (prose) two draft steps
    code, prose = runs["bandit:Thompson"]["code"], runs["bandit:Thompson"]["prose"]
    assert code["none"] == {"steps": 1, "step_ms_mean": 2.0, "draft_ms_mean": 0.05, "tokens_per_step": 1.0,
                            "tokens_per_step_ms": 0.5}
    assert code["draft0.5b-g3"]["tokens_per_step_ms"] == pytest.approx(3 / 8, abs=1e-6)
    assert list(prose) == ["draft0.5b-g3"]
    assert prose["draft0.5b-g3"] == pytest.approx({"steps": 2, "step_ms_mean": 6.1, "draft_ms_mean": 4.1,
                                                   "tokens_per_step": 1.0, "tokens_per_step_ms": 2 / 12.2}, abs=1e-6)
    assert set(runs) == set(RUNS)
