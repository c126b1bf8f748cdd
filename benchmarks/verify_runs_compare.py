"""Side-by-side figures of the committed H200 verify-kernels runs (no GPU).

    python benchmarks/verify_runs_compare.py [--dir docs/benchmarks] [--out PATH]

docs/kernels.md compares runs of ``benchmarks/verify_kernels.py`` made at different
commits (the same shapes, the same timer). This script reads them and writes
``verify-kernels-h200-compare.json``: for each pair (new run against old run) and each
shape, the ratios of the logits pass and of the caller's graph replay, and the graph time
outside the pass (``triton_graph_ms - logits_pass_ms``: the accept, race and finalize
kernels); then min / median / max of those over groups of shapes per dtype. It also
scores the settings of ``pass_variants.py``'s programs-per-SM sweep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_kernels_analysis import shape  # noqa: E402

RUNS = {  # name -> file under --dir
    "ed12466": "verify-kernels-h200-ed12466.json",  # the per-block pass
    "r5758871": "verify-kernels-h200-5758871.json",  # tile pass, race at 16 programs per SM, one-stage draw
    "race32": "verify-kernels-h200-race32-1024280.json",  # tile pass, race at 32 programs per SM
    "gumbel": "verify-kernels-h200-gumbel-08f9712.json",  # log-space race (reverted)
    "two_stage": "verify-kernels-h200-twostage-631ab87.json",  # two-stage philox draw everywhere (reverted)
    "current": "verify-kernels-h200.json",  # 0fa63b4: the two-stage draw from B = 128 and V = 100,000 only
}
PAIRS = [
    ("r5758871", "ed12466"),
    ("race32", "ed12466"),
    ("gumbel", "r5758871"),
    ("two_stage", "r5758871"),
    ("current", "r5758871"),
]
GOAL_LOGITS = 10_000_000
GROUPS: dict[str, Callable[[dict], bool]] = {
    "all": lambda r: True,
    "goal_band": lambda r: r["B"] * (r["gamma"] + 1) * r["V"] >= GOAL_LOGITS,
    "b_ge_128": lambda r: r["B"] >= 128,
    "b_ge_128_v_ge_128256": lambda r: r["B"] >= 128 and r["V"] >= 128256,
    "b_le_32_or_v_32000": lambda r: r["B"] <= 32 or r["V"] == 32000,
}
PER_SM_FILE = "pass-variants-h200-persm.json"


def spread(xs: list[float]) -> dict[str, float] | None:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)} if xs else None


def compare(new: dict, old: dict) -> dict[str, Any]:
    olds = {shape(r): r for r in old["summary"]["rows"]}
    rows = []
    for r in new["summary"]["rows"]:
        o = olds.get(shape(r))
        if o is None:
            continue
        out_new = r["triton_graph_ms"] - r["logits_pass_ms"]
        out_old = o["triton_graph_ms"] - o["logits_pass_ms"]
        rows.append({**{k: r[k] for k in ("B", "gamma", "V", "dtype")},
                     "pass_us": [o["logits_pass_ms"] * 1e3, r["logits_pass_ms"] * 1e3],
                     "graph_us": [o["triton_graph_ms"] * 1e3, r["triton_graph_ms"] * 1e3],
                     "outside_pass_us": [out_old * 1e3, out_new * 1e3],
                     "pass_ratio": r["logits_pass_ms"] / o["logits_pass_ms"],
                     "graph_ratio": r["triton_graph_ms"] / o["triton_graph_ms"],
                     "outside_pass_ratio": out_new / out_old})  # fmt: skip
    groups = {}
    for dtype in ("bfloat16", "float32"):
        for g, keep in GROUPS.items():
            sel = [r for r in rows if r["dtype"] == dtype and keep(r)]
            groups[f"{dtype}/{g}"] = {k: spread([r[k] for r in sel])
                                      for k in ("pass_ratio", "graph_ratio", "outside_pass_ratio")}
    return {"new": new["commit"], "old": old["commit"], "rows": rows, "groups": groups}


def per_sm_scores(data: dict) -> dict[str, list[dict]]:
    import verify_kernels as vk  # torch and triton, as pass_variants.py needs them anyway

    out = {}
    for dtype in ("bfloat16", "float32"):
        rows = [r for r in data["sweep"] if r["dtype"] == dtype and "ms" in r]
        ratios = vk.sweep_scores(rows, lambda r: (r["form"], r["BLOCK_V"], r["num_warps"], r["programs_per_sm"]))
        scored = [{"form": k[0], "BLOCK_V": k[1], "num_warps": k[2], "programs_per_sm": k[3],
                   "score": sum(v) / len(v), "shapes": len(v)} for k, v in ratios.items()]  # fmt: skip
        out[dtype] = sorted(scored, key=lambda s: s["score"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "benchmarks")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = {name: json.loads((args.dir / f).read_text()) for name, f in RUNS.items()}
    result = {
        "how": __doc__.split("\n\n")[2].replace("\n", " "),
        "runs": {name: {"file": f, "commit": runs[name]["commit"]} for name, f in RUNS.items()},
        "pairs": {f"{a}_vs_{b}": compare(runs[a], runs[b]) for a, b in PAIRS},
        "pass_per_sm": {"file": PER_SM_FILE,
                        "how": "score: time over each shape's best (over every form and setting of the sweep), "
                               "averaged over the sweep's shapes",
                        "by_dtype": per_sm_scores(json.loads((args.dir / PER_SM_FILE).read_text()))},
    }
    out = args.out or args.dir / "verify-kernels-h200-compare.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
