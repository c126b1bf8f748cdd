"""Tiny checkpoints the contract suites build the bundled model back-ends from (CPU, float64)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from _contract_keys import VOCAB

from flashspec_core.testing.tiny import perturbed_lm, tiny_lm


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A V = 16 target (context-dependent: init 0.3) and a draft that is its perturbed copy."""
    root = tmp_path_factory.mktemp("contracts")
    target = tiny_lm(root / "target", vocab=VOCAB, seed=0, init=0.3)
    return {"target": target, "draft": perturbed_lm(target, root / "draft", noise=0.05, seed=1)}


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """The tiny models' matrices are too small to gain from threads, which only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
