"""The statistical exactness gate: does a verifier sample from the target's law?

A :class:`Case` fixes a toy target and a toy draft (:class:`~flashspec_core.testing.laws.MarkovModel`
each, ``p != q``), sampling params, ``gamma`` and the number of trials. :func:`run_case`
drafts ``gamma`` tokens per row from ``q`` (autoregressively, each row independently),
builds the target logits the way a real target would (position ``i`` sees the
drafted prefix), calls the verifier through the public :class:`Verifier` protocol and
returns the p-values of these chi-square tests against the exact laws:

* ``first``: the first emitted token, per starting context;
* ``pos<i>`` for ``i = 2 .. gamma+1``: the ``i``-th token given the accepted prefix
  (rows where it was emitted in this step), per context of token ``i - 1``;
* ``joint``: the first two emitted tokens (a second step from the first token when
  nothing was accepted), against ``p(y1) p(y2 | y1)``;
* ``accepted``: the number accepted, against :func:`~flashspec_core.testing.laws.markov_accept_law`.

Each is a grouped likelihood-ratio (G) test with bins merged up to
:data:`GATE_MIN_EXPECTED` expected counts (see the comment there for why not Pearson
with 5).

:func:`gate` applies Holm's correction at :data:`GATE_ALPHA` to those p-values; it is
the one decision function both the suite and the mutation tests use. Greedy cases
(``temperature == 0``) are checked exactly instead: every row must follow the
argmax path. :func:`transition_test` is the stationary-chain check on an emitted
stream; it only needs the streams, so a pipeline-level test can reuse it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import attrs
import torch

from flashspec_core.contracts import SamplingParams, Verdict, Verifier
from flashspec_core.sampling import probs_from_logits, sample
from flashspec_core.testing.chisq import ChiSquare, chisquare, expected_counts, grouped_counts, holm
from flashspec_core.testing.laws import MarkovModel, greedy_tokens, markov_accept_law

# Per gate run, family-wise over the gate's own tests (Holm). The stats suite runs at
# most 20 gate runs per verifier, so by Bonferroni its false-alarm rate is <= 1e-3.
GATE_ALPHA = 5e-5
MIN_TRIALS = 10_000
# The gate tests far out in the tail (1e-6 .. 5e-5 per test), where Pearson's
# statistic with bins of expected count 5 rejects ~20x more often than its nominal
# level (exact Poisson tails, benchmarks/exactness_power.py). The likelihood-ratio
# (G) statistic with bins merged up to 20 expected counts stays within ~1.3x.
GATE_MIN_EXPECTED = 20.0
GATE_STATISTIC: Literal["pearson", "g"] = "g"
# Rows per verify call: bounds the [rows, gamma+1, V] logits tensor to ~32 MB.
_CHUNK_ELEMENTS = 8_000_000

Report = Callable[[SamplingParams], SamplingParams]  # params a draft reports q with (mutants only)
VerifyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, SamplingParams, torch.Generator | None], Verdict]


@attrs.frozen
class Case:
    """One configuration of the exactness suite."""

    name: str
    vocab: int
    gamma: int
    sampling: SamplingParams
    trials: int = MIN_TRIALS
    contexts: int = 4
    deterministic: bool = False  # draft_probs None (the verifier sees a one-hot q)
    q_zeros: float = 0.0  # fraction of the draft's logits set to -inf (q = 0 there)
    p_neg_inf: float = 0.0  # fraction of the target's logits set to -inf
    overlap: float = 0.7  # how close the draft's logits are to the target's (0: unrelated)
    scale: float = 2.0  # spread of the target's logits
    table_seed: int = 0


@attrs.frozen
class Models:
    target: MarkovModel
    draft: MarkovModel


def make_models(case: Case) -> Models:
    """The case's target and draft tables (fixed by ``table_seed``, not by the trial seed)."""
    g = torch.Generator().manual_seed(10_007 * case.table_seed + 31 * case.vocab + case.gamma)
    shape = (case.contexts, case.vocab)
    target = case.scale * torch.randn(shape, generator=g)
    draft = case.overlap * target + (1 - case.overlap) * case.scale * torch.randn(shape, generator=g)
    target = _knock_out(target, case.p_neg_inf, g)
    draft = _knock_out(draft, case.q_zeros, g)
    return Models(MarkovModel(target), MarkovModel(draft))


