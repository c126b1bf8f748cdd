"""Check and time the Triton verifier against the reference on one CUDA GPU
(``benchmarks/verify_kernels.py``).

Writes ``DIR/verify-kernels-h200.json``: provenance, the code's launch settings, the GPU
checks (token equality with the reference in exact mode, no host sync under
``torch.cuda.set_sync_debug_mode("error")``, CUDA-graph replay), a device-to-device copy
bandwidth, and per shape, at the code's defaults, the median times of

* ``logits_pass_ms``: the one full pass over the logits alone;
* ``read_floor_ms``: the same bytes read by the simplest streaming kernel (one block per
  program, one sum; the fastest of three block sizes);
* ``triton_ms``: a whole philox ``TritonVerifier.verify`` step as the engine calls it; the
  logits stay at one address, as the fast target's output buffer does, so from the second
  call on the step replays a pinned graph (:mod:`flashspec_triton.stepgraphs`);
* ``triton_graph_ms``: the same step replayed from the caller's CUDA graph;
* ``reference_ms``: ``ReferenceVerifier.verify`` on the same GPU;
* ``compile_ms``: ``Noise.draw`` + ``torch.compile(verify_random, dynamic=True)`` (B >= 8).

Times are ``triton.testing.do_bench`` medians, which clear the L2 before every timed call;
``*_wall_ms`` are host medians of ``step(); synchronize()``. ``bandwidth_fraction`` is the
logits' bytes / ``logits_pass_ms`` / the copy bandwidth; ``read_floor_fraction`` the same
with ``read_floor_ms``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

from flashspec_bench.provenance import provenance, write_json
from flashspec_core import sampling
from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import Noise, verify_random
from flashspec_kernels import verify as ops
from flashspec_reference.plugin import ReferenceVerifier
from flashspec_triton.plugin import TritonVerifier, TritonVerifierConfig

DEV = torch.device("cuda")
T0 = time.time()


# the shapes timed, in the order the loops of time_shapes walk them
SHAPE_GRID = {"B": (1, 8, 32, 128, 512), "gamma": (4, 8), "V": (32000, 128256, 151936),
              "dtypes": (torch.bfloat16, torch.float32)}


def log(*a: object) -> None:
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def make_inputs(b: int, gamma: int, v: int, dtype: torch.dtype, with_q: bool = False, seed: int = 0):
    """Target logits, drafts sampled from a q near p (so acceptance varies), and q."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    logits = torch.randn((b, gamma + 1, v), generator=g, device=DEV, dtype=torch.float32) * 4
    qlogits = logits[:, :gamma] + torch.randn((b, gamma, v), generator=g, device=DEV) * 2
    q = torch.softmax(qlogits, dim=-1)
    expo = torch.empty_like(q).exponential_(generator=g)
    tokens = torch.argmax(q / expo, dim=-1)
    del qlogits, expo
    return logits.to(dtype), tokens, (q if with_q else None)


def copy_bandwidth() -> dict:
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=300, return_mode="median")
    return {"bytes_read_plus_written": 2 * n, "ms": ms, "gbs": 2 * n / ms / 1e6}


# --------------------------------------------------------------------------- GPU checks


