"""Derived figures behind docs/kernels.md's H200 sections, from verify-kernels-h200.json.

    python benchmarks/verify_kernels_analysis.py [--json PATH] [--out PATH]

Reads the JSON that ``benchmarks/verify_kernels.py`` writes (``summary.rows``, ``raw``, the
two sweeps and the GPU checks) and writes ``docs/benchmarks/verify-kernels-h200-analysis.json``:
the figures the page quotes that are not already fields of the input (ranges and medians over
groups of shapes, counts of checks, sweep scores, the sizes at which a graph replay plus a copy
of the logits beats direct launches). Each group carries a ``how`` string that says how its
numbers are made. Times are in microseconds (keys ending ``_us``); fractions and ratios are
plain numbers (0.35 is 35 %).

A shape's size is its number of logits, ``B (gamma + 1) V``, or those logits' bytes. Which
shapes the verifier replayed from its own CUDA graph, and which block sizes and programs per
SM the sweeps at the start of the run started from, depend on the code at the measured commit
(the JSON's ``commit``): :data:`DEFAULTS` holds them per commit, and a threshold the JSON's
``config`` records (``graph_max_bytes``) replaces the commit's. A commit missing from
:data:`DEFAULTS` is an error, never guessed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from e2e_analysis import git_head, median, rounded, span  # noqa: E402  (a sibling script, not a package)

Json = dict[str, Any]

COMPILED_S = 0.5  # a torch.compile first call longer than this compiled (the others took ~0 s)
MIB = 1 << 20
ITEMSIZE = {"bfloat16": 2, "float32": 4}  # bytes per logit
GOAL_LOGITS, GOAL_FRACTION = 10e6, 0.8  # the goal: the pass at >= 80 % of copy bandwidth from 10M logits on
HOST_BOUND = 1.1  # a direct-launch step above this times its graph replay waits on the host
# bands of logits, (low, high]: the goal's 10M-100M band, its upper half, and the rest
GOAL_BAND = (10e6, 100e6)
FROM_50M = (50e6, 100e6)
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
    """The code's settings at a measured commit: the verifier's graph-replay threshold, and
    verify.py's block sizes and programs per SM, which the run's sweeps started from."""

    graph_max: int  # a step of at most this many ...
    graph_unit: str  # ... "bytes" (graph_max_bytes) or "logits" (graph_max_logits, before 08657b6) replays
    graph_from: str  # where graph_max comes from
    pass_config: dict[int, tuple[int, int]]  # PASS_CONFIG: bytes per logit -> (logits per block, warps)
    race: tuple[int, int]  # (RACE_BLOCK_V, RACE_WARPS)
    programs_per_sm: int  # PROGRAMS_PER_SM (a literal 4 before 3bc7dcf)

    def graphed(self, r: Json) -> bool:
        return (nbytes(r) if self.graph_unit == "bytes" else logits(r)) <= self.graph_max

    def describe(self) -> str:
        return f"logits of at most {self.graph_max} {self.graph_unit} ({self.graph_from})"


DEFAULTS = {  # the JSON's commit -> the code's defaults there
    "1b9e1fc": Defaults(1 << 24, "logits", "graph_max_logits at 1b9e1fc", {2: (8192, 8), 4: (8192, 8)}, (2048, 4), 4),
    "dcd459a": Defaults(96 << 20, "bytes", "graph_max_bytes at dcd459a", {2: (4096, 8), 4: (4096, 8)}, (8192, 8), 4),
}


def run_defaults(data: Json) -> Defaults:
    """DEFAULTS at the JSON's commit, with the graph threshold its config records, if any."""
    commit = data.get("commit")
    rec = data["config"].get("defaults")
    if rec:  # recorded by verify_kernels.py since 029a2b0
        return Defaults(int(rec["graph_max_bytes"]), "bytes", "config.defaults.graph_max_bytes",
                        {int(k): (int(v[0]), int(v[1])) for k, v in rec["PASS_CONFIG"].items()},
                        (int(rec["RACE_BLOCK_V"]), int(rec["RACE_WARPS"])), int(rec["PROGRAMS_PER_SM"]))
    if commit not in DEFAULTS:
        raise ValueError(f"no defaults known for the measured commit {commit!r}: add its graph threshold, "
                         "PASS_CONFIG, RACE_BLOCK_V / RACE_WARPS and PROGRAMS_PER_SM to DEFAULTS")
    d = DEFAULTS[commit]
    if "graph_max_bytes" in data["config"]:
        d = dataclasses.replace(d, graph_max=int(data["config"]["graph_max_bytes"]), graph_unit="bytes",
                                graph_from="config.graph_max_bytes")
    return d


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


