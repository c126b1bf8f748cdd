"""Greedy traces of the real Qwen pair on the domain-shifting workload (``bandit_workload.py trace``).

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
  arm lack them; :func:`add_match` derives them from the prompt (tokenised again, checked
  against the trace's ``prompt_len`` and ``lookup_run``) and the traced tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flashspec_bench.provenance import DOCS, ROOT, logger, provenance

WORKLOAD = ROOT / "benchmarks" / "workloads" / "domains.jsonl"
TRACES = DOCS / "bandit-workload-traces.json"
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
LOOKUP_GAMMA = 8  # the largest lookup gamma any arm uses; smaller ones are prefixes
MATCH_MIN_NGRAM = 2  # a one-token match is as often chance as a repeat: stated, not tuned
DOMAINS = ("code", "prose", "edit")
say = logger("bandit-workload")


def load_prompts(path: Path = WORKLOAD) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def round_robin(prompts: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    """code, prose, edit, code, ...: a trace cut short still covers every domain evenly."""
    by = {d: [p for p in prompts if p["domain"] == d] for d in DOMAINS}
    out = []
    for i in range(max(len(v) for v in by.values())):
        out += [by[d][i] for d in DOMAINS if i < len(by[d])]
    return out


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
    data.setdefault("config", {}).update({
        "target": TARGET, "draft": DRAFT, "dtype": args.dtype, "device": "cpu", "decoding": "greedy",
        "max_new_tokens": args.max_new_tokens, "lookup": "flashspec_lookup.lookup, default LookupConfig",
        "match_lookup": f"flashspec_lookup.lookup, LookupConfig(min_ngram={MATCH_MIN_NGRAM}, fill=False)",
        "lookup_gamma": LOOKUP_GAMMA, "workload": str(args.workload.relative_to(ROOT))})
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
        data.update(provenance("benchmarks/bandit_workload.py trace"))
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, separators=(",", ":")))
        tmp.replace(args.out)  # checkpoint: a crash loses at most the prompt in flight
    say(f"wrote {args.out}")
    return 0
