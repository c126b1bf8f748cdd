"""The warm-up's graph-key count on the CPU: per slot count, basic asks for fewer keys than full."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path
from typing import Any

from flashspec_bench.warmup_keys import DEVICE, count, report, tiny_config
from flashspec_core.testing.tiny import tiny_family

GPU = Path(__file__).resolve().parents[2] / "flashspec_core" / "configs" / "gpu.toml"


def short_gpu_config() -> dict[str, Any]:
    """gpu.toml with 256-slot caches: 2 spans (128, 256), quick."""
    config = tomllib.loads(GPU.read_text())
    config["target"]["max_len"] = 256
    config["arm"] = [a | {"max_len": 256} if a.get("use") == "fast" else a for a in config["arm"]]
    return config


def test_basic_asks_for_fewer_keys_than_full_at_every_slot_count() -> None:
    config = tiny_config(short_gpu_config(), tiny_family(Path(tempfile.mkdtemp())))
    basic, full = count(config, 2, "basic"), count(config, 2, "full")
    assert list(full["keys_per_slot_count"]) == [1, 2] == list(basic["keys_per_slot_count"])
    assert all(0 < basic["keys_per_slot_count"][b] < full["keys_per_slot_count"][b] for b in (1, 2))
    assert basic["keys"] == sum(basic["keys_per_slot_count"].values())
    assert basic["lengths"] == full["lengths"]  # a context of basic's bound: the cut is the drafts' prewarm


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
