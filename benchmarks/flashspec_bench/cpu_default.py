"""The bundled default config against plain decoding with the same target, on this CPU.

What a first-time user runs (``flashspec generate`` with ``flashspec_core/configs/default.toml``)
is timed side by side with a target-only variant of the same config: the same loaded
target, its ``[[arm]]`` list replaced by one ``use = "none"`` arm. Both are one pipeline
whose arms are swapped between requests (the policy allows it), so the weights are loaded
once and both systems read the same memory. Every request of the default starts from an
untrained selector and reward scale, with fresh random draws unless the config seeds the
selector, as each ``flashspec generate`` process does.

The two systems alternate request by request (A B A B), and the one that goes first flips
with every prompt and repeat, so a drift in the machine's load weighs on both alike; the
load averages before and after are recorded beside the numbers. Each run of the default
keeps its step log (arm, width, accepted, milliseconds per step), to tell why it is as fast
as it is: which arms the selector tried, and what their steps cost here. Each system runs every
prompt once untimed first (two tokens: allocations, first-call costs).

``--smoke`` runs the same default config with its models replaced by the tiny random
models of :mod:`flashspec_core.testing.tiny` (a few seconds); its result goes under
``benchmarks/.results``, never into the docs.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import platform
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from flashspec_bench.provenance import DOCS, RESULTS, logger, provenance, write_json

SCRIPT = "benchmarks/cpu_default.py"
DEFAULT, TARGET_ONLY = "default", "target_only"
README_PROMPT = "Write a Python function that checks whether a string is a palindrome."
PROMPTS = (
    README_PROMPT,
    # An edit that repeats most of its input: prompt lookup can copy whole lines.
    "Rename the variable `total` to `subtotal` in this function and return the whole function:\n\n"
    "def cart_total(items):\n"
    "    total = 0\n"
    "    for item in items:\n"
    "        total += item.price * item.quantity\n"
    "    if total > 100:\n"
    "        total = total * 0.9\n"
    "    return total\n",
    "Explain in two sentences what a hash table is.",
)
SMOKE_PROMPTS = ("t1 t2 t3 t4 t1 t2", "t5 t6", "t7 t8 t9 t1 t2 t3")


def target_only(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its arms replaced by one plain-decoding arm; everything else kept."""
    return {**config, "arm": [{"name": "plain", "use": "none"}]}


def schedule(prompts: int, repeats: int) -> list[tuple[int, str]]:
    """(prompt index, system) in run order: repeat by repeat, prompt by prompt, both systems;
    the first of a pair flips from prompt to prompt and, for each prompt, from repeat to
    repeat, so neither system always runs on the warmer or quieter side of a drift."""
    order = []
    for rep in range(repeats):
        for i in range(prompts):
            pair = (DEFAULT, TARGET_ONLY) if (rep + i) % 2 == 0 else (TARGET_ONLY, DEFAULT)
            order += [(i, system) for system in pair]
    return order


def summarize(runs: Sequence[dict[str, Any]], prompts: int) -> dict[str, Any]:
    """Median tokens/s per system and prompt, and the default's ratio to target-only.

    ``default_vs_target_only`` is the ratio on the first prompt (README's); ``..._all_prompts``
    is the geometric mean of the per-prompt ratios.
    """
    per_prompt = []
    for i in range(prompts):
        medians = {s: _median([r["tokens_per_s"] for r in runs if r["prompt"] == i and r["system"] == s])
                   for s in (DEFAULT, TARGET_ONLY)}
        a, b = medians[DEFAULT], medians[TARGET_ONLY]
        ratio = a / b if a and b else None
        per_prompt.append({"prompt": i, **{f"{s}_tokens_per_s": _round(m) for s, m in medians.items()},
                           "default_vs_target_only": _round(ratio)})
    ratios = [p["default_vs_target_only"] for p in per_prompt if p["default_vs_target_only"]]
    return {
        "per_prompt": per_prompt,
        "default_tokens_per_s": per_prompt[0][f"{DEFAULT}_tokens_per_s"] if per_prompt else None,
        "target_only_tokens_per_s": per_prompt[0][f"{TARGET_ONLY}_tokens_per_s"] if per_prompt else None,
        "default_vs_target_only": per_prompt[0]["default_vs_target_only"] if per_prompt else None,
        "default_vs_target_only_all_prompts": _round(math.exp(statistics.fmean(map(math.log, ratios))))
        if ratios else None,
    }


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# ------------------------------------------------------------------ the first run


def read_time_v(text: str) -> dict[str, Any]:
    """Wall time, peak RSS and CPU share from GNU ``/usr/bin/time -v``'s report."""
    fields = dict(line.strip().rsplit(": ", 1) for line in text.splitlines() if ": " in line)
    clock = [float(x) for x in fields["Elapsed (wall clock) time (h:mm:ss or m:ss)"].split(":")]
    wall = sum(x * 60**i for i, x in enumerate(reversed(clock)))
    return {"wall_s": round(wall, 1), "peak_rss_gib": round(int(fields["Maximum resident set size (kbytes)"]) / 2**20, 2),
            "cpu_percent": fields.get("Percent of CPU this job got"),
            "terminated": next((line.strip() for line in text.splitlines() if "terminated by signal" in line), None)}


