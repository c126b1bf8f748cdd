"""flashspec_bench.cpu_default: the run order, the ratios, and a smoke run of the default config on the tiny models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashspec_bench import cpu_default as cd


def test_target_only_keeps_everything_but_the_arms() -> None:
    config = cd.load(Path(cd.__file__).resolve().parents[2] / "flashspec_core" / "configs" / "default.toml")
    plain = cd.target_only(config)
    assert [a["use"] for a in plain["arm"]] == ["none"]
    assert {k: v for k, v in plain.items() if k != "arm"} == {k: v for k, v in config.items() if k != "arm"}
    assert len(config["arm"]) > 1  # the input is left as it was


def test_schedule_pairs_the_systems_and_flips_who_goes_first() -> None:
    order = cd.schedule(prompts=3, repeats=2)
    assert len(order) == 12
    pairs = [order[i : i + 2] for i in range(0, 12, 2)]
    assert all({s for _, s in pair} == {cd.DEFAULT, cd.TARGET_ONLY} and pair[0][0] == pair[1][0] for pair in pairs)
    firsts = [pair[0][1] for pair in pairs]
    assert firsts == [cd.DEFAULT, cd.TARGET_ONLY, cd.DEFAULT, cd.TARGET_ONLY, cd.DEFAULT, cd.TARGET_ONLY]
    assert [pair[0][0] for pair in pairs] == [0, 1, 2, 0, 1, 2]
    two = cd.schedule(prompts=2, repeats=2)  # each prompt's pair flips between repeats too
    assert [two[k] for k in (0, 4)] == [(0, cd.DEFAULT), (0, cd.TARGET_ONLY)]
    assert [two[k] for k in (2, 6)] == [(1, cd.TARGET_ONLY), (1, cd.DEFAULT)]


def test_summarize_takes_medians_per_prompt_and_the_first_prompts_ratio() -> None:
    def run(prompt: int, system: str, tps: float) -> dict[str, object]:
        return {"prompt": prompt, "system": system, "tokens_per_s": tps}

    runs = [run(0, cd.DEFAULT, 1.0), run(0, cd.DEFAULT, 3.0), run(0, cd.DEFAULT, 2.0),
            run(0, cd.TARGET_ONLY, 4.0), run(0, cd.TARGET_ONLY, 4.0),
            run(1, cd.DEFAULT, 9.0), run(1, cd.TARGET_ONLY, 1.0)]
    got = cd.summarize(runs, prompts=2)
    assert got["default_tokens_per_s"] == 2.0 and got["target_only_tokens_per_s"] == 4.0
    assert got["default_vs_target_only"] == 0.5
    assert got["per_prompt"][1]["default_vs_target_only"] == 9.0
    assert got["default_vs_target_only_all_prompts"] == pytest.approx(4.5 ** 0.5, abs=1e-3)  # geometric mean of 0.5 and 9


def test_same_output_compares_tokens_within_a_prompt_only() -> None:
    rows = [{"prompt": 0, "tokens": [1, 2]}, {"prompt": 0, "tokens": [1, 2]}, {"prompt": 1, "tokens": [3]}]
    assert cd.same_output(rows)
    assert not cd.same_output([*rows, {"prompt": 1, "tokens": [4]}])


def test_smoke_run_times_both_systems_alike_and_writes_the_ratio(tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    assert cd.main(["--smoke", "--max-new-tokens", "6", "--repeats", "1", "--prompts", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"commit", "torch", "cpus", "config", "load", "runs", "summary"} <= set(result)
    assert len(result["load"]["loadavg_before"]) == 3 and len(result["load"]["loadavg_after"]) == 3
    assert [(r["prompt"], r["system"]) for r in result["runs"]] == cd.schedule(2, 1)
    assert all(r["new_tokens"] == 6 and r["tokens_per_s"] > 0 for r in result["runs"])
    plain = [r for r in result["runs"] if r["system"] == cd.TARGET_ONLY]
    assert all(r["mean_accepted_length"] == 1.0 for r in plain)  # one token per step: no drafting
    assert all(r["step_log"] is None for r in plain)
    for r in result["runs"]:
        if r["system"] == cd.DEFAULT:  # one entry per step, naming the arms that arm_steps counts
            log = r["step_log"]
            assert len(log) == r["steps"] and sum(n + 1 for _, _, n, _ in log) >= r["new_tokens"]  # the last may overrun
            assert {arm: sum(e[0] == arm for e in log) for arm in r["arm_steps"]} == r["arm_steps"]
            assert all(0 <= n <= width and ms > 0 for _, width, n, ms in log)
    assert result["same_output"] is True  # greedy: the default's drafts must not change the tokens
    summary = result["summary"]
    assert summary["default_vs_target_only"] == pytest.approx(
        summary["default_tokens_per_s"] / summary["target_only_tokens_per_s"], rel=1e-2)


def test_first_run_records_read_time_and_the_stamped_output() -> None:
    report = ("Command terminated by signal 15\n\tCommand being timed: \"bash -c x\"\n"
              "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.5\n\tMaximum resident set size (kbytes): 2097152\n"
              "\tPercent of CPU this job got: 34%\n")
    got = cd.read_time_v(report)
    assert got["wall_s"] == 3723.5 and got["peak_rss_gib"] == 2.0 and got["cpu_percent"] == "34%"
    assert got["terminated"] == "Command terminated by signal 15"
    lines = ["     0.0 pip", "     3.0 flashspec: converting", "    40.0 [flashspec] generating", "    52.5 ```python"]
    assert cd.read_stamped(lines) == {"first_text_s": 52.5, "longest_silence_s": 37.0, "longest_silence_at_s": 3.0,
                                      "longest_silence_after": "flashspec: converting"}


def test_reseed_gives_a_copied_selector_fresh_draws_its_parts_still_share() -> None:
    import copy

    from flashspec_selectors.selectors import Factored, FactoredConfig

    fresh = Factored(FactoredConfig(), 3)
    same = [copy.deepcopy(fresh).rng.random() for _ in range(2)]
    assert same[0] == same[1]  # what a plain copy per request did: the same draws every time
    a, b = copy.deepcopy(fresh), copy.deepcopy(fresh)
    cd.reseed(a)
    cd.reseed(b)
    assert a.rng.random() != b.rng.random()
    assert a.beta.rng is a.rng  # the rewards-only fallback draws from the reseeded generator too
    cd.reseed(object())  # a selector without a generator is left alone
