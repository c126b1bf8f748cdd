"""A real domain-shifting workload for the bandit selectors, replayed from exact traces.

    python benchmarks/bandit_workload.py trace      # CPU, models cached; checkpoints per prompt
    python benchmarks/bandit_workload.py costs      # CPU step timings of the real models
    python benchmarks/bandit_workload.py simulate   # replays every policy over the traces
    python benchmarks/bandit_workload.py render     # the tables in docs/bandits.md, from the JSON

``trace`` runs the Qwen2.5-Coder-1.5B target greedily on every prompt of
``benchmarks/workloads/domains.jsonl`` (code, prose, edit) and records the tokens. Greedy
speculative decoding emits exactly the target's greedy tokens whichever arm drafts, so
every arm's acceptance follows from the trace by teacher forcing, without generating
again: at position ``t`` (``t`` tokens emitted so far) an arm with a greedy or
deterministic proposer accepts ``min(gamma, run[t])`` tokens, where ``run[t]`` counts the
consecutive positions ``j >= t`` at which the proposer's token equals the target's.

* 0.5B draft: one forward over prompt + continuation; ``match[j]`` is whether its argmax
  after ``j`` emitted tokens equals the target's token ``j``.
* prompt lookup (``flashspec_lookup.lookup`` with its default config): its gamma-8
  proposal at each ``t`` compared with the next 8 target tokens. The proposal for a
  smaller gamma is a prefix of it, so ``min(gamma, run)`` holds there too.
* matched prompt lookup (``LookupConfig(min_ngram=2, fill=False)``, gamma 8): at each
  ``t`` the proposal's width ``match_width[t]`` (0..8: only what a match of >= 2 tokens
  gives, 0 without one) and its accepted prefix ``match_run[t]``. Traces made before this
  arm lack them; ``simulate`` derives them from the prompt (tokenised again, checked
  against the trace's ``prompt_len`` and ``lookup_run``) and the traced tokens.
* matched lookup with a fallback (``lookup-match>draft0.5b-g3``): at each ``t`` the
  matched lookup's step where ``match_width[t] > 0``, else the draft's step, costed as a
  draft step plus the search that found nothing. Which one runs depends on the context
  alone, so both arrays above give it without a new trace.

``simulate`` replays fixed arms, the selectors (acceptance and throughput rewards) and the
per-domain oracle over the traces with a step-cost model per arm and proposal width. Its tokens/s are
*modelled* (emitted tokens / modelled time), never measured end to end.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "benchmarks" / "workloads" / "domains.jsonl"
OUT = ROOT / "docs" / "benchmarks"
TRACES = OUT / "bandit-workload-traces.json"
RESULT = OUT / "bandit-workload.json"
COSTS_CPU = OUT / "bandit-workload-costs-cpu.json"
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
LOOKUP_GAMMA = 8  # the largest lookup gamma any arm uses; smaller ones are prefixes
MATCH_MIN_NGRAM = 2  # a one-token match is as often chance as a repeat: stated, not tuned
DOMAINS = ("code", "prose", "edit")


@attrs.frozen
class Arm:
    name: str
    source: str  # "draft" | "lookup" | "match" | "none": which run array the arm reads
    gamma: int  # the widest proposal; a "match" arm proposes 0..gamma tokens, the others exactly gamma
    fallback: Arm | None = None  # proposes instead, in the same step, where this arm's proposal is empty

    @property
    def primary(self) -> Arm:
        """The arm without its fallback: the name before ``>``."""
        return Arm(self.name.split(">")[0], self.source, self.gamma) if self.fallback else self


def with_fallback(arm: Arm, fallback: Arm) -> Arm:
    """``arm>fallback``, the engine's name for an arm that hands empty proposals to ``fallback``."""
    return Arm(f"{arm.name}>{fallback.name}", arm.source, arm.gamma, fallback)


_G3, _G6, _MATCH = Arm("draft0.5b-g3", "draft", 3), Arm("draft0.5b-g6", "draft", 6), Arm("lookup-match", "match", 8)
ARMS = (
    _G3,
    _G6,
    Arm("lookup-g8", "lookup", 8),
    _MATCH,
    with_fallback(_MATCH, _G3),
    with_fallback(_MATCH, _G6),
    Arm("none", "none", 0),
)
# The lookup-first pair (the engine's `select = false` on the draft): the selector only decides
# whether to draft where lookup finds nothing, so it never pays to explore a draft-only arm.
ADAPTIVE = (_MATCH, with_fallback(_MATCH, _G3))
# The GPU's *_gated_small sections (benchmarks/e2e_h200.py): match-only lookup first, and where it
# finds nothing a plain step or the draft at gamma 1, 2 or 3 (short proposals pay where a draft
# forward costs over half a target forward, as on the H200).
_G1, _G2 = Arm("draft0.5b-g1", "draft", 1), Arm("draft0.5b-g2", "draft", 2)
SMALL = (_MATCH, with_fallback(_MATCH, _G1), with_fallback(_MATCH, _G2), with_fallback(_MATCH, _G3))


