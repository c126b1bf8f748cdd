"""The workload replay's accounting, on a tiny synthetic trace (no models)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("bandit_workload", ROOT / "benchmarks" / "bandit_workload.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bandit_workload"] = mod  # attrs needs the module registered to resolve annotations
    spec.loader.exec_module(mod)
    return mod


bw = _load()


def _trace(domain: str, draft: list[bool], lookup: list[int], width: list[int] | None = None) -> dict:
    width = [min(8, r + 1) if r else 0 for r in lookup] if width is None else width  # a match where lookup hits
    return {"domain": domain, "tokens": list(range(len(draft))), "draft_run": bw.match_runs(draft),
            "lookup_run": lookup, "match_width": width, "match_run": [min(r, w) for r, w in zip(lookup, width, strict=True)]}


TRACES = {
    "code-0": _trace("code", [True, True, False, True, True, True, True, False, True], [0] * 9),
    "code-1": _trace("code", [True] * 7, [1, 0, 0, 0, 0, 0, 0]),
    "prose-0": _trace("prose", [False, True, False, False, True, False], [0] * 6),
    "prose-1": _trace("prose", [False] * 5, [0] * 5, [0, 2, 0, 0, 3]),
    "edit-0": _trace("edit", [True, False] * 6, [8, 7, 6, 5, 4, 3, 2, 1, 4, 3, 2, 1]),
    "edit-1": _trace("edit", [False] * 10, [8, 8, 8, 7, 6, 5, 4, 3, 2, 1]),
}
COSTS = {"target_forward_s": {"1": 1.0, "4": 1.2, "7": 1.4, "9": 1.5}, "draft_forward_s": 0.3, "verify_s": 0.01,
         "lookup_propose_s": 0.02}


def test_match_runs():
    assert bw.match_runs([True, True, False, True]) == [2, 1, 0, 1]
    assert bw.match_runs([]) == []


def test_lookup_runs_copies_earlier_text():
    prompt = [5, 6, 7, 8, 9, 5, 6]
    assert bw.lookup_runs(prompt, [7, 8, 9, 1], gamma=8) == [3, 2, 1, 0]


def test_lookup_match_proposes_only_matches():
    prompt = [5, 6, 7, 8, 9, 5, 6]
    # t=0: "5 6" matched -> proposes 7 8 9 5 6 (5 wide), 3 right; t=1: "6 7" -> 8 9 5 6 7;
    # t=2: "7 8" -> 9 5 6 7 8; t=3: "8 9" -> 5 6 7 8 9, first wrong; t=4: "9 1" no match
    widths, runs = bw.lookup_match(prompt, [7, 8, 9, 1, 2], gamma=8)
    assert widths == [5, 5, 5, 5, 0]
    assert runs == [3, 2, 1, 0, 0]
    assert bw.lookup_match(prompt, [7, 8], gamma=2) == ([2, 2], [2, 1])


@pytest.mark.parametrize("order", ["interleaved", "blocked"])
def test_every_policy_emits_exactly_the_trace(order):
    n = sum(len(t["tokens"]) for t in TRACES.values())
    costs = bw.step_costs(COSTS)
    ids = bw.order_prompts(TRACES, order)
    assert sorted(ids) == sorted(TRACES)
    for name, (make, _) in bw.selector_makers(horizon=50, breakpoints=5).items():
        for reward in ("acceptance", "throughput"):
            steps = bw.replay(make(0), reward, TRACES, ids, costs)
            assert sum(s.emitted for s in steps) == n, (name, reward)
            for pid in TRACES:  # every prompt ends exactly at its last token
                assert sum(s.emitted for s in steps if s.prompt == pid) == len(TRACES[pid]["tokens"])
            assert all(0 <= s.accepted <= s.width <= bw.ARMS[s.arm].gamma for s in steps)


def test_orders():
    assert bw.order_prompts(TRACES, "blocked") == ["code-0", "code-1", "prose-0", "prose-1", "edit-0", "edit-1"]
    assert bw.order_prompts(TRACES, "interleaved") == ["code-0", "prose-0", "edit-0", "code-1", "prose-1", "edit-1"]


def test_fixed_arm_accounting_by_hand():
    costs = bw.step_costs(COSTS)
    assert [c[a.gamma] for a, c in zip(bw.ARMS, costs, strict=True)] == pytest.approx(
        [1.2 + 0.01 + 0.9, 1.4 + 0.01 + 1.8, 1.5 + 0.01 + 0.02, 1.5 + 0.01 + 0.02, 1.0 + 0.01])
    assert [len(c) for c in costs] == [1, 1, 1, 9, 1]
    match = costs[3]
    assert match[0] == pytest.approx(costs[4][0] + 0.02)  # no match: a plain step plus the search
    assert all(match[w] < match[w + 1] for w in range(8))  # unmeasured widths from the fitted line
    steps = bw.replay(_fixed(2), "acceptance", {"edit-1": TRACES["edit-1"]}, ["edit-1"], costs)
    # lookup run 8 at t=0 -> accept 8, emit 9; then t=9 -> run 1, accept 1 but only 1 token left
    assert [(s.accepted, s.emitted) for s in steps] == [(8, 9), (1, 1)]


def test_match_arm_pays_for_the_width_it_proposes():
    costs = bw.step_costs(COSTS)
    steps = bw.replay(_fixed(3), "acceptance", {"prose-1": TRACES["prose-1"]}, ["prose-1"], costs)
    assert [(s.width, s.accepted, s.emitted) for s in steps] == [(0, 0, 1), (2, 0, 1), (0, 0, 1), (0, 0, 1),
                                                                  (3, 0, 1)]
    assert [s.seconds for s in steps] == [costs[3][w] for w in (0, 2, 0, 0, 3)]
    assert bw.tally(steps)["acceptance"] == 0.0  # 5 proposed, none accepted


def _fixed(arm: int):
    from flashspec_selectors import FixedConfig, FixedSelector

    return FixedSelector(FixedConfig(arm=arm), len(bw.ARMS))


def test_oracle_beats_every_fixed_arm_per_domain():
    sim = bw.simulate(TRACES, bw.step_costs(COSTS), seeds=2)
    pol = sim["policies"]
    oracle = pol["oracle:per-domain"]
    for d in bw.DOMAINS:
        for a in bw.ARMS:
            assert oracle["per_domain"][d]["tps"] >= pol[f"fixed:{a.name}"]["per_domain"][d]["tps"]
    assert all(oracle["tps"] >= pol[f"fixed:{a.name}"]["tps"] - 1e-12 for a in bw.ARMS)
    assert oracle["arm_per_domain"]["edit"] in ("lookup-g8", "lookup-match")
    n = sum(len(t["tokens"]) for t in TRACES.values())
    for key, p in pol.items():
        if p["kind"] != "oracle":
            assert p["overall"]["emitted"] == pytest.approx(n), key
    head = bw.headline(pol, "blocked")
    assert head["oracle_tps"] >= head["best_fixed_tps"]


def test_rule_inputs_count_domain_changes():
    assert bw.rule_inputs(TRACES, bw.order_prompts(TRACES, "blocked")) == {"horizon": 49, "breakpoints": 2}
    assert bw.rule_inputs(TRACES, bw.order_prompts(TRACES, "interleaved"))["breakpoints"] == 5
