"""Write README.md's results table from docs/benchmarks/e2e-h200.json.

The README quotes no number by hand in its table: this script fills the block between
``<!-- results:begin -->`` and ``<!-- results:end -->`` with the batch-1 end-to-end table
that ``benchmarks/e2e_h200.py`` measured, then the training-free arms (draft trees against
chains, the float32 check, the bandit and each arm per batch size, target-only per batch
size, self-speculation, the forward against its floor), the systems the summary withholds,
and the server (``docs/benchmarks/serve-h100.json``, ``benchmarks/serve_bench.py``). ``--check`` exits 1 when the README differs from
what the JSON gives (tests/core/test_docs.py runs it).

    python benchmarks/render_readme.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "docs/benchmarks/e2e-h200.json"
# The server's file measured with the shipped gpu.toml (serve-h200.json predates its four-arm design).
SERVE = "docs/benchmarks/serve-h100.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
SECTION = "b1_greedy"  # the section whose systems summary.tokens_per_s lists
HF = {"hf_eager": "HF generate", "hf_compiled": "HF generate (static cache, compiled)",
      "hf_assisted": "HF assisted generation", "hf_lookup": "HF prompt lookup"}


def table(data: dict[str, Any]) -> str:
    """The batch-1 table: every system's tokens/s and its ratio to FlashSpec's own target-only."""
    s = data["summary"]
    env = data["sections"][SECTION]["environment"]
    tps = s["tokens_per_s"]
    base = tps["target_only"]
    lines = [
        f"Batch 1, greedy, {s['max_new_tokens']} new tokens; {s['label']}; {env['device']}, "
        f"torch {env['torch']}, measured {data['section_dates'][SECTION]} "
        f"([`benchmarks/e2e_h200.py`](benchmarks/e2e_h200.py), [`{SOURCE}`]({SOURCE}) `summary.tokens_per_s`):",
        "",
        "| system | tokens/s | vs own target-only |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {v:.1f} | {v / base:.2f}x |" for name, v in tps.items() if name not in HF]
    lines += [f"| {label} | {tps[name]:.1f} | - |" for name, label in HF.items() if name in tps]
    over = ", ".join(f"{s[key]:.1f}x {label}" for name, label in HF.items()
                     if (key := "speedup_vs_hf_generate" if name == "hf_eager" else f"speedup_vs_{name}") in s)
    lines += ["", "`fixed:` runs one arm (or match-only lookup falling back to the draft) on every step; `bandit:` "
                  "lets that selector choose among the five arms and no draft. The HF baselines ran on the first "
                  f"4 of the 12 prompts (all code); there the best FlashSpec system ran at {over}."]
    return "\n".join(lines)


def arms(data: dict[str, Any]) -> str:
    """Draft trees against chains at batch 1, target-only per batch, self-speculation's
    acceptance per depth, the forward over its floor, and what ``summary.invalid_systems`` withholds."""
    from flashspec_bench.arm_summary import arm_kinds

    s, sec = data["summary"], data["sections"]["tree_b1"]
    kinds, rows = arm_kinds(sec["config"]), sec["summaries"]
    base = rows["target_only"]["tokens_per_s"]
    lines = [f"Draft trees against chains: batch 1, greedy, {sec['args']['max_new_tokens']} new tokens, code and prose "
             f"prompts, measured {data['section_dates']['tree_b1']} ([`{SOURCE}`]({SOURCE}) "
             "`sections.tree_b1.summaries`, `summary.tree`):", "",
             "| system | draft forwards per step | tokens/s | vs own target-only | tokens per target forward |",
             "|---|---:|---:|---:|---:|"]
    for name, row in rows.items():
        if row.get("tokens_per_s"):
            arm = kinds.get(name.removeprefix("fixed:"), {"draft_forwards": "-" if name.startswith("bandit:") else 0})
            lines.append(f"| {name} | {arm['draft_forwards']} | {row['tokens_per_s']:.1f} | "
                         f"{row['tokens_per_s'] / base:.2f}x | {row['mean_accepted_length']:.2f} |")
    measured = {n: k for n, k in kinds.items() if k["family"] == "model" and rows.get(f"fixed:{n}", {}).get("tokens_per_s")}
    tps = {n: rows[f"fixed:{n}"]["tokens_per_s"] for n in measured}
    per_forward = {n: rows[f"fixed:{n}"]["mean_accepted_length"] for n in measured}
    chains = [n for n, k in measured.items() if not k["tree"]]
    best = max(chains, key=tps.__getitem__)

    def chain_of(tree: str) -> str:  # the chain of as many draft forwards that accepts the most per forward
        same = [n for n in chains if measured[n]["draft_forwards"] == measured[tree]["draft_forwards"]]
        return max(same, key=per_forward.__getitem__)

    trees = [n for n, k in measured.items() if k["tree"] and chains]
    said = [f"{n} {per_forward[n] / per_forward[chain_of(n)]:.2f}x {chain_of(n)}'s tokens per target forward, "
            f"{tps[n] / tps[best]:.2f}x the tokens/s of the fastest chain ({best})" for n in trees]
    lines += ["", "Each tree against the chain of as many draft forwards: " + "; ".join(said) + "."]
    lines += ["", exactness(s["tree"].get("greedy_identical_fp32_detail"))]
    lines += ["", *sweep_table(s["batch_sweep"], s.get("suffix_vs_target_only_code_edit_b1"))]
    sweep, fwd = s["batch_sweep"], s["forward"]
    lines += ["", f"Target-only per batch size (`summary.batch_sweep`: whole requests, {sweep['config']['max_new_tokens']}"
                  " new tokens; `summary.forward`: one decoding forward alone, random weights with the same shapes):",
              "", "| batch | target-only tokens/s, end to end | one forward alone |", "|---:|---:|---:|"]
    for b in sorted((k for k in sweep if k.isdigit()), key=int):
        alone = fwd.get("target_only_tokens_per_s" if b == "1" else f"target_only_tokens_per_s_b{b}")
        lines.append(f"| {b} | {sweep[b]['all']['target_only']:.1f} | {alone:.1f} |" if alone else
                     f"| {b} | {sweep[b]['all']['target_only']:.1f} | - |")
    lines += ["", "Self-speculation (the target's first layers as the draft, no training; `summary.self_spec`):",
              "", "| batch | arm | layers | gamma | acceptance rate | by draft position | vs own target-only |",
              "|---:|---|---:|---:|---:|---|---:|"]
    for b, arms_at in s["self_spec"].items():
        for name, r in arms_at.items():
            at = ", ".join(f"{x:.3f}" for x in r["acceptance_by_position"])
            lines.append(f"| {b} | {name} | {r['layers']} | {r['gamma']} | {r['acceptance_rate']:.3f} | {at} | "
                         f"{r['vs_target_only']:.2f}x |")
    lines += ["", f"A target forward (1.5B shape, batch 1) takes {fwd['target_forward_over_floor']:.2f}x its bandwidth "
                  f"floor and a draft forward (0.5B) {fwd['draft_forward_over_floor']:.2f}x; the 7B shape runs at "
                  f"{fwd['synthetic_7b_fraction_of_floor']:.2f} of its floor's speed (`summary.forward`, "
                  "[`benchmarks/forward_kernels.py`](benchmarks/forward_kernels.py))."]
    withheld = s.get("invalid_systems") or {}
    if withheld:
        named = "; ".join(f"{sec_name}: {', '.join(sorted(bad))}" for sec_name, bad in withheld.items())
        lines += ["", f"Withheld (`summary.invalid_systems`), so left out of the tables and of every ratio: {named}. "
                      "In those sections the suffix arm's corpus had already learned the warm-up's and the other "
                      "systems' outputs of the same prompts, so it predicted tokens it had seen (its largest mean "
                      f"accepted length: {evidence(withheld)}), and every bandit there has the suffix arm among its "
                      "arms. The bench now gives each "
                      "system and repeat its own emptied corpus (`cross_request_state` in `bench.json`)."]
    return "\n".join(lines)


def exactness(detail: dict[str, Any] | None) -> str:
    """tree_b1's float32 greedy check: which systems matched target-only's tokens."""
    if not detail:
        return "The float32 greedy check of tree_b1 did not run."
    systems = detail["systems"]
    same = [n for n, ok in systems.items() if ok]
    differ = [n for n, ok in systems.items() if not ok]
    head = (f"Float32 greedy check ({detail['prompts']} prompts, `summary.tree.greedy_identical_fp32_detail`): "
            f"{len(same)} of {len(systems)} systems gave target-only's tokens")
    return head + (f"; {', '.join(differ)} did not." if differ else ", every one.")


def sweep_table(sweep: dict[str, Any], suffix_b1: float | None) -> list[str]:
    """Per batch size: the config's bandit and every arm over own target-only, all prompts
    (``summary.batch_sweep``), and the bandit's worst domain."""
    batches = sorted((k for k in sweep if k.isdigit()), key=int)
    arms_seen = list(dict.fromkeys(n for b in batches for n in sweep[b]["all"]
                                   if n not in ("target_only", "bandit") and not n.endswith("_vs_target_only")))
    sel = sweep["config"].get("selector") or {}
    buckets = f", a selector per batch bucket {sel['batch_buckets']}" if sel.get("batch_buckets") else ""
    lines = [f"Batch sweep (`summary.batch_sweep`, greedy, {sweep['config']['max_new_tokens']} new tokens, HumanEval, "
             f"code edits, chats, code and prose): tokens/s over own target-only on all prompts; `bandit` is the "
             f"`{sel.get('use', '?')}` selector{buckets}; `-` not measured (the section's budget):", "",
             "| batch | bandit | bandit's worst domain | " + " | ".join(arms_seen) + " |",
             "|---:|---:|---|" + "---:|" * len(arms_seen)]
    for b in batches:
        row, base = sweep[b]["all"], sweep[b]["all"]["target_only"]
        worst = min(((d, r["bandit_vs_target_only"]) for d, r in sweep[b].items()
                     if d != "all" and "bandit_vs_target_only" in r), key=lambda x: x[1], default=None)
        cells = [f"{row[n] / base:.2f}x" if n in row else "-" for n in arms_seen]
        lines.append(f"| {b} | {row['bandit'] / base:.2f}x | " + (f"{worst[0]} {worst[1]:.2f}x" if worst else "-")
                     + " | " + " | ".join(cells) + " |")
    if suffix_b1 is not None:
        lines += ["", f"On the code-edit prompts at batch 1 the suffix arm runs at {suffix_b1:.2f}x target-only "
                      "(`summary.suffix_vs_target_only_code_edit_b1`)."]
    return lines


