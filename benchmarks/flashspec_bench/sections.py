"""The end-to-end benchmark on one H200, section by section (``benchmarks/e2e_h200.py``).

    python benchmarks/e2e_h200.py smoke --out DIR          # tiny + random-shape checks (~1 min)
    python benchmarks/e2e_h200.py full --gguf DIR --out DIR --budget 480
    python benchmarks/e2e_h200.py summarize --from DIR --out docs/benchmarks --commit SHA [--merge E2E_JSON]

``full`` converts the carried GGUF files once to bf16 safetensors under /tmp, then runs
``flashspec bench`` sections in priority order, each with what is left of the budget:
(1) real pair, batch 1, greedy, every system; (2) batch 8 greedy; (3) batch 1 at
temperature 0.7; (4) labelled-synthetic scaling with Qwen2.5-7B/14B/32B layer shapes.
A section that does not fit is skipped and recorded as skipped, never estimated.
``summarize`` (:func:`flashspec_bench.e2e.summarize`) writes the committed summary and the
raw rows to the ignored ``benchmarks/.results/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from flashspec_bench import arm_sections
from flashspec_bench.e2e import RAW, SECTIONS, SKIPPED, SMALL_GAMMAS, build_summary, summarize_main
from flashspec_bench.provenance import ROOT, logger, write_json
from flashspec_bench.runs import Always, run_pipeline, summarize_run

WORKLOAD = ROOT / "benchmarks" / "workloads" / "mixed.jsonl"
DOMAINS = ROOT / "benchmarks" / "workloads" / "domains.jsonl"  # 60 prompts: enough rows for batch 32
# The bandits' batch rule (fixed arms run without it), as in default.toml. The batched sections
# b2/b4/b8/b32_greedy run with LIMIT_4 (the bandits may speculate at up to four rows);
# b2_limited and b4_limited run the default.
SPECULATE_MAX_BATCH, LIMIT_4 = 1, 4
MODELS = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}
# the bandits each section runs besides its config's (Thompson): the docs compare every one
MORE_SELECTORS = ("ucb1", "sliding_window_ucb", "request_thompson", "glr_thompson", "discounted_thompson")
BF16 = Path("/tmp/fsbf16")
say = logger("e2e")


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
    ``select = false``). ``gated``: match-only lookup as ``[selector] first``, and the selector
    choosing, only where it finds nothing, between the first draft and no draft; with
    ``every``, among every draft gamma, padded lookup and no draft; ``adaptive`` with
    ``every``: match-only lookup falling back to nothing or to the draft at each gamma;
    ``padded = False`` leaves padded lookup out of ``gated`` with ``every``. ``reward``: the
    selector's reward. All stop speculating above ``limit`` live rows; ``attention`` is every
    fast model's (``sdpa`` turns both Triton kernels off)."""
    g, d = lookup_gamma, draft_gammas[0]

    def draft(gamma: int) -> str:
        return f"[[arm]]\n{fast_table(paths['draft'], max_len, fuse, attention)}gamma = {gamma}\nname = \"draft0.5b-g{gamma}\"\n"

    match = f'[[arm]]\nuse = "prompt_lookup"\ngamma = {g}\nmin_ngram = 2\nfill = false\n'

    def or_draft(x: int) -> str:  # match-only lookup, the draft at gamma x where it finds nothing
        return f'{match}fallback = "draft0.5b-g{x}"\nname = "lookup-match-g{g}-or-draft0.5b-g{x}"\n'

    only_match = f'{match}name = "lookup-match-g{g}"\n'
    padded_arm = f'[[arm]]\nuse = "prompt_lookup"\ngamma = {g}\nname = "lookup-g{g}"\n'
    none, first = '[[arm]]\nuse = "none"\nname = "none"\n', ""
    if gated:
        chosen = [*map(draft, draft_gammas), *([padded_arm] if padded else [])] if every else [draft(d)]
        arms = [f"{only_match}select = false\n", *chosen, none]
        first = f'first = "lookup-match-g{g}"\n'
    elif adaptive and every:
        arms = [only_match, *map(or_draft, draft_gammas), *(f"{draft(x)}select = false\n" for x in draft_gammas)]
    elif adaptive:
        arms = [only_match, or_draft(d), f"{draft(d)}select = false\n"]
    else:
        arms = [*map(draft, draft_gammas), padded_arm, only_match, or_draft(d), none]
    return (f"[target]\n{fast_table(paths['target'], max_len, fuse, attention)}\n" + "\n".join(arms)
            + f'\n[verifier]\nuse = "{verifier}"\n\n[selector]\nuse = "thompson"\nreward = "{reward}"\n'
            + f"speculate_max_batch = {limit}\n{first}")


