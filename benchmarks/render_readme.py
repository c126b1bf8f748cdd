"""Write README.md's results tables from the committed JSON under docs/benchmarks/.

The README quotes no number by hand: this script fills the block between
``<!-- results:begin -->`` and ``<!-- results:end -->``. ``--check`` exits 1 when the
README differs from what the JSON gives (a test runs it).

    python benchmarks/render_readme.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "benchmarks"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _load(name: str) -> dict[str, Any] | None:
    path = BENCH / name
    return json.loads(path.read_text()) if path.is_file() else None


def _kernels(data: dict[str, Any]) -> list[str]:
    s = data["summary"]
    lines = [
        "**Verify step on the H200** (`docs/benchmarks/verify-kernels-h200.json`, bf16 logits, gamma 4, "
        f"V = 151936; device-to-device copy {s['copy_bandwidth_gbs']:.0f} GB/s measured in the same run):",
        "",
        "| B | triton ms | reference ms | torch.compile(reference) ms | speedup vs reference | logits pass / copy bandwidth |",
        "|---|---|---|---|---|---|",
    ]
    for r in s["rows"]:
        if r["V"] == 151936 and r["gamma"] == 4 and r["dtype"] == "bfloat16":
            compile_ms = "-" if r["compile_ms"] is None else f"{r['compile_ms']:.3f}"
            lines.append(
                f"| {r['B']} | {r['triton_ms']:.3f} | {r['reference_ms']:.3f} | {compile_ms} | "
                f"{r['reference_ms'] / r['triton_ms']:.1f}x | {r['bandwidth_fraction']:.0%} |"
            )
    return lines


def _at(summary: dict[str, Any], section: str) -> str:
    """``, at <commit>`` where the summary says which commit measured the section."""
    sha = (summary.get("section_commits") or {}).get(section)
    return f", at `{sha}`" if sha else ""


def _only(bandits: list[str]) -> str:
    """A caveat where a section compared no selectors: one bandit ran alone."""
    return f" (only {bandits[0].split('@')[0]} ran in this section)" if len(bandits) == 1 else ""


def _e2e(data: dict[str, Any]) -> list[str]:
    s = data["summary"]
    tps = s["tokens_per_s"]
    base = tps["target_only"]
    lines = [
        f"**End to end on the H200** (`docs/benchmarks/e2e-h200.json`; {s['label']}; batch 1, greedy, "
        f"{s['max_new_tokens']} new tokens; every system in one run, warmed on every batch; FlashSpec on its fast path):",
        "",
        "| system | tokens/s | vs own target-only |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {v:.1f} | {v / base:.2f}x |" for name, v in tps.items()]
    over = ", ".join(f"{name} {s[key]:.1f}x" for key, name in (
        ("speedup_vs_hf_generate", "HF eager"), ("speedup_vs_hf_compiled", "HF compiled"),
        ("speedup_vs_hf_assisted", "HF assisted"), ("speedup_vs_hf_lookup", "HF prompt lookup")) if s.get(key))
    lines += ["", f"Best FlashSpec system ({s['best_flashspec']}) over each HF baseline, on the prompts HF ran: {over}."]
    for key, what in (
        ("b1_adaptive", "Bandits choosing between match-only prompt lookup and the same falling back to the 0.5B draft"),
        ("b1_adaptive_gammas", "Bandits choosing between match-only prompt lookup and the same falling back to the "
                               "0.5B draft at gamma 3 or at gamma 5"),
        ("b1_gated", "Match-only prompt lookup as `[selector] first`, the bandits choosing between the 0.5B draft and "
                     "no draft only where it finds nothing"),
        ("b1_gated_every", "Match-only prompt lookup as `[selector] first`, the bandits choosing between every draft "
                           "gamma, padded lookup and no draft where it finds nothing"),
        ("b1_gated_small", "Match-only prompt lookup as `[selector] first`, the bandits choosing between the 0.5B "
                           "draft at gamma 1, 2 or 3 and no draft where it finds nothing"),
    ):
        by = (s.get(key) or {}).get("bandit_speedup_by_domain_all")
        if by:
            per = "; ".join(f"{n.removeprefix('bandit:')} " + ", ".join(f"{d} {x:.2f}x" for d, x in v.items())
                            for n, v in by.items())
            lines += ["", f"{what} (`summary.{key}`{_at(s, key)}), over own target-only per domain: {per}"
                          f"{_only(list(by))}."]
    for key in ("b2_greedy", "b2_limited", "b4_greedy", "b4_limited", "b8_greedy", "b8_limited", "b32_greedy",
                "b32_limited"):
        b = s.get(key) or {}
        if b.get("bandit_speedup_vs_own_target_only"):
            r = b["bandit_speedup_vs_own_target_only"].values()
            sec = data["sections"][key]
            limit = re.search(r"speculate_max_batch = (\d+)", sec["config"])
            base = sec["summaries"]["target_only"]["tokens_per_s"]
            fixed = [v["tokens_per_s"] / base for n, v in sec["summaries"].items() if n.startswith("fixed:")]
            arms = f"; fixed arms {min(fixed):.2f}x to {max(fixed):.2f}x" if fixed else ""
            lines += ["", f"Batch {b['batch_size']} (`summary.{key}`): target-only {b['target_only_tokens_per_s']:.0f} "
                      f"tokens/s; bandits with `speculate_max_batch = {limit.group(1) if limit else 'none'}` "
                      f"{min(r):.2f}x to {max(r):.2f}x of it{arms}."]
    if s.get("greedy_identical") is not None:
        lines += ["", f"float32, TF32 off: greedy speculative output identical to target-only: {s['greedy_identical']}."]
    return lines


def _bandits(data: dict[str, Any]) -> list[str]:
    t = data["summary"]["paper_table"]
    lines = [
        "**Bandit simulation** (`docs/benchmarks/bandit-sim.json`; T = 10,000, Bernoulli means [0.3, 0.7, 0.5]; "
        "cumulative regret, mean and 95% interval over seeds):",
        "",
        "| selector | regret | 95% interval |",
        "|---|---|---|",
    ]
    for name in ("ucb1", "thompson", "sliding_window_ucb", "discounted_thompson"):
        lo, hi = t[name]["ci95"]
        lines.append(f"| {name} | {t[name]['mean']:.1f} | [{lo:.1f}, {hi:.1f}] |")
    lines += ["", f"UCB1 upper bound (Auer et al. 2002), computed: {t['ucb1_bound']:.1f}."]
    if "thompson_bound_leading" in t:
        lines[-1] += (f" Leading term of Thompson sampling's bound (Kaufmann et al. 2012; Agrawal & Goyal 2013), "
                      f"computed: {t['thompson_bound_leading']:.1f}.")
    return lines


def _workload(data: dict[str, Any], e2e: dict[str, Any] | None = None) -> list[str]:
    w = data["summary"]["workload"]
    a = w["adaptive"]["by_order"]["interleaved"]
    lines = [
        f"**Domain-shifting workload** (`docs/benchmarks/bandit-workload.json`; 60 prompts: code, prose, editing; "
        f"acceptance measured on the real Qwen pair by teacher forcing, tokens/s *modelled* from {w['cost_model']}, "
        f"not measured end to end): with every arm, best selector ({w['best_selector']}) {w['best_selector_tps']:.1f}, "
        f"best fixed arm ({w['best_fixed']}) {w['best_fixed_tps']:.1f}, per-domain oracle {w['oracle_tps']:.1f} "
        f"modelled tokens/s ({w['selector_vs_oracle']:.0%} of the oracle); with the two lookup-first arms "
        f"({', '.join(w['adaptive']['arms'])}), {a['best_selector']} {a['best_selector_tps']:.1f} "
        f"({a['selector_vs_all_arms_best_fixed']:.2f}x the best fixed arm of all, "
        f"{a['selector_vs_all_arms_oracle']:.0%} of the oracle over every arm).",
    ]
    gated = (w.get("gated") or {}).get("by_order")
    if gated:
        per = "; ".join(f"{o}: {v['best_selector'].split('@')[0]} {v['best_selector_tps']:.1f} "
                        f"({v['selector_vs_all_arms_best_fixed']:.3f}x the best fixed arm of all, "
                        f"{v['selector_vs_all_arms_oracle']:.1%} of the oracle over every arm)" for o, v in gated.items())
        lines += ["", f"The same two policies with match-only lookup as `[selector] first` (the selector asked only "
                      f"where it finds nothing), best selector per order: {per}."]
    measured = (e2e or {}).get("summary") or {}
    g = measured.get("workload_gpu_adaptive")
    if g:
        lines += ["", f"Measured on the H200 (`e2e-h200.json`, `summary.workload_gpu_adaptive`, two lookup-first arms, "
                  f"best over both orders): {g['best_selector']} {g['best_selector_tps']:.1f} tokens/s, best fixed arm "
                  f"({g['best_fixed']}) {g['best_fixed_tps']:.1f}, per-domain oracle {g['oracle_tps']:.1f} "
                  f"({g['selector_vs_best_fixed']:.0%} of the best fixed arm, {g['selector_vs_oracle']:.0%} of the oracle)."]
    for key, section, what in (
        ("workload_gpu_gated", "workload_gated", "with match-only lookup as `[selector] first`"),
        ("workload_gpu_gated_small", "workload_gated_small",
         "with match-only lookup as `[selector] first` and the 0.5B draft at gamma 1, 2 or 3 or no draft behind it"),
    ):
        g = measured.get(key)
        if not g:
            continue
        best = {o: max((k for k in g["policies"] if k.endswith(f"@{o}")), key=lambda k: g["policies"][k]["tps"])
                for o in ("interleaved", "blocked") if any(k.endswith(f"@{o}") for k in g["policies"])}
        per = "; ".join(f"{o}: {k.removesuffix('@' + o)} {g['policies'][k]['tps']:.1f} tokens/s "
                        f"({g['policies'][k]['tps'] / g['best_fixed_tps']:.4f}x the best fixed system, "
                        f"{g['policies'][k]['tps'] / g['oracle_tps']:.1%} of the oracle)" for o, k in best.items())
        bandits = sorted({k.split("@")[0] for k in g["policies"] if k.startswith("bandit:")})
        lines += ["", f"Measured on the H200 {what} (`summary.{key}`{_at(measured, section)}; best fixed system "
                  f"{g['best_fixed']} {g['best_fixed_tps']:.1f}, per-domain oracle {g['oracle_tps']:.1f}), the best "
                  f"bandit per order: {per}{_only(bandits)}."]
    return lines


def render() -> str:
    parts: list[list[str]] = []
    for name, fn in (
        ("e2e-h200.json", _e2e),
        ("verify-kernels-h200.json", _kernels),
        ("bandit-sim.json", _bandits),
        ("bandit-workload.json", lambda d: _workload(d, _load("e2e-h200.json"))),
    ):
        data = _load(name)
        if data is not None:
            parts.append(fn(data))
    body = "\n\n".join("\n".join(p) for p in parts)
    return f"{BEGIN}\n{body}\n{END}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args(argv)
    readme = ROOT / "README.md"
    text = readme.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + render() + text[stop:]
    if args.check:
        if new != text:
            print("README.md results are out of date: run python benchmarks/render_readme.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
