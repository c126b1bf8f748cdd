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
    """gpu.toml with 256-slot caches: 2 spans (128, 256), quick."""
    config = tomllib.loads(GPU.read_text())
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
    assert basic["keys"] == sum(basic["keys_per_slot_count"].values())
    assert 0 < basic["prewarmed"] < full["prewarmed"]


def test_the_warm_up_covers_every_key_a_served_load_asks_for() -> None:
    """A served load (clients joining and leaving, prompts of several lengths) after a basic
    warm-up asks for no graph key the warm-up did not: on the GPU no request pays for a capture."""
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    got = served(config, 4, "basic", SMALL_LOAD)
    assert got["missed"] == 0, got["missed_keys"]
    assert list(got["missed_per_concurrency"]) == ["c1", "c4"]


def test_the_served_replay_finds_keys_a_warm_up_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the drafts' prewarm the same load asks for draft keys the dummy batches never met,
    and the replay names them by cache: the check above can fail."""
    monkeypatch.setattr(warmup, "prewarm_drafts", lambda *_a, **_k: 0)
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    got = served(config, 4, "basic", SMALL_LOAD)
    assert got["missed"] > 0
    assert {name for per in got["missed_keys"].values() for name in per} == {"draft-g1,draft-g2,draft-g3"}


def test_the_report_has_a_row_per_max_batch_and_level_and_says_it_only_counted(tmp_path: Path) -> None:
    config = short_gpu_config()
    data = report(config, "gpu.toml (256-slot caches)", [1, 2], ["basic"], tiny_family(tmp_path))
    assert data["device"] == DEVICE and data["cuda"] is None and data["script"] == "benchmarks/warmup_keys.py"
    assert data["commit"] and data["torch"] and data["config"]["tables"] == config
    assert [(r["max_batch"], r["level"]) for r in data["rows"]] == [(1, "basic"), (2, "basic")]
    for row in data["rows"]:
        per_cache = row["keys_per_cache_and_slot_count"]
        assert set(per_cache) == {"target", "draft-g1,draft-g2,draft-g3"}  # the draft arms share one model
        assert row["keys"] == sum(row["keys_per_slot_count"].values()) == sum(sum(n.values()) for n in per_cache.values())
        assert row["context"] == 255 and row["lengths"][-1] <= row["context"]
    one, two = (r["keys_per_slot_count"] for r in data["rows"])
    assert one[1] == two[1] > 0 and set(two) == {1, 2}  # a slot count's keys do not depend on the larger ones