def shapes(rows: list[Json], d: Defaults) -> Json:
    g = [r for r in rows if d.graphed(r)]
    return {"how": f"summary.rows; graphed: {d.describe()}, the verifier replayed its own graph; direct: the rest; "
                   "logits: B (gamma + 1) V per shape; mib: their bytes (MiB = 2^20 bytes)",
            "graph_max": d.graph_max, "graph_unit": d.graph_unit,
            "rows": len(rows), "graphed": len(g), "direct": len(rows) - len(g),
            "graphed_mib": mib(g), "direct_mib": mib(r for r in rows if not d.graphed(r)),
            "logits": {shape(r, with_dtype=False): logits(r) for r in rows}}


def graphed_steps(rows: list[Json], d: Defaults) -> Json:
    g = [r for r in rows if d.graphed(r)]
    b1 = [r for r in rows if r["B"] == 1]
    return {"how": "the graphed shapes: their MiB; triton_ms (the step), triton_graph_ms (the caller's graph), their "
                   "difference, triton_direct_ms (the same step with graph_max = 0) and direct / step, the shapes "
                   "whose step is faster than direct and those it is not; the batch sizes per dtype and V; batch_1: "
                   "graph and logits pass of the B = 1 shapes",
            "shapes": len(g), "mib": mib(g),
            "batch_sizes": {k: {str(v): sorted({r["B"] for r in rs if r["V"] == v}) for v in sorted({r["V"] for r in rs})}
                            for k, rs in by_dtype(g).items()},
            "step_us": spread(us(r["triton_ms"]) for r in g),
            "graph_us": spread(us(r["triton_graph_ms"]) for r in g),
            "step_minus_graph_us": spread(us(r["triton_ms"] - r["triton_graph_ms"]) for r in g),
            "direct_us": spread(us(r["triton_direct_ms"]) for r in g),
            "direct_over_step": span(r["triton_direct_ms"] / r["triton_ms"] for r in g),
            "faster_than_direct": of([r["triton_ms"] < r["triton_direct_ms"] for r in g]),
            "not_faster_than_direct": [{**step_vs(r, "triton_direct"), "mib": nbytes(r) / MIB}
                                       for r in g if r["triton_ms"] >= r["triton_direct_ms"]],
            "batch_1": {"graph_us": span(us(r["triton_graph_ms"]) for r in b1),
                        "pass_us": span(us(r["logits_pass_ms"]) for r in b1)}}


def direct_steps(rows: list[Json], d: Defaults) -> Json:
    dr = [r for r in rows if not d.graphed(r)]
    slow = [r for r in dr if r["triton_ms"] > HOST_BOUND * r["triton_graph_ms"]]
    rest = [r for r in dr if r not in slow]
    return {"how": f"the direct-launch shapes: their MiB and logits, triton_ms / triton_graph_ms; host_bound: those "
                   f"whose step (triton_ms) exceeds {HOST_BOUND:g} x triton_graph_ms, with triton_direct_ms (a second "
                   "timing of the same direct launch) and graph_plus_copy: triton_graph_ms + copy_same_size_ms (a "
                   "replay plus a copy of the logits in); the others' triton_ms - triton_graph_ms",
            "shapes": len(dr), "mib": mib(dr), "logits": span(logits(r) for r in dr),
            "step_over_graph": span(r["triton_ms"] / r["triton_graph_ms"] for r in dr),
            "host_bound": [{**step_vs(r, "triton_direct"), "mib": nbytes(r) / MIB, "graph_us": us(r["triton_graph_ms"]),
                            "graph_plus_copy_us": us(r["triton_graph_ms"] + r["copy_same_size_ms"])} for r in slow],
            "others_step_minus_graph_us": span(us(r["triton_ms"] - r["triton_graph_ms"]) for r in rest)}


