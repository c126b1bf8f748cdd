"""Per-row sampling and seeded rows keep each row's law: in the verifier, the pipeline and the server's engine.

* Verifier: the exactness gate (:func:`flashspec_core.testing.exactness.gate`) runs on rows
  interleaved with as many rows of other settings (greedy, top-k, top-p, other temperatures,
  half of them seeded), all verified by one ``verify_rows`` call; the gate reads only the
  case's rows. Seeded case rows (a fresh seed per trial) must follow the law over seeds.
* Pipeline and engine: a mixed batch cycles three settings over its rows (greedy;
  T = 0.7, top_p = 0.9; T = 1.3, top_k = 5); each row's first 3 tokens must follow the
  target's law under its own setting (chi-square at ALPHA, as the pipeline gate), and greedy
  rows must all be the greedy continuation. Through the engine, rows join and leave the
  running batch between steps, so every row is decoded among rows at other stages.
* A seeded request gets the same tokens from the engine (float32) alone, beside 1 and 3
  requests of other settings, and when it joins a batch already running.

The ``stats`` cases draw N = 12,000 sequences per setting; the cheap ones a few hundred.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _law import ALPHA, law_of
from _tiny import pipeline_dict
from transformers import AutoModelForCausalLM

from flashspec_core.build import build_pipeline
from flashspec_core.contracts import RowSampling, SamplingParams, Verdict, VerifiesRows
from flashspec_core.pipeline import Pipeline
from flashspec_core.sampling import gumbel_noise
from flashspec_core.testing import verifier_contract as vc
from flashspec_core.testing.chisq import holm
from flashspec_core.testing.exactness import GATE_ALPHA, Case, gate, run_case
from flashspec_core.testing.tiny import EOS, LENGTH, PROMPT, chi_square_pvalue

MIXED = [{"temperature": 0.0}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.3, "top_k": 5}]
S = SamplingParams


# ------------------------------------------------------------------ the verifier


# The rows a case's rows share each verify call with: every kind of setting, seeded or not.
OTHERS = [S(0.0), S(1.3, top_k=3), S(0.5, top_p=0.7), S(2.0)]
VERIFIER_CASES = [
    Case("v16_g2_t0.6_topk", 16, 2, S(0.6, top_k=5)),
    Case("v32_g4_t1.7_topp", 32, 4, S(1.7, top_p=0.8)),
    Case("det_v20_g4_t1", 20, 4, S(1.0), deterministic=True, overlap=0.9, scale=3.0),
    Case("greedy_v16_g4", 16, 4, S(0.0), overlap=0.9),
]
SEED = 20_261_203


def _interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Rows ``a[0], b[0], a[1], b[1], ...``."""
    return torch.stack([a, b], dim=1).flatten(0, 1)


def mixed_rows(verifier: VerifiesRows, seeded: bool = False) -> Callable[..., Verdict]:
    """A verify function that hides ``verifier.verify_rows`` behind the plain signature: the
    case's rows (even rows; a fresh seed each when ``seeded``) are verified among as many rows
    of :data:`OTHERS` settings with other rows' logits (odd rows; every second one seeded)."""
    seeds = itertools.count(1)

    def verify(logits: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None, sampling: SamplingParams,
               generator: torch.Generator | None) -> Verdict:
        n = logits.shape[0]
        params, row_seeds = [], []
        for i in range(n):
            params += [sampling, OTHERS[i % len(OTHERS)]]
            row_seeds += [next(seeds) if seeded else None, next(seeds) if i % 2 else None]
        rows = RowSampling(params, seeds=row_seeds, starts=[7 + i % 5 for i in range(2 * n)])
        both = verifier.verify_rows(_interleave(logits, logits.flip(0)), _interleave(tokens, tokens.flip(0)),
                                    None if probs is None else _interleave(probs, probs.flip(0)), rows, generator)
        return Verdict(tokens=both.tokens[0::2], num_accepted=both.num_accepted[0::2])

    return verify


