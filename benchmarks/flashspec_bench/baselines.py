"""The Hugging Face baselines of ``flashspec bench``, on the same prompts and GPU as FlashSpec.

* ``hf_eager``: ``model.generate`` with the dynamic cache, eager;
* ``hf_compiled``: ``model.generate`` with a static cache, which transformers compiles;
* ``hf_assisted``: assisted generation with the config's first model draft;
* ``hf_lookup``: prompt-lookup decoding.

Same stopping and sampling as FlashSpec: the target's EOS tokens, no repetition penalty,
no top-k/top-p.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from flashspec_bench.bench_cli import HF_SYSTEMS  # the names the command line accepts (without torch)
from flashspec_bench.provenance import logger
from flashspec_bench.runs import BATCH_IDS, batches, sync

Extra = Callable[[], dict[str, Any]]  # generate() keyword arguments made fresh for each call
say = logger("bench")


def hf_load(path: str, dtype: torch.dtype, device: torch.device) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model.to(device)  # type: ignore[arg-type]  # transformers types .to oddly; moves in place
    return model.eval()


def hf_kwargs(model: Any, args: argparse.Namespace, eos: set[int]) -> dict[str, Any]:
    kw: dict[str, Any] = {"max_new_tokens": args.max_new_tokens, "eos_token_id": sorted(eos),
                          "pad_token_id": model.config.pad_token_id or sorted(eos)[0],
                          "repetition_penalty": 1.0, "top_k": None, "top_p": None}
    if args.temperature > 0:
        kw.update(do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        kw.update(do_sample=False, temperature=None)
    return kw


def hf_run(model: Any, prompts: list[list[int]], groups: list[list[int]], domains: list[str], kw: dict[str, Any],
           extra: Extra = dict) -> dict[str, Any]:
    requests = []
    device = next(model.parameters()).device
    eos = set(kw["eos_token_id"])
    for group in groups:
        width = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), width), kw["pad_token_id"], dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):  # left padding, as generate expects
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        sync()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw, **extra())
        sync()
        wall = time.perf_counter() - t0
        bid = next(BATCH_IDS)
        for row, i in enumerate(group):
            new = out[row, width:].tolist()
            cut = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))
            requests.append({"prompt": i, "domain": domains[i], "new_tokens": cut, "wall_s": wall,
                             "batch": group, "batch_id": bid, "tokens": new[:cut]})
    return {"requests": requests, "steps": []}


def hf_runs(paths: dict[str, str | None], prompts: list[list[int]], domains: list[str], eos: set[int],
            args: argparse.Namespace, record: Callable[[str, dict[str, Any]], None], deadline: float) -> None:
    """Each HF system the bench asks for: a warm-up, then ``args.repeats`` timed runs."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" and args.dtype != "float32" else torch.float32
    model = hf_load(str(paths["target"]), dtype, device)
    kw = hf_kwargs(model, args, eos)
    n = min(args.hf_prompts or len(prompts), len(prompts))
    groups, single = batches(n, args.batch_size), batches(n, 1)
    warm = groups if args.warmup < 0 else groups[: args.warmup] or groups[:1]
    for system in (s for s in HF_SYSTEMS if s in args.systems):
        if time.perf_counter() > deadline:
            say(f"{system}: skipped (deadline)")
            continue
        try:
            use_groups, extra = setup(system, model, paths, args, dtype, device, groups, single, prompts)
            if use_groups is None:
                continue
            say(f"{system}: warm-up")
            hf_run(model, prompts, warm if use_groups is groups else single[:1], domains, kw, extra)
            say(f"{system}: {len(use_groups)} batches x {args.repeats}")
            runs = [hf_run(model, prompts, use_groups, domains, kw, extra) for _ in range(args.repeats)]
            record(system, {"requests": [r for x in runs for r in x["requests"]], "steps": []})
        except Exception as exc:  # one broken baseline must not lose the others' numbers
            say(f"{system}: FAILED {type(exc).__name__}: {exc}")
            record(system, {"requests": [], "steps": [], "error": f"{type(exc).__name__}: {exc}"})
    del model
    gc.collect()


def setup(system: str, model: Any, paths: dict[str, str | None], args: argparse.Namespace, dtype: torch.dtype,
          device: torch.device, groups: list[list[int]], single: list[list[int]], prompts: list[list[int]]
          ) -> tuple[list[list[int]] | None, Extra]:
    """The batches a system runs (None: it cannot run at this batch size) and its extra arguments."""
    if system == "hf_eager":
        return groups, dict
    if args.batch_size != 1:
        say(f"{system}: batch 1 only; skipped")
        return None, dict
    if system == "hf_compiled":
        from transformers import StaticCache

        cache = StaticCache(config=model.config, max_cache_len=max(len(p) for p in prompts) + args.max_new_tokens + 16)

        def extra() -> dict[str, Any]:
            cache.reset()
            return {"past_key_values": cache}

        return single, extra
    if system == "hf_assisted":
        if paths.get("draft") is None:
            say("hf_assisted: needs a model draft; skipped")
            return None, dict
        assistant = hf_load(str(paths["draft"]), dtype, device)
        assistant.generation_config.num_assistant_tokens = args.assistant_tokens
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        return single, lambda: {"assistant_model": assistant}
    return single, lambda: {"prompt_lookup_num_tokens": args.lookup_tokens}
