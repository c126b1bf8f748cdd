"""The skinny-GEMM pickers' configs fit a program's shared memory, checked on a CPU.

Why: Triton refuses a launch whose kernel needs more shared memory than the GPU gives a
program (232448 bytes on the H100 and H200), and the interpreter, which runs the CPU tests,
never asks. The first NF4 kernel buffered each step's code-book values and scales as
float32 tiles, four times the bytes of gemv's bf16 weight tile, and with gemv's three stages
the 1.5B's gate-up matrix (64 columns, steps of 256) asked for 278528 bytes on an H100.

How: :func:`flashspec_kernels.gemv.pick` and :func:`flashspec_kernels.nf4.pick` drop
stages until their ``shared_bytes`` estimate fits. The first tests check that for the
engine's shapes (0.5B draft, 1.5B target) and the synthetic 7B/14B/32B ones, in every dtype,
on the H100 and on GPUs with less (A100, sm_86/sm_89). The compiler test then compiles
the distinct specializations the H100's picks launch for ``GPUTarget("cuda", 90, 32)``, in a
child process without ``TRITON_INTERPRET`` (``test_compiles_for_the_gpu.py`` says why), and
checks that what Triton allocates is within the estimate (bfloat16; float32 with ``-m slow``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

triton = pytest.importorskip("triton")

from triton.runtime.errors import OutOfResources  # noqa: E402

from flashspec_fast.keys import QWEN25_SHAPES  # noqa: E402
from flashspec_kernels import gemv, nf4  # noqa: E402
from flashspec_kernels.gemv import SHARED, Config  # noqa: E402

VOCAB = 151936
H100_SMS = 132
# (SMs, shared memory per program in bytes): H100/H200; A100; sm_86 and sm_89 cards
GPUS = {"h100": (H100_SMS, SHARED), "a100": (108, 166912), "sm89": (128, 101376)}
ITEMSIZES = {"bfloat16": 2, "float32": 4}  # float16: bfloat16's bytes


def _matrices(shape: str) -> list[tuple[str, int, int, bool]]:
    """``(name, n, k, glu)`` of each GEMM of a decoding forward with gemv (the gate-up pair as
    one GLU matrix of ``F`` columns; the LM head)."""
    c = QWEN25_SHAPES[shape]
    d, f, heads, kv = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = d // heads
    return [("qkv", (heads + 2 * kv) * hd, d, False), ("o", d, heads * hd, False), ("gate_up", f, d, True),
            ("down", d, f, False), ("head", VOCAB, d, False)]


def _nf4_matrices(shape: str) -> list[tuple[str, int, int]]:
    """``(name, n, k)`` of each NF4 weight (the gate-up pair one ``[2 F, D]`` matrix; not the head)."""
    return [(name, 2 * n if glu else n, k) for name, n, k, glu in _matrices(shape) if name != "head"]


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("shape", QWEN25_SHAPES)
def test_every_pick_fits_and_keeps_its_blocks(shape: str, gpu: str) -> None:
    """Only stages give way to shared memory on these GPUs: the blocks and slices (so the bits)
    are what the matrix alone gives; gemv keeps its three stages on the H100."""
    sms, shared = GPUS[gpu]
    for dtype, size in ITEMSIZES.items():
        for name, n, k, glu in _matrices(shape):
            cfg = gemv.pick(n, k, glu, sms, size, shared)
            assert gemv.shared_bytes(cfg, size, glu) <= shared, (name, dtype, cfg)
            assert attrs.evolve(cfg, num_stages=3) == gemv.blocks(n, k, glu, sms), (name, dtype, cfg)
            assert gpu != "h100" or cfg.num_stages == 3, (name, dtype, cfg)
        for name, n, k in _nf4_matrices(shape):
            cfg = nf4.pick(n, k, sms, size, shared)
            assert nf4.shared_bytes(cfg, size) <= shared, (name, dtype, cfg)
            assert attrs.evolve(cfg, num_stages=3) == gemv.blocks(n, k, sms=sms), (name, dtype, cfg)


def test_nf4_steps_take_little_shared_memory() -> None:
    """NF4 stages hold a step's packed bytes, one scale per column and group, and x: the first
    version also staged a float32 code-book value and scale per weight, and the 1.5B's gate-up
    matrix (64 columns, steps of 256) asked for 278528 bytes with three stages on an H100."""
    cfg = nf4.pick(2 * 8960, 1536, H100_SMS, 2, SHARED)
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_stages) == (64, 256, 1, 3)
    assert nf4.shared_bytes(cfg, 2) < SHARED // 4


def test_fit_shortens_the_steps_once_one_stage_is_left() -> None:
    def need(cfg: Config) -> int:
        return cfg.num_stages * cfg.block_k * 100

    assert gemv.fit(Config(64, 256, 1), need, 20000) == Config(64, 128, 1, num_stages=1)
    with pytest.raises(ValueError, match="needs 4096 bytes of shared memory, more than the 1000"):
        gemv.fit(Config(16, 256, 1), lambda cfg: cfg.block_k * 256, 1000)


class _Refusing:
    """A kernel whose compilation asks for more of ``resource`` than the GPU has above ``fits``
    stages: ``kernel[grid](...)`` raises OutOfResources before launching, as Triton's does."""

    def __init__(self, fits: int, resource: str = "shared memory") -> None:
        self.fits, self.resource = fits, resource
        self.tried: list[int] = []

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        return self.run

    def run(self, *args: Any, num_warps: int, num_stages: int, **constexprs: Any) -> None:
        self.tried.append(num_stages)
        if num_stages > self.fits:
            raise OutOfResources(300000, SHARED, self.resource)


