"""``flashspec bench``'s command line: its options, and every check of them that needs no torch.

The ``flashspec bench`` entry point. It parses the options and checks them, the workload and
the config (:func:`flashspec_core.config.check_components`, as ``flashspec generate`` does)
before it imports :mod:`flashspec_bench.harness`, whose torch import takes seconds, so a
mistake is one line at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flashspec_core.config import check_components, check_generation, read_config
from flashspec_core.registry import build_catalogue

HF_SYSTEMS = ("hf_eager", "hf_compiled", "hf_assisted", "hf_lookup")  # run by flashspec_bench.baselines
SYSTEMS = ("flashspec", "target_only", *HF_SYSTEMS)
DESCRIPTION = "``flashspec bench``: FlashSpec against Hugging Face baselines, same GPU, same prompts."


def read_workload(path: Path) -> list[dict[str, str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else f"not valid UTF-8 ({exc.reason})"
        raise ValueError(f"--workload {path}: {why}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise ValueError(f"{path}:{n}: each line needs a string 'prompt'")
            rows.append({"prompt": row["prompt"], "domain": str(row.get("domain", "unknown"))})
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


def load_config_dict(path: Path, dtype: str | None, fuse: bool, quantization: str | None = None) -> dict[str, Any]:
    """The config at ``path`` with ``--dtype``, ``--fuse`` and ``--quantization`` put in its fast tables."""
    data = read_config(path)
    for table in [data.get("target", {}), *data.get("arm", [])]:
        if isinstance(table, dict) and table.get("use") == "fast":
            table.update({k: v for k, v in (("dtype", dtype), ("quantization", quantization), ("fuse", fuse)) if v})
            if isinstance(table.get("model"), str) and not Path(table["model"]).is_absolute():
                candidate = path.parent / table["model"]
                table["model"] = str(candidate) if candidate.is_dir() else table["model"]
    return data


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _numbers(kind: type[int] | type[float]) -> Callable[[str], list[Any]]:
    """An argparse type: a comma list of ``kind``, refused in words (not "invalid <lambda> value")."""
    def parse(text: str) -> list[Any]:
        try:
            return [kind(x) for x in text.split(",")]
        except ValueError:
            what = "integers" if kind is int else "numbers"
            raise argparse.ArgumentTypeError(f"expected a comma list of {what}, got {text!r}") from None
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashspec bench", description=DESCRIPTION)
    p.add_argument("--workload", type=Path, required=True, help="JSONL: {'prompt': ..., 'domain': ...} per line")
    p.add_argument("--config", type=Path, required=True, help="FlashSpec pipeline TOML (its arms and selector)")
    p.add_argument("--out", type=Path, required=True, help="output folder (bench.json)")
    p.add_argument("--batch-size", type=int, default=1, help="prompts decoded together per batch (default 1)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy, the default)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt at most (default 128)")
    p.add_argument("--no-prewarm", action="store_true",
                   help="do not capture the drafts' graphs before the warm-up (FastDraft.prewarm)")
    p.add_argument("--warmup", type=int, default=-1,
                   help="batches run untimed before timing, per system (-1: all of them, so no capture or compile "
                        "of a new shape lands in a timed run; a bandit warms up on a tour of its arms, not its own "
                        "choices, and is timed untrained)")
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs per system, after every system has warmed up; within a repeat the systems "
                        "take turns batch by batch and who goes first rotates with the batch and the repeat")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling and selector generators (default 0)")
    p.add_argument("--prompts", type=int, default=0, help="use only the first N prompts (0 = all)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list from {','.join(SYSTEMS)}")
    p.add_argument("--hf-prompts", type=int, default=0, help="HF baselines on the first N prompts only (0 = all)")
    p.add_argument("--selectors", type=_names, default=[],
                   help="comma list of more registered selectors to run as bandits (default configs)")
    p.add_argument("--no-fixed-arms", action="store_true", help="skip the fixed-arm runs (bandit only)")
    p.add_argument("--assistant-tokens", type=int, default=5, help="num_assistant_tokens for hf_assisted")
    p.add_argument("--lookup-tokens", type=int, default=10, help="prompt_lookup_num_tokens for hf_lookup")
    p.add_argument("--dtype", default=None, help="override the dtype of every fast model (e.g. float32)")
    p.add_argument("--order", default="file", choices=["file", "interleaved"],
                   help="serve the prompts in file order, or round-robin over their domains")
    p.add_argument("--quantization", default=None, choices=["none", "nf4"],
                   help="override the quantization of every fast model (nf4 needs bitsandbytes)")
    p.add_argument("--fuse", action="store_true", help="Inductor-fuse elementwise ops in fast models")
    p.add_argument("--exactness", type=int, default=0, metavar="N",
                   help="also run the FlashSpec bandit and target-only decoding greedily in float32 "
                        "with TF32 off on N prompts and compare their tokens")
    p.add_argument("--exactness-fixed", action="store_true",
                   help="the float32 check runs every fixed arm too (draft trees included), not only the bandit")
    p.add_argument("--synthetic-shapes", type=_names, default=[],
                   help="LABELLED SYNTHETIC scaling: e.g. qwen2.5-7b,qwen2.5-14b,qwen2.5-32b")
    p.add_argument("--synthetic-acceptance", type=_numbers(float), default=[0.6, 0.8],
                   help="comma list of the synthetic draft's fixed acceptance rates (default 0.6,0.8)")
    p.add_argument("--synthetic-gammas", type=_numbers(int), default=[4],
                   help="comma list of the synthetic draft's gammas (default 4)")
    p.add_argument("--synthetic-tokens", type=int, default=96, help="new tokens per synthetic run (default 96)")
    p.add_argument("--deadline", type=float, default=0.0, help="seconds; later sections are skipped past it")
    p.add_argument("--commit", default=None, help="the measured commit, where the checkout has no git")
    return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[dict[str, str]]]:
    """The options (``--systems`` as a list) and the workload's rows, every check that needs no torch made.

    :raises ValueError: naming the option, the workload's line or the config's key.
    """
    argv = list(argv)
    args = parser().parse_args(argv[1:] if argv[:1] == ["--"] else argv)  # `flashspec bench -- --workload ...`
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        raise ValueError(f"--systems: unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
    check_generation({"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
                     lambda key: "--" + key.replace("_", "-"))
    for option in ("batch_size", "repeats"):
        if getattr(args, option) < 1:
            raise ValueError(f"--{option.replace('_', '-')} must be an integer >= 1, got {getattr(args, option)}")
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out}: is not a folder (bench.json is written in it)")
    workload = read_workload(args.workload)
    if args.systems:  # only synthetic shapes (no system) load no model of the config
        data = load_config_dict(args.config, args.dtype, args.fuse, args.quantization)
        check_components(data, build_catalogue(), str(args.config), base_dir=args.config.parent)
    return args, workload


def main(argv: Sequence[str] | None = None) -> int:
    args, workload = parse(sys.argv[1:] if argv is None else argv)
    from flashspec_bench.harness import run  # torch: after the options are known to be usable

    return run(args, workload)


if __name__ == "__main__":
    sys.exit(main())
