"""LABELLED SYNTHETIC: the fast target at one rank and at two (``tensor_parallel``).

Random weights of the Qwen2.5 layer shapes, batch 1: per target shape and rank count,
the target alone, then with a 0.5B-shape draft whose tokens the synthetic verifier
accepts with a fixed probability. The summary gives the two-rank target-only speed over
the one-rank one (``tp2_vs_tp1_<shape>``; the headline ``tp2_vs_tp1_32b``) and, per rank
count, speculation's speedup over its own target-only run, so that the gain at two
ranks can be set beside the gain at one.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from flashspec_bench.provenance import logger, provenance, write_json
from flashspec_bench.runs import Always, run_pipeline, summarize_run

say = logger("tp")
LABEL = "synthetic (random weights of the Qwen2.5 shapes, fixed acceptance): timing only"


def pipeline(target: Any, acceptance: float, draft: Any = None, gamma: int = 0) -> Any:
    from flashspec_core.pipeline import Arm, NoDraft, Pipeline
    from flashspec_core.policy import StepPolicy
    from flashspec_core.rewards import make_reward
    from flashspec_fast.synthetic import SyntheticVerifier

    arm = Arm("none", NoDraft(), 0) if draft is None else Arm(f"draft-g{gamma}", draft, gamma)
    return Pipeline(target, SyntheticVerifier(acceptance), StepPolicy([arm], Always(0, 1), make_reward("acceptance")))


def timed(pipe: Any, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    """One warm-up request (graph captures), then one timed request per prompt, at batch 1."""
    args = argparse.Namespace(max_new_tokens=tokens, temperature=0.0, seed=0)
    domains = ["synthetic"] * len(prompts)
    run_pipeline(pipe, prompts, [[0]], args, domains)
    return summarize_run(run_pipeline(pipe, prompts, [[i] for i in range(len(prompts))], args, domains))


def measure(shape: str, tp: int, args: argparse.Namespace, prompts: list[list[int]]) -> list[dict[str, Any]]:
    """Rows of one target shape at ``tp`` ranks: target-only, then each acceptance and gamma."""
    from flashspec_fast.draft import FastDraft
    from flashspec_fast.options import FastOptions, FastTargetOptions, build_model
    from flashspec_fast.tp import make_fast_target

    max_len = max(map(len, prompts)) + args.tokens + 64
    target = make_fast_target(FastTargetOptions(model=f"shape:{shape}", dtype=args.dtype, device=args.device,
                                                max_len=max_len, compile=args.graphs, tensor_parallel=tp))
    dopts = FastOptions(model=f"shape:{args.draft_shape}", dtype=args.dtype, device=args.device, max_len=max_len,
                        compile=args.graphs)
    draft_model, _ = build_model(dopts)
    try:
        base = timed(pipeline(target, 1.0), prompts, args.tokens)
        common = {"label": LABEL, "target_shape": shape, "tensor_parallel": tp, "batch": 1, "cuda_graphs": args.graphs}
        rows = [{**common, "system": "target-only", "tokens_per_s": base["tokens_per_s"],
                 "step_ms_p50": base["step_ms_p50"]}]
        say(f"{shape} tp={tp} target-only: {base['tokens_per_s']:.1f} tok/s")
        for acc in args.acceptance:
            for gamma in args.gammas:
                draft = FastDraft(draft_model, target.vocab, dopts)
                s = timed(pipeline(target, acc, draft, gamma), prompts, args.tokens)
                rows.append({**common, "system": "speculative", "draft_shape": args.draft_shape, "acceptance": acc,
                             "gamma": gamma, "tokens_per_s": s["tokens_per_s"], "step_ms_p50": s["step_ms_p50"],
                             "mean_accepted_length": s["mean_accepted_length"],
                             "speedup_vs_own_target_only": s["tokens_per_s"] / base["tokens_per_s"]})
                say(f"{shape} tp={tp} a={acc} g={gamma}: {rows[-1]['speedup_vs_own_target_only']:.2f}x")
        return rows
    finally:
        close = getattr(target, "close", None)
        if close is not None:
            close()
        del target, draft_model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``tp2_vs_tp1_<size>`` (target-only tokens/s at two ranks over one, per target shape,
    e.g. ``tp2_vs_tp1_32b``) and ``speedup`` (per rank count, shape, acceptance and gamma:
    speculation over its own target-only run)."""
    out: dict[str, Any] = {"speedup": {}}
    alone = {(r["target_shape"], r["tensor_parallel"]): r["tokens_per_s"] for r in rows if r["system"] == "target-only"}
    for (shape, tp), tps in sorted(alone.items()):
        one = alone.get((shape, 1))
        if tp == 2 and one:
            out[f"tp2_vs_tp1_{shape.rsplit('-', 1)[-1]}"] = tps / one
    for r in rows:
        if r["system"] == "speculative":
            key = f"a{r['acceptance']}_g{r['gamma']}"
            out["speedup"].setdefault(f"tp{r['tensor_parallel']}", {}).setdefault(r["target_shape"], {})[key] = \
                r["speedup_vs_own_target_only"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder of tp-h200x2.json")
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-32b", "qwen2.5-14b"], help="the headline 32B first")
    p.add_argument("--tp", nargs="+", type=int, default=[1, 2])
    p.add_argument("--draft-shape", default="qwen2.5-0.5b")
    p.add_argument("--acceptance", nargs="+", type=float, default=[0.6, 0.8])
    p.add_argument("--gammas", nargs="+", type=int, default=[4])
    p.add_argument("--tokens", type=int, default=128, help="new tokens per timed request")
    p.add_argument("--prompts", type=int, default=3, help="timed requests (random 64-token prompts)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default="auto")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="run the target and draft eagerly")
    p.add_argument("--budget", type=float, default=540.0, help="seconds; later runs are skipped once spent")
    p.add_argument("--commit", default=None, help="the measured commit, where the checkout has no git")
    args = p.parse_args(argv)
    t0 = time.time()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 150000, (64,), generator=gen).tolist() for _ in range(args.prompts)]
    res: dict[str, Any] = {**provenance("benchmarks/tp_h200x2.py", args.commit), "label": LABEL,
                           "gpus": torch.cuda.device_count(), "rows": [], "skipped": [], "failed": [], "summary": {}}
    for shape in args.shapes:
        for tp in args.tp:
            if time.time() - t0 > args.budget:
                res["skipped"].append({"target_shape": shape, "tensor_parallel": tp, "why": "budget spent"})
                continue
            try:
                res["rows"].extend(measure(shape, tp, args, prompts))
            except Exception as exc:  # noqa: BLE001  (one failed configuration must not lose the others' rows)
                res["failed"].append({"target_shape": shape, "tensor_parallel": tp, "error": repr(exc)[:2000]})
                say(f"{shape} tp={tp} failed: {exc!r}")
            res["summary"] = summary(res["rows"])
            write_json(args.out / "tp-h200x2.json", res)
    write_json(args.out / "tp-h200x2.json", res)
    return 0
