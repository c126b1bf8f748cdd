"""The end-to-end benchmark's result files: what a committed summary keeps of each section.

A ``flashspec bench`` section (one ``bench.json``) holds every step row and generated token
of every system (``runs``), the prompts (``workload``) and each prompt's bf16 divergence. Those
go to the raw file under the ignored ``benchmarks/.results/``; the committed JSON keeps what
the docs quote: the per-system summaries (with acceptance by position), the section summary,
its arguments, config, bandwidth floor and environment, and divergence counts.
"""

from __future__ import annotations

from typing import Any

# kept as they are: small, and what the docs and the readme renderer read
KEPT = ("environment", "args", "config", "summaries", "summary", "floor", "bandwidth_bytes_per_s",
        "draft_prewarm", "exactness", "synthetic_scaling", "wall_s")


def slim_section(section: dict[str, Any]) -> dict[str, Any]:
    """A section as committed: the KEPT keys, and ``bf16_divergence`` cut to counts per system.

    Dropped: ``runs`` (per-step rows and tokens) and ``workload`` (the prompts); both stay in
    the raw file. A divergence list becomes ``{"prompt_runs": n, "diverged": k}``.
    """
    out = {k: section[k] for k in KEPT if k in section}
    div = section.get("bf16_divergence")
    if div:
        out["bf16_divergence"] = {
            name: {"prompt_runs": len(rows), "diverged": sum(r.get("first_divergence") is not None for r in rows)}
            for name, rows in div.items()}
    return out
