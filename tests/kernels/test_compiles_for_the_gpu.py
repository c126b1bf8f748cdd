"""Every Triton kernel of flashspec_kernels compiles for the H200, checked on a CPU.

Why: CI has no GPU, so the kernel tests run in Triton's interpreter (``TRITON_INTERPRET=1``),
which executes a kernel's body as Python and numpy and accepts code the compiler refuses.
For example, a variable that goes from bf16 to fp32 inside a branch on a runtime value
(``x1`` inside ``if head < H + KV:`` in a rope kernel) runs in the interpreter without
complaint, while the compiler stops with "initial value for `x1` is of type
bf16[constexpr[64]], but the then block redefines it as fp32[constexpr[64]]". Compiling
needs a target, not a GPU, so this module compiles
every kernel as a GPU launch would, down to the cubin (TTIR, TTGIR, LLVM IR, PTX, then the
ptxas that ships with Triton), for ``GPUTarget("cuda", 90, 32)``.

How: the public launchers run on small CPU tensors as on a GPU (verify's ``_interpreting``
patched to False: one row per program, the full pads and blocks, a real vocabulary), and
every ``kernel[grid](...)`` is recorded instead of run. Triton's own binder (what
``JITFunction.run`` calls before compiling) turns each launch's arguments into the
specialization a GPU compiles: pointer and scalar types, constexpr values, an integer 1 as a
constant, 16-divisibility of integers and pointers. A child process then compiles each
distinct specialization once. It has to be another process: with ``TRITON_INTERPRET=1`` set
when Triton is imported, ``@triton.jit`` gives interpreter functions, both the project's
kernels and ``triton.language``'s own (``tl.zeros``, ``tl.max``, ``tl.sum``...), and the
compiler cannot take them (calling one patches ``triton.language`` with the interpreter's
semantics, which breaks every compilation after it). The child runs without the variable
and with Triton's on-disk cache in a temporary directory, so nothing stale is reused.
"""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, KernelInterface, create_function_from_signature  # noqa: E402

from flashspec_core.contracts import SamplingParams  # noqa: E402
from flashspec_core.sampling import Noise  # noqa: E402
from flashspec_kernels import attention, rope, verify  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # the H200: sm_90, 32 threads per warp
H200_SMS = 132
MODULES = (verify, attention, rope)
LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# binding a launch reads Triton's FP-fusion default, which a GPU launch gets as well; it warns once
pytestmark = pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION is unset")


@attrs.frozen
class Specialization:
    """One compilation of one kernel: what ``JITFunction.run`` would hand ``triton.compile``."""

    module: str
    kernel: str
    signature: dict[str, str]  # parameter -> Triton type ("*bf16", "i32", "constexpr", ...)
    constexprs: dict[tuple[int, ...], Any]  # parameter path -> value
    attributes: dict[tuple[int, ...], list]  # parameter path -> [["tt.divisibility", 16]] or []
    options: dict[str, Any]  # the launch's compile options (num_warps, maxnreg)

    def key(self) -> str:
        return repr(attrs.astuple(self, recurse=False))

    def describe(self) -> str:
        names = list(self.signature)
        return textwrap.dedent(f"""\
            {self.module}.{self.kernel}
              signature: {({k: v for k, v in self.signature.items() if v != "constexpr"})}
              constexprs: {({names[path[0]]: value for path, value in self.constexprs.items()})}
              16-divisible: {[names[path[0]] for path, attr in self.attributes.items() if attr]}
              options: {self.options}""")


def _jit_functions(module: types.ModuleType) -> dict[str, KernelInterface]:
    """The module's own ``@triton.jit`` functions (interpreted or not)."""
    return {name: fn for name, fn in vars(module).items()
            if isinstance(fn, KernelInterface) and fn.fn.__module__ == module.__name__}


def _as_jit(fn: KernelInterface) -> JITFunction:
    """A JITFunction for the binder: under the interpreter ``@triton.jit`` gave an
    InterpretedFunction, which keeps the decorator's arguments (do_not_specialize...)."""
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn, **fn.kwargs)


