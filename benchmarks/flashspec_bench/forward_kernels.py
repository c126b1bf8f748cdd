"""Per-forward time of the fast model against its bandwidth floor (``benchmarks/forward_kernels.py``).

LABELLED SYNTHETIC: random weights with the Qwen2.5 layer shapes, bf16, timing only (the
weights do not change the time of a forward). The 0.5B and 1.5B shapes are the engine's
draft and target; 7B, 14B and 32B show how the forward scales. For every shape, batch
(1, 8, 32) and ``kernels`` option (``torch``: cuBLAS GEMMs; ``gemv``: the fused GEMMs of
:mod:`flashspec_fast.fused`; ``persistent``: every layer in one launch of
:mod:`flashspec_kernels.decoder` up to 16 rows, the torch path past that), one decoding forward of ``width`` tokens per row is captured
in a CUDA graph and replayed: the time of a forward is a median over ``repeats`` runs of
``replays`` back-to-back replays. The floor is the weight and KV bytes the forward reads
(:func:`flashspec_bench.floors.forward_bytes`) at the copy bandwidth measured in the same run.
NF4 against bf16 runs the 1.5B shape at batch 1 (the fused NF4 kernel on CUDA: flashspec_kernels.nf4).

``--smoke`` runs tiny shapes in a few seconds (on a CPU: no graphs, the gemv kernels in
Triton's interpreter) to check the script, not to time anything.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from flashspec_bench.floors import copy_bandwidth, floor_ms, forward_bytes
from flashspec_bench.provenance import DOCS, RESULTS, logger, provenance, write_json

say = logger("forward")
LABEL = "synthetic: random weights with the Qwen2.5 layer shapes, timing only"
# (role, shape): the roles name the summary's figures; real = the engine's own draft and target
SHAPES = (("target", "qwen2.5-1.5b"), ("draft", "qwen2.5-0.5b"), ("synthetic_7b", "qwen2.5-7b"),
          ("synthetic_14b", "qwen2.5-14b"), ("synthetic_32b", "qwen2.5-32b"))
REAL = ("target", "draft")
KERNELS = ("torch", "gemv", "persistent")
# --smoke: few programs per launch, as the interpreter runs each one in Python
TINY = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "tie_word_embeddings": True, "vocab_size": 64}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="default: docs/benchmarks/forward-h200.json "
                   "(--smoke: benchmarks/.results/forward-smoke.json)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, a few forwards: checks the script")
    p.add_argument("--budget", type=float, default=180.0, help="seconds; later shapes are skipped past it")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--shapes", nargs="+", default=[s for _, s in SHAPES])
    p.add_argument("--max-len", type=int, default=512, help="KV slots per row (the floor reads them all)")
    p.add_argument("--at", type=int, default=200, help="position of the decoded tokens")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 4], help="tokens per row (0.5B, 1.5B; the others: 1)")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS,
                   help="options to time (torch alone: a rerun after a kernel fault ends a run's CUDA context)")
    p.add_argument("--nf4", action=argparse.BooleanOptionalAction, default=True, help="NF4 1.5B at batch 1")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="Inductor-fused elementwise ops (CUDA only; the e2e benchmark's default)")
    p.add_argument("--commit", default=None, help="the measured commit, where the checkout has no git")
    p.add_argument("--merge", type=Path, default=None, metavar="FORWARD_JSON",
                   help="a committed result of this script on the same device: its rows this run did not "
                        "measure are kept (each with its commit), and the summary is taken over all of them")
    p.add_argument("--from-run", type=Path, default=None, metavar="RUN_JSON",
                   help="measure nothing: take the rows of this finished run (with --merge)")
    args = p.parse_args(argv)
    if args.smoke:
        args.batches, args.widths, args.replays, args.repeats = [1], [1], 1, 1
        args.shapes, args.max_len, args.at = ["qwen2.5-1.5b", "qwen2.5-7b"], 32, 5
    if args.out is None:
        args.out = RESULTS / "forward-smoke.json" if args.smoke else DOCS / "forward-h200.json"
    if args.from_run is not None and args.merge is None:
        p.error("--from-run takes --merge: the committed file to merge the finished run into")
    return args


ROW_KEY = ("role", "shape", "kernels", "quantization", "batch", "width")


def merge(run: dict[str, Any], old: dict[str, Any], old_name: str) -> dict[str, Any]:
    """``run`` (a finished result) with ``old``'s rows that it did not measure, each row tagged
    with the commit that measured it, and the summary over all of them. The two must come from
    the same device: a floor ratio is only comparable on one GPU."""
    if run.get("device") != old.get("device") or run.get("cuda") != old.get("cuda"):
        raise ValueError(f"--merge {old_name}: measured on {old.get('device')!r}, this run on {run.get('device')!r}")
    rows = [{**r, "commit": r.get("commit", run["commit"])} for r in run["rows"]]
    seen = {tuple(r[k] for k in ROW_KEY) for r in rows}
    kept = [{**r, "commit": r.get("commit", old["commit"])} for r in old["rows"]
            if tuple(r[k] for k in ROW_KEY) not in seen]
    rows += kept
    batches = sorted({int(b) for b in old["config"]["batches"]} | {int(b) for b in run["config"]["batches"]})
    commits = dict(Counter(r["commit"] for r in rows))
    return {**run, "summary": summarize(rows, batches), "rows": rows,
            "merged": {"file": old_name, "rows_kept": len(kept), "rows_by_commit": commits,
                       "bandwidth_bytes_per_s": old.get("bandwidth_bytes_per_s")}}


def model_args(shape: str, smoke: bool) -> Any:
    from flashspec_fast.model import ModelArgs, shape_config

    cfg = shape_config(shape)
    return ModelArgs.from_hf({**cfg, **TINY} if smoke else cfg)


def timer(fn: Callable[[], Any], device: torch.device, replays: int, repeats: int) -> list[float]:
    """Milliseconds per call of ``fn``: ``repeats`` means over ``replays`` back-to-back calls."""
    fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / replays)
        else:
            t0 = time.perf_counter()
            for _ in range(replays):
                fn()
            out.append((time.perf_counter() - t0) * 1e3 / replays)
    return out


def forward_fn(model: Any, batch: int, width: int, at: int) -> Callable[[], Any]:
    """One decoding forward of ``width`` tokens per row at positions ``at..``: a graph replay on CUDA."""
    ids = torch.full((batch, width), 100 % model.args.vocab, dtype=torch.long, device=model.device)
    pos = (at + torch.arange(width, device=model.device))[None].expand(batch, width).contiguous()
    span = model.span_for(at + width)

    def run(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model.forward(ids, pos, pos, last_only=width > 1, span=span)

    if model.device.type != "cuda":
        return lambda: run(ids, pos)
    from flashspec_core.cudagraph import capture

    graph, _ = capture(run, [ids, pos], None, warmups=2)
    return graph.replay


def measure(model: Any, meta: dict[str, Any], batches: list[int], widths: tuple[int, ...], args: argparse.Namespace,
            bandwidth: float | None) -> list[dict[str, Any]]:
    rows = []
    model.allocate(max(batches))
    for batch in batches:
        for width in widths:
            times = timer(forward_fn(model, batch, width, args.at), model.device, args.replays, args.repeats)
            ms = statistics.median(times)
            floor = floor_ms(forward_bytes(model, batch), bandwidth)
            rows.append({**meta, "batch": batch, "width": width, "forward_ms_p50": ms,
                         "forward_ms": [round(t, 5) for t in times], "floor_ms": floor,
                         "over_floor": None if floor is None else ms / floor,
                         "fraction_of_floor": None if floor is None else floor / ms,
                         "tokens_per_s": batch * width * 1e3 / ms})
            say(f"{meta['shape']} {meta['kernels']} {meta['quantization']} b={batch} w={width}: {ms:.3f} ms"
                + ("" if floor is None else f" ({ms / floor:.2f}x floor {floor:.3f} ms)"))
    return rows


def run_shape(role: str, shape: str, args: argparse.Namespace, device: torch.device, bandwidth: float | None
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of both kernels options over one set of weights, and what failed (an option
    that fails is reported and the run goes on)."""
    from flashspec_fast.model import Transformer, random_weights

    margs = model_args(shape, args.smoke)
    weights = random_weights(margs, torch.bfloat16 if device.type == "cuda" else torch.float32, device)
    widths = tuple(args.widths) if role in REAL else (1,)
    rows, failed = [], []
    for kernels in args.kernels:
        try:
            meta = {"role": role, "shape": shape, "kernels": kernels, "quantization": "none"}
            rows += measure(Transformer(margs, weights, args.max_len, fuse=args.fuse and device.type == "cuda",
                                        kernels=kernels), meta, args.batches, widths, args, bandwidth)
        except Exception as exc:  # noqa: BLE001 (the other option's and shapes' numbers still count)
            failed.append(f"{shape} kernels={kernels}: {type(exc).__name__}: {exc}")
            say(f"FAILED {failed[-1]}")
        free(device)
    return rows, failed


