"""Does the target score a token with the same bits alone and inside a wider forward?

    python benchmarks/width_invariance.py --model DIR|shape:qwen2.5-1.5b --out DIR [--commit SHA]

Greedy speculative decoding emits target-only's tokens exactly only if a token's logits do
not depend on the forward it is scored in: plain decoding scores it alone (width 1), a
verify step as one of ``gamma + 1`` rows. In bf16 on the H200 the two disagree at near-ties
(``e2e-h200.json``, ``summary.bf16_divergence``). This script finds where:

1. **Logits.** Prefill ``--prefix`` random tokens, score the next ``--positions`` tokens one
   by one (the cache then holds what plain decoding writes), then, for each width ``k``,
   score every window of ``k`` of those tokens in one forward over the same cache (restored
   after each window) and compare each row's logits with the same token's from the
   one-token pass: rows bit-equal, the largest difference, argmax agreement. Once with the
   decode-attention kernel and once with SDPA (``Transformer.decode_kernel`` toggled), so a
   kernel that breaks the invariance shows as the difference between the two.
2. **Pieces.** On random inputs of the model's shapes, each piece of a forward at ``M = 1``
   and as the last of ``M = k`` rows: the GEMMs (QKV, output, gate-up, down, LM head, with
   the residual add in place as the forward does it), the compiled RMSNorm and SiLU-mul
   (the last row; once more on ``[1, T, dim]`` inputs as the forward passes them, the lone
   token a tensor of its own), and the decode-attention kernel (every row against its query alone),
   once under one span and once as the forward calls it, each query under its own span.
3. **Depth.** Part 1 at the widest width over the first ``d`` layers only (1, 2, 4, ...,
   all): the first depth whose rows differ localises the layer where the bits part.

Writes ``width-invariance-<device>.json``: device, versions, commit, config and both
tables. No timing: run it anywhere (CPU: float32 or float64, ``TRITON_INTERPRET=1`` for
the kernel).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
for sub in ("plugins", "kernels", ""):
    sys.path.insert(0, str(ROOT / sub))

from flashspec_fast.model import Transformer, linear, linear_add_  # noqa: E402
from flashspec_fast.options import SHAPE_PREFIX, FastOptions, build_model  # noqa: E402
from flashspec_kernels.attention import decode_attention  # noqa: E402

DTYPES = {"bf16": "bf16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}  # -> FastOptions.dtype


def compare(alone: torch.Tensor, wide: torch.Tensor) -> dict[str, Any]:
    """Row ``i`` of ``wide`` against row ``i`` of ``alone`` (both ``[N, ...]``): how many rows
    are bit-equal, the largest absolute difference, and (for logits) argmax agreement."""
    a, w = alone.reshape(alone.shape[0], -1), wide.reshape(wide.shape[0], -1)
    if a.shape != w.shape:
        raise ValueError(f"compare: shapes {tuple(a.shape)} and {tuple(w.shape)} differ")
    equal = (a == w).all(dim=1)
    diff = (a.double() - w.double()).abs().max().item() if a.numel() else 0.0
    return {"rows": int(a.shape[0]), "bit_equal_rows": int(equal.sum()), "max_abs_diff": diff,
            "argmax_equal_rows": int((a.argmax(dim=1) == w.argmax(dim=1)).sum())}


def logits_table(model: Transformer, prefix: int, positions: int, widths: list[int], seed: int) -> dict[str, Any]:
    """Part 1 for the model as configured (kernel or SDPA): per width, every row of every
    window against the one-token pass."""
    dev = model.device
    gen = torch.Generator(device="cpu").manual_seed(seed)
    total = prefix + positions
    if total >= model.max_len:
        raise ValueError(f"--prefix {prefix} + --positions {positions} must stay below max_len {model.max_len}")
    ids = torch.randint(0, model.args.vocab, (1, total), generator=gen).to(dev)
    model.allocate(1)

    def run(lo: int, hi: int) -> torch.Tensor:  # tokens lo..hi-1 in one forward -> [hi - lo, V]
        pos = torch.arange(lo, hi, device=dev)[None]
        return model.forward(ids[:, lo:hi], pos, pos, span=model.span_for(hi))[0]

    run(0, prefix)
    prefilled = (model.k_cache.clone(), model.v_cache.clone())
    alone = torch.cat([run(p, p + 1) for p in range(prefix, total)])  # [positions, V]
    saved = (model.k_cache.clone(), model.v_cache.clone())
    # The same one-token pass again from the same cache: if this differs, the bits depend on
    # something besides the width (the process's history, a nondeterministic kernel).
    model.k_cache.copy_(prefilled[0])
    model.v_cache.copy_(prefilled[1])
    again = torch.cat([run(p, p + 1) for p in range(prefix, total)])
    model.k_cache.copy_(saved[0])
    model.v_cache.copy_(saved[1])
    out: dict[str, Any] = {"one_token_pass_repeated": compare(alone, again)}
    for k in widths:
        got = []
        for lo in range(prefix, total - k + 1):
            got.append((lo - prefix, run(lo, lo + k)))
            model.k_cache.copy_(saved[0])
            model.v_cache.copy_(saved[1])
        rows = torch.cat([w for _, w in got])
        want = torch.cat([alone[i : i + k] for i, _ in got])
        last = compare(torch.stack([alone[i + k - 1] for i, _ in got]), torch.stack([w[-1] for _, w in got]))
        out[str(k)] = {"every_row": compare(want, rows), "last_row": last}
    return out


def pieces_table(model: Transformer, widths: list[int], seed: int) -> dict[str, Any]:
    """Part 2: each piece at M = 1 against the last row of M = k (attention: every row), on
    random inputs."""
    a, w, dev, dt = model.args, model.w, model.device, model.dtype
    gen = torch.Generator(device="cpu").manual_seed(seed)
    layer = w.layers[0]
    hd, group = a.head_dim, a.heads // a.kv_heads

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(device=dev, dtype=dt)

    def residual(x: torch.Tensor, inp: torch.Tensor, weight: Any) -> torch.Tensor:
        return linear_add_(x.clone(), inp, weight)

    pieces: dict[str, Callable[[int], tuple[torch.Tensor, torch.Tensor]]] = {}
    cases: dict[str, tuple[int, Callable[[torch.Tensor], torch.Tensor]]] = {
        "qkv": (a.dim, lambda h: linear(h, layer.wqkv, layer.bqkv)),
        "gate_up": (a.dim, lambda h: linear(h, layer.w_gate_up)),
        "lm_head": (a.dim, lambda h: torch.nn.functional.linear(h, w.lm_head)),
        "rms_norm (compiled if fuse)": (a.dim, lambda h: model.ops.rms_norm(h, layer.attn_norm, a.norm_eps)),
        "silu_mul (compiled if fuse)": (2 * a.ffn, lambda h: model.ops.silu_mul(h)),
    }
    def last_row(cols: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        def piece(k: int) -> tuple[torch.Tensor, torch.Tensor]:
            h = rnd(k, cols)
            return fn(h[-1:]), fn(h)[-1:]
        return piece

    for name, (cols, fn) in cases.items():
        pieces[name] = last_row(cols, fn)

    def as_forward(cols: int, fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        """As a forward calls the op: ``[1, T, cols]``, the lone token a tensor of its own (no
        view at an offset), so a compiled op meets the layouts it meets in part 1."""
        def piece(k: int) -> tuple[torch.Tensor, torch.Tensor]:
            h = rnd(k, cols)
            return fn(h[-1:].clone()[None])[0], fn(h[None])[0, -1:]
        return piece

    pieces["rms_norm [1, T, dim] (compiled if fuse)"] = as_forward(
        a.dim, lambda h: model.ops.rms_norm(h, layer.attn_norm, a.norm_eps))
    pieces["silu_mul [1, T, 2 ffn] (compiled if fuse)"] = as_forward(2 * a.ffn, lambda h: model.ops.silu_mul(h))
    for name, cols, weight in (("wo + residual (addmm_)", a.heads * hd, layer.wo),
                               ("down + residual (addmm_)", a.ffn, layer.w_down)):
        def res(k: int, cols: int = cols, weight: Any = weight) -> tuple[torch.Tensor, torch.Tensor]:
            x, inp = rnd(k, a.dim), rnd(k, cols)
            return residual(x[-1:], inp[-1:], weight), residual(x, inp, weight)[-1:]
        pieces[name] = res

    def attention(k: int, own_spans: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row of a ``k``-query window against each query alone, all under the window's
        span; ``own_spans``: as the forward calls it, each query alone under its own
        ``span_for(p + 1)``, and the window straddles a power of two, so the spans (and the
        kernel's split counts) differ between the two."""
        slots = min(model.max_len, 512)
        last = slots // 2 + 2 if own_spans else slots - 20  # spans slots / 2 and slots meet at slots / 2
        kc, vc = rnd(1, slots, a.kv_heads, hd), rnd(1, slots, a.kv_heads, hd)
        q = rnd(1, k, a.heads, hd)
        span, pos = model.span_for(last + 1), torch.arange(last - k + 1, last + 1, device=dev)[None]
        alone = torch.cat([decode_attention(q[:, i : i + 1], kc, vc, pos[:, i : i + 1],
                                            model.span_for(int(pos[0, i]) + 1) if own_spans else span)
                           for i in range(k)], 1)
        return alone[0], decode_attention(q, kc, vc, pos, span)[0]  # every row: [k, H, hd]

    pieces[f"decode_attention (group {group}, head dim {hd})"] = attention
    pieces["decode_attention, each at its own span (across a power of two)"] = partial(attention, own_spans=True)
    out: dict[str, Any] = {}
    for name, piece in pieces.items():
        per = {}
        for k in widths:
            per[str(k)] = compare(*piece(k))
        out[name] = per
    return out


