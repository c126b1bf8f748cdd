"""The statistical exactness gate for tree verification (:mod:`flashspec_core.tree`).

A :class:`TreeCase` fixes a toy *second-order* target and draft (next-token logits
depend on the last two tokens, so ``p`` at a node depends on its parent too), a tree
shape, how sibling groups are drawn (:data:`Mode`), sampling params and the number of
trials. :func:`run_tree_case` starts every trial from one of a few fixed token pairs,
drafts a tree per row from ``q`` (each group given the path to its parent), builds the
target's ``p`` at the root and every node, verifies, and runs further steps from the
emitted tokens until every row has ``K`` tokens. It returns the p-values of these
grouped likelihood-ratio (G) tests against laws computed exactly by enumeration from
the oracle :func:`~flashspec_core.testing.laws.filtered_probs`:

* ``first<k>`` for ``k = 1 .. K``: the first ``k`` emitted tokens (over steps), per
  starting pair, against the target's ``k``-token law (``V ** k`` cells);
* ``step<i>`` for ``i = 2 .. D + 1``: the ``i``-th token emitted in the first step given
  the two tokens before it, over the rows that emitted it in that step.

:func:`tree_gate` applies Holm's correction at the chain gate's
:data:`~flashspec_core.testing.exactness.GATE_ALPHA`. Greedy cases are checked exactly:
the first ``K`` tokens must be the greedy continuation and the first step must accept
the deepest node whose path spells it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs
import torch

from flashspec_core.contracts import SamplingParams
from flashspec_core.sampling import probs_from_logits, sample
from flashspec_core.testing.chisq import ChiSquare, chisquare, expected_counts, grouped_counts
from flashspec_core.testing.exactness import (
    GATE_ALPHA,
    GATE_MIN_EXPECTED,
    GATE_STATISTIC,
    MIN_TRIALS,
    CaseResult,
    GateResult,
    decide,
)
from flashspec_core.testing.laws import filtered_probs, greedy_tokens
from flashspec_core.tree import (
    ROOT,
    TreeDraft,
    TreeVerdict,
    children,
    elder_siblings,
    node_depths,
    path_to,
    sample_children,
    verify_tree,
)

# How each sibling group is drawn from q given the path to its parent:
# "iid": independent draws (with replacement); "without": sequentially without replacement;
# "deterministic": the group's top-w tokens of q, verified with q = None;
# "mixed": the eldest child is q's argmax (a one-hot row of q), the others i.i.d. draws;
# "sample": the model drafts' tree_children = "sample" (flashspec_core.tree.sample_children:
# without replacement by an exponential race, each child reporting its law given its elders).
Mode = Literal["iid", "without", "deterministic", "mixed", "sample"]
# p, draft, generator, greedy -> verdict
TreeVerifyFn = Callable[[torch.Tensor, TreeDraft, torch.Generator, bool], TreeVerdict]
# What the draft reports, given the draft it drew and the q rows it drew them from ([B, N, V]).
TreeReport = Callable[[TreeDraft, torch.Tensor], TreeDraft]
# Cells of the largest k-token law tested: V ** K <= this.
MAX_CELLS = 1_024


@attrs.frozen
class TreeCase:
    """One configuration of the tree exactness suite."""

    name: str
    vocab: int
    parents: tuple[int, ...]
    sampling: SamplingParams
    mode: Mode = "iid"
    trials: int = MIN_TRIALS
    starts: int = 3  # distinct starting (previous, last) token pairs
    q_zeros: float = 0.0  # fraction of the draft's logits set to -inf
    p_neg_inf: float = 0.0  # fraction of the target's logits set to -inf
    overlap: float = 0.5  # how close the draft's logits are to the target's
    scale: float = 2.0  # spread of the target's logits
    draft_scale: float = 1.0  # the draft's logits are multiplied by this (> 1: peaked q)
    table_seed: int = 0

    @property
    def depth(self) -> int:
        return max(node_depths(self.parents), default=0)

    @property
    def tokens_tested(self) -> int:
        """K: the first step's longest output, capped so the K-token law has <= MAX_CELLS cells."""
        k = self.depth + 1
        while k > 1 and self.vocab**k > MAX_CELLS:
            k -= 1
        return k


@attrs.frozen
class TreeModels:
    target: torch.Tensor  # [V, V, V] float32 logits of the next token given (previous, last)
    draft: torch.Tensor  # [V, V, V] float32
    starts: torch.Tensor  # [S, 2] int64 starting (previous, last) pairs