def convert(gguf_dir: Path, dest: Path, roles: tuple[str, ...] = ("target", "draft")) -> dict[str, str]:
    """GGUF (Q4_K_M) -> dense bf16 safetensors, once per machine (reloads in about a second)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashspec_models.weights import KNOWN_MODELS

    out = {}
    for role, name in MODELS.items():
        target = dest / f"{name}-bf16"
        if role in roles and not (target / "model.safetensors").is_file():
            t0, gguf = time.perf_counter(), gguf_dir / KNOWN_MODELS[name].gguf_file
            tmp = dest / f"{name}-bf16.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
            model.hf_quantizer = None  # type: ignore[assignment]  # save_pretrained refuses a quantizer-loaded model; the weights are dense
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
            tmp.rename(target)
            say(f"converted {name} in {time.perf_counter() - t0:.0f} s")
        out[role] = str(target)
    return out


def bench(out: Path, config: Path, deadline: float, *extra: str, workload: Path = WORKLOAD) -> dict[str, Any] | None:
    """One section: ``flashspec bench`` in a child process, killed at the deadline."""
    left = deadline - time.time()
    if left < 30:
        say(f"skipped {out.name}: {left:.0f} s left")
        return None
    # the bench's own deadline leaves time to finish what it started (the float32 check, writing
    # bench.json) before the kill; a short section keeps most of its budget for timed runs
    margin = min(60.0, max(15.0, 0.15 * left))
    cmd = [sys.executable, "-m", "flashspec_bench.harness", "--workload", str(workload), "--config", str(config),
           "--out", str(out), "--deadline", str(max(left - margin, 10)), *extra]
    say(" ".join(cmd[2:]))
    try:
        subprocess.run(cmd, check=False, timeout=left)
    except subprocess.TimeoutExpired:
        say(f"{out.name}: killed at the deadline")
    path = out / "bench.json"
    return json.loads(path.read_text()) if path.is_file() else None


def configs(args: argparse.Namespace, paths: dict[str, str]) -> dict[str, Path]:
    """Each section's pipeline config (b1_greedy's unless named here), written under /tmp."""

    def config(name: str, gammas: list[int], lookup: int, max_len: int, **kw: Any) -> Path:
        path = Path(f"/tmp/fs_{name}.toml")
        path.write_text(pipeline_toml(paths, gammas, lookup, args.verifier, max_len, args.fuse,
                                      attention=args.attention, **kw))
        return path

    small = ("b1_gated_small", "workload_gated_small", "workload_gated_small_blocked")
    of = dict.fromkeys(SECTIONS, config("e2e", [3, 5], 6, 768))
    of |= dict.fromkeys(("b2_greedy", "b4_greedy", "b8_greedy", "b32_greedy"),
                        config("e2e_limit4", [3, 5], 6, 768, limit=LIMIT_4))
    of |= dict.fromkeys(("workload_interleaved", "workload_blocked"), config("workload", [3, 6], 8, 1024))
    # the same, reduced to the two lookup-first arms
    of |= dict.fromkeys(("b1_adaptive", "workload_adaptive", "workload_adaptive_blocked"),
                        config("adaptive", [3, 6], 8, 1024, adaptive=True))
    # the same two policies, the selector asked only where lookup finds nothing
    of |= dict.fromkeys(("b1_gated", "workload_gated", "workload_gated_blocked"),
                        config("gated", [3, 6], 8, 1024, gated=True))
    of["b1_gated_every"] = config("gated_every", [3, 5], 6, 768, gated=True, every=True)
    of["b1_adaptive_gammas"] = config("adaptive_gammas", [3, 5], 8, 1024, adaptive=True, every=True)
    # short proposals behind match-only lookup: they pay where a draft forward costs about half a target step
    of |= dict.fromkeys(small, config("gated_small", list(SMALL_GAMMAS), 8, 1024, gated=True, every=True, padded=False))
    of["workload_gated_small_acc"] = config("gated_small_acc", list(SMALL_GAMMAS), 8, 1024, gated=True, every=True,
                                            padded=False, reward="acceptance")
    return of | arm_sections.configs(paths, args.verifier, args.fuse, args.attention)


def plan(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each section's ``flashspec bench`` arguments, in priority order."""
    limit = ["--prompts", str(args.prompts)] if args.prompts else []
    tail = [*(["--selectors", args.selectors] if args.selectors else []), *(["--fuse"] if args.fuse else [])]
    common = ["--max-new-tokens", str(args.max_new_tokens), *limit]
    vs_plain = ["--systems", "flashspec,target_only"]

    def batch(size: int, repeats: int, *more: str) -> list[str]:
        return [*common, "--batch-size", str(size), *vs_plain, *more, "--repeats", str(repeats), *tail]

    b1_three = [*common, *vs_plain, "--repeats", "3", *tail]
    workload = ["--max-new-tokens", "48", *limit]
    interleaved = [*workload, "--order", "interleaved", *vs_plain, "--repeats", "3", *tail]
    blocked = [*workload, "--systems", "flashspec", "--no-fixed-arms", "--repeats", "3", *tail]
    return {
        "b1_greedy": [*common, "--hf-prompts", str(args.hf_prompts), "--exactness", "2", *tail],
        "b1_adaptive": b1_three, "b1_adaptive_gammas": b1_three, "b1_gated": b1_three,
        "b1_gated_every": [*common, *vs_plain, "--repeats", "4", *tail],
        # where does a fixed arm stop paying? (the batch rule of [selector] speculate_max_batch)
        "b2_greedy": batch(2, 3), "b4_greedy": batch(4, 3),
        "b2_limited": batch(2, 3, "--no-fixed-arms"), "b4_limited": batch(4, 3, "--no-fixed-arms"),
        "b8_greedy": [*common, "--batch-size", "8", "--systems", "flashspec,target_only,hf_eager", "--hf-prompts", "8",
                      "--repeats", "3", *tail],
        "b32_greedy": batch(32, 5, "--prompts", "32", "--no-fixed-arms"),
        "b8_limited": batch(8, 5, "--no-fixed-arms"), "b32_limited": batch(32, 5, "--prompts", "32", "--no-fixed-arms"),
        "b1_t07": [*common, "--temperature", "0.7", *vs_plain, *tail],
        "b1_nf4": [*common, "--quantization", "nf4", *vs_plain, "--prompts", "4", "--no-fixed-arms",
                   *(["--fuse"] if args.fuse else [])],
        "workload_interleaved": [*workload, "--order", "interleaved", *vs_plain, *tail],
        "workload_blocked": [*workload, "--systems", "flashspec", "--no-fixed-arms", *tail],
        "workload_adaptive": interleaved, "workload_adaptive_blocked": blocked,
        "workload_gated": interleaved, "workload_gated_blocked": blocked,
        "b1_gated_small": b1_three, "workload_gated_small": interleaved, "workload_gated_small_blocked": blocked,
        "workload_gated_small_acc": interleaved,
        "synthetic": ["--systems", "", "--synthetic-shapes", "qwen2.5-7b,qwen2.5-14b,qwen2.5-32b",
                      "--synthetic-acceptance", "0.6,0.8", "--synthetic-gammas", "4", *(["--fuse"] if args.fuse else [])],
        **arm_sections.plan(args.fuse),
    }