def read_stamped(lines: Sequence[str], start_marker: str = "generating") -> dict[str, Any]:
    """From ``--stamp``'s lines (seconds since start, a space, the output line): when the first
    line after ``start_marker`` came (the first text), and the longest stretch without output."""
    rows = [(float(t), text) for t, _, text in (line.strip().partition(" ") for line in lines) if t]
    first = next((t for i, (t, text) in enumerate(rows) if i and start_marker in rows[i - 1][1]), None)
    gaps = [(b[0] - a[0], a[0], a[1]) for a, b in zip(rows, rows[1:], strict=False)]
    gap, at, before = max(gaps, default=(0.0, 0.0, ""))
    return {"first_text_s": first, "longest_silence_s": round(gap, 1), "longest_silence_at_s": at,
            "longest_silence_after": before[:120]}


def stamp(out: Path) -> None:
    """Copy stdin to ``out``, each line (``\n`` or a progress bar's ``\r``) prefixed with the seconds since start."""
    import sys

    start, pending = time.monotonic(), b""
    with out.open("w") as fh:
        while chunk := sys.stdin.buffer.read1(4096):  # type: ignore[union-attr]  # a BufferedReader at run time
            pending += chunk
            *lines, pending = pending.replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                fh.write(f"{time.monotonic() - start:8.1f} {line.decode(errors='replace')}\n")
            fh.flush()


def disk_gib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**30, 2)


def first_run(args: argparse.Namespace) -> dict[str, Any] | None:
    """README's first command as measured (``--first-run-*``), or None where none was given."""
    if not (args.first_run_time or args.first_run_log or args.first_run_dirs):
        return None
    out: dict[str, Any] = {"command": "README's first set-up command, fresh venv and cache"}
    if args.first_run_time:
        out.update(read_time_v(args.first_run_time.read_text()))
    if args.first_run_log:
        out.update(read_stamped(args.first_run_log.read_text().splitlines()))
    out["disk_gib"] = {str(d): disk_gib(d) for d in args.first_run_dirs or ()}
    return out


# ------------------------------------------------------------------ running