def pinned(rows: list[Json], d: Defaults) -> Json | None:
    """The pinned step (triton_ms: the logits stay at one address) against the same step
    with graph_pin = false (triton_unpinned_ms), the caller's graph and direct launches."""
    rs = [r for r in rows if r.get("triton_unpinned_ms") is not None]
    if not rs:
        return None

    def part(group: list[Json]) -> Json:
        return {"shapes": len(group), "mib": mib(group),
                "step_over_graph": span(r["triton_ms"] / r["triton_graph_ms"] for r in group),
                "unpinned_over_step": span(r["triton_unpinned_ms"] / r["triton_ms"] for r in group),
                "faster_than_unpinned": of([r["triton_ms"] < r["triton_unpinned_ms"] for r in group]),
                "step_minus_graph_us": spread(us(r["triton_ms"] - r["triton_graph_ms"]) for r in group)}

    host = [r for r in rs if r["triton_ms"] > HOST_BOUND * r["triton_graph_ms"]]
    return {"how": f"shapes with triton_unpinned_ms, split at the copy threshold ({d.describe()}): copied (the "
                   "unpinned step copies the logits into its graph) and above (the unpinned step launches directly); "
                   "per part: triton_ms / triton_graph_ms, triton_unpinned_ms / triton_ms, [pinned step faster, "
                   "shapes], triton_ms - triton_graph_ms; host_bound: shapes whose pinned step exceeds "
                   f"{HOST_BOUND:g} x triton_graph_ms, with step and graph",
            "copied": part([r for r in rs if d.graphed(r)]), "above": part([r for r in rs if not d.graphed(r)]),
            "host_bound": [{**step_vs(r, "triton_graph"), "mib": nbytes(r) / MIB} for r in host]}


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


def race_share(r: Json) -> Json:
    race = r["triton_graph_ms"] - r["logits_pass_ms"]
    return {"shape": shape(r), "graph_us": us(r["triton_graph_ms"]), "pass_us": us(r["logits_pass_ms"]),
            "graph_minus_pass_us": us(race), "share_of_graph": race / r["triton_graph_ms"]}


def above_100m(rows: list[Json]) -> Json:
    big = within(rows, ABOVE_100M)
    return {"how": "shapes above 100M logits: triton_ms / triton_graph_ms; at the largest shape of each dtype, "
                   "triton_graph_ms minus logits_pass_ms (the race and finalize) and its share of the graph",
            "logits": span(logits(r) for r in big),
            "step_over_graph": span(r["triton_ms"] / r["triton_graph_ms"] for r in big),
            "largest_shape": {k: race_share(max(v, key=logits)) for k, v in by_dtype(big).items()}}


def same_size_copy_fraction(r: Json, copy_gbs: float) -> float:
    """The same-size copy's rate (bytes read plus written) over the 1 GiB copy's."""
    return 2 * nbytes(r) / (r["copy_same_size_ms"] * 1e6) / copy_gbs


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


