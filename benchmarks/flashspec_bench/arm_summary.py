"""What the tree, batch-sweep and forward results add to ``e2e-h200.json``'s summary.

* ``tree`` (sections ``tree_b1``, ``tree_t07``, ``tree_b4``): accepted tokens per target
  forward of the best draft tree over the best chain of as many draft forwards per step (a
  tree drafts one forward per level, a chain one per token), lookup and suffix branches over
  their chains, tokens/s over own target-only per domain, the float32 greedy check of every
  fixed arm, trees included, and the goals met.
* ``batch_sweep`` (``sweep_b*``): ``{batch: {domain: {system: tokens/s, ...,
  bandit_vs_target_only}}}``; a domain's figures come only from batches that held that
  domain alone, and ``all`` from every batch. ``bandit`` is the config's bandit (its
  ``[selector]`` table in ``config.selector``); a bandit of ``--selectors`` keeps its name
  (``bandit:thompson``) and has its own ``<name>_vs_target_only``.
* ``self_spec``: each self-speculative depth's acceptance (rate, by draft position, mean
  accepted length) and tokens/s over own target-only, per sweep batch size.
* ``arm_sections_budget``: per section, the systems skipped and the timed batches cut for lack of time.
* ``forward``: the kernel benchmark's headline figures (``forward-h200.json``, written by
  ``benchmarks/forward_kernels.py``), copied where that file exists at summarize time.
"""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path
from typing import Any

from flashspec_bench.arm_sections import SWEEP_SECTIONS, TREE_SECTIONS, tree_levels
from flashspec_bench.runs import by_domain, summarize_run

Section = dict[str, Any]
FORWARD_KEYS = ("target_forward_over_floor", "draft_forward_over_floor", "target_only_tokens_per_s",
                "synthetic_7b_fraction_of_floor", "nf4_vs_bf16_b1")
FORWARD_BATCHES = (8, 32)


def arm_kinds(config: str) -> dict[str, dict[str, Any]]:
    """Per arm of a bench config: ``family`` (``model`` for a draft model, else its ``use``),
    whether it proposes trees, and its draft forwards per step (0 for lookup and suffix)."""
    out = {}
    for arm in tomllib.loads(config).get("arm", []):
        use, gamma = arm["use"], int(arm.get("gamma", 0))
        name = arm.get("name", f"{use}-g{gamma}")
        if use == "none":
            continue
        widths, depth = tuple(arm.get("tree_width", ())), int(arm.get("tree_depth", 0))
        model = use in ("fast", "hf", "self", "hf-self")
        tree = (depth > 0 or any(w > 1 for w in widths)) if model else int(arm.get("branches", 1)) > 1
        # a dynamic tree drafts one forward per level, as a tree_width tree does
        forwards = (depth or tree_levels(widths, gamma) if tree else gamma) if model else 0
        out[name] = {"family": "model" if model else use, "tree": tree, "gamma": gamma, "draft_forwards": forwards}
    return out


def _mal(sec: Section, arm: str) -> float | None:
    return (sec["summaries"].get(f"fixed:{arm}") or {}).get("mean_accepted_length")


def tree_vs_chain(sec: Section) -> dict[str, Any]:
    """Accepted tokens per target forward (mean accepted length): per number of draft forwards
    the best tree of the draft model over its best chain, and lookup's tree over its chain."""
    kinds = arm_kinds(sec["config"])
    by_forwards: dict[str, Any] = {}
    for f in sorted({k["draft_forwards"] for k in kinds.values() if k["family"] == "model" and k["tree"]}):
        trees = {n: _mal(sec, n) for n, k in kinds.items() if k["family"] == "model" and k["tree"] and k["draft_forwards"] == f}
        chains = {n: _mal(sec, n) for n, k in kinds.items() if k["family"] == "model" and not k["tree"] and k["draft_forwards"] == f}
        by_forwards[str(f)] = _ratio(trees, chains)
    out: dict[str, Any] = {"by_draft_forwards": by_forwards}
    for family in ("prompt_lookup", "suffix"):  # deterministic drafts: branches against the chain
        of = {n: k for n, k in kinds.items() if k["family"] == family}
        key = "lookup" if family == "prompt_lookup" else family
        out[f"{key}_branches_vs_chain"] = _ratio({n: _mal(sec, n) for n, k in of.items() if k["tree"]},
                                                 {n: _mal(sec, n) for n, k in of.items() if not k["tree"]})
    ratios = [v["ratio"] for v in by_forwards.values() if v.get("ratio") is not None]
    out["max"] = max(ratios, default=None)
    return out


