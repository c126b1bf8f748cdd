"""Derived figures behind docs/kernels.md's H200 sections, from verify-kernels-h200.json
(``benchmarks/verify_kernels_analysis.py``).

Reads the JSON that ``benchmarks/verify_kernels.py`` writes (``summary.rows``, ``raw`` and the
GPU checks) and writes ``docs/benchmarks/verify-kernels-h200-analysis.json``: the figures the
page quotes that are not already fields of the input (ranges over groups of shapes, counts of
checks). Each group carries a ``how`` string that says how its numbers are made. Times are in
microseconds (keys ending ``_us``); fractions and ratios are plain numbers (0.35 is 35 %).

A shape's size is its number of logits, ``B (gamma + 1) V``, or those logits' bytes. The
verifier replayed its own CUDA graph for the shapes of at most ``graph_max_bytes`` bytes of
logits, as the run's ``config.defaults`` records.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashspec_bench.analysis import median, rounded, span
from flashspec_bench.provenance import DOCS, provenance, write_json

Json = dict[str, Any]

COMPILED_S = 0.5  # a torch.compile first call longer than this compiled (the others took ~0 s)
MIB = 1 << 20
ITEMSIZE = {"bfloat16": 2, "float32": 4}  # bytes per logit
GOAL_LOGITS, GOAL_FRACTION = 10e6, 0.8  # the goal: the pass at >= 80 % of copy bandwidth from 10M logits on
# bands of logits, (low, high]: the goal's 10M-100M band, its upper half, and the rest
GOAL_BAND = (10e6, 100e6)
ABOVE_100M = (100e6, math.inf)


def logits(r: Json) -> int:
    return r["B"] * (r["gamma"] + 1) * r["V"]


def dtype(r: Json) -> str:
    return str(r["dtype"]).removeprefix("torch.")


def nbytes(r: Json) -> int:
    return logits(r) * ITEMSIZE[dtype(r)]


def shape(r: Json, with_dtype: bool = True) -> str:
    s = f"B={r['B']} gamma={r['gamma']} V={r['V']}"
    return f"{s} {dtype(r)}" if with_dtype else s


def us(ms: float) -> float:
    return ms * 1e3


@dataclass(frozen=True)
class Defaults:
    """The verifier's graph-replay threshold in the measured run."""

    graph_max: int  # a step of at most this many bytes of logits replayed the verifier's own graph

    def graphed(self, r: Json) -> bool:
        return nbytes(r) <= self.graph_max

    def describe(self) -> str:
        return f"logits of at most {self.graph_max} bytes (config.defaults.graph_max_bytes)"


def run_defaults(data: Json) -> Defaults:
    rec = data["config"].get("defaults")
    if not rec:
        raise ValueError("the JSON's config has no defaults (verify_kernels.py before it recorded them): "
                         "the graph threshold of the run is unknown")
    return Defaults(int(rec["graph_max_bytes"]))


def within(rows: Iterable[Json], band: tuple[float, float]) -> list[Json]:
    """The rows whose logits lie in ``(low, high]``."""
    return [r for r in rows if band[0] < logits(r) <= band[1]]


def by_dtype(rows: Iterable[Json]) -> dict[str, list[Json]]:
    out: dict[str, list[Json]] = {}
    for r in rows:
        out.setdefault(dtype(r), []).append(r)
    return out


def spread(xs: Iterable[float]) -> Json | None:
    """min, max and median."""
    xs = list(xs)
    return {"min": min(xs), "max": max(xs), "median": median(xs)} if xs else None


def mib(rows: Iterable[Json]) -> Json | None:
    return span(nbytes(r) / MIB for r in rows)


def step_vs(r: Json, other: str) -> Json:
    """The philox step of a row against another column, in us."""
    return {"shape": shape(r), "step_us": us(r["triton_ms"]), f"{other}_us": us(r[f"{other}_ms"])}


# --- groups over summary.rows ------------------------------------------------------------


def graphed_steps(rows: list[Json], d: Defaults) -> Json:
    g = [r for r in rows if d.graphed(r)]
    b1 = [r for r in rows if r["B"] == 1]
    return {"how": "the graphed shapes: their MiB; triton_ms (the step), triton_graph_ms (the caller's graph) and "
                   "their difference; the batch sizes per dtype and V; batch_1: graph and logits pass of the B = 1 "
                   "shapes",
            "shapes": len(g), "mib": mib(g),
            "batch_sizes": {k: {str(v): sorted({r["B"] for r in rs if r["V"] == v}) for v in sorted({r["V"] for r in rs})}
                            for k, rs in by_dtype(g).items()},
            "step_us": spread(us(r["triton_ms"]) for r in g),
            "graph_us": spread(us(r["triton_graph_ms"]) for r in g),
            "step_minus_graph_us": spread(us(r["triton_ms"] - r["triton_graph_ms"]) for r in g),
            "batch_1": {"graph_us": span(us(r["triton_graph_ms"]) for r in b1),
                        "pass_us": span(us(r["logits_pass_ms"]) for r in b1)}}