def test_seeded_noise_is_finite_at_the_top_of_its_range() -> None:
    """A seeded row's noise at seed 52093, index 5, token 13 drew the top uniform, which once
    rounded to 1 (+inf noise: a token outside top-k was emitted); any such draw must be finite."""
    assert torch.isfinite(gumbel_noise(torch.tensor([52093]), torch.tensor([5]), 4, 16)).all()
    sweep = gumbel_noise(torch.arange(1 << 12), torch.zeros(1 << 12, dtype=torch.long), 1, 1024)
    assert torch.isfinite(sweep).all() and float(sweep.max()) < 17.0


@pytest.fixture(params=["reference", "triton"])
def rows_verifier(request: pytest.FixtureRequest) -> VerifiesRows:
    verifier = vc.load_verifier_or_skip(request.param, exact=True)
    assert isinstance(verifier, VerifiesRows)
    return verifier


@pytest.mark.stats
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # triton interpreter, q = 0
@pytest.mark.parametrize("case", VERIFIER_CASES, ids=lambda c: c.name)
def test_a_rows_law_holds_among_rows_of_other_settings(rows_verifier: VerifiesRows, case: Case) -> None:
    decision = gate(mixed_rows(rows_verifier), case, SEED)
    assert not decision.rejected, f"rejected by {decision.failing}: {decision.result.pvalues}"


@pytest.mark.stats
@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
@pytest.mark.parametrize("case", VERIFIER_CASES[:2], ids=lambda c: c.name)
def test_seeded_rows_follow_the_law_over_seeds(rows_verifier: VerifiesRows, case: Case) -> None:
    """Every token law of the gate; not its number-accepted law, which is rejection sampling's
    (a seeded row accepts a draft token iff it equals the Gumbel-max sample)."""
    result = run_case(mixed_rows(rows_verifier, seeded=True), case, SEED)
    names = [n for n, t in result.tests.items() if n != "accepted" and t.dof > 0]
    rejected = holm([result.tests[n].pvalue for n in names], GATE_ALPHA)
    assert not any(rejected), f"{[n for n, r in zip(names, rejected, strict=True) if r]}: {result.pvalues}"


def test_the_mixed_rows_gate_catches_a_row_given_its_neighbours_setting(rows_verifier: VerifiesRows) -> None:
    """Power: a verifier that warps each row with the next row's setting (a case row with its
    neighbour's) fails the gate the honest one passes."""

    class Shifted:
        def verify_rows(self, logits: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None,
                        rows: RowSampling, generator: torch.Generator | None) -> Verdict:
            shifted = (*rows.params[1:], rows.params[0])
            return rows_verifier.verify_rows(logits, tokens, probs, RowSampling(shifted, rows.seeds, rows.starts),
                                             generator)

    case = VERIFIER_CASES[0]
    assert gate(mixed_rows(Shifted()), case, SEED).rejected  # type: ignore[arg-type]


# ------------------------------------------------------------------ the pipeline and the engine


def _pipeline(setup: dict[str, Any], selector: str = "alternate_on_rejection") -> Pipeline:
    return build_pipeline(pipeline_dict(setup["target"], setup["drafts"], selector, dtype="float32"),
                          setup["registry"])


def greedy_continuation(target: Path) -> tuple[int, ...]:
    """The target's greedy first tokens after PROMPT, in float64 (ends at EOS)."""
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float64).eval()
    seq: list[int] = []
    with torch.no_grad():
        while len(seq) < LENGTH and (not seq or seq[-1] != EOS):
            seq.append(int(model(torch.tensor([PROMPT + seq])).logits[0, -1].argmax()))
    return tuple(seq)


def _samples(pipe: Pipeline, settings: list[dict[str, Any]], per_setting: int, batch: int,
             seeded: bool = False) -> list[list[tuple[int, ...]]]:
    """``per_setting`` first-3-token sequences for each setting, rows cycling the settings."""
    out: list[list[tuple[int, ...]]] = [[] for _ in settings]
    seeds = itertools.count(10_000)
    for call in itertools.count():
        if min(len(o) for o in out) >= per_setting:
            break
        params = [SamplingParams(**settings[b % len(settings)]) for b in range(batch)]
        rows = RowSampling(params, seeds=[next(seeds) for _ in range(batch)] if seeded else ())
        result = pipe.generate([PROMPT] * batch, max_new_tokens=LENGTH, seed=call, rows=rows)
        for b, ids in enumerate(result.token_ids):
            out[b % len(settings)].append(tuple(ids))
    return [o[:per_setting] for o in out]