def say(msg: str) -> None:
    print(f"[bandit-workload {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _dirty(path: str) -> bool:
    """Whether ``path`` differs from HEAD (or is untracked): then ``commit`` alone does not pin it."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--", path], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return True
    return bool(out.strip())


def versions() -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def load_prompts(path: Path = WORKLOAD) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def round_robin(prompts: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """code, prose, edit, code, ...: a trace cut short still covers every domain evenly."""
    by = {d: [p for p in prompts if p["domain"] == d] for d in DOMAINS}
    out = []
    for i in range(max(len(v) for v in by.values())):
        out += [by[d][i] for d in DOMAINS if i < len(by[d])]
    return out


# ---------------------------------------------------------------- trace phase


def match_runs(matches: Sequence[bool]) -> list[int]:
    """``run[t]`` = number of consecutive ``True`` in ``matches`` starting at ``t``."""
    runs = [0] * len(matches)
    nxt = 0
    for t in range(len(matches) - 1, -1, -1):
        nxt = nxt + 1 if matches[t] else 0
        runs[t] = nxt
    return runs


def lookup_runs(prompt: Sequence[int], cont: Sequence[int], gamma: int) -> list[int]:
    """Accepted tokens of a prompt-lookup proposal of ``gamma`` tokens at each position."""
    import torch

    from flashspec_lookup.lookup import LookupConfig, lookup

    cfg = LookupConfig()
    seq = torch.tensor(list(prompt) + list(cont), dtype=torch.long)
    runs = []
    for t in range(len(cont)):
        proposal = lookup(seq[: len(prompt) + t], gamma, cfg)
        k = 0
        while k < gamma and t + k < len(cont) and proposal[k] == cont[t + k]:
            k += 1
        runs.append(k)
    return runs


def lookup_match(prompt: Sequence[int], cont: Sequence[int], gamma: int,
                 min_ngram: int = MATCH_MIN_NGRAM) -> tuple[list[int], list[int]]:
    """Width and accepted prefix of the matched-only lookup proposal at each position."""
    import torch

    from flashspec_lookup.lookup import LookupConfig, lookup

    cfg = LookupConfig(min_ngram=min_ngram, fill=False)
    seq = torch.tensor(list(prompt) + list(cont), dtype=torch.long)
    widths, runs = [], []
    for t in range(len(cont)):
        proposal = lookup(seq[: len(prompt) + t], gamma, cfg)
        k = 0
        while k < len(proposal) and t + k < len(cont) and proposal[k] == cont[t + k]:
            k += 1
        widths.append(len(proposal))
        runs.append(k)
    return widths, runs


def add_match(traces: Mapping[str, dict[str, Any]], workload: Path = WORKLOAD) -> int:
    """Fill ``match_width``/``match_run`` where a trace lacks them, from its prompt and tokens;
    returns how many it filled.

    The prompt is tokenised again with the target's tokenizer; its length and the padded
    lookup's runs must reproduce the trace's, else the tokens are not the traced ones.
    """
    todo = [k for k, v in traces.items() if "match_width" not in v]
    if not todo:
        return 0
    from transformers import AutoTokenizer

    from flashspec_models.weights import ensure_model

    tok = AutoTokenizer.from_pretrained(ensure_model(TARGET))
    prompts = {p["id"]: p["prompt"] for p in load_prompts(workload)}
    for pid in todo:
        tr = traces[pid]
        ids = encode(tok, prompts[pid])
        if len(ids) != tr["prompt_len"] or lookup_runs(ids, tr["tokens"], LOOKUP_GAMMA) != tr["lookup_run"]:
            raise SystemExit(f"{pid}: the prompt tokenises differently from when it was traced")
        tr["match_width"], tr["match_run"] = lookup_match(ids, tr["tokens"], LOOKUP_GAMMA)
    say(f"derived lookup-match widths and runs of {len(todo)} traces from their prompts")
    return len(todo)


def load_models(dtype: str) -> tuple[Any, Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashspec_models.weights import ensure_model

    tpath, dpath = ensure_model(TARGET), ensure_model(DRAFT)
    tok = AutoTokenizer.from_pretrained(tpath)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    target = AutoModelForCausalLM.from_pretrained(tpath, dtype=dt).eval()
    draft = AutoModelForCausalLM.from_pretrained(dpath, dtype=dt).eval()
    return tok, target, draft


def encode(tok: Any, prompt: str) -> list[int]:
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def trace_one(tok: Any, target: Any, draft: Any, prompt: list[int], max_new: int,
              prefix: Sequence[int] = ()) -> dict[str, Any]:
    """Greedy continuation of ``prompt`` (extending an earlier, shorter one: ``prefix``) and its runs."""
    import torch

    eos = tok.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor([prompt + list(prefix)], dtype=torch.long)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new - len(prefix),
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
            top_p=None,
            top_k=None,
            temperature=None,
        )
    gen_s = time.perf_counter() - t0
    cont = [int(x) for x in out[0, len(prompt) :]]
    if eos in cont:
        cont = cont[: cont.index(eos) + 1]
    with torch.inference_mode():
        logits = draft(torch.tensor([prompt + cont], dtype=torch.long)).logits[0]  # [P+N, V]
    guesses = logits[len(prompt) - 1 : len(prompt) - 1 + len(cont)].argmax(-1).tolist()  # [N]
    return {
        "prompt_len": len(prompt),
        "extended_from": len(prefix),
        "tokens": cont,
        "text": tok.decode(cont),
        "draft_run": match_runs([g == c for g, c in zip(guesses, cont, strict=True)]),
        "lookup_run": lookup_runs(prompt, cont, LOOKUP_GAMMA),
        **dict(zip(("match_width", "match_run"), lookup_match(prompt, cont, LOOKUP_GAMMA), strict=True)),
        "target_generate_s": round(gen_s, 2),
    }


def run_trace(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    prompts = round_robin(load_prompts(args.workload))
    data: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    old = data.get("config", {})
    if old.get("dtype", args.dtype) != args.dtype or old.get("max_new_tokens", 0) > args.max_new_tokens:
        raise SystemExit(f"{args.out} was traced in another dtype or with more tokens; remove it or match them")
    if old and old["max_new_tokens"] < args.max_new_tokens:  # longer cap: continue the earlier traces
        data["config"]["extended_from_max_new_tokens"] = old["max_new_tokens"]
    data.setdefault("config", {}).update(
        {
            "target": TARGET,
            "draft": DRAFT,
            "dtype": args.dtype,
            "device": "cpu",
            "decoding": "greedy",
            "max_new_tokens": args.max_new_tokens,
            "lookup": "flashspec_lookup.lookup, default LookupConfig",
            "match_lookup": f"flashspec_lookup.lookup, LookupConfig(min_ngram={MATCH_MIN_NGRAM}, fill=False)",
            "lookup_gamma": LOOKUP_GAMMA,
            "workload": str(args.workload.relative_to(ROOT)),
        }
    )
    data.setdefault("traces", {})
    tok, target, draft = load_models(args.dtype)
    eos = tok.convert_tokens_to_ids("<|im_end|>")

    def done(pid: str) -> bool:
        tr = data["traces"].get(pid)
        return tr is not None and (len(tr["tokens"]) >= args.max_new_tokens or tr["tokens"][-1] == eos)

    todo = [p for p in prompts if not done(p["id"])]
    say(f"{len(prompts) - len(todo)} prompts traced already, {len(todo)} to go")
    for p in tqdm(todo, desc="trace", unit="prompt"):
        prefix = data["traces"].get(p["id"], {}).get("tokens", [])
        rec = trace_one(tok, target, draft, encode(tok, p["prompt"]), args.max_new_tokens, prefix)
        rec["target_generate_s"] += data["traces"].get(p["id"], {}).get("target_generate_s", 0.0)
        data["traces"][p["id"]] = {"domain": p["domain"], **rec}
        data.update(versions=versions(), commit=commit())
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        tmp.replace(args.out)  # checkpoint: a crash loses at most the prompt in flight
    say(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------- cost phase


def _timed_medians(fns: Mapping[str, Callable[[], object]], reps: int) -> dict[str, dict[str, float]]:
    """Median and min seconds of each callable, timed round-robin so that load from other
    jobs on a shared host drifts over all of them alike instead of over one at a time."""
    for fn in fns.values():
        fn()  # warm-up: first call of a shape picks kernels
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: {"median": statistics.median(v), "min": min(v)} for k, v in times.items()}


def _forward(model: Any, context: int, width: int) -> Callable[[], None]:
    """One KV-cached forward of ``width`` tokens after ``context`` tokens, cache restored after."""
    import torch

    ids = torch.randint(100, 20_000, (1, context + width))
    with torch.inference_mode():
        cache = model(ids[:, :context], use_cache=True).past_key_values

    def step() -> None:
        with torch.inference_mode():
            model(ids[:, context:], past_key_values=cache, use_cache=True)
        cache.crop(-width)

    return step


def run_costs(args: argparse.Namespace) -> int:
    """CPU step costs of the real models here: what ``simulate --cost-model cpu`` reads."""
    import torch

    from flashspec_core import SamplingParams
    from flashspec_lookup.lookup import LookupConfig, PromptLookupDraft

    torch.set_num_threads(args.threads)
    _, target, draft = load_models(args.dtype)
    ctx = args.context
    widths = sorted({a.gamma + 1 for a in ARMS})
    logits = torch.randn(max(widths), 151_936)
    seq = torch.randint(100, 20_000, (1, ctx + 2 * args.reps + 8))
    provider, grown = PromptLookupDraft(LookupConfig()), [ctx]

    def lookup_step() -> object:  # one step of the provider as the pipeline calls it: one new token indexed
        grown[0] += 1
        return provider.propose(seq, grown, LOOKUP_GAMMA, SamplingParams(), None)

    fns: dict[str, Callable[[], object]] = {f"target_{w}": _forward(target, ctx, w) for w in widths}
    fns["draft_1"] = _forward(draft, ctx, 1)
    fns["verify"] = lambda: logits.argmax(-1).tolist()  # greedy verify: argmax + compare
    fns["lookup"] = lookup_step
    t = _timed_medians(fns, args.reps)
    say(f"timings (s): {t}")
    target_s = {str(w): t[f"target_{w}"]["median"] for w in widths}
    draft_s, verify_s, lookup_s = t["draft_1"]["median"], t["verify"]["median"], t["lookup"]["median"]
    costs = {
        "label": "measured on CPU here", "dtype": args.dtype,
        "how": (
            f"median of {args.reps} KV-cached forwards after a {ctx}-token context, {args.dtype}, "
            f"{args.threads} threads, on a shared {platform.machine()} host with other jobs running"
        ),
        "target_forward_s": target_s,
        "draft_forward_s": draft_s,
        "verify_s": verify_s,
        "lookup_propose_s": lookup_s,
        "raw_s": t,
        "versions": versions(),
        "commit": commit(),
    }
    args.out.write_text(json.dumps(costs, indent=1))
    say(f"wrote {args.out}")
    return 0


# ---------------------------------------------------------------- simulate phase


@attrs.frozen
class Step:
    prompt: str
    domain: str
    arm: int
    width: int  # tokens proposed: the arm's gamma, or fewer for a "match" arm
    accepted: int
    emitted: int
    seconds: float


def widths_of(arm: Arm) -> range:
    """Proposal widths an arm can produce."""
    return range(arm.gamma + 1) if arm.source == "match" else range(arm.gamma, arm.gamma + 1)


def target_forward(costs: Mapping[str, Any], width: int) -> float:
    """Target forward seconds of ``width`` tokens: measured, else the least-squares line
    through the measured widths (``target_forward_fit`` where the table carries one)."""
    measured = {int(k): float(v) for k, v in costs["target_forward_s"].items()}
    if width in measured:
        return measured[width]
    if "target_forward_fit" in costs:
        fit = costs["target_forward_fit"]
        slope, icept = float(fit["slope_s_per_token"]), float(fit["intercept_s"])
    else:
        slope, icept = np.polyfit(list(measured), list(measured.values()), 1)
    return float(icept + slope * width)


def step_costs(costs: Mapping[str, Any], arms: Sequence[Arm] = ARMS) -> list[dict[int, float]]:
    """Modelled seconds of one step of each arm at each proposal width ``w`` it can produce:
    target forward of ``w + 1`` tokens, ``w`` one-token draft forwards (draft arms), the
    lookup search (lookup arms, also when it finds nothing), verify. A table with
    ``step_s`` (per arm name: seconds, or a list indexed by width) gives the steps directly.

    An arm with a fallback is keyed by its own width too: ``w > 0`` is its own step,
    ``0`` the fallback's step plus the search that found nothing (``lookup_propose_s``)."""
    out = []
    for a in arms:
        if a.fallback is not None:
            own, fb = step_costs(costs, (a.primary, a.fallback))
            search = float(costs.get("lookup_propose_s", 0.0)) if a.source in ("lookup", "match") else 0.0
            out.append({0: fb[a.fallback.gamma] + search, **{w: own[w] for w in own if w > 0}})
        elif "step_s" in costs:
            v = costs["step_s"][a.name]
            out.append({w: float(v[w]) for w in widths_of(a)} if isinstance(v, list) else {a.gamma: float(v)})
        else:
            out.append(_computed_step(costs, a))
    return out


def _computed_step(costs: Mapping[str, Any], a: Arm) -> dict[int, float]:
    by = {}
    for w in widths_of(a):
        s = target_forward(costs, w + 1) + float(costs["verify_s"])
        if a.source == "draft":
            s += w * float(costs["draft_forward_s"])
        if a.source in ("lookup", "match"):
            s += float(costs.get("lookup_propose_s", 0.0))
        by[w] = s
    return by


def order_prompts(traces: Mapping[str, Mapping[str, Any]], order: str) -> list[str]:
    """Prompt ids in serving order: ``interleaved`` (domains round-robin) or ``blocked``."""
    by = {d: sorted(k for k, v in traces.items() if v["domain"] == d) for d in DOMAINS}
    if order == "blocked":
        return [k for d in DOMAINS for k in by[d]]
    if order == "interleaved":
        return [p["id"] for p in round_robin([{"id": k, "domain": d} for d in DOMAINS for k in by[d]])]
    raise ValueError(f"unknown order {order!r}")


def own_width(arm: Arm, trace: Mapping[str, Any], t: int) -> int:
    """Tokens the arm itself (not its fallback) proposes at ``t``: a function of the context
    alone. It also keys the arm's step cost."""
    return int(trace["match_width"][t]) if arm.source == "match" else arm.gamma


def acting(arm: Arm, trace: Mapping[str, Any], t: int) -> Arm:
    """The arm whose proposal a step at ``t`` verifies: the fallback where ``arm`` proposes nothing."""
    return arm.fallback if arm.fallback is not None and own_width(arm, trace, t) == 0 else arm


def accepted_at(arm: Arm, trace: Mapping[str, Any], t: int) -> int:
    arm = acting(arm, trace, t)
    if arm.source == "none":
        return 0
    return min(arm.gamma, int(trace[f"{arm.source}_run"][t]))


def width_at(arm: Arm, trace: Mapping[str, Any], t: int) -> int:
    """Tokens the step at position ``t`` proposes (the fallback's where it takes over)."""
    return own_width(acting(arm, trace, t), trace, t)


def replay(selector: Any, reward: str, traces: Mapping[str, Mapping[str, Any]], order: Sequence[str],
           costs: Sequence[Mapping[int, float]], arms: Sequence[Arm] = ARMS, first: int | None = None,
           draw_ahead: bool = False) -> list[Step]:
    """Serve every prompt in ``order`` with one selector that keeps its state throughout.

    ``first`` (an index into ``arms``, a ``match`` arm), as the engine's ``[selector] first``:
    where that arm proposes (``match_width[t] > 0``) its step runs without the selector,
    recorded with arm ``-1``, and does not feed the selector's reward scale; elsewhere the
    selector picks and learns. ``draw_ahead``, as the engine's ``[selector] draw_ahead``:
    every step draws the next step's choice before its own reward is fed (one step late);
    the draw is dropped where ``first`` proposes or the prompt ends. The tables replay
    without it (each reward before the next draw); ``sensitivity_draw_ahead`` compares."""
    from flashspec_core.contracts import RequestAware
    from flashspec_core.rewards import make_reward

    score = make_reward(reward)  # what the pipeline feeds its selector, one instance per run
    steps = []
    for pid in order:
        if isinstance(selector, RequestAware):  # as the pipeline does at each generate()
            selector.begin_request(1)
        ahead = None  # a draw from the prompt before is not played
        tr = traces[pid]
        n, t = len(tr["tokens"]), 0
        while t < n:
            if first is not None and (w := own_width(arms[first], tr, t)) > 0:
                acc = accepted_at(arms[first], tr, t)
                emitted = min(acc + 1, n - t)
                steps.append(Step(pid, tr["domain"], -1, w, acc, emitted, costs[first][w]))
                t += emitted
                ahead = selector.select() if draw_ahead else None
                continue
            k = selector.select() if ahead is None else ahead
            w, acc = width_at(arms[k], tr, t), accepted_at(arms[k], tr, t)
            emitted = min(acc + 1, n - t)  # the last step may stop at max_new_tokens / EOS
            seconds = costs[k][own_width(arms[k], tr, t)]  # a fallback step is keyed 0
            ahead = selector.select() if draw_ahead else None  # drawn while the device runs this step
            selector.update(k, score(w, [acc], emitted, seconds))  # the width, as the pipeline does
            steps.append(Step(pid, tr["domain"], k, w, acc, emitted, seconds))
            t += emitted
    return steps


def tally(steps: Sequence[Step], arms: Sequence[Arm] = ARMS) -> dict[str, Any]:
    """tokens/s (modelled), mean accepted length, acceptance and arm shares of some steps."""
    emitted = sum(s.emitted for s in steps)
    seconds = sum(s.seconds for s in steps)
    drafted = sum(s.width for s in steps)
    accepted = sum(s.accepted for s in steps)
    return {
        "tps": emitted / seconds if seconds else 0.0, "emitted": emitted, "seconds": seconds, "steps": len(steps),
        "mean_accepted": accepted / len(steps) if steps else 0.0,
        "tokens_per_step": emitted / len(steps) if steps else 0.0,
        "acceptance": accepted / drafted if drafted else None,
        "arm_share": {a.name: sum(s.arm == i for s in steps) / max(1, len(steps)) for i, a in enumerate(arms)}
        | ({"(first)": sum(s.arm == -1 for s in steps) / len(steps)} if any(s.arm == -1 for s in steps) else {}),
    }


def tally_domains(steps: Sequence[Step], arms: Sequence[Arm] = ARMS) -> dict[str, Any]:
    out = {"overall": tally(steps, arms)}
    for d in DOMAINS:
        out[d] = tally([s for s in steps if s.domain == d], arms)
    return out


def selector_makers(horizon: int | None = None, breakpoints: int | None = None, k: int = len(ARMS)
                    ) -> dict[str, tuple[Callable[[int], Any], bool]]:
    """name -> (make(seed), randomised): every selector with its default config, and, given
    ``horizon`` and ``breakpoints``, the three selectors with a stated default rule
    (window, discount, GLR level and forced exploration) fed those (``<name>[rule]``)."""
    from flashspec_selectors import (
        UCB1,
        DiscountedThompson,
        DiscountedThompsonConfig,
        GLRThompson,
        GLRThompsonConfig,
        RequestThompson,
        RequestThompsonConfig,
        SlidingWindowUCB,
        SlidingWindowUCBConfig,
        Thompson,
        ThompsonConfig,
        UCB1Config,
    )

    out: dict[str, tuple[Callable[[int], Any], bool]] = {
        "ucb1": (lambda seed: UCB1(UCB1Config(), k), False),
        "thompson": (lambda seed: Thompson(ThompsonConfig(seed=seed), k), True),
        "sliding_window_ucb": (lambda seed: SlidingWindowUCB(SlidingWindowUCBConfig(), k), False),
        "discounted_thompson": (lambda seed: DiscountedThompson(DiscountedThompsonConfig(seed=seed), k), True),
        "glr_thompson": (lambda seed: GLRThompson(GLRThompsonConfig(seed=seed), k), True),
        "request_thompson": (lambda seed: RequestThompson(RequestThompsonConfig(seed=seed), k), True),
    }
    if horizon is not None and breakpoints is not None:
        sw = SlidingWindowUCBConfig(horizon=horizon, breakpoints=breakpoints)
        out["sliding_window_ucb[rule]"] = (lambda seed: SlidingWindowUCB(sw, k), False)
        out["discounted_thompson[rule]"] = (lambda seed: DiscountedThompson(
            DiscountedThompsonConfig(horizon=horizon, breakpoints=breakpoints, seed=seed), k), True)
        out["glr_thompson[rule]"] = (lambda seed: GLRThompson(
            GLRThompsonConfig(horizon=horizon, breakpoints=breakpoints, seed=seed), k), True)
    return out


def rule_inputs(traces: Mapping[str, Mapping[str, Any]], order: Sequence[str]) -> dict[str, int]:
    """What a deployer knows before serving: at most one step per token (horizon) and how
    often the domain changes in the serving order (breakpoints)."""
    horizon = sum(len(traces[p]["tokens"]) for p in order)
    changes = sum(traces[a]["domain"] != traces[b]["domain"] for a, b in zip(order, order[1:], strict=False))
    return {"horizon": max(2, horizon), "breakpoints": max(1, changes)}


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    v = np.asarray(values, dtype=float)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return {"mean": float(v.mean()), "ci95": [float(v.mean() - half), float(v.mean() + half)], "n": len(v)}


def simulate(traces: Mapping[str, Mapping[str, Any]], costs: Sequence[Mapping[int, float]], seeds: int,
             arms: Sequence[Arm] = ARMS, first: int | None = None) -> dict[str, Any]:
    """Every policy over both orders: fixed arms, selectors x rewards (seed-averaged), oracle
    (``first``: see :func:`replay`; a fixed arm is then "the first arm, else this one")."""
    from flashspec_selectors import FixedConfig, FixedSelector

    policies: dict[str, Any] = {}
    examples: dict[str, list[int]] = {}
    fixed = {}
    for i, a in enumerate(arms):
        steps = replay(FixedSelector(FixedConfig(arm=i), len(arms)), "acceptance", traces,
                       order_prompts(traces, "blocked"), costs, arms, first)
        fixed[a.name] = tally_domains(steps, arms)
        policies[f"fixed:{a.name}"] = {"kind": "fixed", "order": "any", **_flat(fixed[a.name])}
    best = {d: max(fixed, key=lambda name: fixed[name][d]["tps"]) for d in DOMAINS}
    emitted = sum(fixed[best[d]][d]["emitted"] for d in DOMAINS)
    seconds = sum(fixed[best[d]][d]["seconds"] for d in DOMAINS)
    policies["oracle:per-domain"] = {
        "kind": "oracle", "order": "any", "arm_per_domain": best, "tps": emitted / seconds,
        "per_domain": {d: {**fixed[best[d]][d], "arm": best[d]} for d in DOMAINS},
    }
    rules = {}
    for order in ("interleaved", "blocked"):
        ids = order_prompts(traces, order)
        rules[order] = rule_inputs(traces, ids)
        for name, (make, randomised) in selector_makers(**rules[order], k=len(arms)).items():
            for reward in ("acceptance", "throughput"):
                runs = [tally_domains(replay(make(seed), reward, traces, ids, costs, arms, first), arms)
                        for seed in range(seeds if randomised else 1)]
                policies[f"{name}+{reward}@{order}"] = {
                    "kind": "selector", "selector": name, "reward": reward, "order": order,
                    "seeds": len(runs), "randomised": randomised, **_seed_mean(runs)}
                if order == "blocked":
                    examples[f"{name}+{reward}"] = [s.arm for s in replay(make(0), reward, traces, ids, costs, arms,
                                                                          first)]
    return {"policies": policies, "blocked_arm_choices_seed0": examples, "rule_inputs": rules}


def _flat(dom: Mapping[str, Any]) -> dict[str, Any]:
    return {"tps": dom["overall"]["tps"], "overall": dom["overall"], "per_domain": {d: dom[d] for d in DOMAINS}}


def _seed_mean(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    def avg(part: str) -> dict[str, Any]:
        keys = ("tps", "mean_accepted", "tokens_per_step", "steps", "emitted", "seconds")
        out: dict[str, Any] = {k: float(np.mean([r[part][k] for r in runs])) for k in keys}
        out["tps_ci95"] = mean_ci([r[part]["tps"] for r in runs])["ci95"]
        names = runs[0][part]["arm_share"]
        out["arm_share"] = {n: float(np.mean([r[part]["arm_share"][n] for r in runs])) for n in names}
        return out

    overall = avg("overall")
    return {"tps": overall["tps"], "tps_ci95": overall["tps_ci95"], "overall": overall,
            "per_domain": {d: avg(d) for d in DOMAINS}}


E2E_H200 = OUT / "e2e-h200-raw.json.gz"  # e2e-h200.json's step rows


def load_costs(model: str, cpu_path: Path) -> dict[str, Any]:
    """The step-cost table and its label: ``h200`` from e2e-h200's raw rows, ``cpu`` from ``costs``."""
    if model == "h200":
        with gzip.open(E2E_H200, "rt") as f:
            return h200_costs(json.load(f))
    if not cpu_path.is_file():
        raise SystemExit(f"{cpu_path} missing: run `python benchmarks/bandit_workload.py costs` first")
    return json.loads(cpu_path.read_text())


def h200_costs(e2e: Mapping[str, Any], section: str = "b1_greedy") -> dict[str, Any]:
    """Per-arm step seconds from the raw step rows of the H200 end-to-end run.

    That run's arms are d0.5b-g3, d0.5b-g5, lookup-g6 and target-only; ours are g3, g6,
    lookup-g8, lookup-match (0..8 tokens) and none, so: medians of each step component per
    run; one draft forward = pooled draft ms / pooled gamma of the two draft runs; target
    forward of ``w`` tokens measured at w = 1, 4, 6, 7 and otherwise (2, 3, 5, 8, 9) from
    a least-squares line through those; verify and host time of the nearest measured arm
    of the same kind (lookup-match: the measured match-only lookup run's propose, verify and
    host time where the run has one, else the padded lookup run's, at every width, so a
    width-0 step is a target-only forward plus a lookup search; an arm
    with a fallback: its own step where it proposes, else the fallback's step plus that search).
    """
    runs = e2e["sections"][section]["runs"]

    def med(run: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs[run]["steps"]) / 1e3

    drafts = [k for k in runs if k.startswith("fixed:d")]
    gammas = {k: int(runs[k]["steps"][0]["gamma"]) for k in drafts}
    draft_fwd = sum(med(k, "draft_ms") for k in drafts) / sum(gammas.values())
    widths = {1: med("target_only", "target_ms")}
    widths.update({gammas[k] + 1: med(k, "target_ms") for k in drafts})
    lookup_run = next(k for k in runs if k.startswith("fixed:lookup") and "match" not in k)
    match_run = next((k for k in runs if k.startswith("fixed:lookup-match") and "-or-" not in k), None)
    widths[int(runs[lookup_run]["steps"][0]["gamma"]) + 1] = med(lookup_run, "target_ms")
    slope, icept = np.polyfit(list(widths), list(widths.values()), 1)
    big = max(drafts, key=lambda k: gammas[k])

    def target(w: int) -> float:
        return widths[w] if w in widths else float(icept + slope * w)

    step = {}
    parts = [p for a in (*ARMS, *SMALL) for p in ((a.primary, a.fallback) if a.fallback is not None else (a,))]
    for a in dict.fromkeys(parts):  # an arm with a fallback: step_costs derives it from its two arms
        if a.source == "draft":
            step[a.name] = target(a.gamma + 1) + a.gamma * draft_fwd + med(big, "verify_ms") + med(big, "host_ms")
        elif a.source in ("lookup", "match"):
            own = match_run if a.source == "match" and match_run else lookup_run  # measured match-only steps if any
            rest = med(own, "draft_ms") + med(own, "verify_ms") + med(own, "host_ms")
            by = [target(w + 1) + rest for w in widths_of(a)]
            step[a.name] = by if a.source == "match" else by[0]
        else:
            step[a.name] = sum(med("target_only", k) for k in ("target_ms", "draft_ms", "verify_ms", "host_ms"))
    return {
        "label": "H200 step costs from e2e-h200.json",
        "how": f"{section}: batch 1, greedy, bf16, FlashSpec fast backend; " + (h200_costs.__doc__ or "").split(
            "\n\n")[1].replace("\n    ", " ").strip(),
        "step_s": step, "target_forward_s": {str(k): v for k, v in sorted(widths.items())},
        "target_forward_fit": {"slope_s_per_token": float(slope), "intercept_s": float(icept)},
        "draft_forward_s": draft_fwd, "lookup_propose_s": med(lookup_run, "draft_ms"),
        "measured_at_commit": e2e.get("summary", {}).get("measured_at_commit"),
    }


def headline(policies: Mapping[str, Any], order: str) -> dict[str, Any]:
    sel = {k: v for k, v in policies.items() if v["kind"] == "selector" and v["order"] == order}
    fixed = {k: v for k, v in policies.items() if v["kind"] == "fixed"}
    best_sel, best_fix = max(sel, key=lambda k: sel[k]["tps"]), max(fixed, key=lambda k: fixed[k]["tps"])
    oracle = policies["oracle:per-domain"]["tps"]
    return {
        "best_selector": best_sel, "best_selector_tps": sel[best_sel]["tps"],
        "best_fixed": best_fix, "best_fixed_tps": fixed[best_fix]["tps"], "oracle_tps": oracle,
        "selector_ge_fixed": sel[best_sel]["tps"] >= fixed[best_fix]["tps"],
        "selector_within_5pct_of_oracle": sel[best_sel]["tps"] >= 0.95 * oracle,
        "selector_vs_oracle": sel[best_sel]["tps"] / oracle,
        "selector_vs_best_fixed": sel[best_sel]["tps"] / fixed[best_fix]["tps"],
    }


def arm_stats(traces: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Acceptance per arm per domain, position by position (every t, independent of policy)."""
    out: dict[str, Any] = {}
    for a in ARMS:
        if a.source == "none":
            continue
        out[a.name] = {}
        for d in ("overall", *DOMAINS):
            pos = [(tr, t) for tr in traces.values() if d in ("overall", tr["domain"]) for t in range(len(tr["tokens"]))]
            acc = [accepted_at(a, tr, t) for tr, t in pos]
            width = [width_at(a, tr, t) for tr, t in pos]
            out[a.name][d] = {"acceptance": sum(acc) / max(1, sum(width)), "mean_accepted": float(np.mean(acc)),
                              "mean_width": float(np.mean(width)),
                              "proposes": float(np.mean([w > 0 for w in width])), "positions": len(acc)}
            if a.fallback is not None:
                out[a.name][d]["falls_back"] = float(np.mean([acting(a, tr, t) is a.fallback for tr, t in pos]))
            first = [accepted_at(a, tr, 0) for tr, t in pos if t == 0]  # each request's first decode step
            out[a.name][d]["mean_accepted_first_position"] = float(np.mean(first))
    return out


def _mean_tps(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Modelled tokens/s over seeds' tallies: overall and per domain."""
    return {"tps": float(np.mean([r["overall"]["tps"] for r in runs])),
            "per_domain": {d: float(np.mean([r[d]["tps"] for r in runs])) for d in DOMAINS}}


def order_sensitivity(traces: Mapping[str, Mapping[str, Any]], costs: Mapping[str, Any], seeds: int
                      ) -> dict[str, Any]:
    """request_thompson in the lookup-first design with the two arms in either order (the
    model lists the plain arm first, the engine's config the draft) and with and without an
    opening round, which plays the arms in list order on each request's first steps."""
    from flashspec_selectors import RequestThompson, RequestThompsonConfig

    out: dict[str, Any] = {}
    for label, arms in (("model_order", ADAPTIVE), ("engine_order", tuple(reversed(ADAPTIVE)))):
        per, first = step_costs(costs, arms), [a.name for a in arms].index(ADAPTIVE[0].name)
        for rounds in (0, 1):
            for order in ("interleaved", "blocked"):
                ids = order_prompts(traces, order)
                runs = [tally_domains(replay(RequestThompson(RequestThompsonConfig(seed=seed, initial_round=rounds),
                                                             len(arms)), "throughput", traces, ids, per, arms, first),
                                      arms) for seed in range(seeds)]
                out[f"{label}/initial_round={rounds}/{order}"] = {"arms": [a.name for a in arms], **_mean_tps(runs)}
    return out


def draw_ahead_sensitivity(traces: Mapping[str, Mapping[str, Any]], costs: Mapping[str, Any], seeds: int
                           ) -> dict[str, Any]:
    """Each selector (default config, throughput reward) in the lookup-first design, replayed
    as the tables do (each reward before the next draw) and as the engine's default
    ``draw_ahead`` does (the next choice drawn before this step's reward): the model's cost of
    feedback one step late. Step costs are the same in both: the draw's host time, which
    ``draw_ahead`` takes off the step, is not in the model."""
    per = step_costs(costs, ADAPTIVE)
    out: dict[str, Any] = {}
    for order in ("interleaved", "blocked"):
        ids = order_prompts(traces, order)
        for name, (make, randomised) in selector_makers(k=len(ADAPTIVE)).items():
            row = {}
            for ahead in (False, True):
                runs = [tally_domains(replay(make(seed), "throughput", traces, ids, per, ADAPTIVE, 0, ahead), ADAPTIVE)
                        for seed in range(seeds if randomised else 1)]
                row["draw_ahead" if ahead else "in_turn"] = _mean_tps(runs)
            out[f"{name}+throughput@{order}"] = row
    return out


def tps_table(policies: Mapping[str, Any]) -> dict[str, Any]:
    """Each policy's tokens/s, overall and per domain (the summary's ``policies`` tables)."""
    return {k: {"tps": v["tps"], "per_domain": {d: v["per_domain"][d]["tps"] for d in DOMAINS}}
            for k, v in policies.items()}


def run_simulate(args: argparse.Namespace) -> int:
    data = json.loads(args.traces.read_text())
    traces = data["traces"]
    derived = add_match(traces)
    costs = load_costs(args.cost_model, args.cpu_costs)
    per_arm = step_costs(costs)
    step_cost_s = {a.name: (c[a.gamma] if len(c) == 1 else [c[w] for w in sorted(c)])
                   for a, c in zip(ARMS, per_arm, strict=True)}
    say(f"{len(traces)} traces; step costs (s): {step_cost_s}")
    sim = simulate(traces, per_arm, args.seeds)
    policies = sim["policies"]
    by_order = {o: headline(policies, o) for o in ("interleaved", "blocked")}
    counts = {d: sum(tr["domain"] == d for tr in traces.values()) for d in DOMAINS}
    adaptive = simulate(traces, step_costs(costs, ADAPTIVE), args.seeds, ADAPTIVE)["policies"]
    # [selector] first: the same two policies, the selector asked only where lookup finds nothing
    gated = simulate(traces, step_costs(costs, ADAPTIVE), args.seeds, ADAPTIVE, first=0)["policies"]
    # the same with the draft at gamma 1, 2 or 3 behind lookup (the selector: a plain step or one of the three)
    small = simulate(traces, step_costs(costs, SMALL), args.seeds, SMALL, first=0)["policies"]
    all_oracle = policies["oracle:per-domain"]["tps"]

    def two_arm(pols: Mapping[str, Any]) -> dict[str, Any]:
        out = {}
        for o in ("interleaved", "blocked"):
            h = headline(pols, o)
            out[o] = {**h, "selector_vs_all_arms_oracle": h["best_selector_tps"] / all_oracle,
                      "selector_vs_all_arms_best_fixed": h["best_selector_tps"] / by_order[o]["best_fixed_tps"],
                      "selector_within_5pct_of_all_arms_oracle": h["best_selector_tps"] >= 0.95 * all_oracle,
                      "selector_ge_all_arms_best_fixed": h["best_selector_tps"] >= by_order[o]["best_fixed_tps"]}
        return out

    adaptive_by_order, gated_by_order = two_arm(adaptive), two_arm(gated)
    result = {
        "summary": {"workload": {
            **by_order["interleaved"], "by_order": by_order,
            "cost_model": costs["label"],
            "note": "tokens/s are modelled (emitted tokens / modelled step time, replayed over exact greedy "
                    "traces), not measured end-to-end throughput",
            "prompts_per_domain": counts,
            "adaptive": {"arms": [a.name for a in ADAPTIVE], "by_order": adaptive_by_order,
                         "note": "the selectors choose between these two arms only; the oracle and best fixed arm "
                                 "`selector_vs_all_arms_*` compare with are those of every arm above",
                         "policies": tps_table(adaptive)},
            "gated": {"arms": [a.name for a in ADAPTIVE], "first": ADAPTIVE[0].name, "by_order": gated_by_order,
                      "note": "[selector] first = the match-only lookup: where it proposes, its step runs and the "
                              "selector is neither asked nor fed; elsewhere the selector chooses between its plain "
                              "step (arm lookup-match: the search that found nothing, then a plain step) and the "
                              "draft's (lookup-match>draft0.5b-g3); the fixed policies are those of `adaptive`",
                      "policies": tps_table(gated)},
            "gated_small": {"arms": [a.name for a in SMALL], "first": SMALL[0].name,
                            "by_order": {o: headline(small, o) for o in ("interleaved", "blocked")},
                            "note": "as `gated`, with the selector choosing between a plain step and the draft at "
                                    "gamma 1, 2 or 3 where lookup finds nothing (the GPU's *_gated_small sections); "
                                    "its own fixed policies and oracle",
                            "policies": tps_table(small)},
            "policies": tps_table(policies),
        }},
        "config": {
            "arms": [attrs.asdict(a) for a in ARMS], "seeds": args.seeds,
            "selectors": "flashspec_selectors defaults (UCB1Config(), ThompsonConfig(seed), SlidingWindowUCBConfig(),"
                         " DiscountedThompsonConfig(seed), GLRThompsonConfig(seed), RequestThompsonConfig(seed), the last"
                         " told of each prompt by"
                         " begin_request); [rule] = the same default rule fed horizon = tokens in"
                         " the run and breakpoints = domain changes in the order (see rule_inputs); ucb1 and"
                         " sliding_window_ucb are deterministic: one run",
            "rewards": "flashspec_core.rewards.make_reward: acceptance = accepted / gamma (0 for gamma 0); "
                       "throughput = emitted / modelled step s over the running max",
            "step_cost_s": step_cost_s,
            "step_cost_s_note": "a list is indexed by the arm's own proposal width (lookup-match: 0..8 tokens); "
                                "for an arm `a>b` entry 0 is b's step plus the lookup search that found nothing",
            "match_lookup": f"flashspec_lookup.lookup, LookupConfig(min_ngram={MATCH_MIN_NGRAM}, fill=False), gamma "
                            f"{LOOKUP_GAMMA}; widths and runs of {derived} of {len(traces)} traces derived at simulate "
                            "time from the prompt (tokenised again, checked against the trace's prompt_len and "
                            "lookup_run) and the traced tokens, the rest recorded by `trace`; no model run",
            "cost_model": costs, "trace_config": data["config"],
        },
        "arm_acceptance": arm_stats(traces),
        "sensitivity_cheap_match_step": match_sensitivity(traces, costs, per_arm, args.seeds),
        "sensitivity_arm_order": order_sensitivity(traces, costs, args.seeds),
        "sensitivity_draw_ahead": draw_ahead_sensitivity(traces, costs, args.seeds),
        "policies": policies,
        "adaptive_policies": adaptive,
        "gated_policies": gated,
        "gated_small_policies": small,
        "blocked_arm_choices_seed0": sim["blocked_arm_choices_seed0"],
        "rule_inputs": sim["rule_inputs"],
        "domain_boundaries_blocked": _boundaries(traces),
        "versions": versions(), "commit": commit(), "traces_commit": data.get("commit"),
        "script_modified_since_commit": _dirty("benchmarks/bandit_workload.py"),
    }
    args.out.write_text(json.dumps(result, indent=1))
    say(f"wrote {args.out}")
    if not args.no_plots:
        plot(result, traces, args.out.parent / args.out.stem)
    print(json.dumps(result["summary"]["workload"]["by_order"], indent=1))
    return 0


def match_sensitivity(traces: Mapping[str, Mapping[str, Any]], costs: Mapping[str, Any],
                      per_arm: Sequence[Mapping[int, float]], seeds: int) -> dict[str, Any]:
    """The headline again with the matched lookup's step costed as a ``none`` step plus the
    lookup search plus the wider target forward: what the arm would give if its steps paid
    nothing else of the measured lookup run's overheads (verify, host). Arms with a fallback
    get the same cost where they propose; their fallback steps keep theirs."""
    i = next(k for k, a in enumerate(ARMS) if a.source == "match" and a.fallback is None)
    rest = per_arm[next(k for k, a in enumerate(ARMS) if a.source == "none")][0] - target_forward(costs, 1)
    alt = list(per_arm)
    for k, a in enumerate(ARMS):
        if a.source == "match":
            alt[k] = {w: per_arm[k][w] if a.fallback is not None and w == 0 else
                      target_forward(costs, w + 1) + rest + float(costs.get("lookup_propose_s", 0.0)) for w in per_arm[k]}
    pol = simulate(traces, alt, seeds)["policies"]

    def fixed(a: Arm) -> dict[str, Any]:
        name = f"fixed:{a.name}"
        return {"fixed_tps": pol[name]["tps"], "fixed_per_domain": {d: pol[name]["per_domain"][d]["tps"] for d in DOMAINS}}

    return {
        "how": " ".join((match_sensitivity.__doc__ or "").split()),
        "step_cost_s": [alt[i][w] for w in sorted(alt[i])],
        **fixed(ARMS[i]),
        "fallback_arms": {a.name: {"step_cost_s": [alt[k][w] for w in sorted(alt[k])], **fixed(a)}
                          for k, a in enumerate(ARMS) if a.source == "match" and a.fallback is not None},
        "oracle_arm_per_domain": pol["oracle:per-domain"]["arm_per_domain"],
        "by_order": {o: headline(pol, o) for o in ("interleaved", "blocked")},
    }


def _boundaries(traces: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The blocked serving order; step indices of domain changes depend on the policy."""
    order = order_prompts(traces, "blocked")
    return {"order": order, "first_prompt_of": {d: next(p for p in order if traces[p]["domain"] == d)
                                                for d in DOMAINS if any(traces[p]["domain"] == d for p in order)}}


def plot(result: Mapping[str, Any], traces: Mapping[str, Any], stem: Path) -> None:
    """``<stem>-arms.png`` (arm per step, blocked order) and ``<stem>-tps.png`` (tokens/s by policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = result["summary"]["workload"]["cost_model"]
    names = [a.name for a in ARMS]
    choices = result["blocked_arm_choices_seed0"]
    pick = result["summary"]["workload"]["by_order"]["blocked"]["best_selector"].split("@")[0]  # best on blocked
    arms = choices[pick]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.2), sharex=True, height_ratios=[1.3, 1])
    ax.scatter(range(len(arms)), arms, s=4, c=arms, cmap="tab10", vmin=0, vmax=9)
    window = 25
    for i, name in enumerate(names):
        hit = np.convolve(np.asarray(arms) == i, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(len(hit)) + window - 1, hit, color=plt.get_cmap("tab10")(i), lw=1.2, label=name)
    for x, d in _step_boundaries(result, traces, pick):
        for a in (ax, ax2):
            a.axvline(x, color="k", lw=0.8, ls="--")
        ax.text(x + 3, len(names) - 0.6, d, fontsize=9)
    ax.set_yticks(range(len(names)), names)
    ax.set_ylim(-0.5, len(names) - 0.2)
    ax2.set_ylabel(f"share, last {window} steps")
    ax2.set_ylim(0, 1)
    ax2.legend(fontsize=7, ncol=4, loc="upper left")
    ax2.set_xlabel("decode step (blocked order: code, then prose, then edit)")
    ax.set_title(f"arm chosen by {pick}, seed 0 (replay; {label})", fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{stem}-arms.png", dpi=120)
    plt.close(fig)

    pol = result["policies"]
    keys = [k for k in pol if pol[k]["order"] in ("any", "interleaved")]
    keys += [k for k in pol if pol[k]["order"] == "blocked"]
    tps = [pol[k]["tps"] for k in keys]
    err = [[0, 0] if "tps_ci95" not in pol[k] else [pol[k]["tps"] - pol[k]["tps_ci95"][0],
                                                     pol[k]["tps_ci95"][1] - pol[k]["tps"]] for k in keys]
    colours = {"fixed": "tab:gray", "oracle": "tab:green", "selector": "tab:blue"}
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(keys) + 1.2))
    ax.barh(range(len(keys)), tps, xerr=np.array(err).T, color=[colours[pol[k]["kind"]] for k in keys])
    ax.set_yticks(range(len(keys)), keys, fontsize=8)
    ax.axvline(pol["oracle:per-domain"]["tps"], color="tab:green", lw=0.8, ls="--")
    ax.invert_yaxis()
    ax.set_xlabel(f"modelled tokens/s ({label}; not measured end to end)")
    ax.set_title("tokens/s by policy on the domain-shifting workload (95% CI over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(f"{stem}-tps.png", dpi=120)
    plt.close(fig)


def _step_boundaries(result: Mapping[str, Any], traces: Mapping[str, Any], pick: str) -> list[tuple[int, str]]:
    """Re-derive the step index where each domain starts in the seed-0 blocked replay."""
    order = result["domain_boundaries_blocked"]["order"]
    arms = result["blocked_arm_choices_seed0"][pick]
    out, i, seen = [], 0, set()
    for pid in order:
        tr = traces[pid]
        if tr["domain"] not in seen:
            seen.add(tr["domain"])
            out.append((i, tr["domain"]))
        t = 0
        while t < len(tr["tokens"]):
            t += min(accepted_at(ARMS[arms[i]], tr, t) + 1, len(tr["tokens"]) - t)
            i += 1
    return out


# ---------------------------------------------------------------- docs tables

PAGE = ROOT / "docs" / "bandits.md"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(name: str, v: float | Sequence[float]) -> str:
    if isinstance(v, Sequence):  # by proposal width
        if ">" in name:  # entry 0: the fallback's step
            return (f"{1e3 * v[1]:.3g} ms (1 token) to {1e3 * v[-1]:.3g} ms ({len(v) - 1} tokens), "
                    f"{1e3 * v[0]:.3g} ms when `{name.split('>')[1]}` takes over")
        return f"{1e3 * v[0]:.3g} ms (nothing proposed) to {1e3 * v[-1]:.3g} ms ({len(v) - 1} tokens)"
    return f"{1e3 * v:.3g} ms"


def render(result: Mapping[str, Any], full: bool = True) -> str:
    """Markdown tables of the workload section; every number comes from ``result``."""
    w, pol = result["summary"]["workload"], result["policies"]
    cfg = result["config"]
    n = w["prompts_per_domain"]
    lines = [
        f"Cost model: **{w['cost_model']}**. Prompts traced: " + ", ".join(f"{d} {n[d]}" for d in DOMAINS)
        + f"; greedy, at most {cfg['trace_config']['max_new_tokens']} new tokens each, "
        f"{cfg['trace_config']['dtype']} on {cfg['trace_config']['device']}. Results commit "
        f"`{result['commit'][:10]}`.",
        "",
        "Modelled step time per arm: "
        + ", ".join(f"`{k}` {_ms(k, v)}" for k, v in cfg["step_cost_s"].items()) + ".",
        "",
    ]
    if full:
        lines += _acceptance_table(result) + _policy_table(pol)
    else:
        oracle = pol["oracle:per-domain"]
        lines += ["Per-domain oracle: " + ", ".join(f"{d} `{a}`" for d, a in oracle["arm_per_domain"].items())
                  + "; fixed arms: " + ", ".join(f"`{k.removeprefix('fixed:')}` {v['tps']:.1f}" for k, v in pol.items()
                                                 if v["kind"] == "fixed") + " tok/s.", ""]
    lines += ["**Goals** (best selector per order against the best single fixed arm and the per-domain oracle):",
              "", "| order | best selector | tok/s | best fixed arm | tok/s | oracle tok/s | selector / oracle | "
              ">= best fixed? | within 5% of oracle? |", "|---|---|---:|---|---:|---:|---:|---|---|"]
    for order, h in w["by_order"].items():
        lines.append(f"| {order} | `{h['best_selector'].split('@')[0]}` | {h['best_selector_tps']:.1f} | "
                     f"`{h['best_fixed'].removeprefix('fixed:')}` | {h['best_fixed_tps']:.1f} | {h['oracle_tps']:.1f} | "
                     f"{_pct(h['selector_vs_oracle'])} | {'yes' if h['selector_ge_fixed'] else 'no'} | "
                     f"{'yes' if h['selector_within_5pct_of_oracle'] else 'no'} |")
    g = w.get("gated")
    if full and g:
        lines += ["", f"**Lookup first** (`summary.workload.gated`: `{g['first']}` as `[selector] first`, the selector "
                  "choosing only where it finds nothing between a plain step and the draft's; its two fixed policies "
                  "and their oracle):", "",
                  "| order | best selector | tok/s | best fixed policy | tok/s | oracle tok/s | selector / oracle | "
                  ">= best fixed? | within 5% of oracle? | / best fixed arm of all | / oracle of all arms |",
                  "|---|---|---:|---|---:|---:|---:|---|---|---:|---:|"]
        for order, h in g["by_order"].items():
            lines.append(f"| {order} | `{h['best_selector'].split('@')[0]}` | {h['best_selector_tps']:.1f} | "
                         f"`{h['best_fixed'].removeprefix('fixed:')}` | {h['best_fixed_tps']:.1f} | "
                         f"{h['oracle_tps']:.1f} | {_pct(h['selector_vs_oracle'])} | "
                         f"{'yes' if h['selector_ge_fixed'] else 'no'} | "
                         f"{'yes' if h['selector_within_5pct_of_oracle'] else 'no'} | "
                         f"{h['selector_vs_all_arms_best_fixed']:.3f}x | {_pct(h['selector_vs_all_arms_oracle'])} |")
    return "\n".join(lines)


def _acceptance_table(result: Mapping[str, Any]) -> list[str]:
    lines = ["**Acceptance per arm** (every position of every trace; acceptance = accepted / proposed tokens, "
             "that is / gamma but for the `lookup-match` arms; mean acc. = accepted tokens per step):", "",
             "| arm | " + " | ".join(f"{d} acc. | {d} mean acc." for d in ("overall", *DOMAINS)) + " |",
             "|---|" + "---:|---:|" * (1 + len(DOMAINS))]
    for arm, by in result["arm_acceptance"].items():
        cells = [f"{_pct(by[d]['acceptance'])} | {by[d]['mean_accepted']:.2f}" for d in ("overall", *DOMAINS)]
        lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    for arm, by in result["arm_acceptance"].items():
        if any(by[d].get("proposes", 1.0) < 1.0 for d in by):  # a variable-width arm
            lines += ["", f"`{arm}` proposes tokens (a match of >= 2 tokens) at "
                      + ", ".join(f"{_pct(by[d]['proposes'])} of {d} positions" for d in ("overall", *DOMAINS))
                      + "; mean width " + ", ".join(f"{d} {by[d]['mean_width']:.2f}" for d in ("overall", *DOMAINS))
                      + ". Its acceptance is accepted / proposed tokens."]
        if "falls_back" in by["overall"]:
            lines += ["", f"`{arm}` hands the step to `{arm.split('>')[1]}` at "
                      + ", ".join(f"{_pct(by[d]['falls_back'])} of {d} positions" for d in ("overall", *DOMAINS))
                      + "; its acceptance counts the tokens of whichever proposal the step verified."]
    return [*lines, ""]


def _policy_table(pol: Mapping[str, Any]) -> list[str]:
    lines = ["**Modelled tokens/s by policy**, best first (Thompson variants: mean over seeds and 95% interval; "
             "a domain's column is its tokens over its modelled time within the same run; mean acc. = accepted "
             "tokens per step):", "",
             "| policy | order | overall tok/s | 95% CI | " + " | ".join(DOMAINS) + " | mean acc. |",
             "|---|---|---:|---|" + "---:|" * len(DOMAINS) + "---:|"]
    for k, v in sorted(pol.items(), key=lambda kv: -kv[1]["tps"]):
        ci = v.get("tps_ci95")
        ci_s = f"[{ci[0]:.1f}, {ci[1]:.1f}]" if ci and v.get("seeds", 1) > 1 else "-"
        mal = v["overall"]["mean_accepted"] if "overall" in v else None
        doms = " | ".join(f"{v['per_domain'][d]['tps']:.1f}" for d in DOMAINS)
        name = k.split("@")[0]
        if v["kind"] == "oracle":
            name += " (" + ", ".join(f"{d}: {a}" for d, a in v["arm_per_domain"].items()) + ")"
        lines.append(f"| `{name}` | {v['order']} | {v['tps']:.1f} | {ci_s} | {doms} | "
                     + ("-" if mal is None else f"{mal:.2f}") + " |")
    return [*lines, ""]


BLOCKS = {  # marker name in docs/bandits.md -> (result JSON, full tables?)
    "bandit-workload-tables": (RESULT, True),
    "bandit-workload-cpu-tables": (OUT / "bandit-workload-cpu.json", False),
}


def run_render(args: argparse.Namespace) -> int:
    page = old = PAGE.read_text()
    for name, (path, full) in BLOCKS.items():
        begin, end = f"<!-- BEGIN {name} (benchmarks/bandit_workload.py render) -->", f"<!-- END {name} -->"
        if begin not in page or not path.is_file():
            raise SystemExit(f"{PAGE} has no {begin} marker, or {path} is missing")
        block = f"{begin}\n{render(json.loads(path.read_text()), full)}\n{end}"
        page = page[: page.index(begin)] + block + page[page.index(end) + len(end):]
    if args.check:
        return int(page != old)
    PAGE.write_text(page)
    say(f"updated {PAGE}")
    return 0


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    tr = sub.add_parser("trace", help="greedy target traces + per-position match runs (CPU)")
    tr.add_argument("--workload", type=Path, default=WORKLOAD)
    tr.add_argument("--out", type=Path, default=TRACES)
    tr.add_argument("--max-new-tokens", type=int, default=64)
    tr.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    tr.add_argument("--threads", type=int, default=2)
    co = sub.add_parser("costs", help="CPU step timings of the real models")
    co.add_argument("--out", type=Path, default=COSTS_CPU)
    co.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    co.add_argument("--threads", type=int, default=2)
    co.add_argument("--context", type=int, default=300)
    co.add_argument("--reps", type=int, default=9)
    si = sub.add_parser("simulate", help="replay every policy over the traces")
    si.add_argument("--traces", type=Path, default=TRACES)
    si.add_argument("--out", type=Path, default=RESULT)
    si.add_argument("--cost-model", choices=("h200", "cpu"), default="h200",
                    help="h200: step costs from docs/benchmarks/e2e-h200.json; cpu: the table `costs` measured here")
    si.add_argument("--cpu-costs", type=Path, default=COSTS_CPU)
    si.add_argument("--seeds", type=int, default=10)
    si.add_argument("--no-plots", action="store_true")
    re_ = sub.add_parser("render", help="rewrite the workload tables in docs/bandits.md from the JSON")
    re_.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return {"trace": run_trace, "costs": run_costs, "simulate": run_simulate, "render": run_render}[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
