"""End-to-end benchmark on one H200: writes docs/benchmarks/e2e-h200.json (into --out).

    python benchmarks/e2e_h200.py smoke --out DIR          # tiny + random-shape checks (~1 min)
    python benchmarks/e2e_h200.py full --gguf DIR --out DIR --budget 480

``full`` converts the carried GGUF files once to bf16 safetensors under /tmp, then runs
``flashspec bench`` sections in priority order, each with what is left of the budget:
(1) real pair, batch 1, greedy, every system; (2) batch 8 greedy; (3) batch 1 at
temperature 0.7; (4) labelled-synthetic scaling with Qwen2.5-7B/14B/32B layer shapes.
A section that does not fit is skipped and recorded as skipped, never estimated.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "workloads" / "mixed.jsonl"
DOMAINS = ROOT / "benchmarks" / "workloads" / "domains.jsonl"  # 60 prompts: enough rows for batch 32
# The bandits' batch rule (fixed arms run without it: flashspec_fast.bench), as in default.toml. The batched
# sections b2/b4/b8/b32_greedy run with LIMIT_4 (what the bandits do when they may speculate at up to four
# rows: at batch 2 and 4 they lost, which set the default to 1); b2_limited and b4_limited run the default.
SPECULATE_MAX_BATCH = 1
LIMIT_4 = 4
MODELS = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}

def fast_table(model: str, max_len: int, fuse: bool, attention: str) -> str:
    return (f'use = "fast"\nmodel = "{model}"\ndtype = "bf16"\nmax_len = {max_len}\nfuse = {str(fuse).lower()}\n'
            f'attention = "{attention}"\n')


def pipeline_toml(paths: dict[str, str], draft_gammas: list[int], lookup_gamma: int, verifier: str, max_len: int,
                  fuse: bool, adaptive: bool = False, limit: int = SPECULATE_MAX_BATCH, gated: bool = False,
                  every: bool = False, attention: str = "auto", padded: bool = True,
                  reward: str = "throughput") -> str:
    """The bench config: the 0.5B draft at each gamma, padded and match-only prompt lookup,
    match-only lookup falling back to the first draft, no speculation, Thompson sampling
    with the throughput reward. ``adaptive``: only the two lookup-first arms to choose from
    (match-only lookup, and the same falling back to the first draft, which is
    ``select = false``): the choice is then whether to draft where lookup finds nothing.
    ``gated``: match-only lookup as ``[selector] first``, and the selector choosing, only where
    it finds nothing, between the first draft and no draft: the same two fixed policies as
    ``adaptive``, but the selector learns from the steps where its choice made a difference;
    with ``every``, the selector chooses among every draft gamma, padded lookup and no draft;
    ``adaptive`` with ``every``: match-only lookup falling back to nothing or to the draft at
    each gamma (issue 5's arm set with lookup first in every arm); ``padded = False`` leaves
    padded lookup out of ``gated`` with ``every`` (behind match-only lookup it pads where
    nothing matched). Arms of one draft at several gammas share its model and cache.
    ``reward``: the selector's reward (``throughput``, or ``acceptance``, the fraction of
    each proposal the target accepted).
    All stop speculating above ``limit`` live rows; ``attention`` is every fast model's
    (``sdpa`` turns both Triton kernels off)."""
    g, d = lookup_gamma, draft_gammas[0]

    def draft(gamma: int) -> str:
        return f"[[arm]]\n{fast_table(paths['draft'], max_len, fuse, attention)}gamma = {gamma}\nname = \"draft0.5b-g{gamma}\"\n"

    match = f'[[arm]]\nuse = "prompt_lookup"\ngamma = {g}\nmin_ngram = 2\nfill = false\n'
    lookup_first = [f'{match}name = "lookup-match-g{g}"\n',  # and the same with the draft where lookup finds nothing:
                    f'{match}fallback = "draft0.5b-g{d}"\nname = "lookup-match-g{g}-or-draft0.5b-g{d}"\n']
    first = ""
    padded_arm = f'[[arm]]\nuse = "prompt_lookup"\ngamma = {g}\nname = "lookup-g{g}"\n'
    none = '[[arm]]\nuse = "none"\nname = "none"\n'
    if gated:
        chosen = [*map(draft, draft_gammas), *([padded_arm] if padded else [])] if every else [draft(d)]
        arms = [f'{match}name = "lookup-match-g{g}"\nselect = false\n', *chosen, none]
        first = f'first = "lookup-match-g{g}"\n'
    elif adaptive and every:  # lookup first in every arm, then no draft or the draft at each gamma
        arms = [lookup_first[0], *(f'{match}fallback = "draft0.5b-g{x}"\nname = "lookup-match-g{g}-or-draft0.5b-g{x}"\n'
                                   for x in draft_gammas), *(f"{draft(x)}select = false\n" for x in draft_gammas)]
    elif adaptive:
        arms = [*lookup_first, f"{draft(d)}select = false\n"]
    else:
        arms = [*map(draft, draft_gammas), padded_arm, *lookup_first, none]
    return (f"[target]\n{fast_table(paths['target'], max_len, fuse, attention)}\n" + "\n".join(arms)
            + f'\n[verifier]\nuse = "{verifier}"\n\n[selector]\nuse = "thompson"\nreward = "{reward}"\n'
            + f"speculate_max_batch = {limit}\n{first}")


def say(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def convert(gguf_dir: Path, dest: Path, roles: tuple[str, ...] = ("target", "draft")) -> dict[str, str]:
    """GGUF (Q4_K_M) -> dense bf16 safetensors, once per machine (reloads in about a second)."""
    from flashspec_models.weights import KNOWN_MODELS, _convert

    out = {}
    for role, name in MODELS.items():
        target = dest / f"{name}-bf16"
        if role in roles and not (target / "model.safetensors").is_file():
            t0 = time.perf_counter()
            gguf = gguf_dir / KNOWN_MODELS[name].gguf_file
            tmp = dest / f"{name}-bf16.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            _convert(gguf, tmp, "bfloat16", progress=False)
            tmp.rename(target)
            say(f"converted {name} in {time.perf_counter() - t0:.0f} s")
        out[role] = str(target)
    return out


def bench(out: Path, config: Path, deadline: float, *extra: str, workload: Path = WORKLOAD) -> dict[str, Any] | None:
    left = deadline - time.time()
    if left < 30:
        say(f"skipped {out.name}: {left:.0f} s left")
        return None
    cmd = [
        sys.executable,
        "-m",
        "flashspec_fast.bench",
        "--workload",
        str(workload),
        "--config",
        str(config),
        "--out",
        str(out),
        "--deadline",
        str(max(left - 60, 10)),
        *extra,
    ]
    say(" ".join(cmd[2:]))
    try:
        subprocess.run(cmd, check=False, timeout=left)
    except subprocess.TimeoutExpired:
        say(f"{out.name}: killed at the deadline")
    path = out / "bench.json"
    return json.loads(path.read_text()) if path.is_file() else None


def convert_only(args: argparse.Namespace) -> int:
    convert(args.gguf, Path("/tmp/fsbf16"), tuple(args.which.split(",")))
    return 0


def full(args: argparse.Namespace) -> int:
    runnable = [s for s in SECTIONS if s != "b1_greedy_warm"]  # that one is b1_greedy run again with --bench-extra
    unknown = set(args.sections.split(",")) - set(runnable) - {"all", "none"}
    if unknown:  # before the minutes of GGUF conversion
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(runnable)}, all, none")
    deadline = time.time() + args.budget
    paths = convert(args.gguf, Path("/tmp/fsbf16"))

    def config(name: str, gammas: list[int], lookup: int, max_len: int, **kw: Any) -> Path:
        path = Path(f"/tmp/fs_{name}.toml")
        path.write_text(pipeline_toml(paths, gammas, lookup, args.verifier, max_len, args.fuse,
                                      attention=args.attention, **kw))
        return path

    b1 = config("e2e", [3, 5], 6, 768)
    config_of = dict.fromkeys(SECTIONS, b1)  # each section's config; b1_greedy's unless named below
    config_of |= dict.fromkeys(("b2_greedy", "b4_greedy", "b8_greedy", "b32_greedy"),
                               config("e2e_limit4", [3, 5], 6, 768, limit=LIMIT_4))
    # issue 6's arms, as in benchmarks/bandit_workload.py
    config_of |= dict.fromkeys(("workload_interleaved", "workload_blocked"), config("workload", [3, 6], 8, 1024))
    # the same, reduced to the two lookup-first arms
    config_of |= dict.fromkeys(("b1_adaptive", "workload_adaptive", "workload_adaptive_blocked"),
                               config("adaptive", [3, 6], 8, 1024, adaptive=True))
    # the same two policies, the selector asked only where lookup finds nothing
    config_of |= dict.fromkeys(("b1_gated", "workload_gated", "workload_gated_blocked"),
                               config("gated", [3, 6], 8, 1024, gated=True))
    # b1_greedy's arms, with match-only lookup first
    config_of["b1_gated_every"] = config("gated_every", [3, 5], 6, 768, gated=True, every=True)
    # b1_adaptive's design over the draft at two gammas: lookup, else no draft, the draft at gamma 3 or at 5
    config_of["b1_adaptive_gammas"] = config("adaptive_gammas", [3, 5], 8, 1024, adaptive=True, every=True)
    # issue 5's arm set behind match-only lookup with the short proposals that pay where one draft
    # forward costs about half a target step (d80005c: 1.05 ms against 1.74 ms): gamma 1, 2 and 3
    config_of |= dict.fromkeys(SMALL_GAMMA_SECTIONS, config("gated_small", list(SMALL_GAMMAS), 8, 1024, gated=True,
                                                            every=True, padded=False))
    # the same fed the acceptance fraction, which the replay ranks above throughput on this design
    config_of["workload_gated_small_acc"] = config("gated_small_acc", list(SMALL_GAMMAS), 8, 1024, gated=True,
                                                   every=True, padded=False, reward="acceptance")
    work = args.out  # each section's bench.json lands in --out/<section>/ as soon as it is written
    sections: dict[str, Any] = {}
    limit = ["--prompts", str(args.prompts)] if args.prompts else []
    common = ["--max-new-tokens", str(args.max_new_tokens), *limit]
    fuse = ["--fuse"] if args.fuse else []
    sel = ["--selectors", args.selectors] if args.selectors else []
    # the three-repeat designs: batch 1 on mixed.jsonl; issue 6's workload interleaved with its fixed
    # policies and target-only, and blocked with the bandits alone
    b1_three = [*common, "--systems", "flashspec,target_only", "--repeats", "3", *sel, *fuse]
    interleaved_three = ["--max-new-tokens", "48", *limit, "--order", "interleaved", "--systems",
                         "flashspec,target_only", "--repeats", "3", *sel, *fuse]
    blocked_three = ["--max-new-tokens", "48", *limit, "--systems", "flashspec", "--no-fixed-arms", "--repeats", "3",
                     *sel, *fuse]
    plan = {
        "b1_greedy": [*common, "--hf-prompts", str(args.hf_prompts), "--exactness", "2", *sel, *fuse],
        "b1_adaptive": b1_three,
        "b1_adaptive_gammas": b1_three,
        "b1_gated": b1_three,
        # issue 5's arm set (the draft at two gammas, padded lookup, none) behind match-only lookup
        "b1_gated_every": [*common, "--systems", "flashspec,target_only", "--repeats", "4", *sel, *fuse],
        # batch 2 and 4 place [selector] speculate_max_batch: where does a fixed arm stop paying?
        "b2_greedy": [*common, "--batch-size", "2", "--systems", "flashspec,target_only", "--repeats", "3", *sel, *fuse],
        "b4_greedy": [*common, "--batch-size", "4", "--systems", "flashspec,target_only", "--repeats", "3", *sel, *fuse],
        # the same batches under the default rule: the bandits only, against target-only
        "b2_limited": [*common, "--batch-size", "2", "--systems", "flashspec,target_only", "--no-fixed-arms",
                       "--repeats", "3", *sel, *fuse],
        "b4_limited": [*common, "--batch-size", "4", "--systems", "flashspec,target_only", "--no-fixed-arms",
                       "--repeats", "3", *sel, *fuse],
        "b8_greedy": [*common, "--batch-size", "8", "--systems", "flashspec,target_only,hf_eager", "--hf-prompts", "8",
                      "--repeats", "3", *sel, *fuse],  # one or two batches: repeats, in alternating order
        "b32_greedy": [*common, "--batch-size", "32", "--prompts", "32", "--systems", "flashspec,target_only",
                       "--no-fixed-arms", "--repeats", "5", *sel, *fuse],
        # batch 8 and 32 under the default rule: does the limit keep the bandits at target-only's throughput?
        "b8_limited": [*common, "--batch-size", "8", "--systems", "flashspec,target_only", "--no-fixed-arms",
                       "--repeats", "5", *sel, *fuse],  # 3 at ed12466: 0.963x on identical plain steps
        "b32_limited": [*common, "--batch-size", "32", "--prompts", "32", "--systems", "flashspec,target_only",
                        "--no-fixed-arms", "--repeats", "5", *sel, *fuse],
        "b1_t07": [*common, "--temperature", "0.7", "--systems", "flashspec,target_only", *sel, *fuse],
        "b1_nf4": [*common, "--quantization", "nf4", "--systems", "flashspec,target_only", "--prompts", "4",
                   "--no-fixed-arms", *fuse],
        "workload_interleaved": ["--max-new-tokens", "48", *limit, "--order", "interleaved", "--systems", "flashspec,target_only",
                                 *sel, *fuse],
        "workload_blocked": ["--max-new-tokens", "48", *limit, "--systems", "flashspec", "--no-fixed-arms", *sel, *fuse],
        # three repeats each: the spread between repeats against the gaps between policies
        "workload_adaptive": interleaved_three,
        "workload_adaptive_blocked": blocked_three,
        "workload_gated": interleaved_three,
        "workload_gated_blocked": blocked_three,
        "b1_gated_small": b1_three,
        "workload_gated_small": interleaved_three,
        "workload_gated_small_blocked": blocked_three,
        "workload_gated_small_acc": interleaved_three,
        "synthetic": ["--systems", "", "--synthetic-shapes", "qwen2.5-7b,qwen2.5-14b,qwen2.5-32b",
                      "--synthetic-acceptance", "0.6,0.8", "--synthetic-gammas", "4", *fuse],
    }
    for name, extra in plan.items():
        if args.sections == "all" or name in args.sections.split(","):
            domains = name.startswith(("b32", "workload"))
            sections[name] = bench(work / name, config_of[name], deadline, *extra, *args.bench_extra.split(),
                                   workload=DOMAINS if domains else WORKLOAD)
            write(args.out, sections, work)
    write(args.out, sections, work)
    return 0


def write(out: Path, sections: dict[str, Any], work: Path) -> None:
    """The sections run so far, with the summary ``summarize`` would build (a look while the
    run goes on: the committed file comes from ``summarize`` over the sections' folders)."""
    summary = build_summary({k: sections.get(k) for k in SECTIONS if k in sections}, "unknown (the GPU copy)", {})
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e-h200.json").write_text(json.dumps({"summary": summary, "sections": sections}, indent=1))
    say(f"wrote {out / 'e2e-h200.json'}")
    print(json.dumps(summary, indent=1)[:6000])


def floor_table(bench: dict[str, Any]) -> list[dict[str, Any]]:
    """Measured step time next to the bandwidth-bound one, per configuration.

    floor = bytes read per step (weights + the KV slots attended, per forward: ``floor``'s
    ``*_bytes`` fields) / the copy bandwidth measured in the same run (reads + writes)."""
    bw = bench.get("bandwidth_bytes_per_s")
    fl = bench.get("floor") or {}
    if not bw or "target_forward_bytes" not in fl:
        return []
    target_ms = fl["target_forward_bytes"] / bw * 1e3
    rows = []
    for name, s in bench["summaries"].items():
        if not s.get("step_ms_p50") or name.startswith("bandit"):
            continue
        arm = name.removeprefix("fixed:")
        draft_bytes = (fl["arms"].get(arm) or {}).get("draft_forward_bytes")
        gamma = next(iter(s["arms"].values()))["gamma"] if s.get("arms") else 0
        if draft_bytes is None and (fl["arms"].get(arm) or {}).get("draft_forward_floor_ms") is not None:
            draft_bytes = fl["arms"][arm]["draft_forward_floor_ms"] / 1e3 * bw / 2  # bench at e167dbf stored ms at bw/2
        step = target_ms + gamma * (draft_bytes or 0) / bw * 1e3
        rows.append({"config": name, "gamma": gamma, "measured_step_ms_p50": s["step_ms_p50"],
                     "floor_step_ms": step, "measured_over_floor": s["step_ms_p50"] / step,
                     "mean_accepted_length": s["mean_accepted_length"],
                     "floor_tokens_per_s": s["mean_accepted_length"] / step * 1e3,
                     "measured_tokens_per_s": s["tokens_per_s"]})
    return rows


# sections whose own summary goes into summary[<section>] (b1_greedy's is the summary itself)
SUMMARIZED = ("b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b1_gated_small", "b2_greedy", "b4_greedy", "b2_limited", "b4_limited", "b8_greedy", "b32_greedy",
              "b8_limited", "b32_limited", "b1_t07",
              "b1_nf4")
# the bandits each section runs besides its config's (Thompson): the docs compare every one
MORE_SELECTORS = ("ucb1", "sliding_window_ucb", "request_thompson", "glr_thompson", "discounted_thompson")
SECTIONS = ("b1_greedy", "b1_adaptive", "b1_adaptive_gammas", "b1_gated", "b1_gated_every", "b2_greedy", "b4_greedy", "b2_limited", "b4_limited", "b8_greedy",
            "b32_greedy", "b8_limited", "b32_limited", "b1_t07", "b1_nf4", "synthetic", "workload_interleaved", "workload_blocked", "workload_adaptive",
            "workload_adaptive_blocked", "workload_gated", "workload_gated_blocked", "b1_gated_small",
            "workload_gated_small", "workload_gated_small_blocked", "workload_gated_small_acc", "b1_greedy_warm")
SMALL_GAMMAS = (1, 2, 3)  # the draft gammas of the *_gated_small sections
SMALL_GAMMA_SECTIONS = ("b1_gated_small", "workload_gated_small", "workload_gated_small_blocked")
# b1_greedy_warm: b1_greedy's FlashSpec systems again (`--bench-extra "--systems flashspec,target_only
# --exactness 0"`) where the section itself ran with a one-batch warm-up.


def cold(section: dict[str, Any]) -> bool:
    """Timed with a one-batch warm-up (bench before --warmup -1): the capture and compile of a
    shape first met later (a longer prompt's prefill width, a new attention span) ran inside
    the timed run."""
    return int(section.get("args", {}).get("warmup", 1)) >= 0


def warm_b1(warm: dict[str, Any], cold_b1: dict[str, Any]) -> dict[str, Any]:
    """Batch-1 greedy with every shape captured before timing; HF rates from the cold section
    (a separate run on the same kind of GPU; HF eager has no captures, HF compiled warms up on
    its own batches), over the prompts the HF systems ran."""
    from flashspec_fast.bench import summarize_run

    s, runs = warm["summaries"], warm["runs"]
    spec = [n for n in s if n.startswith(("fixed:", "bandit:")) and s[n].get("tokens_per_s")]
    plain = s["target_only"]["tokens_per_s"]
    best = max(spec, key=lambda n: s[n]["tokens_per_s"])
    out: dict[str, Any] = {
        "label": "batch 1, greedy, 128 new tokens, every batch warmed up before timing",
        "tokens_per_s": {n: v["tokens_per_s"] for n, v in s.items() if v.get("tokens_per_s")},
        "best_flashspec": best, "best_flashspec_tokens_per_s": s[best]["tokens_per_s"],
        "speedup_vs_own_target_only": {n: s[n]["tokens_per_s"] / plain for n in spec},
        "outside_steps_ms_per_request": {n: v.get("outside_steps_ms_per_batch") for n, v in s.items()},
    }
    hf = {n: v for n, v in (cold_b1 or {}).get("summaries", {}).items() if n.startswith("hf_") and v.get("tokens_per_s")}
    if hf:
        some = next(iter(hf))
        common = {r["prompt"] for r in cold_b1["runs"][some]["requests"]}
        mine = {n: summarize_run({"requests": [r for r in runs[n]["requests"] if set(r["batch"]) <= common]})
                for n in [*spec, "target_only"]}
        out["hf_cross_run"] = {
            "prompts": sorted(common),
            "hf_tokens_per_s": {n: v["tokens_per_s"] for n, v in hf.items()},
            "flashspec_tokens_per_s_on_those_prompts": {n: m["tokens_per_s"] for n, m in mine.items()},
            "best_over_hf": {h: max(m["tokens_per_s"] for n, m in mine.items() if n != "target_only") / v["tokens_per_s"]
                             for h, v in hf.items()},
            "target_only_over_hf": {h: mine["target_only"]["tokens_per_s"] / v["tokens_per_s"] for h, v in hf.items()},
        }
    return out


def slim(section: dict[str, Any]) -> dict[str, Any]:
    """A section without its per-step rows and generated tokens (those go to the raw file)."""
    out = {k: v for k, v in section.items() if k != "runs"}
    out["runs"] = {n: {"requests": [{k: v for k, v in r.items() if k != "tokens"} for r in run.get("requests", [])]}
                   for n, run in section.get("runs", {}).items()}
    return out


def workload_summary(inter: dict[str, Any] | None, blocked: dict[str, Any] | None) -> dict[str, Any] | None:
    """Issue 6 on the GPU: measured tokens/s per policy and domain, and the per-domain oracle.

    The oracle serves each domain with its best fixed arm (chosen after the fact): its
    tokens/s is all tokens over the summed time each domain's tokens take at that arm's
    measured per-domain rate. Fixed arms do not depend on the order, so both orders
    share them."""
    if not inter:
        return None
    from flashspec_fast.bench import by_domain

    def tally(run: dict[str, Any]) -> tuple[dict[str, float], dict[str, int]]:
        tokens: dict[str, int] = {}
        for r in run["requests"]:
            tokens[r["domain"]] = tokens.get(r["domain"], 0) + r["new_tokens"]
        return by_domain(run), tokens

    policies: dict[str, Any] = {}
    for order, sec in (("interleaved", inter), ("blocked", blocked)):
        for name, run in (sec or {}).get("runs", {}).items():
            if not run.get("requests") or (order == "blocked" and not name.startswith("bandit")):
                continue
            rates, _ = tally(run)
            s = sec["summaries"][name]
            key = name if not name.startswith("bandit") else f"{name}@{order}"
            policies[key] = {"tps": s["tokens_per_s"], "per_domain": rates,
                             "mean_accepted_length": s.get("mean_accepted_length"),
                             "tps_by_repeat": s.get("tokens_per_s_by_repeat")}
    fixed = {k: v for k, v in policies.items() if k.startswith("fixed:") or k == "target_only"}
    _, tokens = tally(inter["runs"]["target_only"])
    oracle_arm = {d: max(fixed, key=lambda k: fixed[k]["per_domain"].get(d, 0.0)) for d in tokens}
    oracle_time = sum(n / fixed[oracle_arm[d]]["per_domain"][d] for d, n in tokens.items())
    oracle = sum(tokens.values()) / oracle_time
    bandits = {k: v for k, v in policies.items() if k.startswith("bandit")}
    best_sel = max(bandits, key=lambda k: bandits[k]["tps"]) if bandits else None
    best_fixed = max(fixed, key=lambda k: fixed[k]["tps"])
    return {
        "label": "measured end to end on the H200 (flashspec bench, batch 1, greedy, 48 new tokens, bf16)",
        "best_selector": best_sel, "best_selector_tps": bandits[best_sel]["tps"] if best_sel else None,
        "best_fixed": best_fixed, "best_fixed_tps": fixed[best_fixed]["tps"],
        "oracle_tps": oracle, "oracle_arms": oracle_arm,
        "selector_vs_oracle": bandits[best_sel]["tps"] / oracle if best_sel else None,
        "selector_vs_best_fixed": bandits[best_sel]["tps"] / fixed[best_fixed]["tps"] if best_sel else None,
        "policies": policies,
    }


def summarize_dir(args: argparse.Namespace) -> int:
    """Rebuild e2e-h200.json (+ plots) from the sections a ``full`` run left in --from."""
    sections = {k: (json.loads((args.src / k / "bench.json").read_text()) if (args.src / k / "bench.json").is_file()
                    else None) for k in SECTIONS}
    from flashspec_fast.bench import summarize_run

    for sec in sections.values():  # recomputed from the raw rows, so newer summary fields appear too
        if sec:
            sec["summaries"] = {n: summarize_run(r) if r["requests"] else sec["summaries"][n] for n, r in sec["runs"].items()}
    other = dict(x.split("=", 1) for x in args.section_commit)
    unknown = set(other) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"--section-commit: unknown sections {sorted(unknown)}")
    summary = build_summary(sections, args.commit, other)
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / "e2e-h200-raw.json.gz"
    with gzip.open(raw, "wt") as f:  # every step row and generated token of every section
        json.dump({"summary": summary, "sections": sections}, f)
    slim_sections = {k: (slim(v) if v else v) for k, v in sections.items()}
    (args.out / "e2e-h200.json").write_text(json.dumps(
        {"summary": summary, "raw": raw.name, "sections": slim_sections}, indent=1))
    for png in sorted((args.src / "b1_greedy").glob("*.png")):
        shutil.copy(png, args.out / f"e2e-h200-{png.name}")
    print(json.dumps(summary, indent=1))
    return 0