def full(args: argparse.Namespace) -> int:
    unknown = set(args.sections.split(",")) - set(SECTIONS) - {"all", "none"}
    if unknown:  # before the minutes of GGUF conversion
        raise SystemExit(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}, all, none")
    deadline = time.time() + args.budget
    config_of = configs(args, convert(args.gguf, BF16))
    sections: dict[str, Any] = {}
    for name, extra in plan(args).items():  # each section's bench.json lands in --out/<section>/ when written
        if args.sections == "all" or name in args.sections.split(","):
            if skipped(args.out / name, name):
                sections[name] = None
                continue
            sections[name] = bench(args.out / name, config_of[name], deadline, *extra, *args.bench_extra.split(),
                                   workload=workload_of(name))
            peek(args.out, sections)
    return 0


def workload_of(name: str) -> Path:
    if name in arm_sections.TREE_SECTIONS + arm_sections.SWEEP_SECTIONS:
        return arm_sections.workload(name)
    return DOMAINS if name.startswith(("b32", "workload")) else WORKLOAD


def skipped(out: Path, name: str) -> bool:
    """A tree section on a fast path without tree support: skipped, its reason written to
    ``out/SKIPPED`` for the summary (a stale bench.json of an earlier run is moved aside)."""
    why = arm_sections.tree_problem() if name in arm_sections.TREE_SECTIONS else None
    if why is None:
        (out / SKIPPED).unlink(missing_ok=True)
        return False
    say(f"skipped {name}: {why}")
    out.mkdir(parents=True, exist_ok=True)
    if (out / "bench.json").is_file():
        (out / "bench.json").rename(out / "bench.json.old")
    (out / SKIPPED).write_text(why + "\n")
    return True


