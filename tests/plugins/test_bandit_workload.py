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


def _trace(domain: str, draft: list[bool], lookup: list[int]) -> dict:
    return {"domain": domain, "tokens": list(range(len(draft))), "draft_run": bw.match_runs(draft),
            "lookup_run": lookup}


TRACES = {
    "code-0": _trace("code", [True, True, False, True, True, True, True, False, True], [0] * 9),
    "code-1": _trace("code", [True] * 7, [1, 0, 0, 0, 0, 0, 0]),
    "prose-0": _trace("prose", [False, True, False, False, True, False], [0] * 6),
    "prose-1": _trace("prose", [False] * 5, [0] * 5),
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
            assert all(0 <= s.accepted <= bw.ARMS[s.arm].gamma for s in steps)


def test_orders():
    assert bw.order_prompts(TRACES, "blocked") == ["code-0", "code-1", "prose-0", "prose-1", "edit-0", "edit-1"]
    assert bw.order_prompts(TRACES, "interleaved") == ["code-0", "prose-0", "edit-0", "code-1", "prose-1", "edit-1"]


def test_fixed_arm_accounting_by_hand():
    costs = bw.step_costs(COSTS)
    assert costs == pytest.approx([1.2 + 0.01 + 0.9, 1.4 + 0.01 + 1.8, 1.5 + 0.01 + 0.02, 1.0 + 0.01])
    steps = bw.replay(_fixed(2), "acceptance", {"edit-1": TRACES["edit-1"]}, ["edit-1"], costs)
    # lookup run 8 at t=0 -> accept 8, emit 9; then t=9 -> run 1, accept 1 but only 1 token left
    assert [(s.accepted, s.emitted) for s in steps] == [(8, 9), (1, 1)]


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
    assert oracle["arm_per_domain"]["edit"] == "lookup-g8"
    n = sum(len(t["tokens"]) for t in TRACES.values())
    for key, p in pol.items():
        if p["kind"] != "oracle":
            assert p["overall"]["emitted"] == pytest.approx(n), key
    head = bw.headline(pol, "blocked")
    assert head["oracle_tps"] >= head["best_fixed_tps"]


def test_rule_inputs_count_domain_changes():
    assert bw.rule_inputs(TRACES, bw.order_prompts(TRACES, "blocked")) == {"horizon": 49, "breakpoints": 2}
    assert bw.rule_inputs(TRACES, bw.order_prompts(TRACES, "interleaved"))["breakpoints"] == 5