def pass_bandwidth(rows: list[Json], copy_gbs: float) -> Json:
    per: Json = {}
    for k, v in by_dtype(rows).items():
        band, goal = within(v, GOAL_BAND), [r for r in v if logits(r) >= GOAL_LOGITS]
        per[k] = {"goal": {key: goal_reached(goal, key) for key in ("bandwidth_fraction",
                                                                    "bandwidth_fraction_vs_same_size_copy")},
                  "goal_band": fraction_range(band),
                  "goal_band_vs_same_size_copy": fraction_range(band, "bandwidth_fraction_vs_same_size_copy"),
                  "goal_band_same_size_copy_over_copy": span(same_size_copy_fraction(r, copy_gbs) for r in band),
                  "from_50M_to_100M": fraction_range(within(v, FROM_50M)),
                  "above_100M": fraction_range(within(v, ABOVE_100M)),
                  "above_100M_by_B": {str(b): fraction_range([r for r in within(v, ABOVE_100M) if r["B"] == b])
                                      for b in sorted({r["B"] for r in within(v, ABOVE_100M)})}}
    return {"how": "bandwidth_fraction (the pass's rate over the copy bandwidth) per dtype: goal: over the shapes of at "
                   f"least {GOAL_LOGITS:.0f} logits, [shapes at or above {GOAL_FRACTION:g}, shapes], min, max and their "
                   "shapes, the smallest shape (by logits) at or above it and the largest below, of bandwidth_fraction "
                   "and of bandwidth_fraction_vs_same_size_copy; min, max and their "
                   "shapes in the goal's band of 10M to 100M logits, from 50M to 100M, above 100M and above 100M per "
                   "B; bandwidth_fraction_vs_same_size_copy in the band; same_size_copy_over_copy: the same-size "
                   "copy's rate (2 x logits bytes / copy_same_size_ms) over copy_bandwidth.gbs; goal_band_pass_us: "
                   "logits_pass_ms of the band's shapes, both dtypes",
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


def exact(rows: list[Json], d: Defaults) -> Json:
    top = max(rows, key=lambda r: r["triton_exact_ms"])
    b512 = [r for r in rows if r["B"] == 512]
    return {"how": "triton_exact_ms over the graphed shapes; the largest over all with its shape; triton_exact_ms / "
                   "triton_ms at B = 512",
            "graphed_us": span(us(r["triton_exact_ms"]) for r in rows if d.graphed(r)),
            "max": {"shape": shape(top), "exact_us": us(top["triton_exact_ms"])},
            "b512_exact_over_step": span(r["triton_exact_ms"] / r["triton_ms"] for r in b512)}


# --- groups over raw, the sweeps and the checks -------------------------------------------


def graph_threshold(raw: list[Json], d: Defaults) -> Json:
    """Where a replay plus a copy of the logits stops beating the direct launches."""
    rows = sorted(raw, key=lambda r: r["logits_bytes"])
    wins = [r["triton_graph"]["ms"] + r["copy_same_size"]["ms"] < r["triton_direct"]["ms"] for r in rows]
    n_win = next((i for i, w in enumerate(wins) if not w), len(wins))  # the leading run of wins
    n_lose = next((i for i, w in enumerate(reversed(wins)) if w), len(wins))  # the trailing run of losses
    mixed = rows[n_win:len(rows) - n_lose]
    return {"how": "raw rows by logits_bytes: triton_graph.ms + copy_same_size.ms against triton_direct.ms (a win: "
                   "less); the largest size up to which every shape wins, the smallest shape that loses, the "
                   "smallest size from which every shape loses, and the shapes between (MiB = 2^20 bytes); "
                   f"graph_max_mib: the verifier's threshold in the run, {d.describe()}, null if not in bytes",
            "graph_max_mib": d.graph_max / MIB if d.graph_unit == "bytes" else None,
            "wins_up_to_mib": rows[n_win - 1]["logits_bytes"] / MIB if n_win else None,
            "first_loss_mib": rows[n_win]["logits_bytes"] / MIB if n_win < len(rows) else None,
            "loses_from_mib": rows[-n_lose]["logits_bytes"] / MIB if n_lose else None,
            "between_wins": of(wins[n_win:len(rows) - n_lose]),
            "between": [{"shape": shape(r), "mib": r["logits_bytes"] / MIB,
                         "graph_plus_copy_us": us(r["triton_graph"]["ms"] + r["copy_same_size"]["ms"]),
                         "direct_us": us(r["triton_direct"]["ms"])} for r in mixed]}


Setting = tuple[int, int, int, bool]  # (logits per block, warps, programs per SM, PASS_LANE_MAX)


def sweep_scores(rows: list[Json]) -> dict[Setting, float]:
    """Per setting: sum over shapes of time / the shape's best time (as sweep_pass)."""
    best: dict[str, float] = {}
    for r in rows:
        best[shape(r)] = min(best.get(shape(r), math.inf), r["ms"])
    score: dict[Setting, float] = {}
    for r in rows:
        key = (r["BLOCK_V"], r["num_warps"], r["programs_per_sm"], bool(r.get("lane_max", False)))
        score[key] = score.get(key, 0.0) + r["ms"] / best[shape(r)]
    return score


def setting(key: Setting, score: dict[Setting, float]) -> Json:
    return {"block_warps": list(key[:2]), "programs_per_sm": key[2], "lane_max": key[3], "score": score.get(key)}


def pass_sweep_dtype(rows: list[Json], default: Setting, used: Setting, copy_gbs: float) -> Json:
    score = sweep_scores(rows)
    pick = min(score, key=score.__getitem__)
    at = {k[:2]: v for k, v in score.items() if k[2:] == default[2:]}
    best_at = min(at, key=at.__getitem__) if at else None
    ms = {(shape(r), r["BLOCK_V"], r["num_warps"], r["programs_per_sm"], bool(r.get("lane_max", False))): r["ms"]
          for r in rows}
    by_lane = {lane: min((v for k, v in score.items() if k[3] == lane), default=None) for lane in (False, True)}
    names = sorted({shape(r) for r in rows})
    fastest = [min((r for r in rows if shape(r) == s), key=lambda r: r["ms"]) for s in names]
    in_band = [r for r in fastest if within([r], GOAL_BAND)]
    return {"pick": setting(pick, score), "used": setting(used, score), "default": setting(default, score),
            "default_over_used_minus_1": span(ms[(s, *default)] / ms[(s, *used)] - 1 for s in names)
            if default in score and used in score else None,
            "best_at_default_programs_per_sm": {"block_warps": list(best_at), "score": at[best_at]} if best_at else None,
            "per_shape_best_programs_per_sm": span(r["programs_per_sm"] for r in fastest),
            "best_score_by_lane_max": {str(k).lower(): v for k, v in by_lane.items() if v is not None},
            "goal_band_best_fraction": {"shapes": len(in_band), "logits": span(logits(r) for r in in_band),
                                        "fraction_of_copy": span(r["gbs"] / copy_gbs for r in in_band)}}


def pass_sweep(data: Json, d: Defaults) -> Json:
    sw, cfg = data["pass_sweep"], data["config"]
    per_sm = cfg["programs_wanted"] // data["sm_count"]

    def used(dtype_name: str) -> Setting:  # config.PASS_CONFIG is keyed by bytes per logit
        block, warps = cfg["PASS_CONFIG"][str(ITEMSIZE[dtype_name])]
        return block, warps, per_sm, bool(cfg.get("PASS_LANE_MAX", {}).get(str(ITEMSIZE[dtype_name]), False))

    def default(dtype_name: str) -> Setting:  # the per-lane max option is off by default (PASS_LANE_MAX)
        lane = cfg.get("defaults", {}).get("PASS_LANE_MAX", {}).get(str(ITEMSIZE[dtype_name]), False)
        return (*d.pass_config[ITEMSIZE[dtype_name]], d.programs_per_sm, bool(lane))

    return {"how": "pass_sweep: its shapes, (block, warps) pairs, programs per SM and, where swept, the per-lane max "
                   "(PASS_LANE_MAX); per dtype the score of each "
                   "setting (sum over the shapes of time / that shape's best time; null: not swept) for the pick, "
                   "the setting the run used (config.PASS_CONFIG at the launcher's programs per SM, "
                   "config.programs_wanted / sm_count) and the measured commit's default "
                   f"(PASS_CONFIG {d.pass_config} by bytes per logit, {d.programs_per_sm} programs per SM), the default's time / the used setting's - 1 per shape, "
                   "the best pair at the default's programs per SM and lane max; the best score with and without "
                   "the per-lane max (best_score_by_lane_max); per shape the fastest setting's programs per SM, "
                   "and in the 10M-100M band its rate (gbs) over copy_bandwidth.gbs",
            "shapes": len({shape(r, with_dtype=False) for r in sw}), "logits": span(logits(r) for r in sw),
            "pairs": len({(r["BLOCK_V"], r["num_warps"]) for r in sw}),
            "programs_per_sm": sorted({r["programs_per_sm"] for r in sw}), "launcher_programs_per_sm": per_sm,
            "per_dtype": {k: pass_sweep_dtype(v, default(k), used(k), data["copy_bandwidth"]["gbs"])
                          for k, v in by_dtype(sw).items()}}


def label(block: int, warps: int) -> str:
    return f"{block}x{warps}"


def race_sweep(data: Json, d: Defaults) -> Json:
    sw, cfg = data["race_sweep"], data["config"]
    summed: dict[str, float] = {}
    for r in sw:
        key = label(r["RACE_BLOCK_V"], r["num_warps"])
        summed[key] = summed.get(key, 0.0) + us(r["step_graph_ms"])
    return {"how": "race_sweep: step_graph_ms summed over its shapes per (race block, warps), and per shape; "
                   f"default: the measured commit's {d.race}; used: config.RACE_BLOCK_V, RACE_WARPS",
            "default": label(*d.race), "used": label(cfg["RACE_BLOCK_V"], cfg["RACE_WARPS"]),
            "summed_us": summed,
            "per_shape_us": {s: {label(r["RACE_BLOCK_V"], r["num_warps"]): us(r["step_graph_ms"])
                                 for r in sw if shape(r, with_dtype=False) == s}
                             for s in dict.fromkeys(shape(r, with_dtype=False) for r in sw)}}


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
            "step_graphs_pinned": of([c.get("pinned_replays", 0) > 0 for c in sg]),
            "equality": {"cases": len(eq["cases"]), "shapes": sorted({shape(c) for c in eq["cases"]}),
                         "graphed_shapes": sorted({shape(c) for c in eq["cases"] if d.graphed(c)}),
                         "samplings": sorted({c["sampling"] for c in eq["cases"]}),
                         "draws_per_setting": span(trials.values())}}