def check_equality(quick: bool) -> dict:
    """Exact mode must emit the reference's tokens given the same noise."""
    out = {"cases": []}
    exact = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV)
    ref = ReferenceVerifier()
    params = {
        "t1": SamplingParams(),
        "t0.7": SamplingParams(temperature=0.7),
        "greedy": SamplingParams(temperature=0),
        "topk50_topp0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    }
    shapes = [(64, 8, v, torch.bfloat16) for v in (32000, 151936, 128256)] + [(33, 4, 128256, torch.float32)]
    if not quick:
        shapes += [(1, 4, 151936, torch.bfloat16), (512, 4, 32000, torch.bfloat16)]
    total = bad = 0
    for b, gamma, v, dtype in shapes:
        for with_q in (False, True):
            logits, tokens, q = make_inputs(b, gamma, v, dtype, with_q, seed=b + v)
            for name, sp in params.items():
                for trial in range(3):
                    noise = Noise.draw(b, gamma, v, torch.Generator(device=DEV).manual_seed(trial), DEV)
                    got = exact.verify_with_noise(logits, tokens, q, sp, noise)
                    want = ref.verify_with_noise(logits, tokens, q, sp, noise)
                    rows = (got.tokens == want.tokens).all(1) & (got.num_accepted == want.num_accepted)
                    n_bad = int((~rows).sum())
                    total += b
                    bad += n_bad
                    out["cases"].append(
                        dict(B=b, gamma=gamma, V=v, dtype=str(dtype), q=with_q, sampling=name, trial=trial,
                             rows=b, mismatched_rows=n_bad, mean_accepted=float(want.num_accepted.float().mean()))
                    )  # fmt: skip
    out.update(rows=total, mismatched_rows=bad)
    log(f"equality: {bad} mismatched rows of {total}")
    return out


def check_no_sync() -> dict:
    """Steps raise nothing under sync-debug 'error' (after a warm-up that compiles)."""
    res = {}
    gen = torch.Generator(device=DEV).manual_seed(1)
    logits, tokens, q = make_inputs(8, 4, 32000, torch.bfloat16, with_q=True)
    cases = {
        "philox": (TritonVerifier(TritonVerifierConfig(noise="philox"), DEV), None, SamplingParams()),
        "philox_q_generator": (TritonVerifier(TritonVerifierConfig(), DEV), q, SamplingParams(temperature=0.7)),
        "philox_two_stage": (
            TritonVerifier(TritonVerifierConfig(philox_draw="two_stage"), DEV), q, SamplingParams(temperature=0.7)
        ),
        "exact": (TritonVerifier(TritonVerifierConfig(noise="exact"), DEV), q, SamplingParams()),
        "greedy": (TritonVerifier(TritonVerifierConfig(), DEV), None, SamplingParams(temperature=0)),
        "top_k_top_p": (TritonVerifier(TritonVerifierConfig(), DEV), None, SamplingParams(top_k=40, top_p=0.9)),
    }
    for name, (ver, probs, sp) in cases.items():
        for warm in (True, False):
            if not warm:
                torch.cuda.set_sync_debug_mode("error")
            try:
                ver.verify(logits, tokens, probs, sp, gen)
                ver.verify(logits, tokens, probs, sp, gen)
                err = None
            except Exception as exc:  # recorded, not raised: the JSON says what failed
                err = f"{type(exc).__name__}: {exc}"
            finally:
                torch.cuda.set_sync_debug_mode(0)
        res[name] = {"raised": err}
    res["ok"] = all(r["raised"] is None for r in res.values())
    log("no-sync:", res)
    return res


def check_step_graphs() -> dict:
    """The verifier's own graph replay (small steps) against direct launches: same verdicts."""
    res: dict = {"cases": []}
    params = {"greedy": SamplingParams(temperature=0), "t1": SamplingParams(), "t0.7_topk": SamplingParams(0.7, top_k=50)}
    # the last shape (141 MiB of fp32 logits) is above graph_max_bytes: only a pinned graph replays it
    shapes = ((1, 4, 151936, torch.bfloat16), (8, 8, 32000, torch.bfloat16), (3, 1, 128256, torch.float32),
              (32, 8, 128256, torch.float32))  # fmt: skip
    for b, gamma, v, dtype in shapes:
        for with_q in (False, True):
            logits, tokens, q = make_inputs(b, gamma, v, dtype, with_q, seed=7 * b + gamma)
            for noise_mode in ("philox", "exact"):
                graphed = TritonVerifier(TritonVerifierConfig(noise=noise_mode), DEV)
                direct = TritonVerifier(TritonVerifierConfig(noise=noise_mode, graph_max_bytes=0), DEV)
                for name, sp in params.items():
                    same = True
                    for trial in range(4):  # the first calls capture, later ones replay
                        if trial == 3:  # new contents at the same addresses: a pinned graph must read them
                            logits.copy_(make_inputs(b, gamma, v, dtype, with_q, seed=99)[0])
                        ga = graphed.verify(logits, tokens, q, sp, torch.Generator(device=DEV).manual_seed(trial))
                        da = direct.verify(logits, tokens, q, sp, torch.Generator(device=DEV).manual_seed(trial))
                        same &= bool(torch.equal(ga.tokens, da.tokens) and torch.equal(ga.num_accepted, da.num_accepted))
                    res["cases"].append(dict(B=b, gamma=gamma, V=v, dtype=str(dtype), q=with_q, noise=noise_mode,
                                             sampling=name, identical=same))  # fmt: skip
    res["ok"] = all(c["identical"] for c in res["cases"])
    log("step graphs:", res["ok"], sum(c["identical"] for c in res["cases"]), "of", len(res["cases"]))
    return res


def check_graph(draw: ops.Draw = "auto", b: int = 16, v: int = 32000) -> dict:
    """Capture a step in a CUDA graph; replays with new inputs must still be right. ``draw``:
    philox mode's draw (the default shape takes the one-stage race under "auto")."""
    gamma = 4
    logits, tokens, q = make_inputs(b, gamma, v, torch.bfloat16, with_q=True)
    noise = Noise.draw(b, gamma, v, None, DEV)
    sp = SamplingParams(temperature=0.9)
    exact = TritonVerifier(TritonVerifierConfig(noise="exact"), DEV)
    philox = TritonVerifier(TritonVerifierConfig(noise="philox", philox_draw=draw), DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    state = ops.new_philox_state(None, DEV)  # a caller-held state: the kernels advance its counter
    with torch.cuda.stream(side):
        for _ in range(2):
            exact.verify_with_noise(logits, tokens, q, sp, noise)
            philox.verify(logits, tokens, q, sp, None)
            ops.verify_triton(logits, tokens, q, sp, state=state, draw=draw)
    torch.cuda.current_stream().wait_stream(side)
    g_exact, g_philox, g_state = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_exact):
        out_e = exact.verify_with_noise(logits, tokens, q, sp, noise)
    with torch.cuda.graph(g_philox):
        out_p = philox.verify(logits, tokens, q, sp, None)  # draws its state from the default generator
    with torch.cuda.graph(g_state):
        ops.verify_triton(logits, tokens, q, sp, state=state, draw=draw)
    res = {"exact_replays_equal": [], "philox_counter": [], "philox_rows_valid": [], "philox_tokens_changed": []}
    prev = None
    for trial in range(4):
        new_logits, new_tokens, new_q = make_inputs(b, gamma, v, torch.bfloat16, with_q=True, seed=100 + trial)
        new_noise = Noise.draw(b, gamma, v, None, DEV)
        logits.copy_(new_logits)
        tokens.copy_(new_tokens)
        q.copy_(new_q)
        noise.uniform.copy_(new_noise.uniform)
        noise.exponential.copy_(new_noise.exponential)
        g_exact.replay()
        want = verify_random(logits, tokens, q, sp, noise)
        res["exact_replays_equal"].append(
            bool(torch.equal(out_e.tokens, want.tokens) and torch.equal(out_e.num_accepted, want.num_accepted))
        )
        before = int(state[1])
        g_state.replay()
        torch.cuda.synchronize()
        res["philox_counter"].append([before, int(state[1])])
        g_philox.replay()
        n = out_p.num_accepted
        pos = torch.arange(gamma + 1, device=DEV)
        padded = torch.cat([tokens, tokens.new_full((b, 1), -1)], 1)
        valid = ((out_p.tokens == padded) | (pos >= n[:, None])).all() & (
            (out_p.tokens == -1) == (pos > n[:, None])
        ).all()
        res["philox_rows_valid"].append(bool(valid) and bool((out_p.tokens.gather(1, n[:, None]) >= 0).all()))
        if prev is not None:
            res["philox_tokens_changed"].append(bool((prev != out_p.tokens).any()))
        prev = out_p.tokens.clone()
    # replaying twice on the same inputs must draw fresh philox noise
    g_philox.replay()
    first = out_p.tokens.clone()
    g_philox.replay()
    res["philox_same_inputs_new_noise"] = bool((first != out_p.tokens).any())
    res["ok"] = (
        all(res["exact_replays_equal"])
        and all(r[1] == r[0] + 1 for r in res["philox_counter"])
        and all(res["philox_rows_valid"])
    )
    log("graph:", res)
    return res


# --------------------------------------------------------------------------- timing


def compiled_reference():
    """torch.compile of verify_random's own code object; only emit's frozen-attrs
    Verdict is swapped for a plain class, which dynamo cannot build otherwise."""

    class _Plain:
        def __init__(self, tokens: torch.Tensor, num_accepted: torch.Tensor) -> None:
            self.tokens = tokens
            self.num_accepted = num_accepted

    glb = dict(sampling.__dict__, Verdict=_Plain)
    glb["emit"] = types.FunctionType(sampling.emit.__code__, glb)
    fn = types.FunctionType(sampling.verify_random.__code__, glb)
    return torch.compile(fn, dynamic=True)


def wall_ms(fn, n: int = 20) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def bench(fn, wall: bool = True) -> dict:
    fn()
    r = {"ms": do_bench(fn, warmup=10, rep=25, return_mode="median")}
    if wall:
        r["wall_ms"] = wall_ms(fn)
    return r


def logits_pass_fn(logits: torch.Tensor) -> Callable[[], object]:
    """The verifier's one full pass over ``logits`` alone, launched as the verifier does."""
    return ops.logsumexp_pass(logits)


@triton.jit
def _read_floor_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # the least a kernel that reads every logit once can do: one block per program, one sum
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(x, axis=0))