GOAL_EVERY_DOMAIN, GOAL_CODE = 1.0, 1.2  # issue 5: the bandit's tokens/s over own target-only, batch 1, greedy


def bandit_goal(summary: dict[str, Any]) -> dict[str, Any]:
    """Issue 5's bandit goal checked in every batch-1 greedy section that ran bandits: the
    selectors whose tokens/s over own target-only is at least 1.0 on every domain and 1.2
    on code (each section's ``bandit_speedup_by_domain_all``, pooled over its repeats)."""
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


def build_summary(sections: dict[str, Any], commit: str, section_commits: dict[str, str]) -> dict[str, Any]:
    """The ``summary`` object from the sections (those absent or None were not run):
    b1_greedy's headline fields, each SUMMARIZED section's own summary, the workloads, and
    what ran where (``section_commits`` names sections measured at another commit than
    ``commit``)."""
    sections = {k: sections.get(k) for k in SECTIONS} | sections
    b1 = sections["b1_greedy"] or {}
    summary: dict[str, Any] = {k: v for k, v in (b1.get("summary") or {}).items()}
    summary["label"] = "real pair: Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft (bf16, dequantized Q4_K_M GGUF)"
    if b1:
        s = b1["summaries"]
        summary["tokens_per_s"] = {n: v["tokens_per_s"] for n, v in s.items() if v.get("tokens_per_s")}
        summary["outside_steps_ms_per_request"] = {n: v.get("outside_steps_ms_per_batch") for n, v in s.items()}
        summary["floor"] = floor_table(b1)
        div = [r for rows in (b1.get("bf16_divergence") or {}).values() for r in rows]
        hit = [r for r in div if r.get("top2_gap") is not None]
        summary["bf16_divergence"] = {
            "prompt_runs": len(div), "diverged": sum(r["first_divergence"] is not None for r in div),
            "max_top2_gap_over_bf16_spacing": max((r["top2_gap"] / r["bf16_spacing"] for r in hit), default=None)}
        summary["not_measured"] = sorted(
            [k for k, v in s.items() if v.get("error")] +
            [f"{x} (skipped: run budget)" for x in ("hf_eager", "hf_compiled", "hf_assisted", "hf_lookup")
             if x not in s] + (["greedy_identical (float32 check skipped: run budget)"] if "exactness" not in b1 else []))
    for key in SUMMARIZED:
        if sections[key]:
            summary[key] = sections[key]["summary"]
    if sections["synthetic"] and sections["synthetic"].get("synthetic_scaling"):
        summary["scaling_synthetic"] = sections["synthetic"]["synthetic_scaling"]
    workload = workload_summary(sections["workload_interleaved"], sections["workload_blocked"])
    if workload:
        summary["workload_gpu"] = workload
    adaptive = workload_summary(sections["workload_adaptive"], sections["workload_adaptive_blocked"])
    if adaptive:
        adaptive["label"] += "; arms: match-only lookup, and the same falling back to the 0.5B draft (select = false)"
        if workload and adaptive["best_selector"] and not cold(sections["workload_interleaved"]):  # every arm
            adaptive["selector_vs_all_arms_oracle"] = adaptive["best_selector_tps"] / workload["oracle_tps"]
            adaptive["selector_vs_all_arms_best_fixed"] = adaptive["best_selector_tps"] / workload["best_fixed_tps"]
        summary["workload_gpu_adaptive"] = adaptive
    gated = workload_summary(sections["workload_gated"], sections["workload_gated_blocked"])
    if gated:
        gated["label"] += ("; match-only lookup first ([selector] first), the selector choosing between the 0.5B "
                           "draft and no draft only where it finds nothing")
        summary["workload_gpu_gated"] = gated
    small = workload_summary(sections["workload_gated_small"], sections["workload_gated_small_blocked"])
    if small:
        small["label"] += ("; match-only lookup first ([selector] first), the selector choosing among the 0.5B draft at "
                           f"gamma {', '.join(map(str, SMALL_GAMMAS))} and no draft where it finds nothing")
        summary["workload_gpu_gated_small"] = small
    acc = workload_summary(sections["workload_gated_small_acc"], None)
    if acc:
        acc["label"] += "; as workload_gpu_gated_small, interleaved, the selectors fed the acceptance reward"
        summary["workload_gpu_gated_small_acc"] = acc
    summary["bandit_goal"] = bandit_goal(summary)
    if sections["b1_greedy_warm"]:
        summary["b1_greedy_warm"] = warm_b1(sections["b1_greedy_warm"], b1)
    summary["cold_sections"] = [k for k, v in sections.items() if v is not None and cold(v)]
    if summary["cold_sections"]:
        summary["cold_note"] = ("sections timed after a one-batch warm-up: a capture or compile of a shape first met "
                                "later fell inside their timed runs; b1_greedy_warm repeats b1_greedy's FlashSpec "
                                "systems warmed on every batch")
    warm_b1_ran = bool(sections["b1_greedy"]) and not cold(sections["b1_greedy"])
    summary["skipped_sections"] = [k for k, v in sections.items()
                                   if v is None and not (k == "b1_greedy_warm" and warm_b1_ran)]
    summary["unfused_sections"] = [k for k, v in sections.items() if v is not None and not v["args"].get("fuse")]
    summary["measured_at_commit"] = commit
    summary["section_commits"] = {k: section_commits.get(k, commit) for k, v in sections.items() if v is not None}
    return summary


