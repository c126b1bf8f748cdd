"""The dtype a model computes in when its config says ``dtype = "auto"``.

The embedded models are cached in bfloat16 (:mod:`flashspec_models.weights`); that is
the dtype they compute in where the hardware multiplies bfloat16 natively: every CUDA
GPU FlashSpec runs on, and x86 CPUs with AVX512-BF16 or AMX. Other CPUs have no bfloat16
matmul units, so torch emulates bfloat16 there and runs it slower than float32
(``docs/benchmarks/cpu-dtype.json``); their weights are upcast to float32 once, at load.

No torch here: the config check calls this before torch is imported.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["NATIVE_BF16_FLAGS", "auto_dtype", "cpu_flags", "cpu_has_native_bf16"]

# /proc/cpuinfo flags of an x86 CPU that multiplies bfloat16 in hardware (oneDNN uses either)
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = _CPUINFO) -> frozenset[str]:
    """The feature flags of the first CPU listed in ``cpuinfo``; empty where there is no such
    file (macOS, Windows) or it lists no flags (ARM), which counts as no native bfloat16."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_has_native_bf16(flags: Iterable[str] | None = None) -> bool:
    """Whether this CPU (or one with ``flags``) multiplies bfloat16 in hardware."""
    return not NATIVE_BF16_FLAGS.isdisjoint(cpu_flags() if flags is None else flags)


def auto_dtype(device_type: str, flags: Iterable[str] | None = None) -> str:
    """The dtype name ``"auto"`` stands for on a device of ``device_type`` (``"cuda"``, ``"cpu"``, ...).

    :param flags: the CPU's feature flags; default: this machine's, from ``/proc/cpuinfo``.
    :returns: ``"bfloat16"`` on CUDA and on a CPU with native bfloat16, else ``"float32"``.
    """
    if device_type == "cuda":
        return "bfloat16"
    if device_type == "cpu" and cpu_has_native_bf16(flags):
        return "bfloat16"
    return "float32"


def nvidia_gpu_usable(driver: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """Whether an NVIDIA GPU is here for torch to use, decided without importing torch: the
    driver lists a GPU, ``CUDA_VISIBLE_DEVICES`` does not hide them all, and the installed
    torch's version has no ``+cpu`` (or ROCm) build tag."""
    import importlib.metadata
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    try:
        if not any(driver.iterdir()):
            return False
        version = importlib.metadata.version("torch")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return False
    return "+cpu" not in version and "+rocm" not in version


def default_cache_dtype(flags: Iterable[str] | None = None, gpu: bool | None = None) -> str:
    """The dtype a known model is cached in when none is asked for: ``"bfloat16"`` where it is
    computed in natively (an NVIDIA GPU, :func:`nvidia_gpu_usable`; a CPU with AVX512-BF16 or
    AMX), else ``"float32"``: without native bfloat16 a bfloat16 cache is upcast at every load,
    which costs the 1.5B more peak memory and load time than it saves in disk
    (``docs/benchmarks/cpu-dtype.json``).

    :param flags: the CPU's feature flags; default: this machine's.
    :param gpu: whether an NVIDIA GPU is usable; default: :func:`nvidia_gpu_usable`.
    """
    if cpu_has_native_bf16(flags) or (nvidia_gpu_usable() if gpu is None else gpu):
        return "bfloat16"
    return "float32"