# --- driver ------------------------------------------------------------------------------


def analyse(data: Json, d: Defaults) -> Json:
    rows, raw, gbs = data["summary"]["rows"], data["raw"], data["copy_bandwidth"]["gbs"]
    groups: dict[str, Callable[[], Json]] = {
        "shapes": lambda: shapes(rows, d),
        "graphed_steps": lambda: graphed_steps(rows, d),
        "direct_steps": lambda: direct_steps(rows, d),
        "above_100M": lambda: above_100m(rows),
        "pass_bandwidth": lambda: pass_bandwidth(rows, gbs),
        "vs_reference": lambda: vs_reference(rows),
        "vs_compile": lambda: vs_compile(rows, raw),
        "exact": lambda: exact(rows, d),
        "graph_threshold": lambda: graph_threshold(raw, d),
        "pass_sweep": lambda: pass_sweep(data, d),
        "race_sweep": lambda: race_sweep(data, d),
        "checks": lambda: checks(data, d),
        "pinned": lambda: pinned(rows, d),
        "read_floor": lambda: read_floor(rows),
    }
    return {k: v for k, f in groups.items() if (v := f()) is not None}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "verify-kernels-h200.json")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "verify-kernels-h200-analysis.json")
    args = p.parse_args(argv)
    if not args.json.is_file():
        p.error(f"no such file: {args.json}")
    data = json.loads(args.json.read_text())
    try:
        defaults = run_defaults(data)
    except ValueError as exc:
        p.error(str(exc))
    head, dirty = git_head(Path(__file__).resolve())
    result = {"source": {"json": args.json.name, "measured_at_commit": data.get("commit"),
                         "defaults": dataclasses.asdict(defaults)},
              "commit": head, "script_modified_since_commit": dirty,
              "script": "benchmarks/verify_kernels_analysis.py", **analyse(data, defaults)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(result, 4), indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
