"""The serve bench's clients run in a child process (so their Python never takes the GIL from
the server it measures), return what they saw, and go when a deadline cancels their load."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from test_serve_bench_peer import _stand_in

from flashspec_bench import serve as sb


def _children() -> list[int]:
    """This process's children that run a load."""
    me, found = os.getpid(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == me and stat[0] != "Z" and b"load_child" in cmdline:
            found.append(int(pid))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_load_runs_in_a_child_and_returns_every_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("httpx")

    async def here(*_: object, **__: object) -> None:
        raise AssertionError("the clients ran in the bench's own process")

    monkeypatch.setattr(sb, "load_here", here)  # in this process only: the child imports its own
    setup = sb.PeerSetup(_stand_in(tmp_path / "site"), "target", "draft", "float32", 0.0, 4, ("--compile", "off"))
    with sb.peer_serving(setup, tmp_path / "peer.log", "cpu", 30) as url:
        requests, wall = asyncio.run(sb.load(url, "peer", ["a", "b", "c"], 2, 2, 4, {"temperature": 0.0}, False))
    assert sorted(r.text for r in requests) == ["echo: a", "echo: a", "echo: b", "echo: c"]
    assert all(r.error is None and r.tokens == 3 and r.gaps_s == () for r in requests) and wall > 0
    assert _children() == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_load_cut_at_its_deadline_kills_its_child(tmp_path: Path) -> None:
    pytest.importorskip("httpx")
    setup = sb.PeerSetup(_stand_in(tmp_path / "site"), "target", "draft", "float32", 0.0, 4)  # never answers
    with sb.peer_serving(setup, tmp_path / "peer.log", "cpu", 30) as url:
        start = time.monotonic()
        with pytest.raises(sb.TimedOut):
            sb.bounded(sb.load(url, "peer", ["a"], 1, 1, 4, {"temperature": 0.0}, False), start + 1.0)
        assert time.monotonic() - start < 5 and _children() == []
