"""The key checks the fast and hf keys modules share refuse the same values with the same words."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flashspec_core.keycheck import SelfOptions
from flashspec_fast.keys import FastDraftOptions
from flashspec_hf.keys import DraftOptions

DRAFTS = (FastDraftOptions, DraftOptions)


@pytest.mark.parametrize("layers", [0, -1, True, 1.0, "2"])
def test_self_layers_refuses_what_is_not_a_positive_int(layers: object) -> None:
    with pytest.raises(ValueError, match=r"^layers must be an integer >= 1 \(how many of the target's first layers "
                                         rf"draft\), got {layers!r}$"):
        SelfOptions(layers=layers)  # type: ignore[arg-type]


def test_self_layers_keeps_a_positive_int() -> None:
    assert SelfOptions(layers=3).layers == 3


@pytest.mark.parametrize("cls", DRAFTS)
@pytest.mark.parametrize(("keys", "message"), [
    ({"tree_width": [2, 0]}, r"tree_width must be a list of integers >= 1 \(children per node, per level\), got \[2, 0\]"),
    ({"tree_children": "top-k"}, r"tree_children must be one of 'topk', 'sample', got 'top-k'"),
    ({"device": "tpu"}, r"is not a torch device"),
    ({"tree_depth": 2}, r"^tree_depth \(2\) and tree_expand \(0\) go together"),
    ({"tree_depth": 2, "tree_expand": 1, "tree_width": [2]}, r"^tree_width \(a static tree\) and tree_depth / tree_expand"),
    ({"tree_depth": 2, "tree_expand": 1, "tree_children": "sample"}, r"^a dynamic tree keeps the draft's top tokens"),
    ({"tree_expand": -1}, r"'tree_expand' must be >= 0"),
])
def test_drafts_refuse_alike(cls: type, keys: dict[str, Any], message: str, tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text("{}")  # a checkpoint directory to the check; nothing loads it
    assert cls(model=str(tmp_path), tree_depth=2, tree_expand=1).tree_width == ()  # only `keys` is wrong
    with pytest.raises(ValueError, match=message):
        cls(model=str(tmp_path), **keys)