def test_a_refused_launch_retries_with_fewer_stages_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemv, "_stages", {})
    x, cfg = torch.zeros(4), Config(64, 256, 1)
    kernel = _Refusing(fits=1)
    gemv.launch(kernel, (1,), (x,), cfg, BLOCK_N=64)
    gemv.launch(kernel, (1,), (x,), cfg, BLOCK_N=64)
    assert kernel.tried == [3, 2, 1, 1], "the second launch goes straight to the stages that fit"
    never = _Refusing(fits=0)
    with pytest.raises(OutOfResources):
        gemv.launch(never, (1,), (x,), cfg, BLOCK_N=64)
    assert never.tried == [3, 2, 1]
    threads = _Refusing(fits=1, resource="threads")  # not the stages' doing: no retry
    with pytest.raises(OutOfResources):
        gemv.launch(threads, (1,), (x,), cfg, BLOCK_N=64)
    assert threads.tried == [3]


# --------------------------------------------------------------------------- compiling for sm_90

TYPES = {"bfloat16": "bf16", "float32": "fp32"}


def _specs(dtype: str) -> list[dict[str, Any]]:
    """The H100's picks over every shape in ``dtype``, each distinct config once (the number of
    slices left out: it changes the epilogue, not the loop's buffers)."""
    size = ITEMSIZES[dtype]
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for shape in QWEN25_SHAPES:
        for _, n, k, glu in _matrices(shape):
            cfg = gemv.pick(n, k, glu, H100_SMS, size, SHARED)
            spec = {"kernel": "gemv", "dtype": TYPES[dtype], "glu": glu, **attrs.asdict(cfg),
                    "estimate": gemv.shared_bytes(cfg, size, glu)}
            found.setdefault(("gemv", glu, cfg.block_n, cfg.block_k, cfg.num_stages), spec)
        for _, n, k in _nf4_matrices(shape):
            cfg = nf4.pick(n, k, H100_SMS, size, SHARED)
            spec = {"kernel": "nf4", "dtype": TYPES[dtype], "glu": False, **attrs.asdict(cfg),
                    "estimate": nf4.shared_bytes(cfg, size)}
            found.setdefault(("nf4", cfg.block_n, cfg.block_k, cfg.num_stages), spec)
    return list(found.values())


