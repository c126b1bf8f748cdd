"""Host cost of the suffix draft at a large batch, on this CPU, without a model.

    python benchmarks/suffix_cost.py [--rows 32] [--prompt 1000 2000] [--steps 24] [--gamma 8]

Each row's prompt is code-like text (spans of a few hundred tokens repeated with edits), and
each step every row emits 1 to ``gamma + 1`` tokens, most of them copying its prompt on, as a
code-editing request does. Times, separately: the first :meth:`propose` of a request (it feeds
the tree every prompt token), the later ones (only the tokens emitted since), and
:meth:`reset` (the rows join the corpus; eviction beyond ``max_tokens``). Writes
``benchmarks/.results/suffix-cost.json``; ``*_cpu_ms`` is this thread's CPU time, which
other processes on a busy machine do not inflate.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

import torch

from flashspec_core import SamplingParams
from flashspec_suffix.suffix import SuffixConfig, SuffixDraft

VOCAB = 32000


def code_like(rng: random.Random, n: int) -> list[int]:
    """``n`` tokens: spans of a small base text repeated, with a fresh token now and then."""
    base = [rng.randrange(VOCAB) for _ in range(400)]
    out: list[int] = []
    while len(out) < n:
        at = rng.randrange(len(base) - 60)
        out += base[at : at + rng.randrange(8, 60)]
        if rng.random() < 0.3:
            out.append(rng.randrange(VOCAB))
    return out[:n]


def request(draft: SuffixDraft, rng: random.Random, rows: int, prompt: tuple[int, int], steps: int,
            gamma: int) -> dict[str, object]:
    """One batch of ``rows`` requests decoded for ``steps`` steps; the times in ms."""
    greedy = SamplingParams(temperature=0.0)
    texts = [code_like(rng, rng.randrange(prompt[0], prompt[1] + 1)) for _ in range(rows)]
    lengths = [len(t) for t in texts]
    tokens = torch.zeros((rows, prompt[1] + steps * (gamma + 1)), dtype=torch.long)
    for b, t in enumerate(texts):
        tokens[b, : len(t)] = torch.tensor(t)
    times, cpu = [], []  # wall and this thread's CPU ms: on a shared machine the wall clock counts other work too
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        draft.propose(tokens, lengths, gamma, greedy, None)
        times.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time() - c0) * 1e3)
        draft.rollback([0] * rows)
        for b, t in enumerate(texts):  # emit: copy the prompt on from a random earlier point, or a fresh token
            k = rng.randrange(1, gamma + 2)
            at = rng.randrange(len(t) - k)
            new = t[at : at + k] if rng.random() < 0.8 else [rng.randrange(VOCAB) for _ in range(k)]
            tokens[b, lengths[b] : lengths[b] + k] = torch.tensor(new)
            lengths[b] += k
    t0 = time.perf_counter()
    draft.reset()
    reset_ms = (time.perf_counter() - t0) * 1e3
    return {
        "first_propose_ms": times[0],
        "first_propose_cpu_ms": cpu[0],
        "later_propose_ms_median": statistics.median(times[1:]),
        "later_propose_cpu_ms_median": statistics.median(cpu[1:]),
        "later_propose_cpu_ms_max": max(cpu[1:]),
        "mean_propose_cpu_ms": statistics.fmean(cpu),
        "reset_ms": reset_ms,
        "prompt_tokens": sum(len(t) for t in texts),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt", type=int, nargs=2, default=(1000, 2000), metavar=("MIN", "MAX"))
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--gamma", type=int, default=8)
    parser.add_argument("--requests", type=int, default=3, help="batches in a row, on one growing corpus")
    parser.add_argument("--max-tokens", type=int, default=1 << 20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/.results/suffix-cost.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    draft = SuffixDraft(SuffixConfig(max_tokens=args.max_tokens))
    batches = [request(draft, rng, args.rows, tuple(args.prompt), args.steps, args.gamma)
               for _ in range(args.requests)]
    result = {"args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()},
              "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
              "batches": batches}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for n, b in enumerate(batches):
        print(f"batch {n}: " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in b.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
