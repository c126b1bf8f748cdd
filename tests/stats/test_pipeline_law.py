"""Pipeline-level exactness: the first 3 generated tokens follow the target's law.

A tiny target (V = 16) makes the law of the first 3 tokens enumerable from the
target alone; the full pipeline (KV caches, rollback, ragged batches, arms that
switch mid-sequence, draft trees) must reproduce it whatever the selector, adversarial
ones included. Each gate is a chi-square test on N = 12,000 sequences at level
ALPHA = 1e-3; the same gate must reject the planted pipeline bugs below.
"""

from __future__ import annotations

from typing import Any

import pytest
from _law import ALPHA, SteadyClock, gate, law_of, seeded
from _tiny import pipeline_dict

from flashspec_core import pipeline as pipeline_module
from flashspec_core.build import build_pipeline

pytestmark = pytest.mark.stats
SAMPLINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
]


@pytest.fixture(autouse=True)
def steady_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Step times from :class:`SteadyClock`, and selectors that draw seeded (:func:`seeded`):
    each gate's samples are the same every run, as the verifier gates' are."""
    monkeypatch.setattr(pipeline_module, "time", SteadyClock())


SELECTORS = ["fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson", "glr_thompson", "request_thompson", "alternate_on_rejection", "strange_parity"]


@pytest.mark.parametrize("selector", SELECTORS)
def test_law_holds_for_every_selector(law_setup: dict[str, Any], selector: str) -> None:
    sampling = SAMPLINGS[0]
    config = seeded(pipeline_dict(law_setup["target"], law_setup["drafts"], selector, dtype="float32"), law_setup["registry"])
    pipe = build_pipeline(config, law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


@pytest.mark.parametrize("request_rows", [0.0, 8.0])
def test_law_holds_for_factored(law_setup: dict[str, Any], request_rows: float) -> None:
    """The shipped selector, pooled and per request (each request's own acceptance counts)."""
    sampling = SAMPLINGS[0]
    config = pipeline_dict(law_setup["target"], law_setup["drafts"], "factored", dtype="float32",
                           request_rows=request_rows, seed=0)
    pipe = build_pipeline(config, law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


# Buckets across the live-row counts of the gate's batches of 2000 rows (about 1000 to 1900
# after the first step, as rows finish at EOS or their third token): the count crosses buckets
# within a batch, so first-step draws for the top bucket are dropped and other buckets choose.
BUCKETS = [1, 1000, 1250, 1500, 1750, 1950]


@pytest.mark.parametrize("selector", ["thompson"])
def test_law_holds_with_a_selector_per_batch_bucket(law_setup: dict[str, Any], selector: str) -> None:
    """One selector per bucket of live rows (a none arm among the arms): the choice depends on
    past rewards and on how many rows are still live, which the sequences decide, so the law
    is the target's; draws made for a bucket the next step no longer has are dropped."""
    sampling = SAMPLINGS[0]
    config = seeded(pipeline_dict(law_setup["target"], law_setup["drafts"], selector, dtype="float32",
                                  batch_buckets=BUCKETS), law_setup["registry"])
    config["arm"].append({"use": "none", "name": "plain"})
    pipe = build_pipeline(config, law_setup["registry"])
    buckets: set[int] = set()
    pipe.on_step = lambda record: buckets.add(pipe.policy.settings.bucket(record.batch_size))
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA
    assert len(buckets) >= 4  # the gate crossed buckets


def test_law_holds_with_a_gated_first_arm(law_setup: dict[str, Any]) -> None:
    """A match-only lookup tried first, its proposals played or rolled back unplayed by each
    bucket's first gate (exploring every second proposal, so both happen often), the selector
    choosing among the drafts and plain decoding where the gate skips or nothing matched, the
    lookup's length capped by the batch size: the gate and the cap read past steps and the
    batch only, so the law is the target's."""
    sampling = SAMPLINGS[0]
    config = seeded(pipeline_dict(law_setup["target"], law_setup["drafts"], "thompson", dtype="float32",
                                  batch_buckets=BUCKETS), law_setup["registry"])
    config["arm"] = [{"use": "prompt_lookup", "gamma": 4, "min_ngram": 1, "fill": False, "select": False,
                      "name": "lookup-first"}, *config["arm"], {"use": "none", "name": "plain"}]
    # first_tokens: over the gate's batches of 2000 rows the lookup proposes 6000 // 2000 - 1 = 2 a row, not 4
    config["selector"] |= {"first": "lookup-first", "first_explore": 2, "first_tokens": 6000}
    pipe = build_pipeline(config, law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA
    gates = pipe.policy.first_gates
    # each side of the gate ran (the gate's batches are few, wide steps: a dozen or so proposals)
    assert sum(g.steps(played=True) for g in gates) >= 5 and sum(g.steps(played=False) for g in gates) >= 5
    assert pipe.policy.first_gamma(2000) == 2


@pytest.mark.parametrize("sampling", SAMPLINGS[1:], ids=["top_k", "top_p"])
def test_law_holds_with_filtering(law_setup: dict[str, Any], sampling: dict[str, Any]) -> None:
    pipe = build_pipeline(pipeline_dict(law_setup["target"], law_setup["drafts"], "alternate_on_rejection", dtype="float32"), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


# Draft trees (hf target): prompt lookup with sibling branches, the close draft's top-k tree,
# a suffix tree whose state every row of the batch shares (a row's tree depends on the
# other rows' sampled tokens, never on its own step's draws), and the close draft's tree with
# children drawn without replacement (tree_children = "sample", verified with their laws; four
# at the root, where a sibling drawn with replacement would repeat an elder most often);
# alone (fixed) and among the chain arms (adversarial selector); reference verifier, and the
# triton verifier below.
TREE_ARMS = ["lookup-tree", "hf-tree", "suffix-tree", "hf-tree-sampled"]


def tree_dict(setup: dict[str, Any], selector: str = "fixed", arm: int = 0) -> dict[str, Any]:
    """pipeline_dict's arms with the two tree arms first (a fixed selector plays ``arm``)."""
    config = pipeline_dict(setup["target"], setup["drafts"][:1], selector, dtype="float32",
                           **({"arm": arm} if selector == "fixed" else {}))
    trees = [{"use": "prompt_lookup", "gamma": 4, "branches": 2, "name": "lookup-tree"},
             {"use": "hf", "model": str(setup["drafts"][0]), "dtype": "float32", "gamma": 7, "tree_width": [2, 2, 1],
              "name": "hf-tree"},
             {"use": "suffix", "gamma": 4, "branches": 2, "min_match": 1, "name": "suffix-tree"},
             {"use": "hf", "model": str(setup["drafts"][0]), "dtype": "float32", "gamma": 7, "tree_width": [4, 3],
              "tree_children": "sample", "name": "hf-tree-sampled"}]
    return {**config, "arm": trees + config["arm"]}


TREE_CASES = [("lookup-tree", SAMPLINGS[0]), ("lookup-tree", SAMPLINGS[2]), ("hf-tree", SAMPLINGS[0]),
              ("hf-tree", SAMPLINGS[1]),  # each tree arm at T = 1 and under one filter
              pytest.param("suffix-tree", SAMPLINGS[0], marks=pytest.mark.slow),  # by default: among the chains
              ("hf-tree-sampled", SAMPLINGS[0]), ("hf-tree-sampled", SAMPLINGS[1])]


@pytest.mark.parametrize(("arm", "sampling"), TREE_CASES,
                         ids=["lookup-t1", "lookup-top_p", "hf-t1", "hf-top_k", "suffix-t1", "hf-sampled-t1",
                              "hf-sampled-top_k"])
def test_law_holds_for_tree_arms(law_setup: dict[str, Any], arm: str, sampling: dict[str, Any]) -> None:
    pipe = build_pipeline(tree_dict(law_setup, arm=TREE_ARMS.index(arm)), law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # the interpreter's log(0)
@pytest.mark.parametrize("verifier", ["reference", "triton"])
def test_law_holds_with_trees_among_chains(law_setup: dict[str, Any], verifier: str) -> None:
    sampling = SAMPLINGS[0]
    if verifier == "triton":
        pytest.importorskip("triton")
    config = {**tree_dict(law_setup, "alternate_on_rejection"), "verifier": {"use": verifier}}
    pipe = build_pipeline(config, law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA


# The triton verifier (philox noise, Triton's interpreter on the CPU) on the lookup tree alone;
# the hf tree (whose forwards cost the most CPU time) it verifies among the chains above.
TRITON_TREE_CASES = [("lookup-tree", SAMPLINGS[0]), ("lookup-tree", SAMPLINGS[2])]


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # the interpreter's log(0)
@pytest.mark.parametrize(("arm", "sampling"), TRITON_TREE_CASES, ids=["lookup-t1", "lookup-top_p"])
def test_law_holds_for_tree_arms_on_triton(law_setup: dict[str, Any], arm: str, sampling: dict[str, Any]) -> None:
    pytest.importorskip("triton")
    config = {**tree_dict(law_setup, arm=TREE_ARMS.index(arm)), "verifier": {"use": "triton"}}
    pipe = build_pipeline(config, law_setup["registry"])
    assert gate(pipe, law_of(law_setup, sampling), sampling) > ALPHA
