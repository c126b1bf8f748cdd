"""The warm-up's graph-key count on the CPU: per slot count, basic asks for fewer keys than full."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

from flashspec_bench.warmup_keys import DEVICE, Load, count, report, served, tiny_config
from flashspec_core.testing.tiny import tiny_family
from flashspec_serve import warmup

GPU = Path(__file__).resolve().parents[2] / "flashspec_core" / "configs" / "gpu.toml"
# clients join a running batch and leave it; prompts of 5 to 100 tokens, sequences up to 124
SMALL_LOAD = Load(concurrency=(1, 4), per_client=2, max_tokens=24, prompt_lengths=(5, 12, 40, 100))


def short_gpu_config() -> dict[str, Any]:
    """gpu.toml with 256-slot caches: 2 spans (128, 256), quick; its selector seeded, so that a
    served load plays the same arms on every run of a test."""
    config = tomllib.loads(GPU.read_text())
    config["selector"]["seed"] = 0
    config["target"]["max_len"] = 256
    config["arm"] = [a | {"max_len": 256} if a.get("use") == "fast" else a for a in config["arm"]]
    return config


def test_basic_asks_for_fewer_keys_than_full_at_every_slot_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """With basic bounded to 128 tokens in 256-slot caches, the drafts' prewarm leaves out the
    256-slot span: fewer keys at every slot count."""
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    full = count(config, 2, "full")
    monkeypatch.setitem(warmup.LEVELS, "basic", warmup.Level("basic", longest=128))
    basic = count(config, 2, "basic")
    assert list(full["keys_per_slot_count"]) == [1, 2] == list(basic["keys_per_slot_count"])
    assert all(0 < basic["keys_per_slot_count"][b] < full["keys_per_slot_count"][b] for b in (1, 2))
    assert basic["keys"] == sum(basic["keys_per_slot_count"].values()) + basic["keys_any_slot_count"]
    assert basic["keys_any_slot_count"] > 0 and full["keys_any_slot_count"] > 0
    assert 0 < basic["prewarmed"] < full["prewarmed"]


def test_the_warm_up_covers_every_key_a_served_load_asks_for() -> None:
    """A served load (clients joining and leaving, prompts of several lengths) after a basic
    warm-up asks for no graph key the warm-up did not: on the GPU no request pays for a capture."""
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    got = served(config, 4, "basic", SMALL_LOAD)
    assert got["missed"] == 0, got["missed_keys"]
    assert list(got["missed_per_concurrency"]) == ["c1", "c4"]


def test_the_served_replay_finds_keys_a_warm_up_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the drafts' prewarm, and with the dummy batches cut to 5 tokens (so their steps
    meet the first span only), the same load asks for keys the warm-up never met, and the replay
    names them by cache: the check above can fail."""
    monkeypatch.setattr(warmup, "prewarm_drafts", lambda *_a, **_k: 0)
    monkeypatch.setattr(warmup, "warm_lengths", lambda _limit, _growth: [2, 3, 5])
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    got = served(config, 4, "basic", SMALL_LOAD)
    assert got["missed"] > 0
    assert {name for per in got["missed_keys"].values() for name in per} == {"draft", "target"}


def test_the_report_has_a_row_per_max_batch_and_level_and_says_it_only_counted(tmp_path: Path) -> None:
    config = short_gpu_config()
    data = report(config, "gpu.toml (256-slot caches)", [1, 2], ["basic"], tiny_family(tmp_path))
    assert data["device"] == DEVICE and data["cuda"] is None and data["script"] == "benchmarks/warmup_keys.py"
    assert data["commit"] and data["torch"] and data["config"]["tables"] == config
    assert [(r["max_batch"], r["level"]) for r in data["rows"]] == [(1, "basic"), (2, "basic")]
    for row in data["rows"]:
        per_cache = row["keys_per_cache_and_slot_count"]
        assert set(per_cache) == {"target", "draft"}  # the arms with a fallback draw on the draft's cache
        shared = row["keys_any_slot_count"]  # the joins' rows-forwards, one per run of rows, width and span
        assert (shared > 0) == (row["max_batch"] > 1)  # one slot is never joined
        assert row["keys"] - shared == sum(row["keys_per_slot_count"].values()) == sum(sum(n.values()) for n in per_cache.values())
        assert row["context"] == 255 and row["lengths"][-1] <= row["context"]
    one, two = (r["keys_per_slot_count"] for r in data["rows"])
    assert one[1] == two[1] > 0 and set(two) == {1, 2}  # a slot count's keys do not depend on the larger ones