def smoke(args: argparse.Namespace) -> int:
    """Graph-captured fast path on random 1.5B/0.5B shapes vs eager, and HF compile on a tiny model."""
    import torch

    from flashspec_core.pipeline import Arm, NoDraft, Pipeline
    from flashspec_core.rewards import make_reward
    from flashspec_fast.bench import Always, prewarm_drafts, run_pipeline, summarize_run
    from flashspec_fast.draft import FastDraft
    from flashspec_fast.options import FastOptions, build_model
    from flashspec_fast.synthetic import SyntheticVerifier
    from flashspec_fast.target import FastTarget

    res: dict[str, Any] = {}
    prompts = [list(range(100, 164)), list(range(200, 250))]
    ns = argparse.Namespace(max_new_tokens=64, temperature=0.0, seed=0, no_prewarm=False)
    for fuse in (True,) if args.quick else (False, True):
        topts = FastOptions(model="shape:qwen2.5-1.5b", dtype="bf16", max_len=512, fuse=fuse)
        dopts = FastOptions(model="shape:qwen2.5-0.5b", dtype="bf16", max_len=512, fuse=fuse)
        target = FastTarget(build_model(topts)[0], None, None, topts)
        draft = FastDraft(build_model(dopts)[0], target.vocab, dopts)
        for name, arms, ver in (
            ("target_only", [Arm("none", NoDraft(), 0)], SyntheticVerifier(1.0)),
            ("spec_g4_a0.8", [Arm("d", draft, 4)], SyntheticVerifier(0.8)),
        ):
            pipe = Pipeline(target, arms, ver, Always(0, 1), make_reward("acceptance"))
            if arms[0].gamma:  # the bench's own prewarm, at the batch size the runs below use (1)
                res[f"fuse={fuse}:draft_prewarm"] = prewarm_drafts(pipe, [[0], [1]], ns)
            run_pipeline(pipe, prompts, [[0]], ns, ["x", "x"])
            s = summarize_run(run_pipeline(pipe, prompts, [[0], [1]], ns, ["x", "x"]))
            res[f"fuse={fuse}:{name}"] = {
                k: s.get(k) for k in ("tokens_per_s", "step_ms_p50", "breakdown_ms", "host_fraction")
            }
            say(f"fuse={fuse} {name}: {res[f'fuse={fuse}:{name}']}")
        # graphs vs eager on the same random model and shapes: identical greedy tokens
        eager = FastTarget(target.model, None, None, FastOptions(model="shape:qwen2.5-1.5b", compile=False))
        a = Pipeline(
            target, [Arm("none", NoDraft(), 0)], SyntheticVerifier(1.0), Always(0, 1), make_reward("acceptance")
        )
        b = Pipeline(
            eager, [Arm("none", NoDraft(), 0)], SyntheticVerifier(1.0), Always(0, 1), make_reward("acceptance")
        )
        ta = a.generate([prompts[0]], max_new_tokens=32).token_ids
        tb = b.generate([prompts[0]], max_new_tokens=32).token_ids
        res[f"fuse={fuse}:graph_vs_eager_identical"] = ta == tb
        say(f"fuse={fuse} graphs vs eager identical: {ta == tb}")
        del target, draft, eager
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "smoke.json").write_text(json.dumps(res, indent=1))
    if not args.quick:
        tiny_bench(args.out)
    return 0


