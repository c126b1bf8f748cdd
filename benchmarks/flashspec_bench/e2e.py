"""The end-to-end H200 benchmark's results: what its sections sum to, and what is committed.

A section is one ``flashspec bench`` run (its ``bench.json``): every step row and generated
token of every system (``runs``), the prompts (``workload``) and each prompt's bf16
divergence. ``summarize`` writes all of it to the raw file under the ignored
``benchmarks/.results/`` and commits only ``slim_section`` of each section beside the
``summary`` the docs quote.

A run that did not record ``cross_request_state`` timed its suffix arms on a corpus that
already held the outputs they predicted: those systems (and the bandits over a suffix arm)
are withheld from the committed sections and from every ratio and goal, and named with the
reason in ``summary.invalid_systems`` (:func:`invalid_systems`). ``--merge`` lays a run of the
tree and sweep sections over a committed file (:func:`merge_committed`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import tomllib
from pathlib import Path
from typing import Any

from flashspec_bench.arm_sections import SWEEP_SECTIONS, TREE_SECTIONS
from flashspec_bench.arm_summary import arm_summary, sweep_goals
from flashspec_bench.provenance import RESULTS, write_json
from flashspec_bench.runs import CROSS_REQUEST_STATE, by_domain, summarize_run

RAW = RESULTS / "e2e-h200-raw.json.gz"
SECTIONS = ("b1_greedy", "b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b2_greedy", "b4_greedy",
            "b2_limited", "b4_limited", "b8_greedy", "b32_greedy", "b8_limited", "b32_limited", "b1_t07", "b1_nf4",
            "synthetic", "workload_interleaved", "workload_blocked", "workload_adaptive", "workload_adaptive_blocked",
            "workload_gated", "workload_gated_blocked", "b1_gated_small", "workload_gated_small",
            "workload_gated_small_blocked", "workload_gated_small_acc", *TREE_SECTIONS, *SWEEP_SECTIONS)
SKIPPED = "skipped.txt"  # in a section's folder: why it did not run (a tree section without tree support)
FORWARD = "forward-h200.json"  # benchmarks/forward_kernels.py's results, read into summary.forward
# sections whose own summary goes into summary[<section>] (b1_greedy's is the summary itself)
SUMMARIZED = ("b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b1_gated_small", "b2_greedy",
              "b4_greedy", "b2_limited", "b4_limited", "b8_greedy", "b32_greedy", "b8_limited", "b32_limited", "b1_t07",
              "b1_nf4")
SMALL_GAMMAS = (1, 2, 3)  # the draft gammas of the *_gated_small sections
GATED = "; match-only lookup first ([selector] first), the selector choosing "
WORKLOADS = (  # summary key, interleaved section, blocked section, what the label adds
    ("workload_gpu", "workload_interleaved", "workload_blocked", ""),
    ("workload_gpu_adaptive", "workload_adaptive", "workload_adaptive_blocked",
     "; arms: match-only lookup, and the same falling back to the 0.5B draft (select = false)"),
    ("workload_gpu_gated", "workload_gated", "workload_gated_blocked",
     f"{GATED}between the 0.5B draft and no draft only where it finds nothing"),
    ("workload_gpu_gated_small", "workload_gated_small", "workload_gated_small_blocked",
     f"{GATED}among the 0.5B draft at gamma {', '.join(map(str, SMALL_GAMMAS))} and no draft where it finds nothing"),
    ("workload_gpu_gated_small_acc", "workload_gated_small_acc", None,
     "; as workload_gpu_gated_small, interleaved, the selectors fed the acceptance reward"),
)
GOAL_EVERY_DOMAIN, GOAL_CODE = 1.0, 1.2  # the bandit's tokens/s over own target-only, batch 1, greedy
# kept as they are: small, and what the docs and the readme renderer read
KEPT = ("environment", "args", "config", "summaries", "summary", "floor", "bandwidth_bytes_per_s",
        "draft_prewarm", "exactness", "synthetic_scaling", "wall_s", "cross_request_state", "invalid_systems")


STALE_CORPUS = ("its suffix arm had learned from the warm-up's and the other systems' outputs of the same prompts "
                "(a run without cross_request_state), so it predicted outputs it had seen: not a measurement")
ARM_KEYS = ("tree", "batch_sweep", "suffix_vs_target_only_code_edit_b1", "self_spec", "arm_sections_budget", "forward")


def invalid_systems(section: dict[str, Any]) -> dict[str, str]:
    """The systems of a section whose figures a stale suffix corpus inflated, with the reason:
    where its run did not give every system and repeat its own emptied corpus
    (``cross_request_state``), every bandit over a suffix arm and every fixed arm that is a
    suffix arm or falls back to one (every system but target-only if a suffix arm goes first);
    systems the run skipped keep their error instead."""
    if section.get("cross_request_state") == CROSS_REQUEST_STATE:
        return {}
    config = tomllib.loads(section["config"])
    arms = config.get("arm", [])
    suffix = {a.get("name", f"suffix-g{a.get('gamma', 0)}") for a in arms if a.get("use") == "suffix"}
    if not suffix:
        return {}
    first = config.get("selector", {}).get("first") in suffix
    tainted = suffix | {a.get("name") for a in arms if a.get("fallback") in suffix}
    return {name: STALE_CORPUS for name, summary in section["summaries"].items() if not summary.get("error")
            and (name.startswith("bandit:") or (name.startswith("fixed:") and (first or name[6:] in tainted)))}


def withhold(sections: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sections without their :func:`invalid_systems` (so no ratio or goal reads them), and
    per section each such system's reason and mean accepted length (the evidence: near
    ``gamma + 1`` on prompts a draft cannot know)."""
    kept, invalid = {}, {}
    for key, sec in sections.items():
        bad = invalid_systems(sec) if sec else {}
        if not bad:
            kept[key] = sec
            continue
        invalid[key] = {n: {"reason": why, "mean_accepted_length": sec["summaries"][n].get("mean_accepted_length")}
                        for n, why in bad.items()}
        kept[key] = {**sec, **{k: {n: v for n, v in sec[k].items() if n not in bad}
                               for k in ("runs", "summaries", "bf16_divergence") if isinstance(sec.get(k), dict)},
                     "invalid_systems": bad}
    return kept, invalid