def _tree_config() -> dict[str, Any]:
    """gpu.toml's short form with its lookup a tree (3 branches of its matches, no filling), tried
    first on every step (``[selector] first``; a first arm has no fallback): its node count varies
    with what the prompts and outputs repeat. First, not one of the selector's choices, so every
    load meets its trees whatever the selector draws (as a choice, some runs met none)."""
    config = short_gpu_config()
    tree = {"branches": 3, "select": False}
    config["arm"] = [{k: v for k, v in a.items() if k != "fallback"} | tree if a.get("use") == "prompt_lookup" else a
                     for a in config["arm"]]
    config["selector"] = {**config["selector"], "first": "lookup"}
    return tiny_config(config, tiny_family(Path(tempfile.mkdtemp())))


# clients of prompts of 3 distinct tokens, so the lookup tree finds matches of many lengths
TREE_LOAD = Load(concurrency=(1, 2), per_client=2, max_tokens=24, prompt_lengths=(12, 40), alphabet=3)


def test_the_warm_up_meets_every_node_count_of_a_lookup_tree() -> None:
    """A lookup tree's node count varies step to step; the warm-up's one-hot trees of every
    node count leave no tree key to a served load."""
    got = served(_tree_config(), 2, "basic", TREE_LOAD)
    assert got["missed"] == 0, got["missed_keys"]


def test_without_the_one_hot_trees_a_served_load_meets_tree_keys_the_warm_up_missed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: without :func:`warmup.tree_widths` the dummy batches meet only
    the node counts the lookup tree itself proposed on them (here on dummy sequences of up to 5
    tokens), and the load asks for others."""
    monkeypatch.setattr(warmup, "tree_widths", lambda _arms: [])
    monkeypatch.setattr(warmup, "warm_lengths", lambda _limit, _growth: [2, 3, 5])
    got = served(_tree_config(), 2, "basic", TREE_LOAD)
    assert got["missed"] > 0
    assert any("tree" in key for per in got["missed_keys"].values() for keys in per.values() for key in keys)


def test_the_bench_warms_every_tree_node_count_at_every_span_its_sequences_reach() -> None:
    """The e2e bench's tree warm-up (harness.warm_trees) asks for the target's tree forward at
    every batch size, node count 1..gamma and span that steps over prompts of 100 to 150 tokens
    and 30 new ones can meet, before any system is timed."""
    from flashspec_bench.harness import warm_trees
    from flashspec_bench.warmup_keys import counting
    from flashspec_core.build import build_pipeline
    from flashspec_core.contracts import SamplingParams

    pipeline = counting(build_pipeline(_tree_config()))
    caches = warmup.graph_caches(pipeline)
    steps, _ = warm_trees(pipeline, [2, 1], [[1] * 100, [2] * 150], 30, SamplingParams(temperature=0.0))
    gamma = next(a.gamma for a in pipeline.arms if a.name == "lookup")
    span_for = pipeline.target.model.span_for  # type: ignore[attr-defined]
    spans = {span_for(n) for n in range(100 + 1, 150 + 30 + gamma + 1)}  # 128 and 256
    assert len(spans) >= 2 and steps > 0
    got = {key[1:] for key in caches["target"].keys if key[0] == "tree"}
    assert got >= {(b, n, s) for b in (1, 2) for n in range(1, gamma + 1) for s in spans}
    assert warm_trees(pipeline, [1], [], 30, SamplingParams(temperature=0.0)) == (0, 0.0)  # no prompts: nothing


def test_the_shipped_gpu_config_decodes_the_target_s_greedy_output() -> None:
    """gpu.toml's four arms (the draft, the suffix arm and lookup each with the draft behind
    them, plain decoding) over the tiny models in float32: the same tokens as the target alone,
    with the suffix arm proposing the second time a prompt comes (it remembers earlier outputs)."""
    from flashspec_core.build import build_pipeline

    family = tiny_family(Path(tempfile.mkdtemp()))
    config = tiny_config(short_gpu_config(), family)
    plain = tiny_config({**short_gpu_config(), "arm": [{"name": "plain", "use": "none"}]}, family)
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 8, 9, 7, 8], [3, 1, 4, 1, 5, 9, 2, 6]]
    spec = build_pipeline(config)
    first = spec.generate(prompts, 24)
    again = spec.generate(prompts, 24)  # the same prompts: the suffix tree holds their outputs now
    expected = build_pipeline(plain).generate(prompts, 24).token_ids
    assert first.token_ids == again.token_ids == expected
    assert again.summary["arms"]["suffix"]["steps"] > 0, again.summary["arms"]
