"""Accepted tokens per target forward of draft trees against chains, on the real pair.

Each arm (a chain, a static ``tree_width`` tree, dynamic ``tree_depth`` / ``tree_expand``
trees) decodes the same prompts greedily with the same target; a step is one target forward,
so ``tokens_per_forward`` is the mean of ``accepted + 1`` over its steps. Arms are grouped by
their draft forwards per step (a chain of ``gamma``: ``gamma``; a tree: its depth), the cost
a tree is meant to spend no more of than a chain. :func:`main` writes the table with its
provenance to ``docs/benchmarks/tree-shapes-cpu.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashspec_bench.provenance import DOCS, provenance, write_json
from flashspec_core.build import build_pipeline

SCRIPT = "benchmarks/tree_shapes.py"
WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "domains.jsonl"
# name -> (draft keys, draft forwards per step)
ARMS: dict[str, tuple[dict[str, Any], int]] = {
    "chain-g3": ({"gamma": 3}, 3),
    "static-3-2-1": ({"gamma": 15, "tree_width": [3, 2, 1]}, 3),
    "dynamic-d3-k4-n15": ({"gamma": 15, "tree_depth": 3, "tree_expand": 4}, 3),
    "chain-g4": ({"gamma": 4}, 4),
    "dynamic-d4-k4-n15": ({"gamma": 15, "tree_depth": 4, "tree_expand": 4}, 4),
    "dynamic-d4-k4-n31": ({"gamma": 31, "tree_depth": 4, "tree_expand": 4}, 4),
    "chain-g5": ({"gamma": 5}, 5),
    "dynamic-d5-k4-n31": ({"gamma": 31, "tree_depth": 5, "tree_expand": 4}, 5),
    "chain-g6": ({"gamma": 6}, 6),
    "dynamic-d6-k4-n31": ({"gamma": 31, "tree_depth": 6, "tree_expand": 4}, 6),
    "dynamic-d6-k6-n63": ({"gamma": 63, "tree_depth": 6, "tree_expand": 6}, 6),
}


def prompts(per_domain: int, domains: Sequence[str]) -> list[dict[str, str]]:
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    return [r for d in domains for r in [r for r in rows if r["domain"] == d][:per_domain]]


def run_arm(base: dict[str, Any], keys: dict[str, Any], work: list[dict[str, str]], new_tokens: int
            ) -> dict[str, Any]:
    """One arm over the prompts, batch 1: its steps' tokens per target forward, per domain and overall."""
    draft = {"use": base["use"], "model": base["draft"], **base["common"], **keys, "name": "arm"}
    pipe = build_pipeline({"target": {"use": base["use"], "model": base["target"], **base["common"]},
                           "arm": [draft], "verifier": {"use": "reference"}})
    per: dict[str, list[int]] = {}
    outputs, start = [], time.perf_counter()
    for row in work:
        got = pipe.generate([row["prompt"]], max_new_tokens=new_tokens, temperature=0.0)
        per.setdefault(row["domain"], []).extend(s.accepted[0] + 1 for s in got.steps)
        outputs.append(got.token_ids[0])
    wall = time.perf_counter() - start
    every = [n for v in per.values() for n in v]
    return {"tokens_per_forward": sum(every) / len(every), "steps": len(every),
            "per_domain": {d: sum(v) / len(v) for d, v in per.items()}, "wall_s": round(wall, 1),
            "outputs": outputs}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--use", default="fast", choices=("fast", "hf"))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per domain")
    ap.add_argument("--domains", default="code,prose")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--no-chat-template", action="store_true", help="feed the prompts as they are (tiny models)")
    ap.add_argument("--out", default=str(DOCS / "tree-shapes-cpu.json"))
    args = ap.parse_args(argv)
    common: dict[str, Any] = {"dtype": args.dtype, "device": "cpu", "chat_template": not args.no_chat_template}
    if args.use == "fast":
        common |= {"compile": False, "max_len": 1024}
    base = {"use": args.use, "target": args.target, "draft": args.draft, "common": common}
    work = prompts(args.prompts, args.domains.split(","))
    results = {}
    for name in args.arms.split(","):
        keys, forwards = ARMS[name]
        results[name] = {"draft_keys": keys, "draft_forwards": forwards,
                         **run_arm(base, keys, work, args.max_new_tokens)}
        print(name, {k: v for k, v in results[name].items() if k != "outputs"}, flush=True)
        gc.collect()
    same = len({json.dumps(r.pop("outputs")) for r in results.values()}) == 1
    data = {"provenance": provenance(SCRIPT), "target": args.target, "draft": args.draft, "back_end": args.use,
            "dtype": args.dtype, "batch": 1, "temperature": 0.0, "max_new_tokens": args.max_new_tokens,
            "prompts": [r["id"] for r in work], "greedy_outputs_identical": same, "arms": results}
    if args.out != "-":
        write_json(Path(args.out), data)
    print(json.dumps({k: v for k, v in data.items() if k != "provenance"}, indent=1))
    return 0