def tiny_bench(out: Path) -> None:
    """The bench on tiny models with the auto (Triton) verifier and HF's compiled baseline."""
    sys.path.insert(0, str(ROOT / "tests"))
    from _tiny import perturbed_lm, tiny_lm

    root = Path("/tmp/fs_tiny")
    target = tiny_lm(root / "target", vocab=16, seed=0, scale=8.0)
    draft = perturbed_lm(target, root / "draft", noise=0.05, seed=1)
    (root / "w.jsonl").write_text(
        '{"prompt": "t1 t2 t3 t4 t1 t2", "domain": "code"}\n{"prompt": "t5 t6", "domain": "prose"}\n'
    )
    arm = f'use = "fast"\nmodel = "{draft}"\ndtype = "float32"\nmax_len = 128\n'
    (root / "c.toml").write_text(
        f'[target]\nuse = "fast"\nmodel = "{target}"\ndtype = "float32"\nchat_template = false\nmax_len = 128\n'
        f'[[arm]]\n{arm}gamma = 3\nname = "g3"\n[[arm]]\nuse = "prompt_lookup"\ngamma = 4\nname = "lookup"\n'
        '[[arm]]\nuse = "none"\nname = "none"\n[selector]\nuse = "ucb1"\n'
    )
    from flashspec_fast.bench import main as bench_main

    bench_main(
        [
            "--workload",
            str(root / "w.jsonl"),
            "--config",
            str(root / "c.toml"),
            "--out",
            str(out / "tiny"),
            "--max-new-tokens",
            "16",
            "--systems",
            "flashspec,target_only,hf_eager,hf_compiled",
            "--exactness",
            "2",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("smoke")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--quick", action="store_true", help="fused random-shape timing only")
    f = sub.add_parser("full")
    f.add_argument("--gguf", type=Path, required=True, help="folder with the two GGUF files")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--budget", type=float, default=480, help="seconds for all sections")
    f.add_argument("--max-new-tokens", type=int, default=128)
    f.add_argument("--hf-prompts", type=int, default=4)
    f.add_argument("--prompts", type=int, default=0, help="only the first N prompts of each section (0: all)")
    f.add_argument("--bench-extra", default="", help="more `flashspec bench` arguments for every section, after "
                   "the section's own (a later option wins), e.g. \"--systems flashspec,target_only\"")
    f.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="the fast models' fused RMSNorm/SiLU ops (on by default: every committed section ran fused; --no-fuse measures the plain ops)")
    f.add_argument("--attention", choices=("auto", "sdpa", "triton"), default="auto",
                   help="the fast models' decoding attention and rotary kernels (sdpa: PyTorch only, a fallback)")
    f.add_argument("--verifier", default="auto", help="the config's verifier (auto: triton on CUDA)")
    f.add_argument("--selectors", default=",".join(MORE_SELECTORS),
                   help="more bandits to run besides the config's Thompson (bench --selectors; '' for none): by "
                        "default every other bundled selector, so each bandit section compares them all")
    f.add_argument("--sections", default="b1_greedy,b8_greedy,b32_greedy,b1_t07,b1_nf4,synthetic",
                   help=f"comma list of {','.join(s for s in SECTIONS if s != 'b1_greedy_warm')}, 'all', or 'none' "
                        "to convert only (split a run over several calls on a warm machine; /tmp/fsbf16 is reused)")
    c = sub.add_parser("convert", help="only convert (e.g. one model in the background while the other travels)")
    c.add_argument("--gguf", type=Path, required=True)
    c.add_argument("--which", default="target,draft", help="comma list of target,draft")
    m = sub.add_parser("summarize", help="rebuild e2e-h200.json from a full run's --out folder")
    m.add_argument("--from", dest="src", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--commit", required=True, help="the commit the run measured (the GPU copy has no .git)")
    m.add_argument("--section-commit", action="append", default=[], metavar="SECTION=SHA",
                   help="a section measured at another commit than --commit (sections merged from several runs)")
    return p


def main() -> int:
    args = build_parser().parse_args()
    return {"full": full, "smoke": smoke, "summarize": summarize_dir, "convert": convert_only}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