def _ratio(tree_arms: dict[str, float | None], chain_arms: dict[str, float | None]) -> dict[str, Any]:
    trees = {n: v for n, v in tree_arms.items() if v}
    chains = {n: v for n, v in chain_arms.items() if v}
    if not trees or not chains:
        return {"ratio": None, "why": f"no measured {'tree' if not trees else 'chain'} arm at this count"}
    tree, chain = max(trees, key=trees.__getitem__), max(chains, key=chains.__getitem__)
    return {"tree": tree, "chain": chain, "tree_accepted_per_forward": trees[tree],
            "chain_accepted_per_forward": chains[chain], "ratio": trees[tree] / chains[chain]}


def speedups(sec: Section, tree: bool) -> dict[str, Any]:
    """Per domain: the best tree (or chain) arm of the draft model or lookup, its tokens/s over
    own target-only's in that domain."""
    kinds = arm_kinds(sec["config"])
    runs = sec["runs"]
    if "target_only" not in runs:
        return {}
    plain = by_domain(runs["target_only"])
    names = [f"fixed:{n}" for n, k in kinds.items() if k["tree"] == tree and f"fixed:{n}" in runs]
    rates = {n: by_domain(runs[n]) for n in names if runs[n].get("requests")}
    out: dict[str, Any] = {}
    for d, base in plain.items():
        if rates and base:
            best = max(rates, key=lambda n: rates[n].get(d, 0.0))
            out[d] = {"arm": best.removeprefix("fixed:"), "speedup": rates[best].get(d, 0.0) / base}
    return out


def exactness_of(sec: Section | None) -> dict[str, Any]:
    ex = (sec or {}).get("exactness")
    if not ex:
        return {"not_measured": "tree_b1's float32 check did not run"}
    return {"greedy_identical": ex["greedy_identical"], "systems": ex.get("systems", {ex["system"]: ex["greedy_identical"]}),
            "tree_arms": ex.get("tree_arms", []), "prompts": len(ex["prompts"]), "dtype": ex["dtype"]}


def tree_summary(sections: dict[str, Section | None], reasons: dict[str, str]) -> dict[str, Any]:
    """``summary.tree``; sections not run are named with their reason."""
    b1, t07, b4 = (sections.get(k) for k in TREE_SECTIONS)
    out: dict[str, Any] = {"not_measured": {k: reasons.get(k, "not run") for k in TREE_SECTIONS if not sections.get(k)}}
    if not (b1 or t07 or b4):
        return out
    ran = next(s for s in (b1, t07, b4) if s)
    out["verifier"] = tomllib.loads(ran["config"])["verifier"]["use"]
    out["label"] = ("chains vs trees of one 0.5B draft, lookup chain vs branches, on the code and prose prompts "
                    f"(batch 1 greedy and at temperature 0.7, batch 4 greedy; verifier {out['verifier']})")
    for key, sec in (("", b1), ("_t07", t07), ("_b4", b4)):
        if sec:  # the headline ratio (the best over draft-forward counts), and every comparison
            out[f"accepted_per_forward{key}"] = detail = tree_vs_chain(sec)
            out[f"accepted_per_forward_vs_best_chain{key}"] = detail["max"]
    if b1:
        out["speedup_vs_own_target_only"] = {d: v["speedup"] for d, v in speedups(b1, tree=True).items()}
        out["best_tree_arm"] = {d: v["arm"] for d, v in speedups(b1, tree=True).items()}
        out["chain_speedup_vs_own_target_only"] = {d: v["speedup"] for d, v in speedups(b1, tree=False).items()}
    if t07:
        out["speedup_vs_own_target_only_t07"] = {d: v["speedup"] for d, v in speedups(t07, tree=True).items()
                                                 if d == "code"}
        out["chain_speedup_vs_own_target_only_t07"] = {d: v["speedup"] for d, v in speedups(t07, tree=False).items()}
    if b4:
        out["speedup_vs_own_target_only_b4"] = {d: v["speedup"] for d, v in speedups(b4, tree=True).items()}
        out["chain_speedup_vs_own_target_only_b4"] = {d: v["speedup"] for d, v in speedups(b4, tree=False).items()}
    out["left_out"] = left_out(ran)
    out["greedy_identical_fp32_detail"] = exact = exactness_of(b1)
    out["greedy_identical_fp32"] = exact.get("greedy_identical")
    out["goals"] = tree_goals(out)
    return out


