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
