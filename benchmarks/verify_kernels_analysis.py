"""Derived figures behind docs/kernels.md's H200 sections, from verify-kernels-h200.json.

    python benchmarks/verify_kernels_analysis.py [--json PATH] [--out PATH]

Reads the JSON that ``benchmarks/verify_kernels.py`` writes (``summary.rows``, ``raw``, the
two sweeps and the GPU checks) and writes ``docs/benchmarks/verify-kernels-h200-analysis.json``:
the figures the page quotes that are not already fields of the input (ranges and medians over
groups of shapes, counts of checks, sweep scores, the sizes at which a graph replay plus a copy
of the logits beats direct launches). Each group carries a ``how`` string that says how its
numbers are made. Times are in microseconds (keys ending ``_us``); fractions and ratios are
plain numbers (0.35 is 35 %).

A shape's size is its number of logits, ``B (gamma + 1) V``. At the measured commit the
verifier replayed its own CUDA graph for steps of at most ``GRAPH_MAX_LOGITS`` logits and
launched the kernels directly above that; ``PASS_DEFAULT`` and ``RACE_DEFAULT`` are that
commit's block sizes, which the sweeps at the start of the run replaced.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from e2e_analysis import git_head, median, rounded, span  # noqa: E402  (a sibling script, not a package)

Json = dict[str, Any]

GRAPH_MAX_LOGITS = 1 << 24  # TritonVerifierConfig.graph_max_logits at the measured commit
PASS_DEFAULT = (8192, 8)  # verify.PASS_CONFIG (logits per block, warps), both dtypes, at the measured commit
RACE_DEFAULT = (2048, 4)  # verify.RACE_BLOCK_V, RACE_WARPS at the measured commit
COMPILED_S = 0.5  # a torch.compile first call longer than this compiled (the others took ~0 s)
MIB = 1 << 20
ITEMSIZE = {"bfloat16": 2, "float32": 4}  # bytes per logit
# bands of logits, (low, high]: the goal's 10M-100M band, and the direct launches split in two
# between the shapes whose step is host-bound and those where the GPU work catches up (this
# run has no shape between the two)
GOAL_BAND = (10e6, 100e6)
DIRECT_SMALL = (GRAPH_MAX_LOGITS, 50e6)
DIRECT_LARGE = (50e6, 100e6)
ABOVE_100M = (100e6, math.inf)


def logits(r: Json) -> int:
    return r["B"] * (r["gamma"] + 1) * r["V"]


def dtype(r: Json) -> str:
    return str(r["dtype"]).removeprefix("torch.")


def shape(r: Json, with_dtype: bool = True) -> str:
    s = f"B={r['B']} gamma={r['gamma']} V={r['V']}"
    return f"{s} {dtype(r)}" if with_dtype else s


def us(ms: float) -> float:
    return ms * 1e3


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


def graphed(rows: Iterable[Json]) -> list[Json]:
    return [r for r in rows if logits(r) <= GRAPH_MAX_LOGITS]


def step_vs(r: Json, other: str) -> Json:
    """The philox step of a row against another column, in us."""
    return {"shape": shape(r), "step_us": us(r["triton_ms"]), f"{other}_us": us(r[f"{other}_ms"])}


# --- groups over summary.rows ------------------------------------------------------------


def shapes(rows: list[Json]) -> Json:
    return {"how": f"summary.rows; graphed: at most {GRAPH_MAX_LOGITS} logits (graph_max_logits at the measured "
                   "commit), the verifier replayed its own graph; direct: the rest; logits: B (gamma + 1) V per shape",
            "rows": len(rows), "graphed": len(graphed(rows)), "direct": len(rows) - len(graphed(rows)),
            "logits": {shape(r, with_dtype=False): logits(r) for r in rows}}


def graphed_steps(rows: list[Json]) -> Json:
    g = graphed(rows)
    b1 = [r for r in rows if r["B"] == 1]
    vocab = sorted({r["V"] for r in g})
    return {"how": "the graphed shapes: triton_ms (the step), triton_graph_ms (the caller's graph), their "
                   "difference, triton_direct_ms (graph_max_logits = 0) and direct / step; the batch sizes per V; "
                   "batch_1: graph and logits pass of the B = 1 shapes",
            "shapes": len(g), "batch_sizes_by_V": {str(v): sorted({r["B"] for r in g if r["V"] == v}) for v in vocab},
            "step_us": spread(us(r["triton_ms"]) for r in g),
            "graph_us": spread(us(r["triton_graph_ms"]) for r in g),
            "step_minus_graph_us": spread(us(r["triton_ms"] - r["triton_graph_ms"]) for r in g),
            "direct_us": spread(us(r["triton_direct_ms"]) for r in g),
            "direct_over_step": span(r["triton_direct_ms"] / r["triton_ms"] for r in g),
            "batch_1": {"graph_us": span(us(r["triton_graph_ms"]) for r in b1),
                        "pass_us": span(us(r["logits_pass_ms"]) for r in b1)}}


def direct_small(rows: list[Json]) -> Json:
    d = within(rows, DIRECT_SMALL)
    slower = [{**step_vs(r, "triton_graph"), "graph_plus_copy_us": us(r["triton_graph_ms"] + r["copy_same_size_ms"])}
              for r in d if r["triton_graph_ms"] + r["copy_same_size_ms"] > r["triton_ms"]]
    return {"how": f"direct-launch shapes of at most {DIRECT_SMALL[1]:.0f} logits: their logits; triton_ms (the step, "
                   "launched directly) and triton_graph_ms, overall and per dtype; graph_plus_copy: triton_graph_ms + "
                   "copy_same_size_ms (a replay plus a copy of the logits in), per dtype, and the shapes where it is "
                   "slower than the step",
            "logits": span(logits(r) for r in d),
            "step_us": spread(us(r["triton_ms"]) for r in d), "graph_us": spread(us(r["triton_graph_ms"]) for r in d),
            "per_dtype": {k: {"step_us": span(us(r["triton_ms"]) for r in v),
                              "graph_plus_copy_us": span(us(r["triton_graph_ms"] + r["copy_same_size_ms"]) for r in v)}
                          for k, v in by_dtype(d).items()},
            "graph_plus_copy_slower": slower}


def direct_large(rows: list[Json]) -> Json:
    d = sorted(within(rows, DIRECT_LARGE), key=lambda r: r["triton_ms"] - r["triton_graph_ms"], reverse=True)
    return {"how": f"direct-launch shapes of {DIRECT_LARGE[0]:.0f} to {DIRECT_LARGE[1]:.0f} logits: their logits, "
                   "triton_graph_ms, the shape with the largest step minus graph, and the largest step minus graph "
                   "among the others",
            "logits": span(logits(r) for r in d), "graph_us": span(us(r["triton_graph_ms"]) for r in d),
            "largest_gap": step_vs(d[0], "triton_graph") if d else None,
            "others_max_step_minus_graph_us": max((us(r["triton_ms"] - r["triton_graph_ms"]) for r in d[1:]),
                                                  default=None)}


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
    return 2 * logits(r) * ITEMSIZE[dtype(r)] / (r["copy_same_size_ms"] * 1e6) / copy_gbs


def fraction_range(rows: list[Json], key: str = "bandwidth_fraction") -> Json | None:
    if not rows:
        return None
    lo, hi = min(rows, key=lambda r: r[key]), max(rows, key=lambda r: r[key])
    return {"min": lo[key], "max": hi[key], "min_shape": shape(lo), "max_shape": shape(hi),
            "logits": span(logits(r) for r in rows)}


def pass_bandwidth(rows: list[Json], copy_gbs: float) -> Json:
    per: Json = {}
    for k, v in by_dtype(rows).items():
        band = within(v, GOAL_BAND)
        per[k] = {"goal_band": fraction_range(band),
                  "goal_band_vs_same_size_copy": fraction_range(band, "bandwidth_fraction_vs_same_size_copy"),
                  "goal_band_same_size_copy_over_copy": span(same_size_copy_fraction(r, copy_gbs) for r in band),
                  "from_50M_to_100M": fraction_range(within(v, DIRECT_LARGE)),
                  "above_100M": fraction_range(within(v, ABOVE_100M)),
                  "above_100M_by_B": {str(b): fraction_range([r for r in within(v, ABOVE_100M) if r["B"] == b])
                                      for b in sorted({r["B"] for r in within(v, ABOVE_100M)})}}
    return {"how": "bandwidth_fraction (the pass's rate over the copy bandwidth) per dtype: min, max and their shapes "
                   "in the goal's band of 10M to 100M logits, from 50M to 100M, above 100M and above 100M per B; "
                   "bandwidth_fraction_vs_same_size_copy in the band; same_size_copy_over_copy: the same-size copy's "
                   "rate (2 x logits bytes / copy_same_size_ms) over copy_bandwidth.gbs; goal_band_pass_us: "
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
    wall_slower = [{"shape": shape(r), "step_wall_us": us(r["triton_wall_ms"]), "compile_wall_us": us(r["compile_wall_ms"])}
                   for r in c if r["triton_wall_ms"] >= r["compile_wall_ms"]]
    first = [r["compile_first_call_s"] for r in raw if r.get("compile_first_call_s", 0) > COMPILED_S]
    return {"how": "shapes with compile_ms: how many the step beats, speedup_vs_compile range and the lowest; the same "
                   f"count in host wall time and the shapes it loses; raw compile_first_call_s above {COMPILED_S:g} s "
                   "(the calls that compiled): count and range",
            "shapes": len(c), "faster": sum(r["triton_ms"] < r["compile_ms"] for r in c),
            "speedup": span(r["speedup_vs_compile"] for r in c), "lowest": step_vs(low, "compile"),
            "wall_faster": len(c) - len(wall_slower), "wall_slower": wall_slower,
            "compiles": len(first), "compile_s": span(first)}


def exact(rows: list[Json]) -> Json:
    top = max(rows, key=lambda r: r["triton_exact_ms"])
    b512 = [r for r in rows if r["B"] == 512]
    return {"how": "triton_exact_ms over the graphed shapes; the largest over all with its shape; triton_exact_ms / "
                   "triton_ms at B = 512",
            "graphed_us": span(us(r["triton_exact_ms"]) for r in graphed(rows)),
            "max": {"shape": shape(top), "exact_us": us(top["triton_exact_ms"])},
            "b512_exact_over_step": span(r["triton_exact_ms"] / r["triton_ms"] for r in b512)}


# --- groups over raw, the sweeps and the checks -------------------------------------------


def graph_threshold(raw: list[Json]) -> Json:
    """Where a replay plus a copy of the logits stops beating the direct launches."""
    rows = sorted(raw, key=lambda r: r["logits_bytes"])
    wins = [r["triton_graph"]["ms"] + r["copy_same_size"]["ms"] < r["triton_direct"]["ms"] for r in rows]
    n_win = next((i for i, w in enumerate(wins) if not w), len(wins))  # the leading run of wins
    n_lose = next((i for i, w in enumerate(reversed(wins)) if w), len(wins))  # the trailing run of losses
    mixed = rows[n_win:len(rows) - n_lose]
    return {"how": "raw rows by logits_bytes: triton_graph.ms + copy_same_size.ms against triton_direct.ms (a win: "
                   "less); the largest size up to which every shape wins, the smallest shape that loses, the "
                   "smallest size from which every shape loses, and the shapes between (MiB = 2^20 bytes)",
            "wins_up_to_mib": rows[n_win - 1]["logits_bytes"] / MIB if n_win else None,
            "first_loss_mib": rows[n_win]["logits_bytes"] / MIB if n_win < len(rows) else None,
            "loses_from_mib": rows[-n_lose]["logits_bytes"] / MIB if n_lose else None,
            "between_wins": of(wins[n_win:len(rows) - n_lose]),
            "between": [{"shape": shape(r), "mib": r["logits_bytes"] / MIB,
                         "graph_plus_copy_us": us(r["triton_graph"]["ms"] + r["copy_same_size"]["ms"]),
                         "direct_us": us(r["triton_direct"]["ms"])} for r in mixed]}


def sweep_scores(rows: list[Json]) -> dict[tuple[int, int, int], float]:
    """Per (block, warps, programs per SM): sum over shapes of time / the shape's best time (as sweep_pass)."""
    best: dict[str, float] = {}
    for r in rows:
        best[shape(r)] = min(best.get(shape(r), math.inf), r["ms"])
    score: dict[tuple[int, int, int], float] = {}
    for r in rows:
        key = (r["BLOCK_V"], r["num_warps"], r["programs_per_sm"])
        score[key] = score.get(key, 0.0) + r["ms"] / best[shape(r)]
    return score


