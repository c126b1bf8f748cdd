"""The exactness gates' power against planted bugs, their false alarms and calibration.

``exactness_main`` (``benchmarks/exactness_power.py``): for every mutant in
:data:`flashspec_core.testing.mutants.MUTANTS` the verifier gate
(:func:`flashspec_core.testing.exactness.gate`, Holm at ``GATE_ALPHA`` per run, the same
decision the stats suite makes) runs on ``POWER_CASE`` with ``--seeds`` different trial
seeds; power is the fraction of seeds it rejects. The correct verifier runs on
``--null-seeds`` seeds: its rejection rate is the false-alarm rate, and the KS test of its
per-statistic chi-square p-values against Uniform(0, 1) checks calibration.

``pipeline_main`` (``benchmarks/pipeline_power.py``): per seed, the pipeline-level gate of
tests/stats/test_pipeline_law.py (first 3 tokens of a tiny V = 16 target, N = 12,000
sequences, chi-square at ALPHA) on the correct pipeline and on two planted bugs: a KV cache
not rolled back after a rejection, and a per-row peek at the current draft.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from scipy import stats

from flashspec_bench.provenance import DOCS, provenance, write_json

CORRECT = "correct"
SAMPLING = {"temperature": 1.0}


def _one(job: tuple[str, str, int]) -> dict[str, Any]:
    """One gate run: (mutant or CORRECT, verifier name, seed) -> p-values and decision."""
    from flashspec_core.testing import verifier_contract as vc
    from flashspec_core.testing.exactness import gate
    from flashspec_core.testing.mutants import POWER_CASE, mutant

    torch.set_num_threads(1)
    which, name, seed = job
    verifier, report = (vc.load_verifier(name), None) if which == CORRECT else mutant(which)
    start = time.perf_counter()
    decision = gate(verifier, POWER_CASE, seed, report=report)
    return {"mutant": which, "seed": seed, "rejected": decision.rejected, "failing": list(decision.failing),
            "pvalues": decision.result.pvalues, "seconds": time.perf_counter() - start}


def tail_inflation(means: tuple[float, ...] = (5, 10, 20, 50), alphas: tuple[float, ...] = (1e-4, 1e-5, 1e-6)
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


def lower_bound(successes: int, n: int, level: float = 0.95) -> float:
    """One-sided Clopper-Pearson lower confidence bound of a proportion."""
    return 0.0 if successes == 0 else float(stats.beta.ppf(1 - level, successes, n - successes + 1))


def summarise(runs: list[dict[str, Any]], seeds: int, null_seeds: int) -> dict[str, Any]:
    from flashspec_core.testing.chisq import holm, ks_uniform
    from flashspec_core.testing.mutants import MUTANTS

    by = {m: [r for r in runs if r["mutant"] == m] for m in [CORRECT, *MUTANTS]}
    power = {m: sum(r["rejected"] for r in by[m]) / seeds for m in MUTANTS}
    null = by[CORRECT]
    ks = {n: ks_uniform([r["pvalues"][n] for r in null]) for n in null[0]["pvalues"]}
    nominal = {str(a): sum(any(holm(list(r["pvalues"].values()), a)) for r in null) / null_seeds for a in (0.05, 0.01)}
    return {
        "summary": power,
        "power_lower_95": {m: lower_bound(round(p * seeds), seeds) for m, p in power.items()},
        "false_alarm_rate": sum(r["rejected"] for r in null) / null_seeds,
        "false_alarm_rate_at_nominal_alpha": nominal,
        "ks_pvalues": ks,
        "ks_pvalue": min(1.0, len(ks) * min(ks.values())),  # Bonferroni: one number for "the p-values are uniform"
        "seconds_per_gate_run": float(np.median([r["seconds"] for r in runs])),
    }


def exactness_main(argv: list[str] | None = None) -> int:
    from flashspec_core.testing.exactness import GATE_ALPHA, GATE_MIN_EXPECTED, GATE_STATISTIC
    from flashspec_core.testing.mutants import MUTANTS, POWER_CASE

    ap = argparse.ArgumentParser(description="Power of the verifier exactness gate against planted bugs.")
    ap.add_argument("--seeds", type=int, default=300, help="seeds per mutant")
    ap.add_argument("--null-seeds", type=int, default=400, help="seeds for the correct verifier")
    ap.add_argument("--verifier", default="reference")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=DOCS / "exactness-power.json")
    args = ap.parse_args(argv)
    jobs = [(CORRECT, args.verifier, 100_000 + s) for s in range(args.null_seeds)]
    jobs += [(m, args.verifier, 200_000 + s) for m in MUTANTS for s in range(args.seeds)]
    start = time.perf_counter()
    with mp.get_context("fork").Pool(args.workers) as pool:
        runs = pool.map(_one, jobs, chunksize=4)
    result = {
        **provenance("benchmarks/exactness_power.py"),
        "machine": {"workers": args.workers, "cpu_count": mp.cpu_count()},
        "config": {"case": attrs.asdict(POWER_CASE, recurse=True), "gate_alpha": GATE_ALPHA,
                   "gate_statistic": GATE_STATISTIC, "gate_min_expected": GATE_MIN_EXPECTED,
                   "correction": "Holm over the case's tests within each gate run", "seeds_per_mutant": args.seeds,
                   "null_seeds": args.null_seeds, "verifier": args.verifier, "mutants": MUTANTS},
        **summarise(runs, args.seeds, args.null_seeds),
        "tail_inflation": tail_inflation(),
        "wall_seconds": time.perf_counter() - start,
        "runs": runs,
    }
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("summary", "false_alarm_rate", "ks_pvalue", "wall_seconds")}, indent=1))
    return 0


def _pipe(setup: dict[str, Any]) -> Any:
    from flashspec_core.build import build_pipeline
    from flashspec_core.testing.tiny import pipeline_dict

    return build_pipeline(pipeline_dict(setup["target"], setup["drafts"], "fixed", dtype="float32"), setup["registry"])


def _correct(setup: dict[str, Any], law: Any, seed: int) -> float:
    from flashspec_core.testing.tiny import gate

    return gate(_pipe(setup), law, SAMPLING, seed)


def _no_rollback(setup: dict[str, Any], law: Any, seed: int) -> float:
    from flashspec_core.testing.tiny import gate
    from flashspec_hf.lm import CachedLM

    original = CachedLM.drop_last
    CachedLM.drop_last = lambda self, count: None  # type: ignore[method-assign]
    try:
        return gate(_pipe(setup), law, SAMPLING, seed)
    finally:
        CachedLM.drop_last = original  # type: ignore[method-assign]


def _peek(setup: dict[str, Any], law: Any, seed: int) -> float:
    from flashspec_core.pipeline import Arm
    from flashspec_core.testing.tiny import PeekingDraft, gate

    mode = max((s for s in law if s), key=lambda s: law[s])[0]
    pipe = _pipe(setup)
    model_arm, lookup_arm = pipe.arms[:2]  # the model draft and the padded lookup
    pipe.arms = [Arm("peek", PeekingDraft(model_arm.provider, lookup_arm.provider, mode), model_arm.gamma)]
    return gate(pipe, law, SAMPLING, seed)


CASES: dict[str, Callable[[dict[str, Any], Any, int], float]] = {
    "correct": _correct, "kv_not_rolled_back": _no_rollback, "selector_peeks_at_draft": _peek}


def pipeline_main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    from flashspec_core.registry import build_registry
    from flashspec_core.testing.tiny import ALPHA, BATCH, Adversaries, N, law_of, perturbed_lm, tiny_lm

    ap = argparse.ArgumentParser(description="Power of the pipeline-level exactness gate against planted bugs.")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=DOCS / "pipeline-power.json")
    args = ap.parse_args(argv)
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        target = tiny_lm(Path(tmp) / "target", vocab=16, seed=0, init=0.3)
        setup = {"target": target, "drafts": [perturbed_lm(target, Path(tmp) / "close", noise=0.3, seed=1)],
                 "registry": build_registry(extra_plugins=[Adversaries()])}
        law = law_of(setup, SAMPLING)
        pvalues: dict[str, list[float]] = {name: [] for name in CASES}
        for seed in tqdm(range(args.seeds), desc="seeds", file=sys.stderr):
            for name, case in CASES.items():
                pvalues[name].append(case(setup, law, 1000 + seed))
    rate = {name: sum(p < ALPHA for p in ps) / len(ps) for name, ps in pvalues.items()}
    result = {**provenance("benchmarks/pipeline_power.py"),
              "config": {"N": N, "batch": BATCH, "alpha": ALPHA, "seeds": args.seeds, "sampling": SAMPLING, "vocab": 16},
              "pvalues": pvalues, "seconds": time.time() - start,
              "summary": {"rejection_rate": rate, "false_alarm_rate": rate["correct"]}}
    write_json(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0
