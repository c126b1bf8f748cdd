"""Contract checks for any :class:`~flashspec_core.contracts.DraftProvider`.

A provider's proposal must be a function of the current sequences, ``gamma``, the
sampling parameters and the generator alone, never of the calls that came before:
the pipeline rolls it back to each step's accepted count, skips it on steps another
arm plays (their tokens enter the sequences behind its back), shares one instance
between arms of different ``gamma``, and calls :meth:`reset` between requests. The
checks drive a provider through such a history (:class:`Script`) and compare every
proposal with the one a fresh provider makes for the same sequences. Each ``check_*``
raises ``AssertionError`` with a readable message when the contract is broken, so a
third-party draft's test module can apply them to its own provider::

    def make():
        return AcmeDraft(vocab=16)

    @pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
    def test_acme_draft_contract(sampling):
        check_script(make, vocab=16, sampling=sampling)

The contract, for ``B`` rows and a call with ``gamma``:

* ``tokens`` is ``[B, g]`` int64 with ``g <= gamma`` (all rows alike; ``g = 0``, an
  empty proposal, is legal, and ``gamma = 0`` always gives one) and ids in
  ``[0, vocab)``;
* ``probs`` is ``None`` (a one-hot draft) or ``[B, g, vocab]`` with rows of non-negative
  numbers summing to 1, and every drafted token has ``q(x) > 0``;
* after ``rollback(num_accepted)`` (B ints in ``[0, g]``; twice after an empty
  proposal), after steps it sat out and after an empty proposal, its next proposal equals a fresh provider's for the same
  sequences (tokens exactly, ``probs`` to rounding), whatever ``gamma`` the last call had;
* after ``reset()`` it serves a new batch, of another size too.

A provider whose proposals draw on past requests on purpose (a cache of earlier
outputs) fails the comparison with a fresh instance; it can still use
:func:`check_proposal` on its own.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch

from flashspec_core.contracts import Draft, DraftContext, DraftProvider, SamplingParams
from flashspec_core.testing.components import component_config, component_names, component_spec

PROPOSE, ELSEWHERE, EMPTY = "propose", "elsewhere", "empty"
SAMPLINGS = (SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=8, top_p=0.9))


def draft_names() -> list[str]:
    """Every registered draft provider, built-ins and (unless disabled) installed plugins."""
    return component_names("draft")


def load_draft(name: str, context: DraftContext, config: Mapping[str, Any] | None = None) -> DraftProvider:
    """Build registered draft provider ``name`` from its config keys for the pipeline ``context``."""
    spec = component_spec("draft", name)
    return spec.factory(component_config(spec, config), context)  # type: ignore[no-any-return]


def check_proposal(draft: Draft, batch: int, gamma: int, vocab: int) -> None:
    """Shapes, dtypes and ranges of one proposal (see the module docstring)."""
    tokens = draft.tokens
    assert tokens.dim() == 2 and tokens.shape[0] == batch and tokens.shape[1] <= gamma, (
        f"tokens of shape {tuple(tokens.shape)}, not [B = {batch}, <= gamma = {gamma}]"
    )
    assert tokens.dtype == torch.int64, f"tokens must be int64, got {tokens.dtype}"
    cpu = tokens.cpu()
    assert bool(((cpu >= 0) & (cpu < vocab)).all()), f"token ids outside [0, {vocab}): {cpu.tolist()}"
    if draft.probs is None:
        return
    probs = draft.probs.detach().double().cpu()
    want = (batch, tokens.shape[1], vocab)
    assert tuple(probs.shape) == want, f"probs of shape {tuple(probs.shape)}, not {want}"
    assert bool((probs >= 0).all()), "probs must be non-negative"
    sums = probs.sum(-1)
    assert torch.allclose(sums, torch.ones_like(sums), atol=1e-4), f"probs rows sum to {sums.tolist()}, not 1"
    drawn = probs.gather(-1, cpu[..., None]).squeeze(-1)
    assert bool((drawn > 0).all()), f"drafted tokens with q(x) = 0: tokens {cpu.tolist()}"


@attrs.frozen
class Script:
    """The history a provider is driven through: one request of ``batch`` rows, then
    :meth:`~DraftProvider.reset` and a second request of ``batch2`` rows.

    ``events`` per step: ``propose`` (with the next gamma of ``gammas``: two arms sharing
    the provider), ``elsewhere`` (another arm played: every row grows by 1 to 4 tokens the
    provider never saw) or ``empty`` (a ``gamma = 0`` call). Accepted counts and token ids
    come from ``seed``.
    """

    batch: int = 3
    batch2: int = 2
    events: tuple[str, ...] = (
        PROPOSE, PROPOSE, ELSEWHERE, PROPOSE, EMPTY, PROPOSE, ELSEWHERE, ELSEWHERE, PROPOSE, PROPOSE,
    )
    events2: tuple[str, ...] = (PROPOSE, ELSEWHERE, PROPOSE)
    gammas: tuple[int, ...] = (2, 4)
    prompt: tuple[int, int] = (3, 9)  # prompt lengths drawn from this range (inclusive)
    seed: int = 0

    def longest(self) -> int:
        """Longest sequence the script can reach, plus a proposal."""
        per_step = max(max(self.gammas) + 1, 4)
        return self.prompt[1] + max(len(self.events), len(self.events2)) * per_step + max(self.gammas)


def check_script(
    make: Callable[[], DraftProvider],
    vocab: int,
    sampling: SamplingParams,
    script: Script = Script(),
    token_range: int | None = None,
    device: torch.device | str = "cpu",
    atol: float = 1e-5,
) -> None:
    """Drive a provider from ``make`` through ``script`` and compare each proposal with a
    fresh provider's for the same sequences, same ``gamma`` and same generator seed.

    ``token_range``: sequence ids are drawn from ``[0, token_range)`` (default ``vocab``).
    """
    provider, fresh = make(), make()
    rng = random.Random(script.seed)
    ids = token_range or vocab
    for batch, events in ((script.batch, script.events), (script.batch2, script.events2)):
        provider.reset()
        tokens, lengths = _prompts(rng, batch, script, ids)
        gammas = iter(script.gammas * len(events))
        for step, event in enumerate(events):
            where = f"batch of {batch}, step {step} ({event}), lengths {lengths}"
            if event == ELSEWHERE:
                accepted = [rng.randint(0, 3) for _ in lengths]
                _extend(tokens, lengths, [[rng.randrange(ids) for _ in range(n + 1)] for n in accepted])
                continue
            gamma = 0 if event == EMPTY else next(gammas)
            seed = rng.randrange(2**31)
            draft = provider.propose(tokens, lengths, gamma, sampling, _generator(seed, device))
            check_proposal(draft, batch, gamma, vocab)
            assert event != EMPTY or draft.tokens.shape[1] == 0, f"{where}: gamma = 0 must give an empty proposal"
            fresh.reset()
            want = fresh.propose(tokens, lengths, gamma, sampling, _generator(seed, device))
            _same(draft, want, atol, where)
            accepted = [rng.randint(0, draft.tokens.shape[1]) for _ in lengths]
            provider.rollback(accepted)
            if draft.tokens.shape[1] == 0:  # the pipeline may roll an empty proposal back twice
                provider.rollback(accepted)
            kept = draft.tokens.cpu()
            _extend(tokens, lengths, [kept[b, :n].tolist() + [rng.randrange(ids)] for b, n in enumerate(accepted)])


def _prompts(rng: random.Random, batch: int, script: Script, ids: int) -> tuple[torch.Tensor, list[int]]:
    lengths = [rng.randint(*script.prompt) for _ in range(batch)]
    tokens = torch.zeros((batch, script.longest() + 1), dtype=torch.long)
    for b, n in enumerate(lengths):
        tokens[b, :n] = torch.tensor([rng.randrange(ids) for _ in range(n)])
    return tokens, lengths


def _extend(tokens: torch.Tensor, lengths: list[int], new: list[list[int]]) -> None:
    for b, row in enumerate(new):
        tokens[b, lengths[b] : lengths[b] + len(row)] = torch.tensor(row, dtype=torch.long)
        lengths[b] += len(row)


def _generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _same(got: Draft, want: Draft, atol: float, where: str) -> None:
    g, w = got.tokens.cpu(), want.tokens.cpu()
    assert torch.equal(g, w), f"{where}: proposed {g.tolist()}, a fresh provider proposes {w.tolist()}"
    assert (got.probs is None) == (want.probs is None), f"{where}: probs None for one provider only"
    if got.probs is not None and want.probs is not None:
        gp, wp = got.probs.detach().double().cpu(), want.probs.detach().double().cpu()
        diff = (gp - wp).abs().max().item() if gp.numel() else 0.0
        assert diff <= atol, f"{where}: probs differ from a fresh provider's by up to {diff:.3g}"
