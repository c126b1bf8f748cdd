"""Config keys that build each bundled component on the tiny checkpoints (CPU, float64).

A registered component that needs keys and has no entry here fails its contract
tests, so a new component cannot skip them unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flashspec_core.contracts import ComponentKind
from flashspec_core.testing.components import component_spec

VOCAB = 16  # the tiny checkpoints' vocabulary; token "t15" is their EOS
Keys = dict[str, Any] | None
KeysFor = Callable[[dict[str, Path]], Keys]  # from the tiny checkpoints' paths


def model_keys(backend: str, path: Path) -> dict[str, Any]:
    """Keys of a bundled model back-end (``hf`` or ``fast``) on ``path``."""
    keys: dict[str, Any] = {"model": str(path), "dtype": "float64", "device": "cpu", "chat_template": False}
    if backend == "fast":
        keys |= {"max_len": 128, "compile": False}
    return keys


# Self-speculative drafts run the target's own first layers: the target back-end each one
# needs (its contract context loads that target) and its keys.
SELF_DRAFT_TARGETS: dict[str, str] = {"self": "fast", "hf-self": "hf"}
SELF_DRAFT_KEYS: dict[str, KeysFor] = {name: lambda tiny: {"layers": 1} for name in SELF_DRAFT_TARGETS}


def draft_target(name: str) -> str:
    """The target back-end of draft ``name``'s contract context: ``hf`` unless it drafts with its target's layers."""
    return SELF_DRAFT_TARGETS.get(name, "hf")


def keys_for(kind: ComponentKind, name: str, table: dict[str, KeysFor], tiny: dict[str, Path]) -> Keys:
    """``table[name]`` applied to the checkpoints, or no keys for a component whose keys all
    have defaults; a component that needs keys and has no entry fails, naming this file."""
    if name in table:
        return table[name](tiny)
    spec = component_spec(kind, name)
    try:
        spec.default_config()
    except (TypeError, ValueError) as exc:
        pytest.fail(f"{kind} {name!r} needs config keys ({exc}): give it tiny ones in {__file__}")
    return None
