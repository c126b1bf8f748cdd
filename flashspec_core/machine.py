"""Whether this machine certainly lacks CUDA, found without importing torch.

Importing torch takes seconds, so a config that names a CUDA device (or a component that
needs one) on a machine without it is refused before that import when the absence is
certain: every device is hidden by ``CUDA_VISIBLE_DEVICES``, the installed torch is built
without CUDA or ROCm, or (on Linux) neither an NVIDIA nor a ROCm driver is installed. In
any other case :func:`no_cuda` says ``None`` and the check after the torch import decides,
so a wrong guess here can only delay an error, never refuse a machine that works.

This module imports neither torch nor any plugin.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# Files a loaded NVIDIA or ROCm (HIP, which torch exposes as "cuda") kernel driver provides;
# a container given a GPU sees them too.
DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/kfd")
DRIVER_LIBRARIES = ("cuda", "amdhip64")  # libcuda.so, libamdhip64.so


def hidden_by_env(environ: Mapping[str, str]) -> str | None:
    """Why ``environ`` hides every CUDA device from torch, or None. Only the two spellings
    that certainly hide all of them count (``""`` and ``"-1"``)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES is {visible!r}, which hides every GPU"
    return None


def built_without_gpu(version_py: str | None) -> str | None:
    """Why the torch whose ``torch/version.py`` reads ``version_py`` has no CUDA, or None:
    only when the file says both ``cuda`` and ``hip`` are None (a ROCm build serves "cuda")."""
    if version_py is None:
        return None
    found = {}
    for name in ("cuda", "hip"):
        match = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(.*?)\s*$", version_py, re.MULTILINE)
        if match is None:  # a layout this does not know: let torch decide
            return None
        found[name] = match.group(1)
    if found["cuda"] == found["hip"] == "None":
        return "the installed torch is built without CUDA or ROCm"
    return None


def no_driver(platform: str, exists: Callable[[str], bool], find_library: Callable[[str], str | None]) -> str | None:
    """Why a Linux machine has no GPU driver torch could use, or None (always None elsewhere:
    Windows names its driver differently, and a macOS torch is caught by its build)."""
    if not platform.startswith("linux"):
        return None
    if any(exists(path) for path in DRIVER_FILES) or any(find_library(lib) for lib in DRIVER_LIBRARIES):
        return None
    return "there is no NVIDIA or ROCm driver"


def _torch_version_py() -> str | None:
    """The text of the installed ``torch/version.py``, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.origin is None:
            return None
        return Path(spec.origin).with_name("version.py").read_text(encoding="utf-8")
    except (ImportError, ValueError, OSError):
        return None


def no_cuda() -> str | None:
    """Why torch on this machine certainly sees no CUDA device, or None when it may see one.

    The cheapest signs first: the driver's library lookup runs ``ldconfig`` (tens of ms).
    """
    return (hidden_by_env(os.environ) or built_without_gpu(_torch_version_py())
            or no_driver(sys.platform, os.path.exists, ctypes.util.find_library))