def load(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return tomllib.load(fh)


def smoke_config(config: dict[str, Any], root: Path) -> dict[str, Any]:
    """``config`` with the target and every model arm on the tiny random models (float32, no chat template)."""
    from flashspec_core.testing.tiny import tiny_family

    models = tiny_family(root)
    arms = [{**a, "model": str(models["close"]), "dtype": "float32"} if "model" in a else a for a in config["arm"]]
    target = {**config["target"], "model": str(models["target"]), "dtype": "float32", "chat_template": False}
    return {**config, "target": target, "arm": arms}


def reseed(selector: Any) -> None:
    """Fresh OS entropy for a selector's numpy generator, in place (a selector's parts that
    share the generator keep sharing it); a selector without one is left as it is."""
    import numpy as np

    rng = getattr(selector, "rng", None)
    if isinstance(rng, np.random.Generator):
        rng.bit_generator.state = np.random.default_rng().bit_generator.state


class Systems:
    """One pipeline over the default config that plays either system (arms swapped per request)."""

    def __init__(self, config: dict[str, Any], base_dir: Path | None, say: Callable[[str], None]) -> None:
        from flashspec_core.build import build_pipeline
        from flashspec_core.config import parse_config
        from flashspec_core.pipeline import Arm, NoDraft
        from flashspec_core.registry import build_registry

        registry = build_registry()
        self.pipeline = build_pipeline(parse_config(config, registry, "<default config>", base_dir=base_dir),
                                       registry, say)
        policy = self.pipeline.policy
        self.arms, self.settings = list(policy.arms), policy.settings
        # untrained selectors and scorers, copied afresh for every default request
        self.fresh = copy.deepcopy((policy.selectors, policy.rewards, policy.first_rewards, policy.first_gates))
        # A copy keeps its random state: every request would draw the same choices. A process of
        # its own draws fresh ones unless the config seeds the selector, so each copy is reseeded.
        self.reseed = config.get("selector", {}).get("seed") is None
        plain = parse_config(target_only(config), registry, "<target-only config>", base_dir=base_dir).arms[0]
        self.plain = [Arm(name=plain.name, provider=NoDraft(), gamma=0)]

    def generate(self, system: str, prompt: str, max_new_tokens: int) -> dict[str, Any]:
        from flashspec_bench.runs import Always

        policy = self.pipeline.policy
        if system == DEFAULT:
            policy.arms, policy.settings = list(self.arms), self.settings
            policy.selectors, policy.rewards, policy.first_rewards, policy.first_gates = copy.deepcopy(self.fresh)
            if self.reseed:
                for selector in policy.selectors:
                    reseed(selector)
        else:
            policy.arms, policy.settings = self.plain, attrs.evolve(self.settings, first=None)
            policy.selector = Always(0, 1)
        result = self.pipeline.generate([prompt], max_new_tokens=max_new_tokens, temperature=0.0)
        s = result.summary
        return {"system": system, "new_tokens": s["new_tokens"], "wall_s": round(s["wall_s"], 3),
                "tokens_per_s": round(s["new_tokens"] / s["wall_s"], 4), "steps": s["steps"],
                "mean_accepted_length": round(s["mean_accepted_length"], 3),
                "arm_steps": {name: arm.get("steps") for name, arm in s["arms"].items()} if system == DEFAULT else None,
                "step_log": step_log(result.steps) if system == DEFAULT else None,
                "tokens": result.token_ids[0]}


def step_log(steps: Sequence[Any]) -> list[list[Any]]:
    """Each step of a one-prompt run as ``[arm, width, accepted, step_ms]``: which arm the
    selector played, how many tokens it proposed, how many the target kept, and what it cost."""
    return [[r.arm_name, r.gamma, r.accepted[0], round(r.step_ms, 1)] for r in steps]


def measure(systems: Systems, prompts: Sequence[str], repeats: int, max_new_tokens: int,
            say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Warm both systems on every prompt (two tokens), then time :func:`schedule`'s order."""
    for i, prompt in enumerate(prompts):
        for system in (DEFAULT, TARGET_ONLY):
            systems.generate(system, prompt, min(2, max_new_tokens))
        say(f"warmed up on prompt {i}")
    runs = []
    for n, (i, system) in enumerate(schedule(len(prompts), repeats)):
        row = {"prompt": i, "order": n, **systems.generate(system, prompts[i], max_new_tokens)}
        say(f"prompt {i} {system}: {row['new_tokens']} tokens, {row['tokens_per_s']:.3f} tokens/s")
        runs.append(row)
    return runs


def same_output(runs: Sequence[dict[str, Any]]) -> bool:
    """Whether every run of a prompt produced the same tokens (greedy: speculation must not change them)."""
    by_prompt: dict[int, list[Any]] = {}
    for r in runs:
        by_prompt.setdefault(r["prompt"], []).append(r["tokens"])
    return all(all(t == ts[0] for t in ts) for ts in by_prompt.values())


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "machine": platform.machine(), "processor": _cpu_model()}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpu_default.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="the config to time (default: the bundled default.toml)")
    p.add_argument("--smoke", action="store_true", help="the default config on the tiny random models")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="how many of the built-in prompts (README's first)")
    p.add_argument("--out", type=Path, help="the result JSON (default: docs/benchmarks/cpu-default.json; "
                                             "benchmarks/.results/cpu-default-smoke.json with --smoke)")
    p.add_argument("--first-run-time", type=Path, help="/usr/bin/time -v's report of README's first command")
    p.add_argument("--first-run-log", type=Path, help="that command's output as --stamp wrote it")
    p.add_argument("--first-run-dirs", type=Path, nargs="*", help="the folders it filled (cache, venv), for their size")
    p.add_argument("--stamp", type=Path, metavar="LOG", help="only copy stdin to LOG with seconds since start, then exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.stamp:
        stamp(args.stamp)
        return 0
    from flashspec_core.cli import DEFAULT_CONFIG, bundled_config

    say = logger("cpu-default")
    path = args.config or bundled_config(DEFAULT_CONFIG)
    config = load(path)
    prompts = (SMOKE_PROMPTS if args.smoke else PROMPTS)[: args.prompts]
    load_before = os.getloadavg()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        systems = Systems(smoke_config(config, Path(tmp)) if args.smoke else config, path.parent, say)
        runs = measure(systems, prompts, args.repeats, args.max_new_tokens, say)
    wall = time.perf_counter() - start
    load_after = os.getloadavg()
    identical = same_output(runs)
    for r in runs:
        del r["tokens"]
    summary = summarize(runs, len(prompts))
    out = args.out or (RESULTS / "cpu-default-smoke.json" if args.smoke else DOCS / "cpu-default.json")
    result = {
        **provenance(SCRIPT),
        **machine(),
        "config": {"pipeline": "smoke: default.toml on the tiny random models" if args.smoke else str(path.name),
                   "target_only": "the same pipeline with one use = \"none\" arm", "max_new_tokens": args.max_new_tokens,
                   "temperature": 0.0, "repeats": args.repeats, "prompts": list(prompts)},
        "load": {"loadavg_before": [round(x, 2) for x in load_before],
                 "loadavg_after": [round(x, 2) for x in load_after], "wall_s": round(wall, 1)},
        "same_output": identical,
        "first_run": first_run(args),
        "runs": runs,
        "summary": summary,
    }
    say(f"default {summary['default_tokens_per_s']} vs target-only {summary['target_only_tokens_per_s']} tokens/s: "
        f"{summary['default_vs_target_only']}x; wrote {write_json(out, result)}")
    return 0
