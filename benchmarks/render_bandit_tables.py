"""Write the result tables of docs/bandits.md from docs/benchmarks/bandit-sim.json
and docs/benchmarks/bandit-forgetting-sweep.json.

Every number in those tables comes from the JSON that ``benchmarks/bandit_sim.py`` or
``benchmarks/bandit_forgetting_sweep.py`` wrote; the tables live between the
``bandit-tables`` and ``bandit-sweep`` markers and are replaced whole. ``--check`` exits
1 when the page is out of date instead of writing it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "docs" / "benchmarks" / "bandit-sim.json"
PAGE = ROOT / "docs" / "bandits.md"
SELECTORS = ("ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "glr_thompson", "request_thompson")
COLUMNS = (  # table (b): (summary table, bandit_sim.py's scenario, column title)
    ("nonstationary", "switch_at_half", "best arm switches at T/2"),
    ("nonstationary_four_phase", "four_phase", "four phases"),
    ("drifting", "drifting", "drifting"),
    ("nonstationary_degrading", "best_arm_degrades", "best arm degrades at T/2"),
    ("nonstationary_domain_shift", "domain_shift", "domain shift, four phases"),
)
TABLES = ("paper_table", *(t for t, _, _ in COLUMNS))


def _cell(entry: dict[str, Any], digits: int = 1) -> str:
    lo, hi = entry["ci95"]
    return f"{entry['mean']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def render(data: dict[str, Any]) -> str:
    s, cfg = data["summary"], data["config"]
    lines = [
        f"Source: `docs/benchmarks/bandit-sim.json`, written by `{data['generated_by']}` at commit "
        f"`{data['commit'][:7]}`; T = {cfg['horizon']}, {len(cfg['seeds'])} seeds, default configs "
        f"(window W = {cfg['sliding_window_ucb_window']}, discount = {cfg['discounted_thompson_discount']}, "
        f"GLR delta = {cfg['glr_thompson_delta']}, forced = {cfg['glr_thompson_forced']:.4f}; "
        "`request_thompson` is never told of a request here). "
        "Cells: mean cumulative regret at T [95% CI of the mean].",
        "",
        "**(a) Stationary Bernoulli, means [0.3, 0.7, 0.5]**",
        "",
        "| selector | regret at T [95% CI] |",
        "|---|---|",
    ]
    table = {k: s[k] | s.get("added_selectors", {}).get(k, {}) for k in TABLES}
    lines += [f"| `{name}` | {_cell(table['paper_table'][name])} |" for name in SELECTORS]
    lines += [f"| UCB1 bound (Auer et al. 2002) | {s['paper_table']['ucb1_bound']:.1f} |"]
    if "thompson_bound_leading" in s["paper_table"]:
        lines += [
            f"| Thompson bound's leading term (Kaufmann et al. 2012; Agrawal & Goyal 2013) | "
            f"{s['paper_table']['thompson_bound_leading']:.1f} |"
        ]
    lines += [""]
    lines += [
        "**(b) Non-stationary: dynamic regret**",
        "",
        "| selector | " + " | ".join(title for _, _, title in COLUMNS) + " |",
        "|---" * (1 + len(COLUMNS)) + "|",
    ]
    lines += ["| " + " | ".join([f"`{n}`"] + [_cell(table[t][n]) for t, _, _ in COLUMNS]) + " |" for n in SELECTORS]
    goal = s.get("nonstationary_goal")
    if goal:
        cells = [", ".join(f"`{f}`" for f in goal[k]["below_both_plain"]) or "none" for _, k, _ in COLUMNS]
        lines += ["| below both plain selectors | " + " | ".join(cells) + " |"]
    lines += [""] + _costed(data)
    return "\n".join(lines)


def _costed(data: dict[str, Any]) -> list[str]:
    c, arms = data["summary"]["costed"], data["scenarios"]["costed"]["arms"]
    cfg = data["config"]["costed"]
    lines = [
        "**(c) Costed arms: what each reward makes the selector pick**",
        "",
        "| arm | acceptance rate a | gamma | cost | E[accepted] / gamma | tokens per time unit |",
        "|---|---|---|---|---|---|",
    ]
    for k, name in enumerate(cfg["arm_names"]):
        lines.append(
            f"| {name} | {cfg['rates'][k]} | {cfg['gammas'][k]} | {cfg['costs'][k]} | "
            f"{arms['acceptance_fraction'][k]:.3f} | {arms['tokens_per_time_unit'][k]:.3f} |"
        )
    lines += [
        "",
        f"Oracle (always the fastest arm): {c['oracle_tokens_per_time_unit']:.3f} tokens per time unit.",
        "",
        "| selector / reward | steps on the fastest arm | realised tokens per time unit [95% CI] | throughput regret at T [95% CI] |",
        "|---|---|---|---|",
    ]
    for key, e in c.items():
        if not isinstance(e, dict):
            continue
        lo, hi = e["throughput_ci95"]
        lines.append(
            f"| `{key}` | {100 * e['best_arm_fraction']:.1f}% | {e['throughput_mean']:.3f} [{lo:.3f}, {hi:.3f}] "
            f"| {_cell(e)} |"
        )
    return lines


def splice(page: str, block: str, tables: str) -> str:
    begin, end = f"<!-- BEGIN {block} (benchmarks/render_bandit_tables.py) -->", f"<!-- END {block} -->"
    if begin not in page or end not in page:
        raise SystemExit(f"{PAGE}: markers {begin!r} ... {end!r} not found")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{tables}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/bandits.md is out of date")
    args = p.parse_args(argv)
    page = PAGE.read_text()
    new = splice(page, "bandit-tables", render(json.loads(JSON_PATH.read_text())))
    if args.check:
        if new != page:
            print(f"{PAGE} is out of date: run python benchmarks/render_bandit_tables.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
