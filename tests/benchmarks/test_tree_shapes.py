"""benchmarks/tree_shapes.py on the tiny models: every arm decodes, greedy outputs agree, and
the JSON holds tokens per target forward for each arm."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _scripts import load_benchmark
from _tiny import tiny_family


@pytest.mark.parametrize("use", ["fast", "hf"])
def test_tree_shapes_writes_each_arms_tokens_per_forward(tmp_path: Path, use: str) -> None:
    models = tiny_family(tmp_path / "models")
    out = tmp_path / "shapes.json"
    arms = "chain-g3,static-3-2-1,dynamic-d3-k4-n15"
    assert load_benchmark("tree_shapes").main([
        "--target", str(models["target"]), "--draft", str(models["close"]), "--use", use, "--prompts", "1",
        "--domains", "code", "--max-new-tokens", "12", "--arms", arms, "--no-chat-template", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["greedy_outputs_identical"] is True and list(data["arms"]) == arms.split(",")
    for arm in data["arms"].values():
        assert 1.0 <= arm["tokens_per_forward"] <= 1 + arm["draft_keys"]["gamma"] and arm["steps"] >= 1
    assert data["provenance"]["script"] == "benchmarks/tree_shapes.py"