def _check(setup: dict[str, Any], settings: list[dict[str, Any]], samples: list[list[tuple[int, ...]]]) -> None:
    for setting, got in zip(settings, samples, strict=True):
        if setting["temperature"] == 0.0:
            greedy = greedy_continuation(setup["target"])
            assert set(got) == {greedy}, f"{setting}: {set(got)} vs the greedy {greedy}"
        else:
            p = chi_square_pvalue(got, law_of(setup, setting))
            assert p > ALPHA, f"{setting}: p = {p:.2e}"


def sizes(cheap_batch: int, stats_batch: int) -> list[Any]:
    """``(per_setting, batch)``: a few hundred sequences per setting by default, 12,000 under
    the ``stats`` marker (the batch, or the engine's ``max_batch``, grows to match)."""
    return [pytest.param(400, cheap_batch, id="cheap"),
            pytest.param(12_000, stats_batch, id="stats", marks=pytest.mark.stats)]


@pytest.mark.parametrize(("per_setting", "batch"), sizes(1200, 6000))
def test_a_mixed_batch_keeps_each_rows_law(law_setup: dict[str, Any], per_setting: int, batch: int) -> None:
    _check(law_setup, MIXED, _samples(_pipeline(law_setup), MIXED, per_setting, batch))


def test_seeded_rows_of_a_mixed_batch_follow_the_law_over_seeds(law_setup: dict[str, Any]) -> None:
    settings = MIXED[1:]
    _check(law_setup, settings, _samples(_pipeline(law_setup), settings, 400, 800, seeded=True))


@pytest.mark.stats
def test_seeded_and_unseeded_rows_mixed_follow_the_law(law_setup: dict[str, Any]) -> None:
    """Rows of each setting alternate seeded and unseeded (seeds only on even rows)."""
    settings = [{"temperature": 1.0}, MIXED[2], {"temperature": 0.8, "top_p": 0.95}]
    pipe = _pipeline(law_setup)
    out: list[list[tuple[int, ...]]] = [[] for _ in settings]
    seeds = itertools.count(50_000)
    for call in itertools.count():
        if min(len(o) for o in out) >= 12_000:
            break
        rows = RowSampling([SamplingParams(**settings[b % 3]) for b in range(6000)],
                           seeds=[next(seeds) if b % 2 == 0 else None for b in range(6000)])
        for b, ids in enumerate(pipe.generate([PROMPT] * 6000, max_new_tokens=LENGTH, seed=call, rows=rows).token_ids):
            out[b % 3].append(tuple(ids))
    _check(law_setup, settings, [o[:12_000] for o in out])


pytest.importorskip("prometheus_client")  # the engine's metrics
from flashspec_serve.engine import Engine, Job  # noqa: E402


def engine_tokens(pipe: Pipeline, jobs: list[Job], max_batch: int, running: Sequence[Job] = ()) -> list[tuple[int, ...]]:
    """Each job's tokens through one engine; ``running`` jobs are submitted first and ``jobs``
    join once they have all emitted tokens (the batch is mid-decode when they join)."""
    return run_jobs(Engine(pipe, max_batch=max_batch, max_waiting=len(jobs) + len(running)), jobs, running)


def run_jobs(engine: Engine, jobs: list[Job], running: Sequence[Job] = (), queued: bool = False) -> list[tuple[int, ...]]:
    """:func:`engine_tokens` through a given engine (the caller reads its counters afterwards).
    With ``queued`` every job waits in the queue before the engine starts (no ``running``), so
    which rows share a step does not depend on thread timing: an engine given a seed then
    replays the same run."""
    assert not (queued and running)
    if not queued:
        engine.start()

    async def collect(handle: Any, first: asyncio.Event | None = None) -> tuple[int, ...]:
        ids: list[int] = []
        async for event in handle.events():
            assert event.finish not in ("error", "abort"), event.error
            ids.extend(event.token_ids)
            if first is not None and ids:
                first.set()
        return tuple(ids)

    async def run() -> list[tuple[int, ...]]:
        loop = asyncio.get_running_loop()
        if queued:
            handles = [engine.submit(j, loop) for j in jobs]
            engine.start()
            return list(await asyncio.gather(*(collect(h) for h in handles)))
        started = [asyncio.Event() for _ in running]
        early = [asyncio.create_task(collect(engine.submit(j, loop), s)) for j, s in zip(running, started, strict=True)]
        for s in started:
            await s.wait()
        out = await asyncio.gather(*(collect(engine.submit(j, loop)) for j in jobs))
        await asyncio.gather(*early)
        return list(out)

    try:
        return asyncio.run(run())
    finally:
        engine.stop()