def pass_sweep_dtype(rows: list[Json], per_sm: int, picked: tuple[int, int], copy_gbs: float) -> Json:
    score = sweep_scores(rows)
    pick = min(score, key=score.__getitem__)
    at = {k[:2]: v for k, v in score.items() if k[2] == per_sm}
    best_at = min(at, key=at.__getitem__)
    ms = {(shape(r), r["BLOCK_V"], r["num_warps"]): r["ms"] for r in rows if r["programs_per_sm"] == per_sm}
    names = sorted({shape(r) for r in rows})
    fastest = [min((r for r in rows if shape(r) == s), key=lambda r: r["ms"]) for s in names]
    in_band = [r for r in fastest if within([r], GOAL_BAND)]
    return {"pick": {"block_warps": list(pick[:2]), "programs_per_sm": pick[2], "score": score[pick]},
            "at_launcher_per_sm": {"best": list(best_at), "best_score": at[best_at],
                                   "default": list(PASS_DEFAULT), "default_score": at[PASS_DEFAULT],
                                   "picked": list(picked), "picked_score": at[picked],
                                   "default_over_picked_minus_1": span(ms[(s, *PASS_DEFAULT)] / ms[(s, *picked)] - 1
                                                                       for s in names)},
            "per_shape_best_programs_per_sm": span(r["programs_per_sm"] for r in fastest),
            "goal_band_best_fraction": {"shapes": len(in_band), "logits": span(logits(r) for r in in_band),
                                        "fraction_of_copy": span(r["gbs"] / copy_gbs for r in in_band)}}