def read_floor(rows: list[Json]) -> Json | None:
    """The logits pass against the simplest kernel that reads the same bytes (read_floor_ms)."""
    rs = [r for r in rows if r.get("read_floor_ms") is not None]
    if not rs:
        return None
    out: Json = {"how": "read_floor_fraction (the floor kernel's bytes / time / copy bandwidth) and pass_over_floor "
                        "(read_floor_ms / logits_pass_ms: 1 = the pass as fast as the floor) per dtype: over the goal "
                        f"band ({GOAL_BAND[0]:.0e}, {GOAL_BAND[1]:.0e}] of logits and above it; floor_reaching_goal: "
                        f"[shapes whose floor reaches {GOAL_FRACTION:g} of copy bandwidth, shapes] in the band, and "
                        "the smallest shape (by logits) whose floor reaches it",
                 "per_dtype": {}}
    for k, group in by_dtype(rs).items():
        band, above = within(group, GOAL_BAND), within(group, ABOVE_100M)
        reach = sorted((r for r in group if r["read_floor_fraction"] >= GOAL_FRACTION), key=logits)
        out["per_dtype"][k] = {
            "goal_band": {"read_floor_fraction": span(r["read_floor_fraction"] for r in band),
                          "bandwidth_fraction": span(r["bandwidth_fraction"] for r in band),
                          "pass_over_floor": span(r["read_floor_ms"] / r["logits_pass_ms"] for r in band),
                          "floor_reaching_goal": of([r["read_floor_fraction"] >= GOAL_FRACTION for r in band])},
            "above_100M": {"read_floor_fraction": span(r["read_floor_fraction"] for r in above),
                           "pass_over_floor": span(r["read_floor_ms"] / r["logits_pass_ms"] for r in above)},
            "smallest_floor_reaching_goal": ({"shape": shape(reach[0]), "logits": logits(reach[0]),
                                              "read_floor_fraction": reach[0]["read_floor_fraction"]}
                                             if reach else None)}
    return out


def fraction_range(rows: list[Json], key: str = "bandwidth_fraction") -> Json | None:
    if not rows:
        return None
    lo, hi = min(rows, key=lambda r: r[key]), max(rows, key=lambda r: r[key])
    return {"min": lo[key], "max": hi[key], "min_shape": shape(lo), "max_shape": shape(hi),
            "logits": span(logits(r) for r in rows)}


def goal_reached(rows: list[Json], key: str) -> Json | None:
    """[shapes at or above the goal's fraction, shapes], their range, the smallest shape that reaches it and
    the largest that does not."""
    if not rows:
        return None
    hit, miss = [r for r in rows if r[key] >= GOAL_FRACTION], [r for r in rows if r[key] < GOAL_FRACTION]

    def one(r: Json) -> Json:
        return {"shape": shape(r), "logits": logits(r), key: r[key]}

    return {"reached": [len(hit), len(rows)], **fraction_range(rows, key),
            "smallest_reaching": one(min(hit, key=logits)) if hit else None,
            "largest_missing": one(max(miss, key=logits)) if miss else None}


def pass_bandwidth(rows: list[Json]) -> Json:
    per: Json = {}
    for k, v in by_dtype(rows).items():
        big = within(v, ABOVE_100M)
        per[k] = {"goal": goal_reached([r for r in v if logits(r) >= GOAL_LOGITS], "bandwidth_fraction"),
                  "goal_band": fraction_range(within(v, GOAL_BAND)), "above_100M": fraction_range(big),
                  "above_100M_by_B": {str(b): fraction_range([r for r in big if r["B"] == b])
                                      for b in sorted({r["B"] for r in big})}}
    return {"how": "bandwidth_fraction (the pass's rate over the copy bandwidth) per dtype: goal: over the shapes of at "
                   f"least {GOAL_LOGITS:.0f} logits, [shapes at or above {GOAL_FRACTION:g}, shapes], min, max and their "
                   "shapes, the smallest shape (by logits) at or above it and the largest below; min, max and their "
                   "shapes in the goal's band of 10M to 100M logits, above 100M and above 100M per B; "
                   "goal_band_pass_us: logits_pass_ms of the band's shapes, both dtypes",
            "goal_band_pass_us": span(us(r["logits_pass_ms"]) for r in within(rows, GOAL_BAND)), "per_dtype": per}


