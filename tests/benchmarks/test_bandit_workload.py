"""The workload replay's accounting, on a tiny synthetic trace (no models)."""

from __future__ import annotations

import pytest

from flashspec_bench.arms import ADAPTIVE, ARMS, step_costs
from flashspec_bench.traces import DOMAINS, lookup_match, lookup_runs, match_runs
from flashspec_bench.workload import (
    arm_stats,
    headline,
    order_prompts,
    replay,
    rule_inputs,
    selector_makers,
    simulate,
    tally,
)


def _trace(domain: str, draft: list[bool], lookup: list[int], width: list[int] | None = None) -> dict:
    width = [min(8, r + 1) if r else 0 for r in lookup] if width is None else width  # a match where lookup hits
    return {"domain": domain, "tokens": list(range(len(draft))), "draft_run": match_runs(draft),
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
    assert match_runs([True, True, False, True]) == [2, 1, 0, 1]
    assert match_runs([]) == []


def test_lookup_runs_copies_earlier_text():
    prompt = [5, 6, 7, 8, 9, 5, 6]
    assert lookup_runs(prompt, [7, 8, 9, 1], gamma=8) == [3, 2, 1, 0]


def test_lookup_match_proposes_only_matches():
    prompt = [5, 6, 7, 8, 9, 5, 6]
    # t=0: "5 6" matched -> proposes 7 8 9 5 6 (5 wide), 3 right; t=1: "6 7" -> 8 9 5 6 7;
    # t=2: "7 8" -> 9 5 6 7 8; t=3: "8 9" -> 5 6 7 8 9, first wrong; t=4: "9 1" no match
    widths, runs = lookup_match(prompt, [7, 8, 9, 1, 2], gamma=8)
    assert widths == [5, 5, 5, 5, 0]
    assert runs == [3, 2, 1, 0, 0]
    assert lookup_match(prompt, [7, 8], gamma=2) == ([2, 2], [2, 1])


@pytest.mark.parametrize("order", ["interleaved", "blocked"])
def test_every_policy_emits_exactly_the_trace(order):
    n = sum(len(t["tokens"]) for t in TRACES.values())
    costs = step_costs(COSTS)
    ids = order_prompts(TRACES, order)
    assert sorted(ids) == sorted(TRACES)
    for name, (make, _) in selector_makers(horizon=50, breakpoints=5).items():
        for reward in ("acceptance", "throughput"):
            steps = replay(make(0), reward, TRACES, ids, costs)
            assert sum(s.emitted for s in steps) == n, (name, reward)
            for pid in TRACES:  # every prompt ends exactly at its last token
                assert sum(s.emitted for s in steps if s.prompt == pid) == len(TRACES[pid]["tokens"])
            assert all(0 <= s.accepted <= s.width <= ARMS[s.arm].gamma for s in steps)


def test_orders():
    assert order_prompts(TRACES, "blocked") == ["code-0", "code-1", "prose-0", "prose-1", "edit-0", "edit-1"]
    assert order_prompts(TRACES, "interleaved") == ["code-0", "prose-0", "edit-0", "code-1", "prose-1", "edit-1"]


def _arm(name: str) -> int:
    return [a.name for a in ARMS].index(name)


def test_fixed_arm_accounting_by_hand():
    costs = step_costs(COSTS)
    names = ("draft0.5b-g3", "draft0.5b-g6", "lookup-g8", "lookup-match", "none")
    assert [costs[_arm(n)][ARMS[_arm(n)].gamma] for n in names] == pytest.approx(
        [1.2 + 0.01 + 0.9, 1.4 + 0.01 + 1.8, 1.5 + 0.01 + 0.02, 1.5 + 0.01 + 0.02, 1.0 + 0.01])
    assert [len(costs[_arm(n)]) for n in names] == [1, 1, 1, 9, 1]
    match = costs[_arm("lookup-match")]
    assert match[0] == pytest.approx(costs[_arm("none")][0] + 0.02)  # no match: a plain step plus the search
    assert all(match[w] < match[w + 1] for w in range(8))  # unmeasured widths from the fitted line
    steps = replay(_fixed(_arm("lookup-g8")), "acceptance", {"edit-1": TRACES["edit-1"]}, ["edit-1"], costs)
    # lookup run 8 at t=0 -> accept 8, emit 9; then t=9 -> run 1, accept 1 but only 1 token left
    assert [(s.accepted, s.emitted) for s in steps] == [(8, 9), (1, 1)]


def test_match_arm_pays_for_the_width_it_proposes():
    costs = step_costs(COSTS)
    i = _arm("lookup-match")
    steps = replay(_fixed(i), "acceptance", {"prose-1": TRACES["prose-1"]}, ["prose-1"], costs)
    assert [(s.width, s.accepted, s.emitted) for s in steps] == [(0, 0, 1), (2, 0, 1), (0, 0, 1), (0, 0, 1),
                                                                  (3, 0, 1)]
    assert [s.seconds for s in steps] == [costs[i][w] for w in (0, 2, 0, 0, 3)]
    assert tally(steps)["acceptance"] == 0.0  # 5 proposed, none accepted


def test_fallback_arm_drafts_where_lookup_finds_nothing():
    costs = step_costs(COSTS)
    i, g3, match = _arm("lookup-match>draft0.5b-g3"), _arm("draft0.5b-g3"), _arm("lookup-match")
    assert ARMS[i].fallback == ARMS[g3] and ARMS[i].primary == ARMS[match]
    assert costs[i][0] == pytest.approx(costs[g3][3] + 0.02)  # a draft step plus the search that found nothing
    assert all(costs[i][w] == costs[match][w] for w in range(1, 9))  # a lookup step where it matched
    # prose-1: widths 0 2 0 0 3, draft never right: t=0 draft (0 of 3) emits 1; t=1 lookup (0 of 2);
    # t=2, t=3 draft; t=4 lookup (0 of 3)
    steps = replay(_fixed(i), "acceptance", {"prose-1": TRACES["prose-1"]}, ["prose-1"], costs)
    assert [(s.width, s.accepted, s.emitted) for s in steps] == [(3, 0, 1), (2, 0, 1), (3, 0, 1), (3, 0, 1),
                                                                  (3, 0, 1)]
    assert [s.seconds for s in steps] == [costs[i][w] for w in (0, 2, 0, 0, 3)]
    # code-1: lookup matches only at t=0 (run 1 of width 2), then the draft accepts 3 of 3 twice
    steps = replay(_fixed(i), "acceptance", {"code-1": TRACES["code-1"]}, ["code-1"], costs)
    assert [(s.width, s.accepted, s.emitted) for s in steps] == [(2, 1, 2), (3, 3, 4), (3, 1, 1)]
    assert [s.seconds for s in steps] == [costs[i][2], costs[i][0], costs[i][0]]
    stats = arm_stats(TRACES)[ARMS[i].name]["code"]
    assert stats["falls_back"] == pytest.approx(15 / 16)  # code-0: no match at all 9 positions, code-1: 6 of 7


def _fixed(arm: int):
    from flashspec_selectors import FixedConfig, FixedSelector

    return FixedSelector(FixedConfig(arm=arm), len(ARMS))


def test_oracle_beats_every_fixed_arm_per_domain():
    sim = simulate(TRACES, step_costs(COSTS), seeds=2)
    pol = sim["policies"]
    oracle = pol["oracle:per-domain"]
    for d in DOMAINS:
        for a in ARMS:
            assert oracle["per_domain"][d]["tps"] >= pol[f"fixed:{a.name}"]["per_domain"][d]["tps"]
    assert all(oracle["tps"] >= pol[f"fixed:{a.name}"]["tps"] - 1e-12 for a in ARMS)
    assert oracle["arm_per_domain"]["edit"] in ("lookup-g8", "lookup-match")
    n = sum(len(t["tokens"]) for t in TRACES.values())
    for key, p in pol.items():
        if p["kind"] != "oracle":
            assert p["overall"]["emitted"] == pytest.approx(n), key
    head = headline(pol, "blocked")
    assert head["oracle_tps"] >= head["best_fixed_tps"]


def test_rule_inputs_count_domain_changes():
    assert rule_inputs(TRACES, order_prompts(TRACES, "blocked")) == {"horizon": 49, "breakpoints": 2}
    assert rule_inputs(TRACES, order_prompts(TRACES, "interleaved"))["breakpoints"] == 5


def test_first_arm_steps_run_without_the_selector():
    """first = the match arm (the engine's [selector] first): where lookup proposes, the step is
    the match arm's, arm -1, and the selector is neither asked nor updated; elsewhere it picks.
    Each fixed policy is then step for step the ungated fallback arm or match arm."""
    arms = ADAPTIVE  # (lookup-match, lookup-match>draft0.5b-g3)
    costs = step_costs(COSTS, arms)
    ids = order_prompts(TRACES, "blocked")
    no_match = sum(w == 0 for t in TRACES.values() for w in t["match_width"])  # an upper bound on selector steps

    class Counting:
        num_arms = 2

        def __init__(self) -> None:
            self.asked = self.told = 0

        def select(self) -> int:
            self.asked += 1
            return self.asked % 2

        def update(self, arm: int, reward: float) -> None:
            self.told += 1

    sel = Counting()
    steps = replay(sel, "throughput", TRACES, ids, costs, arms, first=0)
    assert sum(s.emitted for s in steps) == sum(len(t["tokens"]) for t in TRACES.values())
    gate = [s for s in steps if s.arm == -1]
    assert gate and all(s.width > 0 for s in gate)
    assert sel.asked == sel.told == len(steps) - len(gate) <= no_match
    from flashspec_selectors import FixedConfig, FixedSelector

    for i in range(len(arms)):
        gated = replay(FixedSelector(FixedConfig(arm=i), 2), "acceptance", TRACES, ids, costs, arms, first=0)
        plain = replay(FixedSelector(FixedConfig(arm=i), 2), "acceptance", TRACES, ids, costs, arms)
        assert [(s.width, s.accepted, s.emitted, s.seconds) for s in gated] == \
               [(s.width, s.accepted, s.emitted, s.seconds) for s in plain]


def test_draw_ahead_replays_the_engines_call_order():
    """draw_ahead: every step draws the next choice before its own reward is fed; a selector
    step plays the draw the step before made, a draw before a first-arm step or at a prompt's
    end is dropped, so there are as many draws as steps plus each prompt's fresh first draw."""
    arms = ADAPTIVE
    costs = step_costs(COSTS, arms)
    ids = order_prompts(TRACES, "blocked")

    class Logged:
        num_arms = 2

        def __init__(self) -> None:
            self.log: list[tuple[str, int]] = []

        def select(self) -> int:
            self.log.append(("select", sum(k == "select" for k, _ in self.log) % 2))
            return self.log[-1][1]

        def update(self, arm: int, reward: float) -> None:
            self.log.append(("update", arm))

    sel = Logged()
    steps = replay(sel, "throughput", TRACES, ids, costs, arms, first=0, draw_ahead=True)
    fresh = 0
    for pid in ids:
        first_step = next(s for s in steps if s.prompt == pid)
        fresh += first_step.arm != -1
    assert sum(k == "select" for k, _ in sel.log) == len(steps) + fresh
    for i, (kind, arm) in enumerate(sel.log):
        if kind == "update":  # the played draw is the one before this step's own draw ahead
            assert arm == [a for k, a in sel.log[:i] if k == "select"][-2]


def test_first_position_acceptance_is_each_trace_at_t0():
    stats = arm_stats(TRACES)
    draft = next(a for a in ARMS if a.source == "draft")
    want = sum(min(draft.gamma, t["draft_run"][0]) for t in TRACES.values() if t["domain"] == "code") / 2
    assert stats[draft.name]["code"]["mean_accepted_first_position"] == want