def used_pair(config: Json, dtype_name: str) -> tuple[int, int]:
    """The (block, warps) of the pass the run used for a dtype (config.PASS_CONFIG, keyed by bytes per logit)."""
    block, warps = config["PASS_CONFIG"][str(ITEMSIZE[dtype_name])]
    return block, warps


def pass_sweep(data: Json) -> Json:
    sw, cfg = data["pass_sweep"], data["config"]
    per_sm = cfg["programs_wanted"] // data["sm_count"]
    return {"how": "pass_sweep: its shapes, (block, warps) pairs and programs per SM; per dtype the score of each "
                   "setting (sum over the shapes of time / that shape's best time), the pick, and at the launcher's "
                   "programs per SM (config.programs_wanted / sm_count) the best pair, the measured commit's default "
                   f"{PASS_DEFAULT} and the pair the run used (config.PASS_CONFIG), with default time / used pair's "
                   "time - 1 per shape; per shape the fastest setting's programs per SM, and in the 10M-100M band its "
                   "rate (gbs) over copy_bandwidth.gbs",
            "shapes": len({shape(r, with_dtype=False) for r in sw}), "logits": span(logits(r) for r in sw),
            "pairs": len({(r["BLOCK_V"], r["num_warps"]) for r in sw}),
            "programs_per_sm": sorted({r["programs_per_sm"] for r in sw}), "launcher_programs_per_sm": per_sm,
            "per_dtype": {k: pass_sweep_dtype(v, per_sm, used_pair(cfg, k), data["copy_bandwidth"]["gbs"])
                          for k, v in by_dtype(sw).items()}}