def _at_least(value: float | None, goal: float) -> bool | None:
    return None if value is None else value >= goal


def tree_goals(tree: dict[str, Any]) -> dict[str, bool | None]:
    """The tree goals (batch 1; None where not measured): accepted tokens per target forward
    >= 1.35x the best chain of as many draft forwards; the best tree >= 1.6x own target-only
    on code, >= 1.25x on prose, >= 1.4x on code at temperature 0.7; float32 greedy identical."""
    greedy, t07 = tree.get("speedup_vs_own_target_only", {}), tree.get("speedup_vs_own_target_only_t07", {})
    return {"accepted_per_forward_1_35x_best_chain": _at_least(tree.get("accepted_per_forward_vs_best_chain"), 1.35),
            "code_1_6x": _at_least(greedy.get("code"), 1.6), "prose_1_25x": _at_least(greedy.get("prose"), 1.25),
            "code_t07_1_4x": _at_least(t07.get("code"), 1.4), "greedy_identical_fp32": tree.get("greedy_identical_fp32")}


def sweep_goals(sweep: dict[str, Any], suffix_b1: float | None) -> dict[str, Any]:
    """The batch-aware goals (None where not measured): the bandit >= 0.98x own target-only at
    every batch size on every domain (with the worst), >= 1.15x at batch 8 and >= 1.1x at
    batch 32 on code edits, the suffix arm >= 1.8x on code edits at batch 1, and at every batch
    size the bandit >= 1.0x the best fixed arm and >= 0.97x the per-domain oracle over the
    domains timed (:func:`against_fixed`)."""
    ratios = {(b, d): row["bandit_vs_target_only"] for b, rows in sweep.items() if b.isdigit()
              for d, row in rows.items() if d != "all" and "bandit_vs_target_only" in row}
    worst = min(ratios, key=ratios.__getitem__) if ratios else None

    def code_edit(batch: str) -> float | None:
        return (sweep.get(batch) or {}).get("code_edit", {}).get("bandit_vs_target_only")

    return {"bandit_0_98x_everywhere": _at_least(ratios[worst], 0.98) if worst else None,
            "bandit_worst": {"batch": worst[0], "domain": worst[1], "bandit_vs_target_only": ratios[worst]}
            if worst else None,
            "bandit_code_edit_b8_1_15x": _at_least(code_edit("8"), 1.15),
            "bandit_code_edit_b32_1_1x": _at_least(code_edit("32"), 1.1),
            "suffix_code_edit_b1_1_8x": _at_least(suffix_b1, 1.8),
            "bandit_1x_best_fixed_everywhere": _everywhere(sweep, "bandit_vs_best_fixed", 1.0),
            "bandit_0_97x_oracle_everywhere": _everywhere(sweep, "bandit_vs_oracle", 0.97)}