class Recorder:
    """Stands in for every kernel launch of MODULES: binds each ``kernel[grid](...)`` call
    to its GPU specialization and records it under the running case's name."""

    def __init__(self) -> None:
        self.backend = make_backend(TARGET)
        self.found: dict[str, tuple[Specialization, list[str]]] = {}  # key -> (specialization, cases)
        self.case = ""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for module in MODULES:
            for name, fn in _jit_functions(module).items():
                monkeypatch.setattr(fn, "run", self._launcher(module.__name__, name, _as_jit(fn)))

    def _launcher(self, module: str, name: str, kernel: JITFunction) -> Callable[..., None]:
        binder = create_function_from_signature(kernel.signature, kernel.params, self.backend)

        def run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
            bound, specialization, options = binder(*args, **kwargs)
            _, signature, constexprs, attributes = kernel._pack_args(self.backend, kwargs, bound, specialization,
                                                                     options)
            launch = {k: v for k, v in kwargs.items() if k not in kernel.arg_names}
            spec = Specialization(module, name, signature, constexprs, attributes, launch)
            self.found.setdefault(spec.key(), (spec, []))[1].append(self.case)

        return run

    @contextmanager
    def running(self, case: str) -> Iterator[None]:
        self.case = case
        yield


# --------------------------------------------------------------------------- the cases


def _verify_cases(rec: Recorder) -> None:
    """Exact and philox noise, with and without draft probs, and greedy, in every logits
    dtype at Qwen2.5's vocabulary; top-k/top-p (float32 filtered logits) and gamma 0."""
    batch, gamma, vocab = 2, 4, 151936
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (batch, gamma), generator=gen)
    q = torch.softmax(torch.randn((batch, gamma, vocab), generator=gen), dim=-1)  # drafts' probs are float32
    noise = Noise.draw(batch, gamma, vocab, gen, "cpu")
    for dtype in LOGIT_DTYPES:
        logits = torch.randn((batch, gamma + 1, vocab), generator=gen).to(dtype)
        for probs, with_q in ((None, "without"), (q, "with")):
            with rec.running(f"verify exact {_name(dtype)} {with_q} draft probs"):
                verify.verify_triton(logits, tokens, probs, SamplingParams(temperature=0.7), noise=noise)
            for draw in ("one_stage", "two_stage"):
                with rec.running(f"verify philox {draw} {_name(dtype)} {with_q} draft probs"):
                    state = verify.new_philox_state(gen, "cpu")
                    verify.verify_triton(logits, tokens, probs, SamplingParams(), state=state, draw=draw)
        with rec.running(f"verify greedy {_name(dtype)}"):
            verify.verify_triton(logits, tokens, None, SamplingParams(temperature=0))
    with rec.running("verify exact bfloat16 with top-k/top-p"):
        verify.verify_triton(logits, tokens, q, SamplingParams(temperature=0.8, top_k=50, top_p=0.9), noise=noise)
    with rec.running("verify greedy bfloat16 with top-p"):
        verify.verify_triton(logits, tokens, None, SamplingParams(temperature=0, top_p=0.5))
    with rec.running("verify philox bfloat16 gamma 0"):
        verify.verify_triton(logits[:, :1], tokens[:, :0], None, SamplingParams(), state=verify.new_philox_state(gen, "cpu"))


def _attention_cases(rec: Recorder) -> None:
    """Split-KV (with the combine) and direct in every dtype; a padded head dim."""
    gen = torch.Generator().manual_seed(1)
    shapes = [("decode, 1.5B heads, split", 1, 1, 12, 2, 128, 256, dtype) for dtype in LOGIT_DTYPES]
    shapes += [("verify, 0.5B heads, direct", 1, 5, 14, 2, 64, 40, dtype) for dtype in LOGIT_DTYPES]
    shapes += [("verify, head dim 80, split", 2, 3, 6, 2, 80, 300, torch.bfloat16)]
    for case, batch, width, heads, kv, hd, span, dtype in shapes:
        q = torch.randn((batch, width, heads, hd), generator=gen).to(dtype)
        k, v = (torch.randn((batch, span + 8, kv, hd), generator=gen).to(dtype) for _ in range(2))
        pos = torch.arange(span - width, span)[None].repeat(batch, 1)
        with rec.running(f"attention {case} {_name(dtype)}"):
            attention.decode_attention(q, k, v, pos, span)


def _rope_cases(rec: Recorder) -> None:
    """Every dtype rope_store takes (16-bit inputs upcast, wider ones not), two head shapes."""
    batch, width = 2, 3
    for dtype, (heads, kv, hd) in [(d, (12, 2, 128)) for d in rope.DTYPES] + [(torch.bfloat16, (14, 2, 64))]:
        qkv = torch.randn((batch, width, heads + 2 * kv, hd)).to(dtype)
        cos, sin = (torch.randn((batch, width, 1, hd)).to(dtype) for _ in range(2))
        k_cache, v_cache = (torch.zeros((batch * 16, kv * hd), dtype=dtype) for _ in range(2))
        with rec.running(f"rope {_name(dtype)} {heads}/{kv} heads of {hd}"):
            rope.rope_store(qkv, cos, sin, k_cache, v_cache, torch.arange(batch * width), heads, kv)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- compiling


