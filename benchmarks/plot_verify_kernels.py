"""Plot docs/benchmarks/verify-kernels-h200.json (written by verify_kernels.py) on the CPU.

    python benchmarks/plot_verify_kernels.py [JSON] [PNG]
    python benchmarks/plot_verify_kernels.py --table [JSON]   # the markdown table in docs/kernels.md

Left: step time against batch size per (V, gamma, dtype) for the Triton verifier
(philox, eager step), the reference verifier and torch.compile of the reference.
Right: the logits pass's fraction of device-to-device copy bandwidth against the
number of logits it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def table(data: dict) -> str:
    """The summary rows as a markdown table (times in microseconds)."""
    head = (
        "| B | gamma | V | dtype | triton step | triton graph | logits pass | pass % copy bw "
        "| reference | torch.compile | x ref | x compile |"
    )
    lines = [head, "|" + "---:|" * 12]
    us = lambda ms: "-" if ms is None else f"{1000 * ms:.0f}"  # noqa: E731
    for r in data["summary"]["rows"]:
        comp = r["speedup_vs_compile"]
        lines.append(
            f"| {r['B']} | {r['gamma']} | {r['V']} | {r['dtype']} | {us(r['triton_ms'])} | {us(r['triton_graph_ms'])} "
            f"| {us(r['logits_pass_ms'])} | {100 * r['bandwidth_fraction']:.0f} | {us(r['reference_ms'])} "
            f"| {us(r['compile_ms'])} | {r['speedup_vs_reference']:.1f} | {'-' if comp is None else f'{comp:.1f}'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Plot (or tabulate) the verify-kernels JSON.")
    p.add_argument("json", nargs="?", type=Path, default=ROOT / "docs/benchmarks/verify-kernels-h200.json")
    p.add_argument("png", nargs="?", type=Path, help="default: the JSON's path with .png")
    p.add_argument("--table", action="store_true", help="print the markdown table of docs/kernels.md instead")
    args = p.parse_args(argv)
    if not args.json.is_file():
        p.error(f"{args.json}: no such file (write it with benchmarks/verify_kernels.py)")
    src: Path = args.json
    if args.table:
        print(table(json.loads(src.read_text())))
        return 0
    dst = args.png or src.with_suffix(".png")
    data = json.loads(src.read_text())
    rows = data["summary"]["rows"]
    fig, (ax_t, ax_bw) = plt.subplots(1, 2, figsize=(14, 5.5))
    groups = sorted({(r["V"], r["gamma"], r["dtype"]) for r in rows})
    cmap = plt.get_cmap("tab20")
    for i, (v, gamma, dtype) in enumerate(groups):
        sel = sorted((r for r in rows if (r["V"], r["gamma"], r["dtype"]) == (v, gamma, dtype)), key=lambda r: r["B"])
        b = [r["B"] for r in sel]
        color = cmap(i % 20)
        label = f"V={v} g={gamma} {dtype}"
        ax_t.plot(b, [r["triton_ms"] for r in sel], "o-", color=color, label=f"triton {label}")
        ax_t.plot(b, [r["reference_ms"] for r in sel], "x--", color=color, alpha=0.6)
        comp = [(r["B"], r["compile_ms"]) for r in sel if r["compile_ms"] is not None]
        if comp:
            ax_t.plot(*zip(*comp, strict=True), "s:", color=color, alpha=0.6, markersize=3)
        ax_bw.plot(
            [r["B"] * (gamma + 1) * v for r in sel],
            [100 * r["bandwidth_fraction"] for r in sel],
            "o-",
            color=color,
            label=label,
        )
    ax_t.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="median step time (ms)")
    ax_t.set_title("verify step: triton (o-), reference (x--), torch.compile (s:)")
    ax_t.legend(fontsize=6, ncol=2)
    ax_bw.axhline(80, color="grey", linestyle="--", linewidth=0.8)
    ax_bw.axvline(10e6, color="grey", linestyle=":", linewidth=0.8)
    ax_bw.set(xscale="log", xlabel="logits read by the pass, B*(gamma+1)*V", ylabel="% of copy bandwidth")
    gbs = data["summary"]["copy_bandwidth_gbs"]
    ax_bw.set_title(f"logits pass vs copy bandwidth ({gbs:.0f} GB/s, read+write)")
    ax_bw.legend(fontsize=6, ncol=2)
    fig.suptitle(f"{data['device']}, torch {data['torch']}, triton {data['triton']}, commit {data['commit']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"wrote {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