def make_tree_models(case: TreeCase) -> TreeModels:
    """The case's tables and starting pairs (fixed by ``table_seed``, not by the trial seed)."""
    v = case.vocab
    g = torch.Generator().manual_seed(10_007 * case.table_seed + 31 * v + len(case.parents))
    target = case.scale * torch.randn((v, v, v), generator=g)
    noise = case.scale * torch.randn((v, v, v), generator=g)
    draft = case.draft_scale * (case.overlap * target + (1 - case.overlap) * noise)
    starts = torch.randint(0, v, (case.starts, 2), generator=g)
    return TreeModels(_knock_out(target, case.p_neg_inf, g), _knock_out(draft, case.q_zeros, g), starts)


def _knock_out(logits: torch.Tensor, fraction: float, g: torch.Generator) -> torch.Tensor:
    """Set about ``fraction`` of each row (last dim) to -inf, never its maximum."""
    if fraction <= 0:
        return logits
    drop = torch.rand(logits.shape, generator=g) < fraction
    top = torch.nn.functional.one_hot(torch.argmax(logits, dim=-1), logits.shape[-1]).bool()
    return logits.masked_fill(drop & ~top, float("-inf"))


@attrs.frozen
class Drawn:
    """One step's draft trees and the target's distributions over them."""

    draft: TreeDraft  # as the drafter reports it
    q_rows: torch.Tensor  # [B, N, V] float32 the group distribution each node was drawn from
    p: torch.Tensor  # [B, N + 1, V] float32 target probabilities at the root and every node


def draw_trees(models: TreeModels, case: TreeCase, state: torch.Tensor, gen: torch.Generator) -> Drawn:
    """Draft one tree per row from ``state`` ([B, 2] int64: previous and last token)."""
    q_table = probs_from_logits(models.draft, case.sampling)  # [V, V, V]
    p_table = probs_from_logits(models.target, case.sampling)
    plist = list(case.parents)
    tok: dict[int, torch.Tensor] = {ROOT - 1: state[:, 0], ROOT: state[:, 1]}  # node -> [B] token
    up = {ROOT: ROOT - 1, **dict(enumerate(plist))}  # node -> its parent (the root's is -2)
    q_rows: list[torch.Tensor] = [torch.empty(0)] * len(plist)
    report_rows: list[torch.Tensor] = [torch.empty(0)] * len(plist)
    for parent in [ROOT, *range(len(plist))]:
        kids = children(plist, parent)
        if not kids:
            continue
        q_base = q_table[tok[up[parent]], tok[parent]]  # [B, V]
        tokens, rows = _draw_group(q_base, len(kids), case.mode, gen)
        for i, kid in enumerate(kids):
            tok[kid], q_rows[kid], report_rows[kid] = tokens[:, i], q_base, rows[i]
    batch, vocab = state.shape[0], case.vocab
    tokens = torch.stack([tok[n] for n in range(len(plist))], dim=1) if plist else state.new_zeros((batch, 0))
    q = torch.stack(q_rows, dim=1) if plist else torch.zeros((batch, 0, vocab))
    reported = None if case.mode == "deterministic" else (torch.stack(report_rows, dim=1) if plist else q)
    p = torch.stack([p_table[tok[up[n]], tok[n]] for n in [ROOT, *range(len(plist))]], dim=1)
    draft = TreeDraft(tokens, torch.tensor(plist, dtype=torch.int64), reported, case.mode == "without")
    return Drawn(draft, q, p)


