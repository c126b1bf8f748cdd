"""flashspec_bench.e2e's summary builder and flashspec_bench.sections' configs, on hand-made
sections (no GPU, no models)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from flashspec_bench import e2e, sections
from flashspec_bench.runs import CROSS_REQUEST_STATE


def _section(summary: dict[str, Any], tps: float) -> dict[str, Any]:
    return {"summary": summary, "args": {"warmup": -1, "fuse": True}, "config": "", "runs": {},
            "summaries": {"target_only": {"tokens_per_s": tps, "outside_steps_ms_per_batch": 1.0}}}


def test_summary_from_the_sections_that_ran() -> None:
    b1 = _section({"speedup_vs_own_target_only": 1.2, "best_flashspec": "fixed:x"}, 100.0)
    gated = _section({"bandit_speedup_by_domain_all": {"bandit:ucb1": {"code": 1.3, "prose": 1.0}}}, 90.0)
    s = e2e.build_summary({"b1_greedy": b1, "b1_gated": gated, "b8_greedy": None}, "abc1234", {"b1_gated": "def5678"})
    assert s["speedup_vs_own_target_only"] == 1.2 and s["tokens_per_s"] == {"target_only": 100.0}
    assert s["b1_gated"] == gated["summary"]  # a SUMMARIZED section's own summary
    assert "b8_greedy" in s["skipped_sections"] and "b1_greedy" not in s["skipped_sections"]
    assert s["section_commits"] == {"b1_greedy": "abc1234", "b1_gated": "def5678"}
    assert s["measured_at_commit"] == "abc1234" and s["unfused_sections"] == []
    # HF baselines and the float32 check that did not run are named, not silently absent
    assert "hf_lookup (skipped: run budget)" in s["not_measured"]
    assert "greedy_identical (float32 check skipped: run budget)" in s["not_measured"]


def test_bandit_goal_names_the_selectors_that_meet_it() -> None:
    """>= 1.0x on every domain and >= 1.2x on code, per batch-1 greedy section."""
    def sec(by: dict[str, dict[str, float]], temperature: float = 0.0) -> dict[str, Any]:
        return _section({"batch_size": 1, "temperature": temperature, "bandit_speedup_by_domain_all": by}, 90.0)

    both = {"bandit:ucb1": {"code": 1.3, "prose": 1.0}, "bandit:Thompson": {"code": 1.25, "prose": 1.01}}
    one = {"bandit:ucb1": {"code": 1.19, "prose": 1.1}, "bandit:Thompson": {"code": 1.4, "prose": 1.02}}
    low = {"bandit:ucb1": {"code": 1.5, "prose": 0.999}, "bandit:Thompson": {"code": 1.5, "prose": 1.2}}
    s = e2e.build_summary({"b1_greedy": _section({}, 100.0), "b1_gated_small": sec(both), "b1_gated": sec(one),
                           "b1_adaptive": sec(low), "b1_t07": sec(both, 0.7)}, "abc1234", {})
    goal = s["bandit_goal"]
    assert goal["sections"]["b1_gated_small"]["meeting"] == ["bandit:ucb1", "bandit:Thompson"]
    assert goal["sections"]["b1_gated"]["meeting"] == ["bandit:Thompson"]  # ucb1's code 1.19 < 1.2
    assert goal["sections"]["b1_adaptive"]["meeting"] == ["bandit:Thompson"]  # ucb1's prose 0.999 < 1.0
    assert goal["sections"]["b1_adaptive"]["min_per_domain"] == {"code": 1.5, "prose": 0.999}
    assert "b1_t07" not in goal["sections"]  # the goal is for greedy decoding
    assert goal["met_by_every_selector_in"] == ["b1_gated_small"]


def test_sections_run_fused_unless_told() -> None:
    """Fused is the default (unfused runs measured every system about a quarter slower), and a
    section that ran unfused is named in the summary."""
    args = sections.parser().parse_args(["full", "--gguf", "g", "--out", "o"])
    assert args.fuse is True
    assert sections.parser().parse_args(["full", "--gguf", "g", "--out", "o", "--no-fuse"]).fuse is False
    plain = _section({}, 80.0)
    plain["args"]["fuse"] = False
    s = e2e.build_summary({"b1_greedy": _section({}, 100.0), "b1_gated": plain}, "abc1234", {})
    assert s["unfused_sections"] == ["b1_gated"]


def test_every_fast_model_takes_the_attention_switch(tmp_path: Any) -> None:
    """`full --attention sdpa` (the fallback if a Triton kernel fails on the GPU) reaches the
    target and every draft arm of each bench config, and the configs are valid TOML."""
    import tomllib

    paths = {"target": str(tmp_path / "t"), "draft": str(tmp_path / "d")}
    for kw in ({}, {"gated": True, "every": True}, {"adaptive": True}, {"adaptive": True, "every": True}):
        cfg = tomllib.loads(sections.pipeline_toml(paths, [3, 5], 6, "triton", 768, True, attention="sdpa", **kw))
        fast = [cfg["target"], *(a for a in cfg["arm"] if a.get("use") == "fast")]
        assert len(fast) >= 2 and {t["attention"] for t in fast} == {"sdpa"}
    # adaptive over the gammas: lookup first in every selectable arm, no draft or the draft at 3 or 5
    cfg = tomllib.loads(sections.pipeline_toml(paths, [3, 5], 8, "triton", 1024, True, adaptive=True, every=True))
    chosen = [a for a in cfg["arm"] if a.get("select", True)]
    assert [a.get("fallback") for a in chosen] == [None, "draft0.5b-g3", "draft0.5b-g5"]
    assert all(a["use"] == "prompt_lookup" and a["fill"] is False for a in chosen)


def test_short_draft_configs(tmp_path: Any) -> None:
    """The *_gated_small design: match-only lookup first, then none or the draft at gamma 1, 2
    or 3 with no padded lookup; the acceptance variant differs only in its reward."""
    import tomllib

    paths = {"target": str(tmp_path / "t"), "draft": str(tmp_path / "d")}
    kw = {"gated": True, "every": True, "padded": False}
    cfg = tomllib.loads(sections.pipeline_toml(paths, [1, 2, 3], 8, "auto", 1024, True, **kw))
    acc = tomllib.loads(sections.pipeline_toml(paths, [1, 2, 3], 8, "auto", 1024, True, reward="acceptance", **kw))
    assert [a["name"] for a in cfg["arm"]] == ["lookup-match-g8", "draft0.5b-g1", "draft0.5b-g2", "draft0.5b-g3", "none"]
    assert cfg["selector"]["first"] == "lookup-match-g8" and cfg["arm"][0]["select"] is False
    assert cfg["selector"]["reward"] == "throughput" and acc["selector"]["reward"] == "acceptance"
    assert {k: v for k, v in acc.items() if k != "selector"} == {k: v for k, v in cfg.items() if k != "selector"}


def _bench_json(tps: float) -> dict[str, Any]:
    """A bench.json with one target-only request and step row, and a long divergence list."""
    run = {"requests": [{"prompt": 0, "domain": "code", "new_tokens": 10, "wall_s": 10 / tps, "batch": [0],
                         "batch_id": 1, "tokens": list(range(10))}],
           "steps": [{"arm_name": "none", "gamma": 0, "accepted": [0], "emitted": 1, "step_ms": 1.0, "draft_ms": 0.0,
                      "target_ms": 0.9, "verify_ms": 0.05, "host_ms": 0.05}] * 10}
    return {"environment": {"device": "test GPU", "date": "2026-12-03"}, "args": {"warmup": -1, "fuse": True},
            "config": "", "workload": [{"prompt": "x", "domain": "code"}] * 100, "runs": {"target_only": run},
            "summaries": {}, "summary": {"batch_size": 1},
            "bf16_divergence": {"fixed:a": [{"prompt": i, "first_divergence": i % 2 or None} for i in range(50)]}}


def test_summarize_commits_the_slim_sections_and_keeps_the_raw_rows_apart(tmp_path: Path) -> None:
    src, out, raw = tmp_path / "run", tmp_path / "docs", tmp_path / "results" / "raw.json.gz"
    (src / "b1_greedy").mkdir(parents=True)
    (src / "b1_greedy" / "bench.json").write_text(json.dumps(_bench_json(100.0)))
    summary = e2e.summarize(src, out, "abc1234", {}, raw)
    committed = json.loads((out / "e2e-h200.json").read_text())
    assert committed["summary"] == summary and summary["tokens_per_s"]["target_only"] == 100.0
    assert {k: committed[k] for k in ("commit", "device", "date")} == {
        "commit": "abc1234", "device": "test GPU", "date": "2026-12-03"}
    assert committed["section_dates"] == {"b1_greedy": "2026-12-03"}
    b1 = committed["sections"]["b1_greedy"]
    assert "runs" not in b1 and "workload" not in b1
    assert b1["bf16_divergence"] == {"fixed:a": {"prompt_runs": 50, "diverged": 25}}
    assert committed["sections"]["b8_greedy"] is None
    with gzip.open(raw, "rt") as f:  # every row, apart from the committed file
        assert json.load(f)["sections"]["b1_greedy"]["runs"]["target_only"]["requests"][0]["tokens"] == list(range(10))


def test_slim_section_keeps_what_the_docs_read() -> None:
    sec = _bench_json(50.0) | {"floor": {"arms": {}}, "exactness": {"greedy_identical": True}}
    slim = e2e.slim_section(sec)
    assert set(slim) == {"environment", "args", "config", "summaries", "summary", "floor", "exactness",
                         "bf16_divergence"}
    assert len(json.dumps(slim)) < len(json.dumps(sec)) / 2


# ---------------------------------------------------------------- suffix arms timed on a stale corpus


def _by_domain_run(wall: float, mal: float | None = None) -> dict[str, Any]:
    return {"requests": [{"prompt": 0, "domain": "code_edit", "new_tokens": 10, "wall_s": wall, "batch": [0],
                          "batch_id": 1}], "steps": [], "mal": mal}


def _sweep(**more: Any) -> dict[str, Any]:
    """A batch-1 sweep section whose suffix arm and bandit look 4x and 2x faster than target-only."""
    from flashspec_bench.arm_sections import sweep_toml

    runs = {"target_only": _by_domain_run(1.0), "fixed:suffix-g8": _by_domain_run(0.25, 8.3),
            "fixed:lookup-match-g6": _by_domain_run(0.8, 1.5), "bandit:Thompson": _by_domain_run(0.5, 6.8)}
    summaries = {n: {"tokens_per_s": 10 / r["requests"][0]["wall_s"], "mean_accepted_length": r.pop("mal")}
                 for n, r in runs.items()}
    summaries["fixed:self-l8-g3"] = {"error": "out of budget: warm-ups past their share of the section's budget"}
    return {"config": sweep_toml(dict(sections.MODELS), "auto", 1024, True), "runs": runs, "summaries": summaries,
            "args": {"fuse": True, "max_new_tokens": 64, "temperature": 0.0}, "workload": [],
            "environment": {"device": "test GPU", "date": "2026-12-03"}, **more}


def test_suffix_systems_of_a_run_without_cross_request_state_are_withheld_from_every_ratio() -> None:
    """Without the record that every system and repeat had its own emptied corpus, the suffix
    arm and the bandits over it are named invalid with the reason and their mean accepted
    length, and no ratio or goal reads them; lookup and target-only stay. With the record
    the same figures count."""
    s = e2e.build_summary({"sweep_b1": _sweep()}, "abc1234", {})
    bad = s["invalid_systems"]["sweep_b1"]
    assert set(bad) == {"fixed:suffix-g8", "bandit:Thompson"}  # the skipped fixed arm keeps its error instead
    assert bad["fixed:suffix-g8"]["mean_accepted_length"] == 8.3 and "cross_request_state" in bad["bandit:Thompson"]["reason"]
    assert s["batch_sweep"]["1"]["code_edit"] == {"target_only": 10.0, "lookup-match-g6": 12.5}
    assert s["suffix_vs_target_only_code_edit_b1"] is None and s["batch_sweep"]["goals"]["bandit_0_98x_everywhere"] is None
    assert s["arm_sections_budget"]["sweep_b1"]["skipped_systems"] == ["fixed:self-l8-g3"]
    ok = e2e.build_summary({"sweep_b1": _sweep(cross_request_state=CROSS_REQUEST_STATE)}, "abc1234", {})
    assert ok["invalid_systems"] == {} and ok["suffix_vs_target_only_code_edit_b1"] == 4.0
    assert ok["batch_sweep"]["1"]["code_edit"]["bandit_vs_target_only"] == 2.0


def test_a_fixed_arm_falling_back_to_suffix_or_behind_a_suffix_first_arm_is_invalid_too() -> None:
    arms = ('[[arm]]\nuse = "suffix"\ngamma = 8\nname = "sfx"\nselect = false\n'
            '[[arm]]\nuse = "prompt_lookup"\ngamma = 6\nname = "lk"\nfallback = "sfx"\n'
            '[[arm]]\nuse = "prompt_lookup"\ngamma = 6\nname = "plain"\n')
    summaries = {n: {"tokens_per_s": 1.0} for n in ("target_only", "fixed:sfx", "fixed:lk", "fixed:plain", "bandit:x")}
    sec = {"config": arms, "summaries": summaries}
    assert set(e2e.invalid_systems(sec)) == {"fixed:sfx", "fixed:lk", "bandit:x"}
    first = {"config": arms + '[selector]\nfirst = "sfx"\n', "summaries": summaries}
    assert set(e2e.invalid_systems(first)) == {"fixed:sfx", "fixed:lk", "fixed:plain", "bandit:x"}
    assert e2e.invalid_systems({"config": arms.replace('"suffix"', '"prompt_lookup"'), "summaries": summaries}) == {}


def test_summarize_merges_a_sweep_run_into_the_committed_file(tmp_path: Path) -> None:
    """The committed sections the run did not measure keep their data, date, commit and summary
    keys; the arm sections' keys come from the run; the withheld systems are left out of the
    committed section (their rows stay in the raw file). A run with other sections is refused."""
    old_src, src, out = tmp_path / "old", tmp_path / "new", tmp_path / "docs"
    (old_src / "b1_greedy").mkdir(parents=True)
    (old_src / "b1_greedy" / "bench.json").write_text(json.dumps(_bench_json(100.0)))
    e2e.summarize(old_src, out, "old1234", {}, tmp_path / "raw_old.json.gz")
    committed = tmp_path / "committed.json"
    committed.write_text((out / "e2e-h200.json").read_text())
    (src / "sweep_b1").mkdir(parents=True)
    (src / "sweep_b1" / "bench.json").write_text(json.dumps(_sweep()))
    raw = tmp_path / "raw.json.gz"
    s = e2e.summarize(src, out, "new5678", {}, raw, merge=committed)
    data = json.loads((out / "e2e-h200.json").read_text())
    old = json.loads(committed.read_text())
    assert data["sections"]["b1_greedy"] == old["sections"]["b1_greedy"] and data["summary"] == s
    assert s["tokens_per_s"] == old["summary"]["tokens_per_s"] and s["bandit_goal"] == old["summary"]["bandit_goal"]
    assert s["section_commits"] == {"b1_greedy": "old1234", "sweep_b1": "new5678"} and data["commit"] == "new5678"
    assert set(s["invalid_systems"]["sweep_b1"]) == {"fixed:suffix-g8", "bandit:Thompson"}
    assert "b1_greedy" not in s["skipped_sections"] and "sweep_b1" not in s["skipped_sections"]
    assert "fixed:suffix-g8" not in data["sections"]["sweep_b1"]["summaries"]
    assert data["sections"]["sweep_b1"]["invalid_systems"]["fixed:suffix-g8"] == e2e.STALE_CORPUS
    with gzip.open(raw, "rt") as f:
        assert "fixed:suffix-g8" in json.load(f)["sections"]["sweep_b1"]["runs"]
    (src / "b1_greedy").mkdir()
    (src / "b1_greedy" / "bench.json").write_text(json.dumps(_bench_json(90.0)))
    with pytest.raises(ValueError, match="b1_greedy"):
        e2e.summarize(src, out, "new5678", {}, raw, merge=committed)


def test_a_merged_run_with_the_reset_clears_the_old_marks_of_the_sections_it_measured_again(tmp_path: Path) -> None:
    """A committed file that withheld sweep_b1's suffix systems and tree_b1's, merged with a
    sweep_b1 run that records ``cross_request_state``: sweep_b1's marks go, its suffix figures
    count; tree_b1, not measured again, keeps its marks."""
    src, out = tmp_path / "src", tmp_path / "docs"
    (src / "sweep_b1").mkdir(parents=True)
    (src / "sweep_b1" / "bench.json").write_text(json.dumps(_sweep()))
    e2e.summarize(src, out, "old1234", {}, tmp_path / "raw_old.json.gz")
    committed = tmp_path / "committed.json"
    old = json.loads((out / "e2e-h200.json").read_text())
    old["summary"]["invalid_systems"]["tree_b1"] = {"fixed:suffix-g8": {"reason": "stale"}}
    committed.write_text(json.dumps(old))
    (src / "sweep_b1" / "bench.json").write_text(json.dumps(_sweep(cross_request_state=CROSS_REQUEST_STATE)))
    s = e2e.summarize(src, out, "new5678", {}, tmp_path / "raw.json.gz", merge=committed)
    assert s["invalid_systems"] == {"tree_b1": {"fixed:suffix-g8": {"reason": "stale"}}}
    assert s["suffix_vs_target_only_code_edit_b1"] == 4.0


def test_a_merged_tree_summary_keeps_the_committed_keys_of_the_tree_sections_not_run_again() -> None:
    """tree_b1 run again, tree_t07 not: summary.tree takes tree_b1's keys from the run and keeps
    the committed _t07 keys (and their goal); a section run again keeps nothing of the old."""
    old = {"not_measured": {"tree_b4": "not run"}, "speedup_vs_own_target_only": {"code": 1.1},
           "speedup_vs_own_target_only_t07": {"code": 1.45}, "accepted_per_forward_vs_best_chain_t07": 1.09}
    new = {"not_measured": {"tree_t07": "not run", "tree_b4": "not run"}, "speedup_vs_own_target_only": {"code": 1.3},
           "goals": {}}
    got = e2e.merge_tree(old, new, {"tree_b1"})
    assert got["speedup_vs_own_target_only"] == {"code": 1.3} and got["speedup_vs_own_target_only_t07"] == {"code": 1.45}
    assert got["not_measured"] == {"tree_b4": "not run"} and got["goals"]["code_t07_1_4x"] is True
    again = e2e.merge_tree(old, {**new, "not_measured": {"tree_b4": "not run"}}, {"tree_b1", "tree_t07"})
    assert "speedup_vs_own_target_only_t07" not in again and again["goals"]["code_t07_1_4x"] is None
    # a run of sweeps alone: every committed tree key stays, tree_b1's (no tag) too
    none = e2e.merge_tree(old, {"not_measured": dict.fromkeys(("tree_b1", "tree_t07", "tree_b4"), "not run")}, set())
    assert none["speedup_vs_own_target_only"] == {"code": 1.1} and none["not_measured"] == {"tree_b4": "not run"}
    assert none["goals"]["code_t07_1_4x"] is True and none["goals"]["code_1_6x"] is False


def test_a_merged_sweep_summary_keeps_the_committed_batch_sizes_not_run_again() -> None:
    """sweep_b1 run again, sweep_b4 not: batch 4 keeps its committed row, against_fixed entry and
    config entries, batch 1 takes the run's; the goals are judged over both."""
    old = {"1": {"all": {"bandit_vs_target_only": 1.2}}, "4": {"prose": {"bandit_vs_target_only": 0.9}},
           "against_fixed": {"1": {"bandit_vs_best_fixed": 0.8, "bandit_vs_oracle": 0.8},
                             "4": {"bandit_vs_best_fixed": 0.96, "bandit_vs_oracle": 0.9}},
           "not_measured": {}, "config": {"repeats": {"1": 1, "4": 3}, "bandit": {"1": "b", "4": "b"},
                                          "prompts_per_domain": {"1": {}, "4": {}}, "note": "old"}}
    new = {"1": {"all": {"bandit_vs_target_only": 1.7}},
           "against_fixed": {"1": {"bandit_vs_best_fixed": 1.01, "bandit_vs_oracle": 0.99}},
           "not_measured": {"sweep_b4": "not run", "sweep_b8": "not run"},
           "config": {"repeats": {"1": 1}, "bandit": {"1": "b"}, "prompts_per_domain": {"1": {}}, "note": "new"}}
    got = e2e.merge_sweep(old, new, {"sweep_b1"}, 1.9)
    assert got["1"] == new["1"] and got["4"] == old["4"] and list(got)[:2] == ["1", "4"]
    assert got["against_fixed"] == {"1": new["against_fixed"]["1"], "4": old["against_fixed"]["4"]}
    assert got["not_measured"] == {"sweep_b8": "not run"} and got["config"]["repeats"] == {"1": 1, "4": 3}
    assert got["config"]["note"] == "new"
    assert got["goals"]["bandit_worst"] == {"batch": "4", "domain": "prose", "bandit_vs_target_only": 0.9}
    assert got["goals"]["bandit_1x_best_fixed_everywhere"] is False and got["goals"]["suffix_code_edit_b1_1_8x"] is True
    again = e2e.merge_sweep(old, {**new, "not_measured": {"sweep_b8": "not run"}}, {"sweep_b1", "sweep_b4"}, 1.9)
    assert "4" not in again and again["goals"]["bandit_1x_best_fixed_everywhere"] is True
