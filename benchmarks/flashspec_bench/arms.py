"""The replay's arms, and the model of what one step of each costs (``bandit_workload.py``).

The arms are those of the GPU's workload sections (:mod:`flashspec_bench.sections`) with the
lookup gamma at 8; a step's time comes from the H200 run's step rows (:func:`h200_costs`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from flashspec_bench.e2e import RAW, load_raw


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


# ---------------------------------------------------------------- simulate phase


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


def load_costs(path: Path | None) -> dict[str, Any]:
    """The step-cost table: :func:`h200_costs` of the raw e2e rows, or a JSON file with the
    table (or a replay result, whose ``config.cost_model`` is one)."""
    if path is None:
        return h200_costs(load_raw(RAW))
    data = json.loads(path.read_text())
    return data["config"]["cost_model"] if "config" in data else data


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

    step: dict[str, float | list[float]] = {}
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