def slim_section(section: dict[str, Any]) -> dict[str, Any]:
    """A section as committed: the KEPT keys, and ``bf16_divergence`` cut to counts per system.

    Dropped: ``runs`` (per-step rows and tokens) and ``workload`` (the prompts); both stay in
    the raw file. A divergence list becomes ``{"prompt_runs": n, "diverged": k}``.
    """
    out = {k: section[k] for k in KEPT if k in section}
    div = section.get("bf16_divergence")
    if div:
        out["bf16_divergence"] = {
            name: {"prompt_runs": len(rows), "diverged": sum(r.get("first_divergence") is not None for r in rows)}
            for name, rows in div.items()}
    return out


def floor_table(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured step time next to the bandwidth-bound one, per configuration.

    floor = bytes read per step (weights + the KV slots attended, per forward: ``floor``'s
    ``*_bytes`` fields) / the copy bandwidth measured in the same run (reads + writes)."""
    bw, fl = bench.get("bandwidth_bytes_per_s"), bench.get("floor") or {}
    if not bw or "target_forward_bytes" not in fl:
        return []
    target_ms = fl["target_forward_bytes"] / bw * 1e3
    rows = []
    for name, s in bench["summaries"].items():
        if not s.get("step_ms_p50") or name.startswith("bandit"):
            continue
        arm = fl["arms"].get(name.removeprefix("fixed:")) or {}
        gamma = next(iter(s["arms"].values()))["gamma"] if s.get("arms") else 0
        step = target_ms + gamma * (arm.get("draft_forward_bytes") or 0) / bw * 1e3
        rows.append({"config": name, "gamma": gamma, "measured_step_ms_p50": s["step_ms_p50"],
                     "floor_step_ms": step, "measured_over_floor": s["step_ms_p50"] / step,
                     "mean_accepted_length": s["mean_accepted_length"],
                     "floor_tokens_per_s": s["mean_accepted_length"] / step * 1e3,
                     "measured_tokens_per_s": s["tokens_per_s"]})
    return rows


def workload_summary(inter: dict[str, Any] | None, blocked: dict[str, Any] | None) -> dict[str, Any] | None:
    """The domain-shifting workload on the GPU: measured tokens/s per policy and domain, and the
    per-domain oracle, which serves each domain with its best fixed arm (chosen after the fact):
    all tokens over the summed time each domain's tokens take at that arm's measured rate.
    Fixed arms do not depend on the order, so both orders share them."""
    if not inter:
        return None

    def tokens(run: dict[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in run["requests"]:
            out[r["domain"]] = out.get(r["domain"], 0) + r["new_tokens"]
        return out

    policies: dict[str, Any] = {}
    for order, sec in (("interleaved", inter), ("blocked", blocked)):
        if not sec:
            continue
        for name, run in sec.get("runs", {}).items():
            if not run.get("requests") or (order == "blocked" and not name.startswith("bandit")):
                continue
            s = sec["summaries"][name]
            policies[name if not name.startswith("bandit") else f"{name}@{order}"] = {
                "tps": s["tokens_per_s"], "per_domain": by_domain(run), "mean_accepted_length": s.get("mean_accepted_length"),
                "tps_by_repeat": s.get("tokens_per_s_by_repeat")}
    fixed = {k: v for k, v in policies.items() if k.startswith("fixed:") or k == "target_only"}
    counts = tokens(inter["runs"]["target_only"])
    oracle_arm = {d: max(fixed, key=lambda k: fixed[k]["per_domain"].get(d, 0.0)) for d in counts}
    oracle = sum(counts.values()) / sum(n / fixed[oracle_arm[d]]["per_domain"][d] for d, n in counts.items())
    bandits = {k: v for k, v in policies.items() if k.startswith("bandit")}
    best_sel = max(bandits, key=lambda k: bandits[k]["tps"]) if bandits else None
    best_fixed = max(fixed, key=lambda k: fixed[k]["tps"])
    sel = bandits[best_sel]["tps"] if best_sel else None
    return {
        "label": "measured end to end on the H200 (flashspec bench, batch 1, greedy, 48 new tokens, bf16)",
        "best_selector": best_sel, "best_selector_tps": sel,
        "best_fixed": best_fixed, "best_fixed_tps": fixed[best_fixed]["tps"],
        "oracle_tps": oracle, "oracle_arms": oracle_arm,
        "selector_vs_oracle": sel / oracle if sel else None,
        "selector_vs_best_fixed": sel / fixed[best_fixed]["tps"] if sel else None,
        "policies": policies,
    }


def bandit_goal(summary: dict[str, Any]) -> dict[str, Any]:
    """The bandit goal checked in every batch-1 greedy section that ran bandits: the selectors
    whose tokens/s over own target-only is at least 1.0 on every domain and 1.2 on code (each
    section's ``bandit_speedup_by_domain_all``, pooled over its repeats)."""
    out: dict[str, Any] = {"how": f"per section: selectors at >= {GOAL_EVERY_DOMAIN} on every domain and >= "
                                  f"{GOAL_CODE} on code (bandit_speedup_by_domain_all, batch 1, greedy)",
                           "sections": {}}
    for key, sec in [("b1_greedy", summary), *((k, summary[k]) for k in SUMMARIZED if isinstance(summary.get(k), dict))]:
        by = sec.get("bandit_speedup_by_domain_all")
        if not by or sec.get("batch_size") != 1 or sec.get("temperature") != 0.0:
            continue
        meets = [n for n, d in by.items() if min(d.values()) >= GOAL_EVERY_DOMAIN and d.get("code", 0.0) >= GOAL_CODE]
        out["sections"][key] = {"selectors": len(by), "meeting": meets,
                                "min_per_domain": {d: min(v[d] for v in by.values()) for d in next(iter(by.values()))}}
    out["met_by_every_selector_in"] = [k for k, v in out["sections"].items() if len(v["meeting"]) == v["selectors"] > 1]
    return out


def b1_summary(b1: dict[str, Any]) -> dict[str, Any]:
    """What the summary adds to b1_greedy's own summary fields."""
    s = b1["summaries"]
    div = [r for rows in (b1.get("bf16_divergence") or {}).values() for r in rows]
    hit = [r for r in div if r.get("top2_gap") is not None]
    not_measured = [k for k, v in s.items() if v.get("error")]
    not_measured += [f"{x} (skipped: run budget)" for x in ("hf_eager", "hf_compiled", "hf_assisted", "hf_lookup")
                     if x not in s]
    if "exactness" not in b1:
        not_measured.append("greedy_identical (float32 check skipped: run budget)")
    return {"tokens_per_s": {n: v["tokens_per_s"] for n, v in s.items() if v.get("tokens_per_s")},
            "outside_steps_ms_per_request": {n: v.get("outside_steps_ms_per_batch") for n, v in s.items()},
            "floor": floor_table(b1),
            "bf16_divergence": {"prompt_runs": len(div), "diverged": sum(r["first_divergence"] is not None for r in div),
                                "max_top2_gap_over_bf16_spacing": max((r["top2_gap"] / r["bf16_spacing"] for r in hit),
                                                                      default=None)},
            "not_measured": sorted(not_measured)}


def build_summary(sections: dict[str, Any], commit: str, section_commits: dict[str, str],
                  reasons: dict[str, str] | None = None, forward: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The ``summary`` object from the sections (those absent or None were not run):
    b1_greedy's headline fields, each SUMMARIZED section's own summary, the workloads, the
    trees, the batch sweep and the forward benchmark (:mod:`flashspec_bench.arm_summary`;
    ``reasons``: why a section was skipped; ``forward``: where ``forward-h200.json`` may be),
    and what ran where (``section_commits`` names sections measured at another commit than
    ``commit``)."""
    sections, invalid = withhold({k: sections.get(k) for k in SECTIONS} | sections)
    b1 = sections["b1_greedy"] or {}
    summary: dict[str, Any] = {**(b1.get("summary") or {}), "label": "real pair: Qwen2.5-Coder-1.5B-Instruct target, "
                               "0.5B draft (bf16, dequantized Q4_K_M GGUF)"}
    if b1:
        summary |= b1_summary(b1)
    summary |= {key: sections[key]["summary"] for key in SUMMARIZED if sections[key]}
    if sections["synthetic"] and sections["synthetic"].get("synthetic_scaling"):
        summary["scaling_synthetic"] = sections["synthetic"]["synthetic_scaling"]
    for key, inter, blocked, label in WORKLOADS:
        w = workload_summary(sections[inter], sections[blocked] if blocked else None)
        if w:
            w["label"] += label
            summary[key] = w
    every, adaptive = summary.get("workload_gpu"), summary.get("workload_gpu_adaptive")
    if every and adaptive and adaptive["best_selector"]:
        adaptive["selector_vs_all_arms_oracle"] = adaptive["best_selector_tps"] / every["oracle_tps"]
        adaptive["selector_vs_all_arms_best_fixed"] = adaptive["best_selector_tps"] / every["best_fixed_tps"]
    summary["bandit_goal"] = bandit_goal(summary)
    summary |= arm_summary(sections, reasons or {}, forward)
    summary["invalid_systems"] = invalid
    ran = {k: v for k, v in sections.items() if v is not None}
    summary["skipped_sections"] = [k for k, v in sections.items() if v is None]
    summary["unfused_sections"] = [k for k, v in ran.items() if not v["args"].get("fuse")]
    summary["measured_at_commit"] = commit
    summary["section_commits"] = {k: section_commits.get(k, commit) for k in ran}
    return summary


def summarize(src: Path, out: Path, commit: str, section_commits: dict[str, str], raw: Path = RAW,
              merge: Path | None = None) -> dict[str, Any]:
    """Rebuild ``out/e2e-h200.json`` from the sections a ``full`` run left in ``src``; every
    row goes to ``raw``. ``merge``: a committed ``e2e-h200.json`` whose sections this run did not
    measure are kept as they are, with their summary (:func:`merge_committed`)."""
    sections = {k: json.loads((src / k / "bench.json").read_text()) if (src / k / "bench.json").is_file() else None
                for k in SECTIONS}
    for sec in sections.values():  # recomputed from the raw rows, so newer summary fields appear too
        if sec:
            sec["summaries"] = {n: summarize_run(r) if r["requests"] else sec["summaries"][n]
                                for n, r in sec["runs"].items()}
    unknown = set(section_commits) - set(SECTIONS)
    if unknown:
        raise ValueError(f"--section-commit: unknown sections {sorted(unknown)}")
    reasons = {k: (src / k / SKIPPED).read_text().strip() for k in SECTIONS if (src / k / SKIPPED).is_file()}
    summary = build_summary(sections, commit, section_commits, reasons, (src / "forward" / FORWARD, out / FORWARD))
    raw.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(raw, "wt") as f:  # every step row and generated token of every section
        json.dump({"summary": summary, "sections": sections}, f)
    dates = {k: v["environment"].get("date") for k, v in sections.items() if v}
    envs = [v["environment"] for v in sections.values() if v]
    committed = withhold(sections)[0]
    data: dict[str, Any] = {
        "commit": commit, "device": envs[0]["device"] if envs else None,
        "date": max((d for d in dates.values() if d), default=None), "section_dates": dates,
        "commit_note": "the newest run's commit; each section's own commit is summary.section_commits, its date "
                       "section_dates", "summary": summary,
        "sections": {k: slim_section(v) if v else v for k, v in committed.items()}}
    if merge is not None:
        data = merge_committed(json.loads(merge.read_text()), data)
    write_json(out / "e2e-h200.json", data)
    return data["summary"]


def merge_committed(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (a summarize of the tree and sweep sections alone) laid over a committed ``old``:
    the sections ``new`` did not run keep their data, dates and commits, the summary keeps
    theirs and takes the arm sections' keys (``ARM_KEYS``) from ``new``, but for the tree and
    sweep sections ``new`` did not run again (:func:`merge_tree`, :func:`merge_sweep`, and their
    entries of ``self_spec`` and ``arm_sections_budget``); ``invalid_systems`` keeps the old marks
    only of sections ``new`` did not measure again.
    A run with other sections is refused: their summary keys mix several sections."""
    ran = {k for k, v in new["sections"].items() if v}
    other = sorted(ran - set(TREE_SECTIONS) - set(SWEEP_SECTIONS))
    if other:
        raise ValueError(f"--merge: only tree and sweep sections can be laid over a committed file, not {other}")
    sections = {**old["sections"], **{k: v for k, v in new["sections"].items() if v}}
    sections |= {k: None for k in SECTIONS if k not in sections}
    old_s, new_s = old["summary"], new["summary"]
    summary = {**old_s, **{k: new_s[k] for k in (*ARM_KEYS, "invalid_systems")}}
    if "tree" in old_s and "tree" in new_s:
        summary["tree"] = merge_tree(old_s["tree"], new_s["tree"], ran)
    if "batch_sweep" in old_s and "batch_sweep" in new_s:
        suffix_key = "suffix_vs_target_only_code_edit_b1"
        summary[suffix_key] = new_s[suffix_key] if "sweep_b1" in ran else old_s.get(suffix_key)
        summary["batch_sweep"] = merge_sweep(old_s["batch_sweep"], new_s["batch_sweep"], ran, summary[suffix_key])
        kept = {b: v for b, v in old_s.get("self_spec", {}).items() if f"sweep_b{b}" not in ran}
        summary["self_spec"] = _by_size({**kept, **new_s["self_spec"]})
    summary["arm_sections_budget"] = {**{k: v for k, v in old_s.get("arm_sections_budget", {}).items() if k not in ran},
                                      **new_s["arm_sections_budget"]}
    # a section measured again is judged by the new run alone: an old mark of it no longer holds
    summary["invalid_systems"] = {**{k: v for k, v in old_s.get("invalid_systems", {}).items() if k not in ran},
                                  **new_s["invalid_systems"]}
    summary["skipped_sections"] = [k for k in SECTIONS if not sections[k]]
    summary["unfused_sections"] = sorted({*old_s.get("unfused_sections", []), *new_s["unfused_sections"]})
    summary["measured_at_commit"] = new_s["measured_at_commit"]
    summary["section_commits"] = {**old_s.get("section_commits", {}), **new_s["section_commits"]}
    dates = {**old.get("section_dates", {}), **new["section_dates"]}
    return {**new, "date": max((d for d in dates.values() if d), default=None), "section_dates": dates,
            "summary": summary, "sections": sections}


# summary.tree's keys of the sections measured apart from tree_b1 end in these tags
TREE_TAGS = {"tree_t07": "_t07", "tree_b4": "_b4"}


def merge_tree(old: dict[str, Any], new: dict[str, Any], ran: set[str]) -> dict[str, Any]:
    """``summary.tree`` of a run laid over the committed one: the keys of a tree section this
    run did not measure again (``_t07``, ``_b4``; tree_b1's have no tag) keep their committed
    values, and the goals are judged over the merged keys."""
    from flashspec_bench.arm_summary import tree_goals

    out = dict(new)
    not_measured = dict(new.get("not_measured", {}))
    tags = tuple(TREE_TAGS.values())
    for section in TREE_SECTIONS:
        if section in ran or section in old.get("not_measured", {}):
            continue
        tag = TREE_TAGS.get(section)
        out |= {k: v for k, v in old.items()
                if (k.endswith(tag) if tag else not k.endswith(tags) and k not in ("not_measured", "goals"))}
        not_measured.pop(section, None)
    out["not_measured"] = not_measured
    out["goals"] = tree_goals(out)
    return out


# summary.batch_sweep.config's entries keyed by batch size
SWEEP_CONFIG_BY_BATCH = ("prompts_per_domain", "bandit", "repeats")


def merge_sweep(old: dict[str, Any], new: dict[str, Any], ran: set[str], suffix_b1: float | None) -> dict[str, Any]:
    """``summary.batch_sweep`` of a run laid over the committed one: a batch size whose section
    this run did not measure again keeps its committed row, ``against_fixed`` entry and config
    entries (``summary.section_commits`` says which commit measured it); the goals are judged
    over every batch size then present."""
    by_batch = {b: v for b, v in new.items() if b.isdigit()}
    fixed = dict(new.get("against_fixed", {}))
    not_measured = dict(new.get("not_measured", {}))
    config = dict(new.get("config") or old.get("config") or {})
    per = {k: dict(config.get(k, {})) for k in SWEEP_CONFIG_BY_BATCH}
    for section in SWEEP_SECTIONS:
        b = section.removeprefix("sweep_b")
        if section in ran or b not in old:
            continue
        by_batch[b] = old[b]
        fixed[b] = (old.get("against_fixed") or {}).get(b)
        for k in SWEEP_CONFIG_BY_BATCH:
            if b in (old.get("config") or {}).get(k, {}):
                per[k][b] = old["config"][k][b]
        not_measured.pop(section, None)
    out: dict[str, Any] = {**_by_size(by_batch), "against_fixed": _by_size(fixed), "not_measured": not_measured}
    if config:
        out["config"] = {**config, **{k: _by_size(v) for k, v in per.items()}}
    out["goals"] = sweep_goals(out, suffix_b1)
    return out


def _by_size(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` (keyed by batch size) in increasing batch size."""
    return dict(sorted(d.items(), key=lambda kv: int(kv[0])))


def load_raw(path: Path = RAW) -> dict[str, Any]:
    """The raw file ``summarize`` wrote: ``{"summary": ..., "sections": {name: bench.json}}``."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no raw e2e file; `python benchmarks/e2e_h200.py summarize` writes it")
    with gzip.open(path, "rt") as f:
        return json.load(f)


def summarize_main(args: argparse.Namespace) -> int:
    """``e2e_h200.py summarize``."""
    other = dict(x.split("=", 1) for x in args.section_commit)
    print(json.dumps(summarize(args.src, args.out, args.commit, other, args.raw, args.merge), indent=1))
    return 0