def run_nf4(args: argparse.Namespace, device: torch.device, bandwidth: float | None) -> tuple[list[dict[str, Any]], str | None]:
    """The 1.5B shape at batch 1 with NF4 weights, or why not."""
    try:
        from flashspec_fast.model import Transformer, random_weights
        from flashspec_fast.nf4 import quantize_weights

        margs = model_args("qwen2.5-1.5b", args.smoke)
        weights = quantize_weights(random_weights(margs, torch.bfloat16 if device.type == "cuda" else torch.float32,
                                                  device))
        model = Transformer(margs, weights, args.max_len, fuse=args.fuse and device.type == "cuda")
        meta = {"role": "target", "shape": "qwen2.5-1.5b", "kernels": "torch", "quantization": "nf4"}
        return measure(model, meta, [1], (1,), args, bandwidth), None
    except Exception as exc:  # noqa: BLE001 (a kernel that fails to build or capture is reported, not fatal)
        say(f"nf4: not measured ({exc})")
        return [], f"nf4: {type(exc).__name__}: {exc}"


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def pick(rows: list[dict[str, Any]], role: str, batch: int, kernels: str | None = None, quantization: str = "none"
         ) -> dict[str, Any] | None:
    """The width-1 row of ``role`` at ``batch``: of ``kernels``, or the fastest of both."""
    found = [r for r in rows if r["role"] == role and r["batch"] == batch and r["width"] == 1
             and r["quantization"] == quantization and kernels in (None, r["kernels"])]
    return min(found, key=lambda r: r["forward_ms_p50"]) if found else None


