"""Where a result comes from and where it goes: one provenance record, one JSON writer.

Every benchmark writes ``provenance(script)`` beside its numbers: the commit it measured,
whether the checkout had uncommitted changes to tracked files, the device, the versions of
the packages that matter, and the date. Summaries that are committed go under ``DOCS``;
raw per-run dumps (every step row, every generated token) go under ``RESULTS``, which git
ignores.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "benchmarks"
RESULTS = ROOT / "benchmarks" / ".results"
PACKAGES = ("flashspec-engine", "torch", "transformers", "triton", "numpy", "scipy")


def git(*args: str) -> str | None:
    """``git args`` in the checkout, stripped; None where there is no git or no repository."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def device() -> dict[str, str | None]:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"device": name or platform.processor() or platform.machine() or "cpu", "cuda": torch.version.cuda}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance(script: str, commit: str | None = None) -> dict[str, Any]:
    """The record a result carries (flat: ``device``, ``torch``, ... are top-level keys).
    ``commit`` names the measured commit where the checkout has no git (a copy on a GPU
    machine); ``dirty`` is then None (unknown)."""
    status = None if commit else git("status", "--porcelain", "--untracked-files=no")
    return {"script": script, "commit": commit or git("rev-parse", "HEAD"),
            "dirty": None if status is None else bool(status), **device(), **versions(),
            "date": datetime.datetime.now(datetime.UTC).date().isoformat()}


def write_json(path: Path, data: Any, indent: int | None = 1) -> Path:
    """``data`` as JSON at ``path`` (folders made as needed), ending in a newline; with
    ``indent=None`` on one line without spaces (the recorded steps: the 2 MB limit per file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    separators = (",", ":") if indent is None else None
    path.write_text(json.dumps(data, indent=indent, separators=separators) + "\n")
    return path


def logger(tag: str) -> Callable[[str], None]:
    """A ``say(msg)`` that prints ``[tag HH:MM:SS] msg`` on stderr."""

    def say(msg: str) -> None:
        print(f"[{tag} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return say
