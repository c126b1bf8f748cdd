from __future__ import annotations

from typing import Any

import pytest
from _law import Adversaries
from _tiny import perturbed_lm, tiny_lm

from flashspec_core.registry import build_registry


@pytest.fixture(scope="module")
def law_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny target whose next token depends strongly on context, two drafts of it."""
    root = tmp_path_factory.mktemp("law")
    target = tiny_lm(root / "target", vocab=16, seed=0, init=0.3)
    drafts = [perturbed_lm(target, root / "close", noise=0.3, seed=1), tiny_lm(root / "far", vocab=16, seed=7, init=0.3)]
    return {"target": target, "drafts": drafts, "registry": build_registry(extra_plugins=[Adversaries()])}
