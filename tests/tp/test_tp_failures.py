"""The tensor-parallel target's start and its failures: a bad split is refused before any
process starts; one rank runs the same code as one process, bit for bit; a worker that dies
or hangs ends rank 0's call with a named error in bounded time; a worker whose rank 0 dies
exits."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attrs
import pytest
import torch
import torch.distributed as dist
from _tiny import tiny_family

from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError
from flashspec_fast.options import FastTargetOptions
from flashspec_fast.target import make_target
from flashspec_fast.tp import TensorParallelError, TensorParallelTarget, make_tp_target

TOKENS = torch.tensor([[1, 2, 3, 4, 5, 0], [3, 4, 5, 6, 7, 8]])
LENGTHS = [5, 6]
DRAFT = torch.tensor([[1, 2], [3, 4]])


@pytest.fixture(scope="module")
def target_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_family(tmp_path_factory.mktemp("tp_fail"))["target"]


def options(path: Path, tp: int = 2) -> FastTargetOptions:
    return FastTargetOptions(model=str(path), dtype="float32", device="cpu", compile=False, chat_template=False,
                             max_len=64, tensor_parallel=tp)


def started(path: Path, timeout_s: float = 20.0) -> TensorParallelTarget:
    target = make_tp_target(options(path), 2, timeout_s=timeout_s)
    target.prefill(TOKENS, LENGTHS)
    assert target.score(TOKENS, LENGTHS, DRAFT).shape == (2, 3, 16)
    return target


def test_bad_settings_are_refused_before_any_process_starts(target_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel = 3 must divide the model's attention heads \(4\)"):
        make_tp_target(options(target_path, 3), 3)
    assert not dist.is_initialized() and not multiprocessing.active_children()
    with pytest.raises(ValueError, match="kernels = 'torch'"):
        attrs.evolve(options(target_path), kernels="gemv")
    with pytest.raises(ValueError, match="tensor_parallel"):
        options(target_path, 0)
    arm = {"use": "fast", "model": str(target_path), "gamma": 2, "tensor_parallel": 2}
    with pytest.raises(ConfigError, match="tensor_parallel"):  # a draft table has no such key
        build_pipeline({"target": {"use": "fast", "model": str(target_path)}, "arm": [arm]})


def test_one_rank_runs_the_sharded_code_and_matches_one_process_exactly(target_path: Path) -> None:
    plain = make_target(options(target_path, 1))
    sharded = make_tp_target(options(target_path, 1), 1)
    try:
        assert sharded.workers == [] and dist.get_world_size() == 1
        for t in (plain, sharded):
            t.prefill(TOKENS, LENGTHS)
        assert torch.equal(sharded.score(TOKENS, LENGTHS, DRAFT), plain.score(TOKENS, LENGTHS, DRAFT))
    finally:
        sharded.close()
    assert not dist.is_initialized()
    assert sharded._store is not None and not Path(sharded._store).exists()  # the rendezvous file is gone too


def test_a_dead_worker_is_named_at_the_next_call(target_path: Path) -> None:
    target = started(target_path)
    try:
        os.kill(target.workers[0].pid, signal.SIGKILL)
        target.workers[0].join(5.0)
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match=r"rank 1 \(pid \d+\) exited with code -9"):
            target.score(TOKENS, LENGTHS, DRAFT)
        with pytest.raises(TensorParallelError, match="rank 1"):  # and at every call after it
            target.rollback([0, 0])
        assert time.monotonic() - start < 3.0
    finally:
        target.close()
    assert not dist.is_initialized()


def test_an_idle_worker_waits_and_a_hung_one_times_out_with_a_named_error(target_path: Path) -> None:
    target = started(target_path, timeout_s=2.0)
    time.sleep(3.0)  # longer than a call's timeout: between calls the workers wait for rank 0
    assert target.score(TOKENS, LENGTHS, DRAFT).shape == (2, 3, 16)
    pid = target.workers[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(TensorParallelError, match="a rank stopped answering: .*failed"):
            target.score(TOKENS, LENGTHS, DRAFT)
        assert time.monotonic() - start < 10.0
    finally:
        os.kill(pid, signal.SIGKILL)
        target.close()
    assert not target.workers[0].is_alive()


def test_a_new_target_replaces_the_running_one_even_after_a_failed_build(target_path: Path) -> None:
    """One default process group per process: a pipeline whose build fails after its target
    started (a 'self' arm cannot draft on a sharded target) leaves the target running, and
    the next target must close it rather than join its group."""
    config = {"target": {"use": "fast", "model": str(target_path), "dtype": "float32", "device": "cpu",
                         "compile": False, "chat_template": False, "max_len": 64, "tensor_parallel": 2},
              "arm": [{"use": "self", "layers": 1, "gamma": 2}]}
    with pytest.raises(ValueError, match="draft 'self'.*TensorParallelTarget"):
        build_pipeline(config)
    first = started(target_path)
    second = started(target_path)
    try:
        with pytest.raises(TensorParallelError, match="replaced it in this process"):
            first.score(TOKENS, LENGTHS, DRAFT)
        assert not first.workers[0].is_alive()
        assert second.score(TOKENS, LENGTHS, DRAFT).shape == (2, 3, 16)
    finally:
        second.close()


def test_an_interrupted_call_leaves_the_target_refusing_calls(target_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after the call went out: the worker makes it, rank 0 does not, so their caches
    may differ; every later call says so instead of hanging in a mismatched collective."""
    from flashspec_fast import tp

    target = started(target_path, timeout_s=2.0)

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tp, "execute", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            target.score(TOKENS, LENGTHS, DRAFT)
        monkeypatch.undo()
        with pytest.raises(TensorParallelError, match="interrupted during score"):
            target.score(TOKENS, LENGTHS, DRAFT)
    finally:
        target.close()
    assert not target.workers[0].is_alive()


RANK0 = """
import os, signal, sys
from flashspec_fast.options import FastTargetOptions
from flashspec_fast.tp import make_tp_target
opts = FastTargetOptions(model=sys.argv[1], dtype="float32", device="cpu", compile=False, max_len=64, tensor_parallel=2)
target = make_tp_target(opts, 2)
print(target.workers[0].pid, target._store, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def test_a_worker_exits_when_rank_0_dies(target_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", RANK0, str(target_path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    pid, store = int(run.stdout.split()[0]), Path(run.stdout.split()[1])
    store.unlink(missing_ok=True)  # a killed rank 0 leaves its rendezvous file
    deadline = time.monotonic() + 15.0
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(pid), f"worker {pid} outlived rank 0"