def depth_table(model: Transformer, prefix: int, positions: int, width: int, seed: int) -> dict[str, Any]:
    """Part 3: part 1 at one width over the first ``d`` layers only (the rest dropped, the
    final norm and LM head kept), for growing ``d``: the first depth whose rows differ is
    where a token's bits start to depend on the forward, which the pieces on random inputs
    may not show."""
    full = model.w.layers
    depths = sorted({d for d in (1, 2, 4, 8, 16, len(full)) if d <= len(full)})
    out: dict[str, Any] = {}
    try:
        for d in depths:
            model.w.layers = full[:d]
            out[str(d)] = logits_table(model, prefix, positions, [width], seed)[str(width)]["every_row"]
    finally:
        model.w.layers = full
    return out


def load(model: str, dtype: str, device: str, max_len: int, fuse: bool) -> Transformer:
    """The fast back-end's own loader (flashspec_fast.options.build_model), decode kernels on."""
    if not model.startswith(SHAPE_PREFIX) and not (Path(model) / "config.json").is_file():
        raise SystemExit(f"--model {model}: no config.json there (a converted checkpoint folder or shape:NAME)")
    return build_model(FastOptions(model=model, dtype=DTYPES[dtype], device=device, max_len=max_len, fuse=fuse,
                                   attention="triton"))[0]