def figures(rows: list[dict[str, Any]], batches: list[int], kernels: str | None) -> dict[str, Any]:
    """The issue's figures from one kernels option's rows (None: the faster option per row)."""
    def get(role: str, batch: int, key: str) -> Any:
        row = pick(rows, role, batch, kernels)
        return None if row is None else row[key]

    return {"target_forward_over_floor": get("target", 1, "over_floor"),
            "draft_forward_over_floor": get("draft", 1, "over_floor"),
            "target_only_tokens_per_s": {str(b): get("target", b, "tokens_per_s") for b in batches},
            "synthetic_7b_fraction_of_floor": get("synthetic_7b", 1, "fraction_of_floor")}


def summarize(rows: list[dict[str, Any]], batches: list[int]) -> dict[str, Any]:
    """Headline figures from the faster kernels option of each row, each option's own, the
    other options' speed-up per forward over torch's (``<option>_speedup``), and NF4 against bf16 at batch 1 (bf16's faster option)."""
    summary: dict[str, Any] = figures(rows, batches, None)
    summary["faster_kernels"] = {f"{role}_b{b}": r["kernels"] for role, _ in SHAPES for b in batches
                                 if (r := pick(rows, role, b)) is not None}
    summary["by_kernels"] = {k: figures(rows, batches, k) for k in KERNELS}
    for option in KERNELS[1:]:
        speedup: dict[str, dict[str, float]] = {}
        for r in rows:
            if r["kernels"] == option:
                base = [t for t in rows if t["kernels"] == "torch" and t["quantization"] == "none"
                        and (t["shape"], t["batch"], t["width"]) == (r["shape"], r["batch"], r["width"])]
                if base:
                    speedup.setdefault(r["shape"], {})[f"b{r['batch']}_w{r['width']}"] = (
                        base[0]["forward_ms_p50"] / r["forward_ms_p50"])
        summary[f"{option}_speedup"] = speedup
    nf4, bf16 = pick(rows, "target", 1, quantization="nf4"), pick(rows, "target", 1)
    summary["nf4_vs_bf16_b1"] = None if nf4 is None or bf16 is None else bf16["forward_ms_p50"] / nf4["forward_ms_p50"]
    return summary


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Time every shape of ``args`` (NF4 after the target) within its budget: the result."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":  # before flashspec_kernels is imported: its kernels are made at import
        os.environ.setdefault("TRITON_INTERPRET", "1")
    t0 = time.perf_counter()
    bandwidth = copy_bandwidth(device)
    say(f"{device}: copy bandwidth {bandwidth and bandwidth / 1e12:.2f} TB/s" if bandwidth else f"{device}: no floor")
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for role, shape in SHAPES:
        if shape not in args.shapes:
            continue
        if time.perf_counter() - t0 > args.budget:
            skipped.append(f"{shape}: past the {args.budget:.0f} s budget")
            say(skipped[-1])
            continue
        got, failed = run_shape(role, shape, args, device, bandwidth)
        rows += got
        skipped += failed
        free(device)
        if role == "target" and args.nf4:  # NF4 next, while the budget is fresh
            nf4, why = run_nf4(args, device, bandwidth)
            rows += nf4
            skipped += [why] if why else []
            free(device)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "commit", "merge", "from_run")}
    return {**provenance("benchmarks/forward_kernels.py", args.commit), "label": LABEL,
            "config": {**config, "dtype": "bf16" if device.type == "cuda" else "float32", "graphs": device.type == "cuda",
                       "attention": "auto", "tiny_shape": TINY if args.smoke else None},
            "bandwidth_bytes_per_s": bandwidth, "summary": summarize(rows, args.batches), "rows": rows,
            "skipped": skipped, "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # --from-run: nothing to measure, a finished run is merged into the committed file
    result = json.loads(args.from_run.read_text()) if args.from_run is not None else run_all(args)
    if args.merge is not None:
        result = merge(result, json.loads(args.merge.read_text()), args.merge.name)
    kept = f": {result['merged']['rows_kept']} rows kept from {args.merge.name}" if args.merge is not None else ""
    say(f"wrote {write_json(args.out, result)}{kept}")
    return 0
