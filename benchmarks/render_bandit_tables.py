"""Write the result tables of docs/bandits.md from the committed JSON.

Tables (a) to (c) come from docs/benchmarks/bandit-sim.json (``benchmarks/bandit_sim.py``),
(d) from docs/benchmarks/bandit-workload.json (``benchmarks/bandit_workload.py``: a replay
with modelled step costs), (e) from docs/benchmarks/e2e-h200.json (``benchmarks/e2e_h200.py``:
measured end to end), and the two replays of recorded H200 steps from
docs/benchmarks/bandit-replay.json (``benchmarks/bandit_replay.py``). They live between the ``bandit-tables``, ``workload-tables``, ``replay-batches`` and ``replay-domains`` markers
and are replaced whole. ``--check`` exits 1 when the page is out of date instead of writing it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "docs" / "benchmarks"
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
        f"Source: `docs/benchmarks/bandit-sim.json`, written by `{data.get('script') or data['generated_by']}` ({data['device']}, "
        f"{data['date']}); T = {cfg['horizon']}, {len(cfg['seeds'])} seeds, default configs "
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


WORKLOAD_DESIGNS = (  # table (d): (key under summary.workload, design); None: the whole arm set
    (None, "every arm"),
    ("adaptive", "fallback-only draft"),
    ("gated", "lookup first"),
    ("gated_small", "lookup first, short drafts"),
)
GPU_DESIGNS = (  # table (e): (summary key in e2e-h200.json, design)
    ("workload_gpu", "every arm"),
    ("workload_gpu_adaptive", "fallback-only draft"),
    ("workload_gpu_gated", "lookup first"),
    ("workload_gpu_gated_small", "lookup first, short drafts"),
    ("workload_gpu_gated_small_acc", "lookup first, short drafts, acceptance reward"),
)
GOAL_HEAD = [
    "| design | order | best selector | tokens/s | best fixed policy | tokens/s | per-domain oracle | "
    "selector / best fixed | selector / oracle |",
    "|---|---|---|---:|---|---:|---:|---:|---:|",
]


def render_replay(data: dict[str, Any]) -> str:
    """Table (d): per design and serving order, the best selector of the modelled replay."""
    w = data["summary"]["workload"]
    lines = [
        f"**(d) Replay with modelled step costs** (`docs/benchmarks/bandit-workload.json`, "
        f"`summary.workload`; {w['cost_model']}; {data['date']}): modelled tokens/s, not measured.",
        "",
        *GOAL_HEAD,
    ]
    for key, design in WORKLOAD_DESIGNS:
        for order, v in (w[key] if key else w)["by_order"].items():
            lines.append(
                f"| {design} | {order} | `{v['best_selector'].split('@')[0]}` | {v['best_selector_tps']:.1f} | "
                f"`{v['best_fixed'].removeprefix('fixed:')}` | {v['best_fixed_tps']:.1f} | {v['oracle_tps']:.1f} | "
                f"{v['selector_vs_best_fixed']:.3f} | {v['selector_vs_oracle']:.3f} |"
            )
    return "\n".join(lines)


def render_gpu(data: dict[str, Any]) -> str:
    """Table (e): per design and serving order, the best selector measured on the GPU."""
    s = data["summary"]
    dates = [d for k, d in data["section_dates"].items() if k.startswith("workload")]  # this table's sections
    lines = [
        f"**(e) Measured end to end** (`docs/benchmarks/e2e-h200.json`, `summary.workload_gpu*`; "
        f"{data['device']}, {min(dates)} to {max(dates)}; batch 1, greedy, 48 new tokens; three repeats, one in "
        "the every-arm design). Under lookup first, `draft0.5b-gN` is lookup where it matches, else that "
        "draft. The blocked order ran no fixed policies: it is set against the interleaved ones.",
        "",
        *GOAL_HEAD,
    ]
    for key, design in GPU_DESIGNS:
        g = s[key]
        for order in ("interleaved", "blocked"):
            runs = {k: v["tps"] for k, v in g["policies"].items() if k.startswith("bandit:") and k.endswith(f"@{order}")}
            if not runs:
                continue
            best = max(runs, key=runs.__getitem__)
            lines.append(
                f"| {design} | {order} | `{best.split('@')[0].removeprefix('bandit:')}` | {runs[best]:.1f} | "
                f"`{g['best_fixed'].removeprefix('fixed:')}` | {g['best_fixed_tps']:.1f} | {g['oracle_tps']:.1f} | "
                f"{runs[best] / g['best_fixed_tps']:.3f} | {runs[best] / g['oracle_tps']:.3f} |"
            )
    return "\n".join(lines)


REPLAYED = (("thompson_per_bucket", "`thompson`, one per bucket"), ("factored", "`factored`, pooled"),
            ("factored_per_request", "`factored`, shipped (`request_rows = 8`, `plain_per_class = 2`)"))
IN_ORDER = (*REPLAYED[1:], ("factored_mean", "`factored`, shipped, scored by the rows' mean (`static_batch = false`)"),
            ("factored_per_request_all_arms", "`factored`, shipped, over every arm the sweep timed"),
            ("factored_per_request_self_priced", "`factored`, shipped, with the self arms priced by their layers"))
DOMAINS = (("humaneval", "HumanEval"), ("code_edit", "code edit"), ("chat", "chat"), ("code", "code"), ("prose", "prose"))


def render_replay_batches(data: dict[str, Any]) -> str:
    """The pooled replay of recorded H200 steps (bandit-replay.json ``batches``)."""
    lines = [
        f"**Replay of recorded H200 steps** (`docs/benchmarks/bandit-replay.json`, `batches`; {data['requests']} "
        f"requests per run in batches of the batch size, {data['seeds']} seeds, {data['captures_dropped']} capture "
        f"steps left out, each arm's gamma its widest recorded step, the arms recorded at 3/4 of the batch size or "
        f"more; {data['date']}): tokens/s over target-only (plain steps), and regret in ms per request against the "
        "best fixed arm in hindsight. Modelled from recorded steps, not measured.",
        "",
        "| batch | arms | best fixed arm | best fixed | " + " | ".join(t for _, t in REPLAYED)
        + " | " + " | ".join(f"regret, {t} (ms/request)" for _, t in REPLAYED) + " |",
        "|---:|---:|---|---:|" + "---:|" * (2 * len(REPLAYED)),
    ]
    for batch, row in data["batches"].items():
        best, systems = row["best_fixed_arm"], row["systems"]
        ratios = " | ".join(f"{systems[k]['vs_target_only']:.2f}x" for k, _ in REPLAYED)
        regrets = " | ".join("{:.2f} [{:.2f}, {:.2f}]".format(*systems[k]["regret_ms_per_request"]) for k, _ in REPLAYED)
        lines.append(f"| {batch} | {len(row['arms'])} | `{best}` | {systems['fixed:' + best]['vs_target_only']:.2f}x | "
                     f"{ratios} | {regrets} |")
    return "\n".join(lines)


def render_replay_domains(data: dict[str, Any]) -> str:
    """The replay in each sweep's run order, per domain, beside the bench's own measured run
    (bandit-replay.json ``domains``)."""
    lines = [
        f"**Replay in the sweep's domain order** (`docs/benchmarks/bandit-replay.json`, `domains`; "
        f"{data['config']['domain_seeds']} seeds; {data['date']}): tokens/s over target-only per domain and over "
        "the whole run, each batch's prefill included. Modelled from recorded steps, not measured; the selector's "
        "own host time is not in it. `measured` is the bench's own run of the shipped selector in the same sweep "
        "(`domains[b].measured`), what the replay is to be read against.",
        "",
        "| batch | selector | " + " | ".join(t for _, t in DOMAINS) + " | all |",
        "|---:|---|" + "---:|" * (len(DOMAINS) + 1),
    ]
    for batch, row in data["domains"].items():
        systems = row["systems"]
        for key, title in IN_ORDER:
            if key not in systems:
                continue
            cells = " | ".join(f"{systems[key]['by_domain'][d]:.2f}x" for d, _ in DOMAINS)
            lines.append(f"| {batch} | {title} | {cells} | {systems[key]['vs_target_only']:.2f}x |")
        measured = row.get("measured", {}).get("bandit:Factored")
        if measured:
            cells = " | ".join(f"{measured[d]:.2f}x" for d, _ in DOMAINS)
            lines.append(f"| {batch} | measured, shipped | {cells} | {measured['all']:.2f}x |")
        fixed = max((k for k in systems if k.startswith("fixed:")), key=lambda k: systems[k]["vs_target_only"])
        cells = " | ".join(f"{systems[fixed]['by_domain'][d]:.2f}x" for d, _ in DOMAINS)
        lines.append(f"| {batch} | best fixed arm of the run, `{fixed.removeprefix('fixed:')}` | {cells} | "
                     f"{systems[fixed]['vs_target_only']:.2f}x |")
        best = row["best_fixed_by_domain"]
        cells = " | ".join(f"{best[d][1]:.2f}x `{best[d][0]}`" for d, _ in DOMAINS)
        lines.append(f"| {batch} | best fixed arm of the domain | {cells} | |")
    return "\n".join(lines)


def splice(page: str, block: str, tables: str) -> str:
    begin, end = f"<!-- BEGIN {block} (benchmarks/render_bandit_tables.py) -->", f"<!-- END {block} -->"
    if begin not in page or end not in page:
        raise SystemExit(f"{PAGE}: markers {begin!r} ... {end!r} not found")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{tables}\n{end}{tail}"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((BENCH / name).read_text())
    return data


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/bandits.md is out of date")
    args = p.parse_args(argv)
    page = PAGE.read_text()
    new = splice(page, "bandit-tables", render(load("bandit-sim.json")))
    new = splice(new, "workload-tables", render_replay(load("bandit-workload.json")) + "\n\n"
                 + render_gpu(load("e2e-h200.json")))
    replayed = load("bandit-replay.json")
    new = splice(new, "replay-batches", render_replay_batches(replayed))
    new = splice(new, "replay-domains", render_replay_domains(replayed))
    if args.check:
        if new != page:
            print(f"{PAGE} is out of date: run python benchmarks/render_bandit_tables.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