def _knock_out(logits: torch.Tensor, fraction: float, g: torch.Generator) -> torch.Tensor:
    """Set about ``fraction`` of each row to -inf, never the whole row."""
    if fraction <= 0:
        return logits
    drop = torch.rand(logits.shape, generator=g) < fraction
    drop[torch.arange(logits.shape[0]), torch.argmax(logits, dim=-1)] = False
    return logits.masked_fill(drop, float("-inf"))


@attrs.frozen
class Step:
    """One verify step over a batch of independent rows."""

    state: torch.Tensor  # [B] int64 last token before the step
    draft_tokens: torch.Tensor  # [B, gamma] int64
    tokens: torch.Tensor  # [B, gamma+1] int64 verdict tokens, -1 padded
    num_accepted: torch.Tensor  # [B] int64


def draft(
    models: Models,
    state: torch.Tensor,
    gamma: int,
    sampling: SamplingParams,
    gen: torch.Generator,
    report: Report | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draft ``gamma`` tokens per row from q and build the target logits they imply.

    ``report`` plants a draft-side bug: q is reported with other params than it was
    sampled with. Returns draft tokens [B, gamma] int64, draft probs [B, gamma, V] float32 and
    target logits [B, gamma+1, V] float32 (position ``i`` conditioned on the drafted prefix).
    """
    q_table = probs_from_logits(models.draft.logits, sampling)  # [S, V]
    prev, tokens = state, []
    for _ in range(gamma):
        prev = sample(q_table[models.draft.context(prev)], gen)
        tokens.append(prev)
    draft_tokens = torch.stack(tokens, dim=1) if tokens else state.new_zeros((state.shape[0], 0))
    path = torch.cat([state[:, None], draft_tokens], dim=1)
    if report is not None:
        q_table = probs_from_logits(models.draft.logits, report(sampling))
    draft_probs = q_table[models.draft.context(path[:, :gamma])]
    return draft_tokens, draft_probs, models.target.next_logits(path)


@attrs.frozen
class Rng:
    """The harness's CPU generator (drafts, states) and the verifier's on its device."""

    host: torch.Generator
    device: torch.Generator

    @classmethod
    def seeded(cls, seed: int, device: torch.device | str) -> Rng:
        host = torch.Generator().manual_seed(seed)
        return cls(host, torch.Generator(device=device).manual_seed(seed ^ 0x5EED))


def step(
    verify: VerifyFn, models: Models, case: Case, state: torch.Tensor, rng: Rng, report: Report | None = None
) -> Step:
    """Draft from q and verify on ``rng.device``'s device, in chunks of rows; each row is one trial."""
    rows = max(1, _CHUNK_ELEMENTS // ((case.gamma + 1) * case.vocab))
    dev = rng.device.device
    parts = []
    for chunk in state.split(rows):
        draft_tokens, draft_probs, logits = draft(models, chunk, case.gamma, case.sampling, rng.host, report)
        probs = None if case.deterministic else draft_probs.to(dev)
        verdict = verify(logits.to(dev), draft_tokens.to(dev), probs, case.sampling, rng.device)
        parts.append(Step(chunk, draft_tokens, verdict.tokens.cpu().long(), verdict.num_accepted.cpu().long()))
    return Step(*(torch.cat([getattr(p, f.name) for p in parts]) for f in attrs.fields(Step)))


@attrs.frozen
class CaseResult:
    """What one gate run measured."""

    case: str
    tests: dict[str, ChiSquare]
    mismatches: int  # greedy cases: rows off the argmax path; -1 when not greedy

    @property
    def pvalues(self) -> dict[str, float]:
        return {k: t.pvalue for k, t in self.tests.items()}


def run_case(
    verifier: Verifier | VerifyFn,
    case: Case,
    seed: int,
    report: Report | None = None,
    device: torch.device | str = "cpu",
) -> CaseResult:
    """Run one case with trial seed ``seed`` and test every law listed in the module doc."""
    verify = verifier.verify if isinstance(verifier, Verifier) else verifier
    models = make_models(case)
    rng = Rng.seeded(seed, device)
    state = torch.randint(0, case.vocab, (case.trials,), generator=rng.host)
    first = step(verify, models, case, state, rng, report)
    if case.sampling.greedy:
        return CaseResult(case.name, {}, greedy_mismatches(models, case.sampling, first))
    tests = {"first": _conditional(models.target, case.sampling, first.state, first.tokens[:, 0])}
    for i in range(1, case.gamma + 1):
        emitted = first.num_accepted >= i
        tests[f"pos{i + 1}"] = _conditional(
            models.target, case.sampling, first.tokens[emitted, i - 1], first.tokens[emitted, i]
        )
    tests["joint"] = _joint(verify, models, case, first, rng, report)
    law = markov_accept_law(
        models.target.law(case.sampling),
        probs_from_logits(models.draft.logits, case.sampling),
        case.gamma,
        case.deterministic,
    )
    counts = grouped_counts(
        models.target.context(first.state), first.num_accepted, models.target.contexts, case.gamma + 1
    )
    tests["accepted"] = chisquare(counts, expected_counts(counts, law), GATE_MIN_EXPECTED, GATE_STATISTIC)
    return CaseResult(case.name, tests, -1)


def _conditional(target: MarkovModel, sampling: SamplingParams, prev: torch.Tensor, token: torch.Tensor) -> ChiSquare:
    """Test ``token ~ p(. | context(prev))`` row by row (tokens out of range count as impossible)."""
    counts = _counts_in_range(target.context(prev), token, target.contexts, target.vocab)
    return chisquare(
        counts, expected_counts(counts, _with_impossible_cell(target.law(sampling))), GATE_MIN_EXPECTED, GATE_STATISTIC
    )


def _counts_in_range(groups: torch.Tensor, cells: torch.Tensor, num_groups: int, num_cells: int) -> torch.Tensor:
    """Grouped counts with one extra impossible cell for anything outside [0, num_cells)."""
    bad = (cells < 0) | (cells >= num_cells)
    return grouped_counts(groups, torch.where(bad, num_cells, cells), num_groups, num_cells + 1)


def _with_impossible_cell(law: torch.Tensor) -> torch.Tensor:
    return torch.cat([law, torch.zeros_like(law[..., :1])], dim=-1)


def _joint(verify: VerifyFn, models: Models, case: Case, first: Step, rng: Rng, report: Report | None) -> ChiSquare:
    """Test ``(y1, y2) ~ p(y1 | s) p(y2 | y1)``; a second step supplies y2 when N = 0."""
    y1, y2 = first.tokens[:, 0], first.tokens[:, 1].clone()
    again = first.num_accepted == 0
    if again.any():
        y2[again] = step(verify, models, case, y1[again].clamp(0, case.vocab - 1), rng, report).tokens[:, 0]
    vocab, law = case.vocab, models.target.law(case.sampling)  # [S, V]
    pair_law = law[:, :, None] * law[models.target.context(torch.arange(vocab))][None]  # [S, V, V]
    pair_law = _with_impossible_cell(pair_law.reshape(models.target.contexts, vocab * vocab))
    bad = (y1 < 0) | (y1 >= vocab) | (y2 < 0) | (y2 >= vocab)
    cells = torch.where(bad, vocab * vocab, y1 * vocab + y2)
    counts = grouped_counts(models.target.context(first.state), cells, models.target.contexts, vocab * vocab + 1)
    return chisquare(counts, expected_counts(counts, pair_law), GATE_MIN_EXPECTED, GATE_STATISTIC)


def greedy_mismatches(models: Models, sampling: SamplingParams, result: Step) -> int:
    """Rows whose verdict differs from the argmax path (exact check for temperature 0)."""
    best = greedy_tokens(models.target.logits, sampling)  # [S]
    path = torch.cat([result.state[:, None], result.draft_tokens], dim=1)
    want = best[models.target.context(path)]  # [B, gamma+1]
    gamma = result.draft_tokens.shape[1]
    n = torch.cumprod((result.draft_tokens == want[:, :gamma]).long(), dim=1).sum(dim=1)
    pos = torch.arange(gamma + 1)
    padded = torch.cat([result.draft_tokens, torch.full_like(n[:, None], -1)], dim=1)
    tokens = torch.where(pos < n[:, None], padded, -1)
    tokens = torch.where(pos == n[:, None], want.gather(1, n[:, None]), tokens)
    bad = (tokens != result.tokens).any(dim=1) | (n != result.num_accepted)
    return int(bad.sum())


@attrs.frozen
class GateResult:
    """The decision of :func:`gate` and what it was based on."""

    rejected: bool
    failing: tuple[str, ...]  # tests rejected by Holm (or "greedy" for an exact mismatch)
    result: CaseResult


def gate(
    verifier: Verifier | VerifyFn,
    case: Case,
    seed: int,
    alpha: float = GATE_ALPHA,
    report: Report | None = None,
    device: torch.device | str = "cpu",
) -> GateResult:
    """Reject ``verifier`` on ``case`` if any law is off (Holm over the case's tests at ``alpha``).

    Tests with no degrees of freedom (too few rows reached a deep position) are left
    out of the family.
    """
    return decide(run_case(verifier, case, seed, report, device), case.sampling.greedy, alpha)


def decide(result: CaseResult, greedy: bool, alpha: float) -> GateResult:
    """The gate's decision on a measured case: any greedy mismatch, or any law test that
    Holm rejects at ``alpha`` among those with degrees of freedom (or an impossible outcome)."""
    if greedy:
        return GateResult(result.mismatches > 0, ("greedy",) if result.mismatches else (), result)
    names = [n for n, t in result.tests.items() if t.dof > 0 or t.impossible]
    rejected = holm([result.tests[n].pvalue for n in names], alpha)
    failing = tuple(n for n, r in zip(names, rejected, strict=True) if r)
    return GateResult(bool(failing), failing, result)


def transition_test(
    streams: Sequence[torch.Tensor],  # each [L] int64: one row's emitted tokens, in order
    law: torch.Tensor,  # [S, V] exact next-token law per context
    context: Callable[[torch.Tensor], torch.Tensor],  # previous tokens -> context ids in [0, S)
    min_expected: float = GATE_MIN_EXPECTED,
) -> ChiSquare:
    """Stationary-chain check: transition counts of emitted streams against the target's law.

    Every consecutive pair ``(a, b)`` of a stream is one transition; given the
    visited contexts the counts are multinomial per context (Anderson & Goodman 1957).
    """
    contexts, vocab = law.shape
    prev = torch.cat([s[:-1] for s in streams]).long()
    nxt = torch.cat([s[1:] for s in streams]).long()
    counts = _counts_in_range(context(prev.clamp(0, vocab - 1)), nxt, contexts, vocab)
    return chisquare(counts, expected_counts(counts, _with_impossible_cell(law)), min_expected, GATE_STATISTIC)


def run_chain(
    verifier: Verifier | VerifyFn,
    case: Case,
    steps: int,
    rows: int,
    seed: int,
    report: Report | None = None,
    device: torch.device | str = "cpu",
) -> tuple[list[torch.Tensor], Models]:
    """Decode ``steps`` consecutive steps for ``rows`` independent sequences; return the streams."""
    verify = verifier.verify if isinstance(verifier, Verifier) else verifier
    models = make_models(case)
    rng = Rng.seeded(seed, device)
    state = torch.randint(0, case.vocab, (rows,), generator=rng.host)
    emitted = [[int(t)] for t in state]
    for _ in range(steps):
        result = step(verify, models, case, state, rng, report)
        for row, (toks, n) in enumerate(zip(result.tokens.tolist(), result.num_accepted.tolist(), strict=True)):
            emitted[row].extend(toks[: n + 1])
        state = result.tokens.gather(1, result.num_accepted[:, None]).squeeze(1).clamp(0, case.vocab - 1)
    return [torch.tensor(e) for e in emitted], models