READ_FLOOR_CONFIGS = [(4096, 4), (8192, 8), (16384, 8)]  # (logits per program, warps)


def read_floor(logits: torch.Tensor) -> dict:
    """The fastest of READ_FLOOR_CONFIGS: the same bytes read by the simplest streaming kernel,
    timed as the pass is; what launch latency and the DRAM ramp leave at this size."""
    n = logits.numel()
    times = {}
    for block, warps in READ_FLOOR_CONFIGS:
        out = torch.empty(triton.cdiv(n, block), dtype=torch.float32, device=DEV)
        run = functools.partial(_read_floor_kernel[(triton.cdiv(n, block),)], logits, out, n, BLOCK=block, num_warps=warps)
        run()
        times[f"{block}x{warps}"] = do_bench(run, warmup=10, rep=25, return_mode="median")
    best = min(times, key=times.get)
    return {"ms": times[best], "config": best, "by_config": times}


def graph_step(ver: TritonVerifier, logits, tokens, sp) -> callable:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ver.verify(logits, tokens, None, sp, None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ver.verify(logits, tokens, None, sp, None)
    return graph.replay


def time_shape(b: int, gamma: int, v: int, dtype: torch.dtype, ctx: dict) -> dict:
    """All timings of one shape (inputs freed on return)."""
    sp, gen = SamplingParams(), ctx["gen"]
    logits, tokens, _ = make_inputs(b, gamma, v, dtype, seed=b)
    nbytes = logits.numel() * logits.element_size()
    row = dict(B=b, gamma=gamma, V=v, dtype=str(dtype).replace("torch.", ""), logits_bytes=nbytes)
    row["logits_pass"] = bench(logits_pass_fn(logits), wall=False)
    row["read_floor"] = read_floor(logits)
    row["triton"] = bench(lambda: ctx["philox"].verify(logits, tokens, None, sp, gen))
    row["triton_graph"] = bench(graph_step(ctx["philox"], logits, tokens, sp), wall=False)
    row["reference"] = bench(lambda: ctx["ref"].verify(logits, tokens, None, sp, gen))
    if b >= 8 and ctx["compile"]:
        fn = ctx["compiled"].setdefault(dtype, compiled_reference())
        t = time.time()
        fn(logits, tokens, None, sp, Noise.draw(b, gamma, v, gen, DEV))
        row["compile_first_call_s"] = time.time() - t
        row["compile"] = bench(lambda: fn(logits, tokens, None, sp, Noise.draw(b, gamma, v, gen, DEV)))
    row["bandwidth_fraction"] = nbytes / (row["logits_pass"]["ms"] * 1e6) / ctx["copy_gbs"]
    row["read_floor_fraction"] = nbytes / (row["read_floor"]["ms"] * 1e6) / ctx["copy_gbs"]
    return row


def time_shapes(cfg: dict, copy_gbs: float, deadline: float) -> list[dict]:
    ctx = {
        "philox": TritonVerifier(TritonVerifierConfig(noise="philox"), DEV),
        "ref": ReferenceVerifier(),
        "compiled": {},
        "compile": cfg["compile"],
        "gen": torch.Generator(device=DEV).manual_seed(0),
        "copy_gbs": copy_gbs,
    }
    rows = []
    for dtype in cfg["dtypes"]:
        for v in cfg["V"]:
            for gamma in cfg["gamma"]:
                for b in cfg["B"]:
                    if time.time() > deadline:
                        log("time budget reached; skipping the remaining shapes")
                        return rows
                    if b * (gamma + 1) * v * (torch.finfo(dtype).bits // 8) * 4 > cfg["max_bytes"]:
                        continue
                    rows.append(time_shape(b, gamma, v, dtype, ctx))
                    log(summary_row(rows[-1]))
    return rows


def summary_row(r: dict) -> dict:
    get = lambda k: r[k]["ms"] if k in r else None  # noqa: E731
    return dict(
        B=r["B"], gamma=r["gamma"], V=r["V"], dtype=r["dtype"],
        triton_ms=get("triton"), triton_graph_ms=get("triton_graph"),
        logits_pass_ms=get("logits_pass"), read_floor_ms=get("read_floor"), reference_ms=get("reference"), compile_ms=get("compile"),
        triton_wall_ms=r["triton"]["wall_ms"], reference_wall_ms=r["reference"]["wall_ms"],
        compile_wall_ms=r["compile"]["wall_ms"] if "compile" in r else None,
        bandwidth_fraction=r["bandwidth_fraction"], read_floor_fraction=r.get("read_floor_fraction"),
        speedup_vs_reference=get("reference") / get("triton"),
        speedup_vs_compile=(get("compile") / get("triton")) if "compile" in r else None,
    )  # fmt: skip


def code_defaults() -> dict[str, Any]:
    """The kernel module's launch settings the run times at."""
    return {
        "PASS_CONFIG": {str(k): list(v) for k, v in ops.PASS_CONFIG.items()},
        "PASS_TILE": {str(k): v for k, v in ops.PASS_TILE.items()},
        "ARGMAX_CONFIG": {str(k): list(v) for k, v in ops.ARGMAX_CONFIG.items()},
        "RACE_BLOCK_V": ops.RACE_BLOCK_V, "RACE_WARPS": ops.RACE_WARPS,
        "PROGRAMS_PER_SM": ops.PROGRAMS_PER_SM, "RACE_PROGRAMS_PER_SM": ops.RACE_PROGRAMS_PER_SM,
        # philox mode's draw: two-stage from this many rows and tokens ("auto")
        "TWO_STAGE_MIN_BATCH": ops.TWO_STAGE_MIN_BATCH, "TWO_STAGE_MIN_VOCAB": ops.TWO_STAGE_MIN_VOCAB,
        "graph_max_bytes": TritonVerifierConfig().graph_max_bytes,
    }


CHECKS: dict[str, Callable[[bool], dict[str, Any]]] = {
    "no_sync": lambda quick: check_no_sync(),
    "cuda_graph": lambda quick: check_graph(),
    # the two-stage draw "auto" takes from 128 rows and 100,000 tokens, at such a shape
    "cuda_graph_two_stage": lambda quick: check_graph("two_stage", b=128, v=151936),
    "step_graphs": lambda quick: check_step_graphs(),
    "equality": check_equality,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "docs/benchmarks")))
    ap.add_argument("--commit", default=None, help="the measured commit, where the checkout has no git")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--skip", default="", help="comma list of: checks,timing")
    args = ap.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    torch.fx.experimental._config.use_duck_shape = False  # B == gamma must not specialise the compile
    props = torch.cuda.get_device_properties(DEV)
    cfg: dict[str, Any] = {
        **{k: list(v) for k, v in SHAPE_GRID.items()}, "compile": True, "max_bytes": 40 << 30,
        "sampling": "temperature 1, no top-k/top-p, deterministic drafts (draft_probs None)",
        "timer": "triton.testing.do_bench median (L2 cleared before each call), warmup 10 ms, rep 25 ms",
    }
    if args.quick:
        cfg.update(B=[1, 8, 128], gamma=[4], V=[32000, 151936], dtypes=[torch.bfloat16])
    result: dict[str, Any] = {
        **provenance("benchmarks/verify_kernels.py", args.commit), "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "config": {**{k: ([str(x) for x in v] if k == "dtypes" else v) for k, v in cfg.items()},
                   "defaults": code_defaults()},
    }
    path = args.out / "verify-kernels-h200.json"
    result["copy_bandwidth"] = copy_bandwidth()
    copy_gbs = result["copy_bandwidth"]["gbs"]
    log(f"copy bandwidth {copy_gbs:.0f} GB/s")
    write_json(path, result)
    for name, fn in CHECKS.items() if "checks" not in skip else ():
        try:
            result[name] = fn(args.quick)
        except Exception as exc:  # a failing check is recorded and the run goes on
            result[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            log(name, "FAILED", exc)
        write_json(path, result)
    if "timing" not in skip:
        rows = time_shapes(cfg, copy_gbs, T0 + args.budget_s)
        result["raw"] = rows
        result["summary"] = {"copy_bandwidth_gbs": copy_gbs, "rows": [summary_row(r) for r in rows]}
        write_json(path, result)
    log("done")
    return 0