def _source(spec: dict[str, Any]) -> Any:
    """The ASTSource a launch of ``spec`` compiles: gemv with the norm and the bias or GLU (its
    largest loads), NF4 with a bias; 16-divisible pointers, K and strides."""
    from triton.compiler import ASTSource

    dt = spec["dtype"]
    common = {"BLOCK_M": 16, "BLOCK_N": spec["block_n"], "BLOCK_K": spec["block_k"], "SPLIT_K": spec["split_k"],
              "BIAS": not spec["glu"], "INTERPRET": False}
    if spec["kernel"] == "gemv":
        fn = gemv._gemv_kernel
        types = dict.fromkeys(("x_ptr", "w_ptr", "nw_ptr", "b_ptr", "out_ptr"), f"*{dt}")
        types |= {"part_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
        constexprs = common | {"NORM": True, "RESID": False, "GLU": spec["glu"]}
    else:
        fn = nf4._nf4_kernel
        types = {"x_ptr": f"*{dt}", "p_ptr": "*u8", "s_ptr": "*fp32", "t_ptr": "*fp32", "b_ptr": f"*{dt}",
                 "out_ptr": f"*{dt}", "part_ptr": "*fp32", "count_ptr": "*i32"}
        constexprs = common | {"GROUP": nf4.GROUP}
    names = list(fn.arg_names)
    signature = {p: "constexpr" if p in constexprs else types.get(p, "i32") for p in names}
    aligned = [p for p in names if types.get(p, "")[:1] == "*" or p == "K" or p.startswith("stride")]
    return ASTSource(fn, signature, {(names.index(p),): v for p, v in constexprs.items()},
                     {(names.index(p),): [["tt.divisibility", 16]] for p in aligned})


def _child(specs_path: str, out_path: str) -> None:
    """The child process: compile each spec for sm_90, write the shared memory it takes."""
    from triton.backends.compiler import GPUTarget

    specs = json.loads(Path(specs_path).read_text())
    shared = [triton.compile(_source(s), target=GPUTarget("cuda", 90, 32),
                             options={"num_warps": s["num_warps"], "num_stages": s["num_stages"]}).metadata.shared
              for s in specs]
    Path(out_path).write_text(json.dumps(shared))


# float32 is slow (its kernels take about 20 s to compile on two cores), and GPUs run 16-bit models
@pytest.mark.parametrize("dtype", ["bfloat16", pytest.param("float32", marks=pytest.mark.slow)])
def test_the_h100_picks_compile_within_the_estimate(dtype: str, tmp_path: Path) -> None:
    try:
        triton.knobs.nvidia.ptxas.path  # noqa: B018 (raises where Triton ships no ptxas)
    except RuntimeError as exc:
        pytest.skip(f"no ptxas to compile for sm_90: {exc}")
    specs = _specs(dtype)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # what a launch gets; set, so Triton does not warn
    n = max(1, min(4, os.cpu_count() or 1))
    children = []
    for i in range(n):
        (tmp_path / f"specs{i}").write_text(json.dumps(specs[i::n]))
        args = [sys.executable, __file__, str(tmp_path / f"specs{i}"), str(tmp_path / f"shared{i}")]
        children.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    shared: list[int] = [0] * len(specs)
    for i, child in enumerate(children):
        output = child.communicate()[0]
        assert child.returncode == 0, f"the compiling child process failed ({child.returncode}):\n{output}"
        shared[i::n] = json.loads((tmp_path / f"shared{i}").read_text())
    table = "\n".join(f"  {s['kernel']} {s['dtype']} {s['block_n']}x{s['block_k']} split {s['split_k']} "
                      f"{s['num_stages']} stages: {got} bytes, estimate {s['estimate']}"
                      for s, got in zip(specs, shared, strict=True))
    assert all(got <= s["estimate"] <= SHARED for s, got in zip(specs, shared, strict=True)), table


if __name__ == "__main__":
    _child(*sys.argv[1:])