def commit(given: str | None) -> str | None:
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="converted checkpoint folder, or shape:qwen2.5-1.5b (random)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--widths", default="2,4,7", help="forward widths to compare with width 1 (at most 16)")
    p.add_argument("--prefix", type=int, default=200, help="prefill length before the compared positions")
    p.add_argument("--positions", type=int, default=48)
    p.add_argument("--max-len", type=int, default=768)
    p.add_argument("--no-fuse", action="store_true", help="eager elementwise ops (the bench runs fuse = true)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--paths", default="decode_kernel,sdpa",
                   help="the attention paths of part 1, in the order they run (the counts moved between runs)")
    p.add_argument("--commit")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    widths = [int(x) for x in args.widths.split(",")]
    paths = args.paths.split(",")
    if sorted(paths) != ["decode_kernel", "sdpa"]:
        raise SystemExit(f"--paths {args.paths}: give decode_kernel and sdpa once each, in the order to run them")
    if not all(2 <= k <= 16 for k in widths):
        raise SystemExit(f"--widths {args.widths}: each must be 2..16 (the decode kernel's widths above one)")
    device = torch.device(args.device)
    fuse = not args.no_fuse and device.type == "cuda"
    model = load(args.model, args.dtype, args.device, args.max_len, fuse)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "triton": __import__("triton").__version__, "commit": commit(args.commit),
        "config": {**{k: v for k, v in vars(args).items() if k != "out"}, "fuse": fuse, "out": str(args.out)},
        "logits": {}, "pieces": pieces_table(model, widths, args.seed),
    }
    for name in paths:
        model.decode_kernel = name == "decode_kernel"
        table = logits_table(model, args.prefix, args.positions, widths, args.seed)
        result["logits"][name] = table
        rep = table["one_token_pass_repeated"]
        print(f"[width-invariance] {name}: one-token pass repeated {rep['bit_equal_rows']}/{rep['rows']} rows equal; "
              + ", ".join(f"k={k} {v['every_row']['bit_equal_rows']}/{v['every_row']['rows']} rows equal"
                          for k, v in table.items() if k != "one_token_pass_repeated"), file=sys.stderr)
    model.decode_kernel = True
    width = max(widths)
    result["depth"] = {"width": width, "positions": min(args.positions, 16), "decode_kernel": True,
                       "by_layers": depth_table(model, args.prefix, min(args.positions, 16), width, args.seed)}
    print(f"[width-invariance] first d layers, k={width}: " + ", ".join(
        f"d={d} {v['bit_equal_rows']}/{v['rows']}" for d, v in result["depth"]["by_layers"].items()), file=sys.stderr)
    for name, per in result["pieces"].items():
        print(f"[width-invariance] {name}: " + ", ".join(
            f"k={k} {'equal' if v['bit_equal_rows'] else 'DIFFERS'}" for k, v in per.items()), file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "h200" if "H200" in result["device"] else device.type
    path = args.out / f"width-invariance-{tag}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
