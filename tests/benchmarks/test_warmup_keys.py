"""The warm-up's graph-key count on the CPU: per slot count, basic asks for fewer keys than full."""

from __future__ import annotations

import tempfile
import tomllib
from pathlib import Path

from flashspec_bench.warmup_keys import count, tiny_config
from flashspec_core.testing.tiny import tiny_family

GPU = Path(__file__).resolve().parents[2] / "flashspec_core" / "configs" / "gpu.toml"


def test_basic_asks_for_fewer_keys_than_full_at_every_slot_count() -> None:
    config = tomllib.loads(GPU.read_text())
    config["target"]["max_len"] = 256  # 2 spans (128, 256): quick
    config["arm"] = [a | {"max_len": 256} if a.get("use") == "fast" else a for a in config["arm"]]
    config = tiny_config(config, tiny_family(Path(tempfile.mkdtemp())))
    basic, full = count(config, 2, "basic"), count(config, 2, "full")
    assert list(full["keys_per_slot_count"]) == [1, 2] == list(basic["keys_per_slot_count"])
    assert all(0 < basic["keys_per_slot_count"][b] < full["keys_per_slot_count"][b] for b in (1, 2))
    assert basic["keys"] == sum(basic["keys_per_slot_count"].values())
    assert basic["lengths"] == full["lengths"]  # a context of basic's bound: the cut is the drafts' prewarm
