"""The repository stays small: no tracked file over 2 MB, and one current result file per
benchmark under docs/benchmarks/, named by what it measures, never by a commit (the commit,
GPU and date live inside the file; superseded runs live in git history)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2 * 1024 * 1024
RESULTS = "docs/benchmarks/"
COMMIT_LIKE = re.compile(r"[0-9a-f]{7,}")


def tracked() -> list[str]:
    """Paths git tracks in this checkout (skips the test outside a git work tree)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git work tree")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def too_large(root: Path, paths: list[str], limit: int = LIMIT) -> list[str]:
    """``path (size)`` for each of ``paths`` under ``root`` larger than ``limit`` bytes."""
    sizes = {p: (root / p).stat().st_size for p in paths if (root / p).is_file()}
    return [f"{p} ({n / 1e6:.1f} MB)" for p, n in sizes.items() if n > limit]


def named_by_commit(paths: list[str]) -> list[str]:
    """Result files whose name holds a run of 7 or more hex digits, as a commit hash does."""
    return [p for p in paths if p.startswith(RESULTS) and COMMIT_LIKE.search(Path(p).name.lower())]


def test_no_tracked_file_over_2_mb() -> None:
    assert not too_large(ROOT, tracked()), "tracked files over 2 MB: keep summaries, not raw rows"


def test_no_result_file_named_by_a_commit() -> None:
    bad = named_by_commit(tracked())
    assert not bad, f"put the commit inside the file, not in its name: {bad}"


def test_the_checks_catch_what_they_are_for(tmp_path: Path) -> None:
    (tmp_path / "big.json").write_bytes(b"0" * (LIMIT + 1))
    (tmp_path / "small.json").write_bytes(b"0" * LIMIT)
    assert too_large(tmp_path, ["big.json", "small.json", "gone.json"]) == ["big.json (2.1 MB)"]
    paths = [
        "docs/benchmarks/verify-kernels-h200-5758871.json",
        "docs/benchmarks/race32-1024280.json",
        "docs/benchmarks/e2e-h200.json",
        "docs/benchmarks/bandit-sim-stationary.png",
        "benchmarks/run-1a2b3c4d.py",
    ]
    assert named_by_commit(paths) == paths[:2]
