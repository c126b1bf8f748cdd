from __future__ import annotations

from pathlib import Path

import pytest
from _tiny import tiny_family


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny fast-format models: a target and drafts, one directory per module."""
    return tiny_family(tmp_path_factory.mktemp("tp"))