def _everywhere(sweep: dict[str, Any], key: str, goal: float) -> bool | None:
    """Whether ``key`` of every measured :func:`against_fixed` reaches ``goal`` (None: none measured)."""
    values = [v[key] for v in (sweep.get("against_fixed") or {}).values() if v]
    return all(x >= goal for x in values) if values else None


def left_out(sec: Section) -> list[str]:
    """The tree arms the section's config left out, and why (its ``# left out:`` lines)."""
    return [line.removeprefix("# left out: ") for line in sec["config"].splitlines() if line.startswith("# left out: ")]


def pure(run: dict[str, Any]) -> dict[str, Any]:
    """The run's requests from batches that held one domain."""
    domains: dict[int, set[str]] = {}
    for r in run["requests"]:
        domains.setdefault(r["batch_id"], set()).add(r["domain"])
    return {"requests": [r for r in run["requests"] if len(domains[r["batch_id"]]) == 1]}


def config_bandit(sec: Section) -> str | None:
    """The bandit of the section's config (``bandit:<its class>``): the one not named by ``--selectors``."""
    extra = {f"bandit:{n}" for n in (sec.get("args") or {}).get("selectors", [])}
    return next((n for n in sec["summaries"] if n.startswith("bandit:") and n not in extra), None)


def _system(name: str, own: str | None) -> str:
    return "bandit" if name == own else name.removeprefix("fixed:")


