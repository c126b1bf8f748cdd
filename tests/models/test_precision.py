"""flashspec_models.precision: what ``dtype = "auto"`` computes in, from the CPU's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashspec_models import precision

AVX2_ONLY = {"fpu", "sse2", "avx", "avx2", "fma"}  # a common x86 CPU without bfloat16 matmul
SAPPHIRE_RAPIDS = AVX2_ONLY | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}


@pytest.mark.parametrize(
    ("device", "flags", "expected"),
    [
        ("cpu", AVX2_ONLY, "float32"),
        ("cpu", AVX2_ONLY | {"avx512f", "avx512bw", "avx512_vnni"}, "float32"),  # AVX-512 without BF16
        ("cpu", AVX2_ONLY | {"avx512f", "avx512_bf16"}, "bfloat16"),  # Cooper Lake, Zen 4
        ("cpu", AVX2_ONLY | {"amx_tile", "amx_bf16"}, "bfloat16"),
        ("cpu", SAPPHIRE_RAPIDS, "bfloat16"),
        ("cpu", set(), "float32"),  # no /proc/cpuinfo, or an ARM CPU's list
        ("cuda", AVX2_ONLY, "bfloat16"),  # the GPU decides, not the host CPU
        ("cuda", set(), "bfloat16"),
        ("mps", SAPPHIRE_RAPIDS, "float32"),
    ],
)
def test_auto_dtype(device: str, flags: set[str], expected: str) -> None:
    assert precision.auto_dtype(device, flags) == expected


def test_cpu_flags_reads_the_first_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert precision.cpu_flags(cpuinfo) == {"fpu", "avx2", "amx_bf16"}
    assert precision.cpu_has_native_bf16(precision.cpu_flags(cpuinfo))


@pytest.mark.parametrize("text", [None, "processor\t: 0\nFeatures\t: fp asimd bf16\n"])  # missing; ARM's layout
def test_cpu_flags_is_empty_without_an_x86_flags_line(tmp_path: Path, text: str | None) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    if text is not None:
        cpuinfo.write_text(text)
    assert precision.cpu_flags(cpuinfo) == frozenset()
    assert precision.auto_dtype("cpu", precision.cpu_flags(cpuinfo)) == "float32"


def test_auto_dtype_reads_this_machine_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: frozenset({"amx_bf16"}))
    assert precision.auto_dtype("cpu") == "bfloat16"
    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: frozenset({"avx2"}))
    assert precision.auto_dtype("cpu") == "float32"


@pytest.mark.parametrize("flags", [AVX2_ONLY, SAPPHIRE_RAPIDS], ids=["avx2", "amx"])
def test_loaders_compute_auto_in_the_decided_dtype(monkeypatch: pytest.MonkeyPatch, flags: set[str]) -> None:
    import torch

    from flashspec_fast.keys import FastOptions
    from flashspec_hf.loading import ModelOptions, _dtype

    monkeypatch.setattr(precision, "cpu_flags", lambda cpuinfo=None: frozenset(flags))
    expected = torch.bfloat16 if flags is SAPPHIRE_RAPIDS else torch.float32
    cpu = torch.device("cpu")
    assert _dtype(ModelOptions(model="smollm2-135m-instruct"), cpu) == expected
    assert FastOptions(model="smollm2-135m-instruct").torch_dtype(cpu) == expected
    assert _dtype(ModelOptions(model="smollm2-135m-instruct", dtype="float32"), cpu) == torch.float32
    assert _dtype(ModelOptions(model="smollm2-135m-instruct"), torch.device("cuda")) == torch.bfloat16



@pytest.mark.parametrize(("flags", "gpu", "expected"), [
    ({"avx2", "fma"}, False, "float32"),  # upcasting a bfloat16 cache at every load costs more than it saves
    ({"avx2", "avx512_bf16"}, False, "bfloat16"),
    ({"amx_bf16"}, False, "bfloat16"),
    ({"avx2"}, True, "bfloat16"),  # an NVIDIA GPU computes in bfloat16
])
def test_default_cache_dtype_is_bfloat16_only_where_it_is_computed_natively(
        flags: set[str], gpu: bool, expected: str) -> None:
    from flashspec_models.precision import default_cache_dtype

    assert default_cache_dtype(flags, gpu) == expected


@pytest.mark.parametrize(
    ("gpus", "visible", "torch_version", "expected"),
    [
        (1, None, "2.11.0+cu130", True),
        (1, "0", "2.11.0", True),  # PyPI's Linux wheel: a CUDA build with no local tag
        (0, None, "2.11.0+cu130", False),  # the driver lists no GPU
        (None, None, "2.11.0+cu130", False),  # no NVIDIA driver at all
        (1, "", "2.11.0+cu130", False),  # CUDA_VISIBLE_DEVICES hides every GPU
        (1, "-1", "2.11.0+cu130", False),
        (1, None, "2.13.0+cpu", False),  # a CPU build of torch cannot use the GPU
        (1, None, "2.11.0+rocm6.2", False),
        (1, None, None, False),  # torch not installed (yet)
    ],
)
def test_an_nvidia_gpu_is_usable_only_where_the_driver_lists_one_it_is_visible_and_torch_is_a_cuda_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int | None, visible: str | None,
        torch_version: str | None, expected: bool) -> None:
    import importlib.metadata

    from flashspec_models.precision import nvidia_gpu_usable

    driver = tmp_path / "gpus"
    if gpus is not None:
        driver.mkdir()
        for i in range(gpus):
            (driver / f"0000:0{i}:00.0").mkdir()
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    real = importlib.metadata.version

    def fake(name: str) -> str:
        if name != "torch":
            return real(name)
        if torch_version is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return torch_version

    monkeypatch.setattr(importlib.metadata, "version", fake)
    assert nvidia_gpu_usable(driver) is expected