def _draw_group(
    q: torch.Tensor, width: int, mode: Mode, gen: torch.Generator
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Draw ``width`` siblings from q ([B, V]): tokens [B, width], the q row each reports."""
    if mode == "deterministic":
        return torch.topk(q, width, dim=-1).indices, [q] * width
    if mode == "sample":
        expo = torch.empty_like(q).exponential_(generator=gen).clamp_min_(torch.finfo(torch.float32).tiny)
        tokens, laws = sample_children(q, width, expo)
        return tokens, list(laws.unbind(1))
    if mode == "without":
        left, drawn = q.clone(), []
        for _ in range(width):
            if bool((left.sum(-1) <= 0).any()):
                raise ValueError(f"q has fewer than {width} tokens to draw without replacement")
            drawn.append(sample(left, gen))
            left.scatter_(1, drawn[-1][:, None], 0.0)
        return torch.stack(drawn, dim=1), [q] * width
    drawn = [sample(q, gen) for _ in range(width)]
    rows = [q] * width
    if mode == "mixed":
        drawn[0] = torch.argmax(q, dim=-1)
        rows[0] = torch.nn.functional.one_hot(drawn[0], q.shape[-1]).float()
    return torch.stack(drawn, dim=1), rows


def reference_verify(p: torch.Tensor, draft: TreeDraft, generator: torch.Generator, greedy: bool) -> TreeVerdict:
    """:func:`flashspec_core.tree.verify_tree` in the gate's calling convention."""
    return verify_tree(p, draft, generator, greedy=greedy)


@attrs.frozen
class Decoded:
    """What a run measured: the first step and the first K tokens of every row."""

    start: torch.Tensor  # [B] int64 index of the starting pair
    state: torch.Tensor  # [B, 2] int64 starting pair
    first: Drawn
    verdict: TreeVerdict  # of the first step
    stream: torch.Tensor  # [B, K] int64 first K emitted tokens (over steps)


def decode(
    verify: TreeVerifyFn,
    models: TreeModels,
    case: TreeCase,
    seed: int,
    report: TreeReport | None = None,
) -> Decoded:
    """Decode steps of trees from random starting pairs until every row has K tokens."""
    gen = torch.Generator().manual_seed(seed)
    k = case.tokens_tested
    start = torch.randint(0, case.starts, (case.trials,), generator=gen)
    hist = torch.cat([models.starts[start], torch.full((case.trials, k), -1)], dim=1)  # [B, 2 + K]
    filled = torch.zeros(case.trials, dtype=torch.int64)
    need = torch.arange(case.trials)
    first: tuple[Drawn, TreeVerdict] | None = None
    while need.numel():
        state = torch.stack([hist[need, filled[need]], hist[need, filled[need] + 1]], dim=1).clamp(0, case.vocab - 1)
        drawn = draw_trees(models, case, state, gen)
        draft = report(drawn.draft, drawn.q_rows) if report is not None else drawn.draft
        verdict = verify(drawn.p, draft, gen, case.sampling.greedy)
        first = first or (drawn, verdict)
        _append(hist, filled, need, verdict)
        need = need[filled[need] < k]
    assert first is not None
    return Decoded(start, hist[:, :2], first[0], first[1], hist[:, 2:])


def _append(hist: torch.Tensor, filled: torch.Tensor, rows: torch.Tensor, verdict: TreeVerdict) -> None:
    """Write each row's emitted tokens after its ``filled`` ones (at most K in all)."""
    k = hist.shape[1] - 2
    emitted = verdict.num_accepted.clamp_min(0) + 1  # [R]; a step emits >= 1 token
    j = torch.arange(verdict.tokens.shape[1])
    pos = filled[rows, None] + j  # [R, D + 1]
    ok = (j < emitted[:, None]) & (pos < k)
    hist[rows[:, None].expand_as(pos)[ok], 2 + pos[ok]] = verdict.tokens[ok]
    filled[rows] = (filled[rows] + emitted).clamp_max(k)


def k_token_law(p_law: torch.Tensor, starts: torch.Tensor, k: int) -> torch.Tensor:
    """Exact law of the first ``k`` tokens from each start: [V, V, V], [S, 2] -> [S, V ** k] float64.

    Cells in lexicographic order (token 1 slowest), computed by enumerating all ``V ** k``
    sequences and multiplying their conditional probabilities.
    """
    vocab = p_law.shape[-1]
    seqs = torch.cartesian_prod(*[torch.arange(vocab)] * k).reshape(vocab**k, k)  # [V^k, k]
    laws = []
    for pair in starts:
        hist = torch.cat([pair.expand(seqs.shape[0], 2), seqs], dim=1)
        prob = torch.ones(seqs.shape[0], dtype=torch.float64)
        for i in range(k):
            prob = prob * p_law[hist[:, i], hist[:, i + 1], hist[:, i + 2]]
        laws.append(prob)
    return torch.stack(laws)


def _encode(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, k] -> [B] cell index, ``vocab ** k`` (the impossible cell) for any token out of range."""
    k = tokens.shape[1]
    weights = vocab ** torch.arange(k - 1, -1, -1)
    bad = ((tokens < 0) | (tokens >= vocab)).any(dim=1)
    return torch.where(bad, vocab**k, (tokens.clamp(0, vocab - 1) * weights).sum(dim=1))


def _test(groups: torch.Tensor, cells: torch.Tensor, law: torch.Tensor) -> ChiSquare:
    """G test of cells [B] grouped by groups [B] against law [G, C] (+ an impossible cell)."""
    law = torch.cat([law, torch.zeros_like(law[:, :1])], dim=1)
    counts = grouped_counts(groups, cells, law.shape[0], law.shape[1])
    return chisquare(counts, expected_counts(counts, law), GATE_MIN_EXPECTED, GATE_STATISTIC)


def law_tests(models: TreeModels, case: TreeCase, run: Decoded) -> dict[str, ChiSquare]:
    """The ``first<k>`` and ``step<i>`` tests of the module docstring."""
    p_law = filtered_probs(models.target, case.sampling)  # [V, V, V] float64 oracle
    v = case.vocab
    tests = {}
    for k in range(1, case.tokens_tested + 1):
        law = k_token_law(p_law, models.starts, k)
        tests[f"first{k}"] = _test(run.start, _encode(run.stream[:, :k], v), law)
    seq = torch.cat([run.state, run.verdict.tokens], dim=1)  # [B, 2 + D + 1]
    for i in range(2, case.depth + 2):
        rows = run.verdict.num_accepted >= i - 1
        prev = seq[rows, i - 1 : i + 1].clamp(0, v - 1)  # the two tokens before token i
        tests[f"step{i}"] = _test(
            prev[:, 0] * v + prev[:, 1], _encode(seq[rows, i + 1 : i + 2], v), p_law.reshape(v * v, v)
        )
    return tests


def greedy_mismatches(models: TreeModels, case: TreeCase, run: Decoded) -> int:
    """Rows off the greedy continuation, or whose first step did not accept exactly the
    deepest node spelling it through eldest-of-their-token siblings (the exact check for
    temperature 0: a duplicate sibling's subtree is never searched)."""
    best = greedy_tokens(models.target, case.sampling)  # [V, V]
    seq = [run.state[:, 0], run.state[:, 1]]
    for _ in range(max(case.tokens_tested, case.depth)):
        seq.append(best[seq[-2], seq[-1]])
    want = torch.stack(seq[2:], dim=1)  # [B, max(K, D)]
    tokens, depths = run.first.draft.tokens, node_depths(case.parents)
    elder = elder_siblings(case.parents)
    good = [  # node n spells the greedy token at its depth and no elder sibling has its token
        (tokens[:, n] == want[:, depths[n] - 1]) & (tokens[:, list(elder[n])] != tokens[:, n, None]).all(dim=1)
        for n in range(len(depths))
    ]
    deepest = torch.zeros_like(run.start)
    for node, depth in enumerate(depths):
        walked = torch.stack([good[m] for m in path_to(case.parents, node)], dim=1).all(dim=1)
        deepest = torch.where(walked, torch.clamp_min(deepest, depth), deepest)
    bad = (run.stream != want[:, : case.tokens_tested]).any(dim=1) | (run.verdict.num_accepted != deepest)
    return int(bad.sum())


def run_tree_case(verify: TreeVerifyFn, case: TreeCase, seed: int, report: TreeReport | None = None) -> CaseResult:
    """Run one case with trial seed ``seed``: the law tests, or the exact greedy check."""
    models = make_tree_models(case)
    run = decode(verify, models, case, seed, report)
    if case.sampling.greedy:
        return CaseResult(case.name, {}, greedy_mismatches(models, case, run))
    return CaseResult(case.name, law_tests(models, case, run), -1)


def tree_gate(
    verify: TreeVerifyFn, case: TreeCase, seed: int, alpha: float = GATE_ALPHA, report: TreeReport | None = None
) -> GateResult:
    """Reject ``verify`` on ``case`` if any law is off (Holm over the case's tests at ``alpha``)."""
    return decide(run_tree_case(verify, case, seed, report), case.sampling.greedy, alpha)


def impossible_emissions(p: torch.Tensor, verdict: TreeVerdict) -> int:
    """Emitted tokens the target gives probability 0 where they were emitted.

    p: [B, N + 1, V] the target's probabilities the verifier saw; token ``i`` of a row
    was emitted at the root (``i = 0``) or at accepted node ``path[i - 1]``.
    """
    batch, width = verdict.tokens.shape
    at = torch.cat([torch.full((batch, 1), ROOT), verdict.path], dim=1)[:, :width] + 1  # [B, D + 1]
    emitted = torch.arange(width) <= verdict.num_accepted[:, None]
    vocab = p.shape[-1]
    token = verdict.tokens.clamp(0, vocab - 1)
    prob = p[torch.arange(batch)[:, None], at.clamp_min(0), token]
    bad = emitted & ((prob <= 0) | (verdict.tokens < 0) | (verdict.tokens >= vocab))
    return int(bad.sum())