def peek(out: Path, sections: dict[str, Any]) -> None:
    """The sections run so far with their summary, a look while the run goes on (the committed
    file comes from ``summarize`` over the sections' folders)."""
    summary = build_summary({k: sections.get(k) for k in SECTIONS if k in sections}, "unknown (the GPU copy)", {})
    say(f"wrote {write_json(out / 'e2e-h200.json', {'summary': summary, 'sections': sections})}")
    print(json.dumps(summary, indent=1)[:6000])


def smoke(args: argparse.Namespace) -> int:
    """Graph-captured fast path on random 1.5B/0.5B shapes vs eager, and HF compile on a tiny model."""
    import torch

    from flashspec_bench.harness import prewarm_drafts
    from flashspec_core.pipeline import Arm, NoDraft, Pipeline
    from flashspec_core.policy import StepPolicy
    from flashspec_core.rewards import make_reward
    from flashspec_fast.draft import FastDraft
    from flashspec_fast.options import FastOptions, build_model
    from flashspec_fast.synthetic import SyntheticVerifier
    from flashspec_fast.target import FastTarget

    res: dict[str, Any] = {}
    prompts = [list(range(100, 164)), list(range(200, 250))]
    ns = argparse.Namespace(max_new_tokens=64, temperature=0.0, seed=0, no_prewarm=False)
    plain = [Arm("none", NoDraft(), 0)]
    for fuse in (True,) if args.quick else (False, True):
        topts = FastOptions(model="shape:qwen2.5-1.5b", dtype="bf16", max_len=512, fuse=fuse)
        dopts = FastOptions(model="shape:qwen2.5-0.5b", dtype="bf16", max_len=512, fuse=fuse)
        target = FastTarget(build_model(topts)[0], None, None, topts)
        draft = FastDraft(build_model(dopts)[0], target.vocab, dopts)
        for name, arms, ver in (("target_only", plain, SyntheticVerifier(1.0)),
                                ("spec_g4_a0.8", [Arm("d", draft, 4)], SyntheticVerifier(0.8))):
            pipe = Pipeline(target, ver, StepPolicy(arms, Always(0, 1), make_reward("acceptance")))
            if arms[0].gamma:  # the bench's own prewarm, at the batch size the runs below use (1)
                res[f"fuse={fuse}:draft_prewarm"] = prewarm_drafts(pipe, [[0], [1]], ns)
            run_pipeline(pipe, prompts, [[0]], ns, ["x", "x"])
            s = summarize_run(run_pipeline(pipe, prompts, [[0], [1]], ns, ["x", "x"]))
            res[f"fuse={fuse}:{name}"] = {k: s.get(k) for k in ("tokens_per_s", "step_ms_p50", "breakdown_ms",
                                                                 "host_fraction")}
            say(f"fuse={fuse} {name}: {res[f'fuse={fuse}:{name}']}")
        # graphs vs eager on the same random model and shapes: identical greedy tokens
        eager = FastTarget(target.model, None, None, FastOptions(model="shape:qwen2.5-1.5b", compile=False))
        ta, tb = (Pipeline(t, SyntheticVerifier(1.0), StepPolicy(plain, Always(0, 1), make_reward("acceptance")))
                  .generate([prompts[0]], max_new_tokens=32).token_ids for t in (target, eager))
        res[f"fuse={fuse}:graph_vs_eager_identical"] = ta == tb
        say(f"fuse={fuse} graphs vs eager identical: {ta == tb}")
        del target, draft, eager
        torch.cuda.empty_cache()
    write_json(args.out / "smoke.json", res)
    if not args.quick:
        tiny_bench(args.out)
    return 0