def by_repeat(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's requests split by timed repeat (one part where the rows carry no repeat)."""
    parts: dict[Any, list[dict[str, Any]]] = {}
    for r in run.get("requests", []):
        parts.setdefault(r.get("repeat", 0), []).append(r)
    return [{"requests": parts[k]} for k in sorted(parts)]


def _rates(run: dict[str, Any]) -> dict[str, list[float]]:
    """tokens/s of ``all`` and of each domain in each timed repeat (domains from their own batches)."""
    out: dict[str, list[float]] = {}
    for part in by_repeat(run):
        if (tps := summarize_run(part)["tokens_per_s"]) is not None:
            out.setdefault("all", []).append(tps)
        for d, tps in by_domain(pure(part)).items():
            out.setdefault(d, []).append(tps)
    return out


def sweep_section(sec: Section) -> dict[str, Any]:
    """One batch size: tokens/s per domain and system, and each bandit over own target-only.
    With several timed repeats (the systems take turns within each) a figure is the median over
    the repeats, and a ratio the median of the repeats' ratios, so one stalled batch moves
    neither (``config.repeats`` of the summary says how many there were)."""
    out: dict[str, dict[str, Any]] = {"all": {}}
    own = config_bandit(sec)
    rates: dict[str, dict[str, list[float]]] = {}
    for name, run in sec["runs"].items():
        if not run.get("requests") or not (name == "target_only" or name.startswith(("fixed:", "bandit:"))):
            continue
        system = _system(name, own)
        rates[system] = _rates(run)
        for d, values in rates[system].items():
            out.setdefault(d, {})[system] = statistics.median(values)
    base = rates.get("target_only", {})
    for d, row in out.items():
        for bandit in [k for k in row if k == "bandit" or k.startswith("bandit:")]:
            pairs = list(zip(rates[bandit].get(d, []), base.get(d, []), strict=False))
            if pairs and all(t for _, t in pairs):
                row[f"{bandit}_vs_target_only"] = statistics.median(b / t for b, t in pairs)
    return out


def repeats(sec: Section) -> int:
    """The most timed repeats any system of the section ran."""
    return max((len(by_repeat(run)) for run in sec["runs"].values() if run.get("requests")), default=0)


def against_fixed(sec: Section, row: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The bandit against the best fixed arm and the per-domain oracle (each domain its best fixed
    arm, chosen after the fact) over the domains timed alone (``row``: :func:`sweep_section`);
    plain decoding (target-only) counts as a fixed arm. A system's figure over the domains is
    its speed over target-only with each domain weighted by target-only's time on it, as one
    mixed run of those prompts would take. ``None`` where the bandit or no fixed arm ran."""
    domains = [d for d in row if d != "all" and "bandit" in row[d] and "target_only" in row[d]]
    base = (sec["runs"].get("target_only") or {}).get("requests", [])
    tokens: dict[str, int] = {}
    for r in pure(by_repeat({"requests": base})[0])["requests"] if base else []:
        tokens[r["domain"]] = tokens.get(r["domain"], 0) + r["new_tokens"]
    domains = [d for d in domains if tokens.get(d)]
    fixed = [s for s in row.get("all", {}) if all(row[d].get(s) for d in domains)
             and not (s == "bandit" or s.startswith("bandit:") or s.endswith("_vs_target_only"))]
    if not domains or not fixed:
        return None
    time = {d: tokens[d] / row[d]["target_only"] for d in domains}  # target-only's seconds per domain

    def over(rates: dict[str, float]) -> float:  # speed over target-only, weighted by its time
        return sum(time.values()) / sum(time[d] * row[d]["target_only"] / rates[d] for d in domains)

    speeds = {s: over({d: row[d][s] for d in domains}) for s in fixed}
    best = max(speeds, key=speeds.__getitem__)
    oracle = {d: max(fixed, key=lambda s, d=d: row[d][s]) for d in domains}
    oracle_speed = over({d: row[d][oracle[d]] for d in domains})
    bandit = over({d: row[d]["bandit"] for d in domains})
    return {"domains": domains, "best_fixed": best, "best_fixed_vs_target_only": speeds[best],
            "oracle": oracle, "oracle_vs_target_only": oracle_speed, "bandit_vs_target_only": bandit,
            "bandit_vs_best_fixed": bandit / speeds[best], "bandit_vs_oracle": bandit / oracle_speed}


def sweep_summary(sections: dict[str, Section | None], reasons: dict[str, str]) -> dict[str, Any]:
    """``summary.batch_sweep`` and its config (what was small on purpose)."""
    ran = {int(k.removeprefix("sweep_b")): v for k in SWEEP_SECTIONS if (v := sections.get(k))}
    out: dict[str, Any] = {str(b): sweep_section(sec) for b, sec in sorted(ran.items())}
    out["against_fixed"] = {str(b): against_fixed(sec, out[str(b)]) for b, sec in sorted(ran.items())}
    out["not_measured"] = {k: reasons.get(k, "not run") for k in SWEEP_SECTIONS if not sections.get(k)}
    if ran:
        first = next(iter(ran.values()))
        out["config"] = {"max_new_tokens": first["args"]["max_new_tokens"], "temperature": first["args"]["temperature"],
                         "prompts_per_domain": {str(b): _per_domain(sec) for b, sec in sorted(ran.items())},
                         "note": (first["config"].splitlines()[0].lstrip("# ") if first["config"].startswith("#")
                                  else ""),
                         "selector": tomllib.loads(first["config"]).get("selector"),
                         "bandit": {str(b): config_bandit(sec) for b, sec in sorted(ran.items())},
                         "repeats": {str(b): repeats(sec) for b, sec in sorted(ran.items())},
                         "domains_per_batch": "a domain's figures come from batches of that domain alone; "
                                              "'all' from every batch"}
    return out


def _per_domain(sec: Section) -> dict[str, int]:
    counts: dict[str, int] = {}
    for w in sec.get("workload", []):
        counts[w["domain"]] = counts.get(w["domain"], 0) + 1
    return counts


def suffix_vs_target_only(sweep: dict[str, Any], batch: str = "1", domain: str = "code_edit") -> float | None:
    row = (sweep.get(batch) or {}).get(domain) or {}
    suffix = next((v for k, v in row.items() if k.startswith("suffix")), None)
    return suffix / row["target_only"] if suffix and row.get("target_only") else None


def self_spec(sections: dict[str, Section | None]) -> dict[str, Any]:
    """Per sweep batch size, each self-speculative arm alone: its depth (layers), acceptance
    rate, acceptance by draft position, mean accepted length and tokens/s over target-only."""
    out: dict[str, Any] = {}
    for name in SWEEP_SECTIONS:
        sec = sections.get(name)
        if not sec:
            continue
        config = {a.get("name"): a for a in tomllib.loads(sec["config"]).get("arm", [])}
        plain = (sec["summaries"].get("target_only") or {}).get("tokens_per_s")
        rows = {}
        for arm, cfg in config.items():
            s = sec["summaries"].get(f"fixed:{arm}") or {}
            if cfg.get("use") not in ("self", "hf-self") or not s.get("tokens_per_s"):
                continue
            stats = s.get("arms", {}).get(arm, {})
            rows[arm] = {"layers": cfg["layers"], "gamma": cfg["gamma"], "acceptance_rate": stats.get("acceptance_rate"),
                         "acceptance_by_position": stats.get("acceptance_by_position"),
                         "mean_accepted_length": stats.get("mean_accepted_length"),
                         "vs_target_only": s["tokens_per_s"] / plain if plain else None}
        out[name.removeprefix("sweep_b")] = rows
    return out


def budget(sections: dict[str, Section | None]) -> dict[str, Any]:
    """Per section that ran short: the systems it skipped, and where its timed batches stopped."""
    out: dict[str, Any] = {}
    for name in (*TREE_SECTIONS, *SWEEP_SECTIONS):
        sec = sections.get(name)
        if not sec:
            continue
        skipped = sorted(n for n, s in sec["summaries"].items() if str(s.get("error", "")).startswith("out of budget"))
        stopped = next((r["stopped"] for r in sec["runs"].values() if r.get("stopped")), None)
        if skipped or stopped:
            out[name] = {"skipped_systems": skipped, "stopped": stopped}
    return out


def forward_summary(*candidates: Path) -> dict[str, Any]:
    """``summary.forward``: the wanted figures of the first ``forward-h200.json`` found (searched
    for by key anywhere in it, its ``summary`` first), or why not."""
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        return {"not_measured": "no forward-h200.json at summarize time (benchmarks/forward_kernels.py writes it)",
                "looked_in": [str(p) for p in candidates]}
    data = json.loads(path.read_text())
    out: dict[str, Any] = {"source": path.name, **{k: data.get(k) for k in ("commit", "date", "device") if k in data}}
    for key in FORWARD_KEYS:
        out[key] = find(data, key)
    tps = out.get("target_only_tokens_per_s")
    for b in FORWARD_BATCHES:
        by_batch = tps.get(str(b), tps.get(b)) if isinstance(tps, dict) else None
        out[f"target_only_tokens_per_s_b{b}"] = by_batch if by_batch is not None else find(
            data, f"target_only_tokens_per_s_b{b}")
    if isinstance(tps, dict):  # per batch size there; the headline figure is batch 1's
        out["target_only_tokens_per_s"] = tps.get("1", tps.get(1))
    out["missing"] = [k for k, v in out.items() if v is None]
    return out


def find(data: Any, key: str) -> Any:
    """The value of ``key`` in nested dicts/lists: ``data["summary"]`` first, then breadth first."""
    queue = [data.get("summary"), data] if isinstance(data, dict) else [data]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            if key in node:
                return node[key]
            queue += list(node.values())
        elif isinstance(node, list):
            queue += node
    return None


def arm_summary(sections: dict[str, Section | None], reasons: dict[str, str], forward: tuple[Path, ...]) -> dict[str, Any]:
    """The keys this module adds to the summary."""
    sweep = sweep_summary(sections, reasons)
    suffix = suffix_vs_target_only(sweep)
    sweep["goals"] = sweep_goals(sweep, suffix)
    return {"tree": tree_summary(sections, reasons), "batch_sweep": sweep,
            "suffix_vs_target_only_code_edit_b1": suffix, "self_spec": self_spec(sections),
            "arm_sections_budget": budget(sections), "forward": forward_summary(*forward)}