def serving(data: dict[str, Any]) -> str:
    """The server's headline ratios from :data:`SERVE`, and what its load repeats."""
    s, ld = data["summary"], data["summary"].get("load_test") or {}
    c32 = s.get("c32", {}).get("output_tokens_per_s")
    highest = s.get("throughput_vs_peer_highest")
    if s.get("throughput_vs_peer_c32") is not None:
        peer = f"{s['throughput_vs_peer_c32']:.2f}x the peer at 32 clients"
    elif highest:  # the peer decodes one request at a time: a level of many clients can outlast its time
        peer = (f"{highest['ratio']:.1f}x the peer's output tokens/s at {highest['clients']} clients, the most it "
                f"answered within the stage's time (no `throughput_vs_peer_c32`; non-streaming loads, as the peer "
                f"has no streaming)")
    else:
        peer = "the peer did not answer within the stage's time (no `throughput_vs_peer_c32`)"
    nospec = s.get("spec_vs_nospec") or {}
    levels = ", ".join(f"{v:.2f}x at {k[1:]}" for k, v in nospec.items() if v is not None)
    offline_row = (data.get("runs", {}).get("offline") or {}).get("c1") or {}
    if offline_row.get("graph_captures") == 0:
        offline = f"one streaming client {s['stream_vs_offline_c1']:.2f}x offline generate"
    else:  # a run whose timed offline pass captured graphs (or did not count them) is not a fair comparison
        offline = ("offline generate not compared (its timed pass did not report zero graph captures, "
                   "so it may include one-off costs the server's warm-up had paid)")
    cfg = data.get("config") or {}
    repeats = (f" The load sends its {cfg['prompts']} prompts in turn, {cfg['requests_per_client']} requests per "
               "client, greedy: from a prompt's second request on, the suffix arm proposes the output it decoded "
               "before, so these ratios are those of a load that repeats its requests."
               if cfg.get("prompts") and cfg.get("requests_per_client") else "")
    return (f"Server ([`{SERVE}`]({SERVE}), {data['device']}, measured {data['date']}, "
            f"[`benchmarks/serve_bench.py`](benchmarks/serve_bench.py)): streaming with speculation "
            f"{c32:.1f} output tokens/s at 32 clients, {s['spec_vs_nospec_c32']:.2f}x the same server without "
            f"speculation ({levels} clients); {offline}; of {ld.get('sent')} "
            f"requests {ld.get('lost')} lost, {ld.get('duplicated')} duplicated, {ld.get('mixed_up')} mixed up, "
            f"{ld.get('differs_from_offline')} differing from offline generate (bf16 near-ties); {peer}.{repeats}")


def evidence(withheld: dict[str, Any]) -> str:
    """The withheld fixed arm with the largest mean accepted length, as ``<value> (<system>, <section>)``."""
    cases = [(bad["mean_accepted_length"], name, sec) for sec, systems in withheld.items()
             for name, bad in systems.items() if name.startswith("fixed:") and bad.get("mean_accepted_length")]
    if not cases:
        return "not recorded"
    value, name, sec = max(cases)
    return f"{value:.2f} tokens per target forward, {name} in {sec}"


def render(text: str) -> str:
    """``text`` with its results block replaced by the table from the committed JSON."""
    data = json.loads((ROOT / SOURCE).read_text())
    serve = serving(json.loads((ROOT / SERVE).read_text()))
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    return f"{text[:start]}{BEGIN}\n{table(data)}\n\n{arms(data)}\n\n{serve}\n{END}{text[stop:]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is out of date")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md results are out of date: run python benchmarks/render_readme.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
