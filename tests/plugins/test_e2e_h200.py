"""benchmarks/e2e_h200.py's summary builder, on hand-made sections (no GPU, no models)."""

from __future__ import annotations

from typing import Any

from _scripts import load_benchmark

e2e = load_benchmark("e2e_h200")


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
    assert s["measured_at_commit"] == "abc1234" and s["cold_sections"] == [] and s["unfused_sections"] == []
    # HF baselines and the float32 check that did not run are named, not silently absent
    assert "hf_lookup (skipped: run budget)" in s["not_measured"]
    assert "greedy_identical (float32 check skipped: run budget)" in s["not_measured"]


def test_bandit_goal_names_the_selectors_that_meet_it() -> None:
    """Issue 5: >= 1.0x on every domain and >= 1.2x on code, per batch-1 greedy section."""
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
    """The 683df99 lease ran `full` without --fuse and measured every system about a quarter
    slower than the fused sections it would have been merged with: fused is the default now,
    and a section that ran unfused is named in the summary."""
    args = e2e.build_parser().parse_args(["full", "--gguf", "g", "--out", "o"])
    assert args.fuse is True
    assert e2e.build_parser().parse_args(["full", "--gguf", "g", "--out", "o", "--no-fuse"]).fuse is False
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
        cfg = tomllib.loads(e2e.pipeline_toml(paths, [3, 5], 6, "triton", 768, True, attention="sdpa", **kw))
        fast = [cfg["target"], *(a for a in cfg["arm"] if a.get("use") == "fast")]
        assert len(fast) >= 2 and {t["attention"] for t in fast} == {"sdpa"}
    # adaptive over the gammas: lookup first in every selectable arm, no draft or the draft at 3 or 5
    cfg = tomllib.loads(e2e.pipeline_toml(paths, [3, 5], 8, "triton", 1024, True, adaptive=True, every=True))
    chosen = [a for a in cfg["arm"] if a.get("select", True)]
    assert [a.get("fallback") for a in chosen] == [None, "draft0.5b-g3", "draft0.5b-g5"]
    assert all(a["use"] == "prompt_lookup" and a["fill"] is False for a in chosen)


def test_short_draft_configs(tmp_path: Any) -> None:
    """The *_gated_small design: match-only lookup first, then none or the draft at gamma 1, 2
    or 3 with no padded lookup; the acceptance variant differs only in its reward."""
    import tomllib

    paths = {"target": str(tmp_path / "t"), "draft": str(tmp_path / "d")}
    kw = {"gated": True, "every": True, "padded": False}
    cfg = tomllib.loads(e2e.pipeline_toml(paths, [1, 2, 3], 8, "auto", 1024, True, **kw))
    acc = tomllib.loads(e2e.pipeline_toml(paths, [1, 2, 3], 8, "auto", 1024, True, reward="acceptance", **kw))
    assert [a["name"] for a in cfg["arm"]] == ["lookup-match-g8", "draft0.5b-g1", "draft0.5b-g2", "draft0.5b-g3", "none"]
    assert cfg["selector"]["first"] == "lookup-match-g8" and cfg["arm"][0]["select"] is False
    assert cfg["selector"]["reward"] == "throughput" and acc["selector"]["reward"] == "acceptance"
    assert {k: v for k, v in acc.items() if k != "selector"} == {k: v for k, v in cfg.items() if k != "selector"}