def tiny_bench(out: Path) -> None:
    """The bench on tiny models with the auto (Triton) verifier and HF's compiled baseline."""
    from flashspec_bench.harness import main as bench_main
    from flashspec_core.testing.tiny import perturbed_lm, tiny_lm

    root = Path("/tmp/fs_tiny")
    target = tiny_lm(root / "target", vocab=16, seed=0, scale=8.0)
    draft = perturbed_lm(target, root / "draft", noise=0.05, seed=1)
    (root / "w.jsonl").write_text('{"prompt": "t1 t2 t3 t4 t1 t2", "domain": "code"}\n'
                                  '{"prompt": "t5 t6", "domain": "prose"}\n')
    (root / "c.toml").write_text(
        f'[target]\nuse = "fast"\nmodel = "{target}"\ndtype = "float32"\nchat_template = false\nmax_len = 128\n'
        f'[[arm]]\nuse = "fast"\nmodel = "{draft}"\ndtype = "float32"\nmax_len = 128\ngamma = 3\nname = "g3"\n'
        '[[arm]]\nuse = "prompt_lookup"\ngamma = 4\nname = "lookup"\n[[arm]]\nuse = "none"\nname = "none"\n'
        '[selector]\nuse = "ucb1"\n')
    bench_main(["--workload", str(root / "w.jsonl"), "--config", str(root / "c.toml"), "--out", str(out / "tiny"),
                "--max-new-tokens", "16", "--systems", "flashspec,target_only,hf_eager,hf_compiled", "--exactness", "2"])


def parser() -> argparse.ArgumentParser:
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
                   help="the fast models' fused RMSNorm/SiLU ops (on by default; --no-fuse measures the plain ops)")
    f.add_argument("--attention", choices=("auto", "sdpa", "triton"), default="auto",
                   help="the fast models' decoding attention and rotary kernels (sdpa: PyTorch only, a fallback)")
    f.add_argument("--verifier", default="auto", help="the config's verifier (auto: triton on CUDA)")
    f.add_argument("--selectors", default=",".join(MORE_SELECTORS),
                   help="more bandits to run besides the config's Thompson (bench --selectors; '' for none)")
    f.add_argument("--sections", default="b1_greedy,b8_greedy,b32_greedy,b1_t07,b1_nf4,synthetic",
                   help=f"comma list of {','.join(SECTIONS)}, 'all', or 'none' "
                        "to convert only (split a run over several calls on a warm machine; /tmp/fsbf16 is reused)")
    c = sub.add_parser("convert", help="only convert (e.g. one model in the background while the other travels)")
    c.add_argument("--gguf", type=Path, required=True)
    c.add_argument("--which", default="target,draft", help="comma list of target,draft")
    m = sub.add_parser("summarize", help="rebuild e2e-h200.json from a full run's --out folder")
    m.add_argument("--from", dest="src", type=Path, required=True)
    m.add_argument("--out", type=Path, required=True, help="folder for e2e-h200.json")
    m.add_argument("--raw", type=Path, default=RAW, help="the raw rows (git-ignored)")
    m.add_argument("--commit", required=True, help="the commit the run measured (the GPU copy has no .git)")
    m.add_argument("--section-commit", action="append", default=[], metavar="SECTION=SHA",
                   help="a section measured at another commit than --commit (sections merged from several runs)")
    m.add_argument("--merge", type=Path, default=None, metavar="E2E_JSON",
                   help="a committed e2e-h200.json: the sections this run did not measure keep their data and "
                        "summary (tree and sweep sections only)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.mode == "convert":
        convert(args.gguf, BF16, tuple(args.which.split(",")))
        return 0
    return {"full": full, "smoke": smoke, "summarize": summarize_main}[args.mode](args)
