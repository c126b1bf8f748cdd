"""Power of the pipeline-level exactness gate against planted pipeline bugs.

For each seed, runs the gate of tests/stats/test_pipeline_law.py (first 3 tokens of
a tiny V = 16 target, N = 12,000 sequences, chi-square at ALPHA) on the correct
pipeline and on two planted bugs: a KV cache that is not rolled back after a
rejection, and a per-row peek at the current draft (what a selector that looks
at this step's draft amounts to). Writes docs/benchmarks/pipeline-power.json.

    python benchmarks/pipeline_power.py [--seeds 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "stats")]

import torch  # noqa: E402
import transformers  # noqa: E402
from _law import ALPHA, BATCH, Adversaries, N, gate, law_of  # noqa: E402
from _tiny import perturbed_lm, pipeline_dict, tiny_lm  # noqa: E402
from test_pipeline_mutants import PeekingDraft  # noqa: E402
from tqdm import tqdm  # noqa: E402

from flashspec_core.build import build_pipeline  # noqa: E402
from flashspec_core.pipeline import Arm  # noqa: E402
from flashspec_core.registry import build_registry  # noqa: E402
from flashspec_hf.lm import CachedLM  # noqa: E402

SAMPLING = {"temperature": 1.0}


def _setup(root: Path) -> dict[str, Any]:
    target = tiny_lm(root / "target", vocab=16, seed=0, init=0.3)
    drafts = [perturbed_lm(target, root / "close", noise=0.3, seed=1)]
    return {"target": target, "drafts": drafts, "registry": build_registry(extra_plugins=[Adversaries()])}


def _pipe(setup: dict[str, Any]) -> Any:
    return build_pipeline(pipeline_dict(setup["target"], setup["drafts"], "fixed", dtype="float32"), setup["registry"])


def _correct(setup: dict[str, Any], law: Any, seed: int) -> float:
    return gate(_pipe(setup), law, SAMPLING, seed)


def _no_rollback(setup: dict[str, Any], law: Any, seed: int) -> float:
    original = CachedLM.drop_last
    CachedLM.drop_last = lambda self, count: None  # type: ignore[method-assign]
    try:
        return gate(_pipe(setup), law, SAMPLING, seed)
    finally:
        CachedLM.drop_last = original  # type: ignore[method-assign]


def _peek(setup: dict[str, Any], law: Any, seed: int) -> float:
    mode = max((s for s in law if s), key=lambda s: law[s])[0]
    pipe = _pipe(setup)
    model_arm, lookup_arm = pipe.arms
    pipe.arms = [Arm("peek", PeekingDraft(model_arm.provider, lookup_arm.provider, mode), model_arm.gamma)]
    return gate(pipe, law, SAMPLING, seed)


CASES = {"correct": _correct, "kv_not_rolled_back": _no_rollback, "selector_peeks_at_draft": _peek}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "pipeline-power.json")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        setup = _setup(Path(tmp))
        law = law_of(setup, SAMPLING)
        pvalues: dict[str, list[float]] = {name: [] for name in CASES}
        for seed in tqdm(range(args.seeds), desc="seeds", file=sys.stderr):
            for name, case in CASES.items():
                pvalues[name].append(case(setup, law, 1000 + seed))
    summary = {name: sum(p < ALPHA for p in ps) / len(ps) for name, ps in pvalues.items()}
    result = {
        "script": "benchmarks/pipeline_power.py",
        "commit": commit,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__},
        "device": platform.processor() or platform.machine(),
        "config": {"N": N, "batch": BATCH, "alpha": ALPHA, "seeds": args.seeds, "sampling": SAMPLING, "vocab": 16},
        "pvalues": pvalues,
        "seconds": time.time() - start,
        "summary": {"rejection_rate": summary, "false_alarm_rate": summary["correct"]},
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