def label(block: int, warps: int) -> str:
    return f"{block}x{warps}"


def race_sweep(data: Json) -> Json:
    sw, cfg = data["race_sweep"], data["config"]
    summed: dict[str, float] = {}
    for r in sw:
        key = label(r["RACE_BLOCK_V"], r["num_warps"])
        summed[key] = summed.get(key, 0.0) + us(r["step_graph_ms"])
    return {"how": "race_sweep: step_graph_ms summed over its shapes per (race block, warps), and per shape; "
                   f"default: the measured commit's {RACE_DEFAULT}; used: config.RACE_BLOCK_V, RACE_WARPS",
            "default": label(*RACE_DEFAULT), "used": label(cfg["RACE_BLOCK_V"], cfg["RACE_WARPS"]),
            "summed_us": summed,
            "per_shape_us": {s: {label(r["RACE_BLOCK_V"], r["num_warps"]): us(r["step_graph_ms"])
                                 for r in sw if shape(r, with_dtype=False) == s}
                             for s in dict.fromkeys(shape(r, with_dtype=False) for r in sw)}}


def of(flags: Sequence[bool]) -> list[int]:
    """[true, all]"""
    return [sum(map(bool, flags)), len(flags)]


def checks(data: Json) -> Json:
    g, eq, sg = data["cuda_graph"], data["equality"], data["step_graphs"]["cases"]
    trials = Counter((shape(c), c["q"], c["sampling"]) for c in eq["cases"])
    return {"how": "[passed, total] of the cuda_graph lists (philox_counter: replays after which the counter "
                   "advanced by exactly one) and of step_graphs.cases identical; equality: its cases, the distinct "
                   "shapes and samplings, and the noise draws per (shape, draft probs, sampling)",
            "exact_replays_equal": of(g["exact_replays_equal"]),
            "philox_counter_advanced_by_one": of([b - a == 1 for a, b in g["philox_counter"]]),
            "philox_rows_valid": of(g["philox_rows_valid"]), "philox_tokens_changed": of(g["philox_tokens_changed"]),
            "step_graphs_identical": of([c["identical"] for c in sg]),
            "equality": {"cases": len(eq["cases"]), "shapes": sorted({shape(c) for c in eq["cases"]}),
                         "samplings": sorted({c["sampling"] for c in eq["cases"]}),
                         "draws_per_setting": span(trials.values())}}