def _engine_samples(pipe: Pipeline, settings: list[dict[str, Any]], per_setting: int, max_batch: int,
                    seeded: bool = False) -> tuple[list[list[tuple[int, ...]]], Engine]:
    """As :func:`_samples`, each sequence a request to the engine, requests cycling the settings;
    and the engine. All requests are queued before the engine starts and its generator is
    seeded, so the samples are the same each run (the suite's seeds are fixed: a clean run
    cannot fail by chance on one run and pass on the next); rows still join the running batch
    as others finish."""
    n = per_setting * len(settings)
    jobs = [Job(tuple(PROMPT), LENGTH, SamplingParams(**settings[i % len(settings)]),
                seed=20_000 + i if seeded else None) for i in range(n)]
    engine = Engine(pipe, max_batch=max_batch, max_waiting=n, seed=SEED)
    got = run_jobs(engine, jobs, queued=True)
    return [got[k :: len(settings)] for k in range(len(settings))], engine


@pytest.mark.parametrize(("per_setting", "max_batch"), sizes(300, 2000))
def test_the_engine_keeps_each_requests_law(law_setup: dict[str, Any], per_setting: int, max_batch: int) -> None:
    samples, engine = _engine_samples(_pipeline(law_setup), MIXED, per_setting, max_batch)
    _check(law_setup, MIXED, samples)
    assert engine.row_prefills + engine.rebuilds > 4  # requests joined a running batch many times


@pytest.mark.parametrize(("per_setting", "max_batch"), sizes(300, 2000))
def test_the_engine_keeps_seeded_requests_law(law_setup: dict[str, Any], per_setting: int, max_batch: int) -> None:
    settings = MIXED[1:]
    _check(law_setup, settings, _engine_samples(_pipeline(law_setup), settings, per_setting, max_batch, seeded=True)[0])


# ------------------------------------------------------------------ a seeded request, whatever the batch


SEEDED = Job((1, 2, 3, 1, 2), 16, S(1.0), seed=1234)
NEIGHBOURS = [Job((4, 5, 6), 20, S(0.7, top_p=0.9)), Job((7, 8), 12, S(0.0)),
              Job((9, 1, 4, 4), 24, S(1.3, top_k=5), seed=99), Job((2,), 16, S(1.0))]


def test_a_seeded_request_gets_its_tokens_whatever_else_is_in_the_batch(law_setup: dict[str, Any]) -> None:
    """float32 target and drafts, arms switching on rejection: alone, beside 1 and 3 requests
    of other settings (submitted before and after it), and joining a batch mid-decode."""
    pipe = _pipeline(law_setup)
    alone = engine_tokens(pipe, [SEEDED], 8)[0]
    assert len(alone) >= 8, alone  # enough tokens for the comparisons to mean something
    assert engine_tokens(pipe, [NEIGHBOURS[0], SEEDED], 8)[1] == alone
    assert engine_tokens(pipe, [*NEIGHBOURS[1:], SEEDED], 8)[3] == alone
    assert engine_tokens(pipe, [SEEDED, *NEIGHBOURS[:3]], 8)[0] == alone
    assert engine_tokens(pipe, [SEEDED], 8, running=NEIGHBOURS)[0] == alone
    other_seed = engine_tokens(pipe, [Job(SEEDED.prompt, SEEDED.max_tokens, SEEDED.params, seed=1235)], 8)[0]
    assert other_seed != alone  # the tokens are the seed's, not fixed by the prompt