def vs_reference(rows: list[Json]) -> Json:
    low = min(rows, key=lambda r: r["speedup_vs_reference"])
    b8 = [r for r in rows if r["B"] == 8 and r["V"] >= 128000]
    return {"how": "speedup_vs_reference (reference_ms / triton_ms) over all shapes, the lowest with its step, "
                   "reference and graph; at B = 8 and V >= 128k, also in host wall time (reference_wall_ms / "
                   "triton_wall_ms)",
            "speedup": span(r["speedup_vs_reference"] for r in rows),
            "lowest": {**step_vs(low, "reference"), "graph_us": us(low["triton_graph_ms"])},
            "b8_large_vocab": {"shapes": len(b8), "speedup": span(r["speedup_vs_reference"] for r in b8),
                               "wall_speedup": span(r["reference_wall_ms"] / r["triton_wall_ms"] for r in b8)}}


def vs_compile(rows: list[Json], raw: list[Json]) -> Json:
    c = [r for r in rows if r["compile_ms"] is not None]
    low = min(c, key=lambda r: r["speedup_vs_compile"])
    slower = [{**step_vs(r, "compile"), "graph_us": us(r["triton_graph_ms"])} for r in c if r["triton_ms"] >= r["compile_ms"]]
    wall_slower = [{"shape": shape(r), "step_wall_us": us(r["triton_wall_ms"]), "compile_wall_us": us(r["compile_wall_ms"])}
                   for r in c if r["triton_wall_ms"] >= r["compile_wall_ms"]]
    first = [r["compile_first_call_s"] for r in raw if r.get("compile_first_call_s", 0) > COMPILED_S]
    return {"how": "shapes with compile_ms: how many the step beats and the shapes it does not (with triton_graph_ms), "
                   "speedup_vs_compile range and the lowest; the same count in host wall time and the shapes it loses; "
                   f"raw compile_first_call_s above {COMPILED_S:g} s (the calls that compiled): count and range",
            "shapes": len(c), "faster": len(c) - len(slower), "slower": slower,
            "speedup": span(r["speedup_vs_compile"] for r in c), "lowest": step_vs(low, "compile"),
            "wall_faster": len(c) - len(wall_slower), "wall_slower": wall_slower,
            "compiles": len(first), "compile_s": span(first)}


def of(flags: Sequence[bool]) -> list[int]:
    """[true, all]"""
    return [sum(map(bool, flags)), len(flags)]


def checks(data: Json, d: Defaults) -> Json:
    g, eq, sg = data["cuda_graph"], data["equality"], data["step_graphs"]["cases"]
    trials = Counter((shape(c), c["q"], c["sampling"]) for c in eq["cases"])
    return {"how": "[passed, total] of the cuda_graph lists (philox_counter: replays after which the counter "
                   "advanced by exactly one) and of step_graphs.cases identical; equality: its cases, the distinct "
                   "shapes (and those the verifier replayed from its graph) and samplings, and the noise draws per "
                   "(shape, draft probs, sampling)",
            "exact_replays_equal": of(g["exact_replays_equal"]),
            "philox_counter_advanced_by_one": of([b - a == 1 for a, b in g["philox_counter"]]),
            "philox_rows_valid": of(g["philox_rows_valid"]), "philox_tokens_changed": of(g["philox_tokens_changed"]),
            "step_graphs_identical": of([c["identical"] for c in sg]),
            "equality": {"cases": len(eq["cases"]), "shapes": sorted({shape(c) for c in eq["cases"]}),
                         "graphed_shapes": sorted({shape(c) for c in eq["cases"] if d.graphed(c)}),
                         "samplings": sorted({c["sampling"] for c in eq["cases"]}),
                         "draws_per_setting": span(trials.values())}}


# --- driver ------------------------------------------------------------------------------


def analyse(data: Json, d: Defaults) -> Json:
    rows, raw = data["summary"]["rows"], data["raw"]
    groups: dict[str, Callable[[], Json | None]] = {
        "graphed_steps": lambda: graphed_steps(rows, d),
        "pass_bandwidth": lambda: pass_bandwidth(rows),
        "read_floor": lambda: read_floor(rows),
        "vs_reference": lambda: vs_reference(rows),
        "vs_compile": lambda: vs_compile(rows, raw),
        "checks": lambda: checks(data, d),
    }
    return {k: v for k, f in groups.items() if (v := f()) is not None}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=DOCS / "verify-kernels-h200.json")
    p.add_argument("--out", type=Path, default=DOCS / "verify-kernels-h200-analysis.json")
    args = p.parse_args(argv)
    if not args.json.is_file():
        p.error(f"no such file: {args.json}")
    data = json.loads(args.json.read_text())
    try:
        defaults = run_defaults(data)
    except ValueError as exc:
        p.error(str(exc))
    result = {**provenance("benchmarks/verify_kernels_analysis.py"),
              "source": {"json": args.json.name, "measured_at_commit": data.get("commit"),
                         "graph_max_bytes": defaults.graph_max},
              **analyse(data, defaults)}
    write_json(args.out, rounded(result, 4))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