# --- driver ------------------------------------------------------------------------------


def analyse(data: Json) -> Json:
    rows, raw, gbs = data["summary"]["rows"], data["raw"], data["copy_bandwidth"]["gbs"]
    groups: dict[str, Callable[[], Json]] = {
        "shapes": lambda: shapes(rows),
        "graphed_steps": lambda: graphed_steps(rows),
        "direct_small": lambda: direct_small(rows),
        "direct_large": lambda: direct_large(rows),
        "above_100M": lambda: above_100m(rows),
        "pass_bandwidth": lambda: pass_bandwidth(rows, gbs),
        "vs_reference": lambda: vs_reference(rows),
        "vs_compile": lambda: vs_compile(rows, raw),
        "exact": lambda: exact(rows),
        "graph_threshold": lambda: graph_threshold(raw),
        "pass_sweep": lambda: pass_sweep(data),
        "race_sweep": lambda: race_sweep(data),
        "checks": lambda: checks(data),
    }
    return {k: f() for k, f in groups.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "verify-kernels-h200.json")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "verify-kernels-h200-analysis.json")
    args = p.parse_args(argv)
    if not args.json.is_file():
        p.error(f"no such file: {args.json}")
    data = json.loads(args.json.read_text())
    head, dirty = git_head(Path(__file__).resolve())
    result = {"source": {"json": args.json.name, "measured_at_commit": data.get("commit")},
              "commit": head, "script_modified_since_commit": dirty,
              "script": "benchmarks/verify_kernels_analysis.py", **analyse(data)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rounded(result, 4), indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