def _compile(spec: Specialization) -> str | None:
    """None if ``spec`` compiles to a cubin, else the compiler's error (in the child)."""
    module = next(m for m in MODULES if m.__name__ == spec.module)
    try:
        triton.compile(ASTSource(getattr(module, spec.kernel), spec.signature, spec.constexprs, spec.attributes),
                       target=TARGET, options=dict(spec.options))
    except Exception as exc:  # whatever the compiler raises is the finding
        return f"{type(exc).__name__}: {exc}"
    return None


def _child(specs_path: str, errors_path: str) -> None:
    """The child process: compile the pickled specializations, pickle their errors."""
    assert not triton.knobs.runtime.interpret, "the child must import Triton without TRITON_INTERPRET"
    specs = [Specialization(**fields) for fields in pickle.loads(Path(specs_path).read_bytes())]
    Path(errors_path).write_bytes(pickle.dumps([_compile(spec) for spec in specs]))


def _compile_in_children(specs: list[Specialization], tmp: Path) -> list[str | None]:
    """``_compile`` over ``specs``, spread over a child process per core (up to 4)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
    n = max(1, min(4, os.cpu_count() or 1, len(specs)))
    children = []
    for i in range(n):
        (tmp / f"specs{i}").write_bytes(pickle.dumps([attrs.asdict(s, recurse=False) for s in specs[i::n]]))
        args = [sys.executable, __file__, str(tmp / f"specs{i}"), str(tmp / f"errors{i}")]
        children.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    errors: list[str | None] = [None] * len(specs)
    for i, child in enumerate(children):
        output = child.communicate()[0]
        assert child.returncode == 0, f"the compiling child process failed ({child.returncode}):\n{output}"
        errors[i::n] = pickle.loads((tmp / f"errors{i}").read_bytes())
    return errors


@attrs.frozen
class Compiled:
    spec: Specialization
    cases: tuple[str, ...]  # the cases that launch it
    error: str | None  # None: it compiled


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> list[Compiled]:
    """Every specialization the cases launch, compiled once."""
    rec = Recorder()
    with pytest.MonkeyPatch.context() as mp:
        rec.install(mp)
        mp.setattr(verify, "_interpreting", lambda device: False)
        mp.setattr(verify, "_programs_wanted", lambda device: verify.PROGRAMS_PER_SM * H200_SMS)
        mp.setattr(verify, "_race_programs_wanted", lambda device: verify.RACE_PROGRAMS_PER_SM * H200_SMS)
        _verify_cases(rec)
        _attention_cases(rec)
        _rope_cases(rec)
    specs = [spec for spec, _ in rec.found.values()]
    errors = _compile_in_children(specs, tmp_path_factory.mktemp("compile"))
    return [Compiled(spec, tuple(dict.fromkeys(cases)), error)
            for (spec, cases), error in zip(rec.found.values(), errors, strict=True)]


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rpartition(".")[2])
def test_compiles_for_the_h200(compiled: list[Compiled], module: types.ModuleType) -> None:
    mine = [c for c in compiled if c.spec.module == module.__name__]
    failed = [c for c in mine if c.error is not None]
    report = "\n\n".join(f"{c.spec.describe()}\n  launched by: {'; '.join(c.cases)}\n  compiler: {c.error}"
                         for c in failed)
    if failed:
        pytest.fail(f"{len(failed)} of the {len(mine)} specializations of {module.__name__} do not compile for "
                    f"sm_90 (the interpreter runs them, a GPU would refuse them):\n\n{report}", pytrace=False)


def test_every_kernel_is_compiled(compiled: list[Compiled]) -> None:
    """Every @triton.jit function of MODULES is launched by a case, or called by one that is."""
    reached = {(c.spec.module, c.spec.kernel) for c in compiled}
    todo = list(reached)
    while todo:
        module, name = todo.pop()
        own = _jit_functions(sys.modules[module])
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(own[name].fn)))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in own:
                if (module, node.func.id) not in reached:
                    reached.add((module, node.func.id))
                    todo.append((module, node.func.id))
    every = {(module.__name__, name) for module in MODULES for name in _jit_functions(module)}
    missed = sorted(f"{module}.{name}" for module, name in every - reached)
    assert not missed, f"no case here launches these Triton functions, nor one that calls them: {missed}"


if __name__ == "__main__":
    _child(*sys.argv[1:])
