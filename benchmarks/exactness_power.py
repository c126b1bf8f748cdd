"""Measure the exactness gate: power against planted bugs, false alarms, calibration.

For every mutant in :data:`flashspec_core.testing.mutants.MUTANTS` the gate
(:func:`flashspec_core.testing.exactness.gate`, Holm at ``GATE_ALPHA`` per run, the
same decision the stats suite makes) runs on ``POWER_CASE`` with ``--seeds``
different trial seeds; power is the fraction of seeds it rejects. The correct
verifier (``--verifier``, default the reference) runs on ``--null-seeds`` seeds:
its rejection rate is the false-alarm rate, and the KS test of its per-statistic
chi-square p-values against Uniform(0, 1) checks calibration.

Writes ``docs/benchmarks/exactness-power.json`` (commit, versions, config, raw
per-seed p-values, ``summary`` {mutant: power}, ``false_alarm_rate``, ``ks_pvalue``).
Run: ``python benchmarks/exactness_power.py`` (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import scipy
import torch
from scipy import stats

from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.chisq import holm, ks_uniform
from flashspec_core.testing.exactness import GATE_ALPHA, GATE_MIN_EXPECTED, GATE_STATISTIC, gate
from flashspec_core.testing.mutants import MUTANTS, POWER_CASE, mutant

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "exactness-power.json"
CORRECT = "correct"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _one(job: tuple[str, str, int]) -> dict[str, Any]:
    """One gate run: (mutant or CORRECT, verifier name, seed) -> p-values and decision."""
    torch.set_num_threads(1)
    which, name, seed = job
    if which == CORRECT:
        verifier, report = vc.load_verifier(name), None
    else:
        verifier, report = mutant(which)
    start = time.perf_counter()
    decision = gate(verifier, POWER_CASE, seed, report=report)
    return {
        "mutant": which,
        "seed": seed,
        "rejected": decision.rejected,
        "failing": list(decision.failing),
        "pvalues": decision.result.pvalues,
        "seconds": time.perf_counter() - start,
    }


def tail_inflation(
    means: tuple[float, ...] = (5, 10, 20, 50), alphas: tuple[float, ...] = (1e-4, 1e-5, 1e-6)
) -> dict[str, Any]:
    """Exact rejection rate / nominal level of a chi-square(1) test on one Poisson(m) bin.

    A small bin dominates the far tail of a grouped statistic, so this is the worst
    case of how far the asymptotic p-value is off at the gate's levels.
    """
    out: dict[str, Any] = {}
    for name in ("pearson", "g"):
        rows = {}
        for m in means:
            x = np.arange(0, int(m * 20 + 200))
            pmf = stats.poisson.pmf(x, m)
            if name == "pearson":
                s = (x - m) ** 2 / m
            else:
                s = 2 * (np.where(x > 0, x * np.log(np.maximum(x, 1) / m), 0.0) - (x - m))
            rows[str(m)] = {str(a): float(pmf[s >= stats.chi2.isf(a, 1)].sum() / a) for a in alphas}
        out[name] = rows
    return out


def _lower_bound(successes: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower confidence bound of a proportion."""
    return 0.0 if successes == 0 else float(stats.beta.ppf(1 - level, successes, n - successes + 1))


def _summarise(runs: list[dict[str, Any]], seeds: int, null_seeds: int) -> dict[str, Any]:
    by = {m: [r for r in runs if r["mutant"] == m] for m in [CORRECT, *MUTANTS]}
    power = {m: sum(r["rejected"] for r in by[m]) / seeds for m in MUTANTS}
    null = by[CORRECT]
    names = list(null[0]["pvalues"])
    ks = {n: ks_uniform([r["pvalues"][n] for r in null]) for n in names}
    nominal = {str(a): sum(any(holm(list(r["pvalues"].values()), a)) for r in null) / null_seeds for a in (0.05, 0.01)}
    return {
        "summary": power,
        "power_lower_95": {m: _lower_bound(round(p * seeds), seeds) for m, p in power.items()},
        "false_alarm_rate": sum(r["rejected"] for r in null) / null_seeds,
        "false_alarm_rate_at_nominal_alpha": nominal,
        "ks_pvalues": ks,
        # Bonferroni over the statistics: one number for "the p-values are uniform".
        "ks_pvalue": min(1.0, len(ks) * min(ks.values())),
        "seconds_per_gate_run": float(np.median([r["seconds"] for r in runs])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=300, help="seeds per mutant")
    ap.add_argument("--null-seeds", type=int, default=400, help="seeds for the correct verifier")
    ap.add_argument("--verifier", default="reference")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    jobs = [(CORRECT, args.verifier, 100_000 + s) for s in range(args.null_seeds)]
    jobs += [(m, args.verifier, 200_000 + s) for m in MUTANTS for s in range(args.seeds)]
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", "flashspec_core", "plugins", "kernels", "benchmarks"))
    start = time.perf_counter()
    with mp.get_context("fork").Pool(args.workers) as pool:
        runs = pool.map(_one, jobs, chunksize=4)
    wall = time.perf_counter() - start
    result = {
        "script": "benchmarks/exactness_power.py",
        "commit": commit,
        "dirty": dirty,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
        "machine": {"platform": platform.platform(), "workers": args.workers, "cpu_count": mp.cpu_count()},
        "config": {
            "case": {**attrs.asdict(POWER_CASE, recurse=True)},
            "gate_alpha": GATE_ALPHA,
            "gate_statistic": GATE_STATISTIC,
            "gate_min_expected": GATE_MIN_EXPECTED,
            "correction": "Holm over the case's tests within each gate run",
            "seeds_per_mutant": args.seeds,
            "null_seeds": args.null_seeds,
            "verifier": args.verifier,
            "mutants": MUTANTS,
        },
        **_summarise(runs, args.seeds, args.null_seeds),
        "tail_inflation": tail_inflation(),
        "wall_seconds": wall,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("summary", "false_alarm_rate", "ks_pvalue", "wall_seconds")}, indent=1))


if __name__ == "__main__":
    main()
