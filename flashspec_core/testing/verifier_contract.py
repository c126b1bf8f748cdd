"""Contract checks for any :class:`~flashspec_core.contracts.Verifier`.

Each ``check_*`` function takes a verifier (and the inputs it needs), raises
``AssertionError`` with a readable message when the contract is broken and
returns nothing otherwise, so a third-party plugin's test module can parametrize
them over its own verifiers::

    @pytest.mark.parametrize("name", verifier_names())
    def test_edges(name):
        v = load_verifier_or_skip(name)
        check_zero_q_draft(v)

The contract, for a step with ``B`` rows, ``gamma`` drafts and vocabulary ``V``:

* ``tokens`` is ``[B, gamma+1]`` int64, ``num_accepted`` is ``[B]`` int64 in ``[0, gamma]``;
* row ``b`` emits ``num_accepted[b] + 1`` tokens in ``[0, V)``: the accepted drafts,
  equal to ``draft_tokens[b, :num_accepted[b]]``, then one recovered or bonus
  token; the rest of the row is ``-1``;
* the same generator seed gives the same verdict;

and, for a verifier that samples from the target's law (all but those declaring
``exact = False``: :class:`~flashspec_core.contracts.DeclaresExactness`):

* a drafted token with ``q(x) = 0`` is accepted iff ``p(x) > 0``; ``p == q`` always
  accepts; a token whose target logit is ``-inf`` is never emitted; when the
  residual ``max(0, p - q)`` is all zero the token comes from ``p``; greedy ties go
  to the lowest index;

and, for a verifier that declares :class:`~flashspec_core.contracts.VerifiesWithNoise`:

* ``verify_with_noise`` emits exactly the reference's tokens given the same noise;

and, for every verifier, inputs outside the contract (draft ids outside ``[0, V)``, a ``q``
that is NaN, negative or does not sum to 1, target logits NaN, ``+inf`` or all ``-inf`` at
a position) are refused with a named error (a ``ValueError``, such as
:class:`~flashspec_core.contracts.VerifierInputError`, naming the argument) or flagged in
:attr:`Verdict.flags <flashspec_core.contracts.Verdict.flags>` on exactly the broken rows
(:func:`check_refuses_bad_inputs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from flashspec_core.contracts import (
    DeclaresExactness,
    SamplingParams,
    Verdict,
    Verifier,
    VerifierInputError,
    VerifiesWithNoise,
)
from flashspec_core.registry import build_registry
from flashspec_core.sampling import Noise, probs_from_logits, sample, verify_greedy, verify_random

ACCEPT, REJECT, RANDOM = "accept", "reject", "random"


class VerifierUnavailable(Exception):
    """A registered verifier cannot run here (e.g. its kernel library is not installed)."""


def verifier_names() -> list[str]:
    """Every registered verifier, built-ins and (unless disabled) installed plugins."""
    return build_registry().names("verifier")


def load_verifier(
    name: str, device: torch.device | str = "cpu", config: Mapping[str, Any] | None = None
) -> Verifier:
    """Build verifier ``name`` with its default config, or with ``config`` (keys of its
    config class); :class:`VerifierUnavailable` if it cannot run."""
    spec = build_registry().get("verifier", name)
    if config and spec.config_cls is None:
        raise ValueError(f"verifier {name!r} takes no config, got {dict(config)}")
    built = spec.config_cls(**(config or {})) if spec.config_cls is not None else None
    try:
        return spec.factory(built, torch.device(device))
    except ImportError as exc:
        raise VerifierUnavailable(f"verifier {name!r}: {exc}") from exc
    except Exception as exc:
        if "not installed" in str(exc) or "not available" in str(exc):
            raise VerifierUnavailable(f"verifier {name!r}: {exc}") from exc
        raise


def load_verifier_or_skip(
    name: str, device: torch.device | str = "cpu", exact: bool = False, config: Mapping[str, Any] | None = None
) -> Verifier:
    """:func:`load_verifier`, turning :class:`VerifierUnavailable` into a pytest skip.

    With ``exact=True`` a verifier that declares ``exact = False`` (a timing-only
    stand-in that does not sample from the target's law) is skipped too.
    """
    import pytest

    try:
        verifier = load_verifier(name, device, config)
    except VerifierUnavailable as exc:
        pytest.skip(str(exc))
    if exact and not is_exact(verifier):
        pytest.skip(f"verifier {name!r} declares exact = False (not a sampler of the target's law)")
    return verifier


def is_exact(verifier: Verifier) -> bool:
    """Whether ``verifier`` claims to sample from the target's law; a verifier opts out
    of the exactness checks with a class attribute ``exact = False``."""
    return not isinstance(verifier, DeclaresExactness) or bool(verifier.exact)


@attrs.frozen
class Inputs:
    """One verify call's arguments (the generator is made from a seed at call time)."""

    target_logits: torch.Tensor  # [B, gamma+1, V] float32
    draft_tokens: torch.Tensor  # [B, gamma] int64
    draft_probs: torch.Tensor | None  # [B, gamma, V] float32, or None (one-hot draft)
    sampling: SamplingParams

    def run(self, verifier: Verifier, seed: int) -> Verdict:
        device = self.target_logits.device
        gen = torch.Generator(device=device).manual_seed(seed)
        return verifier.verify(self.target_logits, self.draft_tokens, self.draft_probs, self.sampling, gen)


def random_inputs(
    batch: int,
    gamma: int,
    vocab: int,
    seed: int,
    sampling: SamplingParams,
    deterministic: bool = False,
    pattern: Sequence[str] | None = None,
    device: torch.device | str = "cpu",
) -> Inputs:
    """Random logits and drafts sampled from q; ``pattern[i]`` forces position ``i``.

    ``accept`` makes ``p`` one-hot on the drafted token (``u q < 1`` always holds);
    ``reject`` gives the drafted token a ``-inf`` target logit (needs ``vocab >= 2``, or
    the row would have no finite logit); ``random`` leaves it be.
    """
    if vocab < 2 and REJECT in (pattern or ()):
        raise ValueError("a forced reject needs vocab >= 2")
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn((batch, gamma + 1, vocab), generator=g)
    q = probs_from_logits(logits[:, :gamma] + torch.randn((batch, gamma, vocab), generator=g), sampling)
    draft_tokens = sample(q, g)
    for i, kind in enumerate(pattern or ()):
        x = draft_tokens[:, i : i + 1]
        if kind == ACCEPT:
            logits[:, i] = torch.full_like(logits[:, i], float("-inf")).scatter(-1, x, 0.0)
        elif kind == REJECT:
            logits[:, i] = logits[:, i].scatter(-1, x, float("-inf"))
    return Inputs(
        logits.to(device),
        draft_tokens.to(device),
        None if deterministic else q.to(device),
        sampling,
    )


def check_verdict(verdict: Verdict, inputs: Inputs) -> None:
    """Shapes, dtypes, ranges, padding, and the accepted prefix equal to the drafts."""
    batch, gamma = inputs.draft_tokens.shape
    vocab = inputs.target_logits.shape[-1]
    tokens, n = verdict.tokens.cpu(), verdict.num_accepted.cpu()
    assert tokens.shape == (batch, gamma + 1), f"tokens shape {tuple(tokens.shape)} != {(batch, gamma + 1)}"
    assert n.shape == (batch,), f"num_accepted shape {tuple(n.shape)} != {(batch,)}"
    assert tokens.dtype == torch.int64 and n.dtype == torch.int64, f"dtypes {tokens.dtype}, {n.dtype} != int64"
    assert bool(((n >= 0) & (n <= gamma)).all()), f"num_accepted outside [0, {gamma}]: {n.tolist()}"
    pos = torch.arange(gamma + 1)
    emitted = pos[None] <= n[:, None]  # [B, gamma+1]
    assert bool(((tokens >= 0) & (tokens < vocab))[emitted].all()), f"emitted token outside [0, {vocab}): {tokens}"
    assert bool((tokens[~emitted] == -1).all()), f"padding after the emitted tokens must be -1: {tokens}"
    drafts = inputs.draft_tokens.cpu()
    accepted = pos[None, :gamma] < n[:, None]
    assert bool((tokens[:, :gamma][accepted] == drafts[accepted]).all()), "accepted tokens differ from the drafts"


def check_pattern(verdict: Verdict, pattern: Sequence[str]) -> None:
    """``num_accepted`` covers the leading forced accepts and stops at the first forced reject."""
    lead = next((i for i, k in enumerate(pattern) if k != ACCEPT), len(pattern))
    stop = next((i for i, k in enumerate(pattern) if k == REJECT), len(pattern))
    n = verdict.num_accepted.cpu()
    assert bool((n >= lead).all()), f"forced accepts at 0..{lead - 1} but num_accepted {n.tolist()}"
    assert bool((n <= stop).all()), f"forced reject at {stop} but num_accepted {n.tolist()}"


def check_deterministic(make: Callable[[], Verifier], inputs: Inputs, seed: int) -> None:
    """A fresh verifier and the same generator seed give the same verdict.

    ``make`` builds a new instance per run: a verifier may keep device-side noise
    state between calls (the ``triton`` verifier's philox counter does), so only a
    fresh instance is a function of the generator alone.
    """
    a, b = inputs.run(make(), seed), inputs.run(make(), seed)
    assert torch.equal(a.tokens.cpu(), b.tokens.cpu()), "same seed, different tokens"
    assert torch.equal(a.num_accepted.cpu(), b.num_accepted.cpu()), "same seed, different num_accepted"


def _one_step(vocab: int, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [batch, 2, V] and one draft token per row (token 0), for the edge cases."""
    logits = torch.linspace(1.0, -1.0, vocab).repeat(batch, 2, 1)
    return logits, torch.zeros((batch, 1), dtype=torch.int64)


def check_zero_q_draft(verifier: Verifier, device: torch.device | str = "cpu", vocab: int = 8) -> None:
    """A drafted token with ``q(x) = 0`` is accepted iff ``p(x) > 0``."""
    logits, x = _one_step(vocab)
    q = torch.zeros((logits.shape[0], 1, vocab))
    q[..., 1] = 1.0  # q(x = 0) = 0
    sampling = SamplingParams(temperature=1.0)
    verdict = Inputs(logits.to(device), x.to(device), q.to(device), sampling).run(verifier, 0)
    assert bool((verdict.num_accepted.cpu() == 1).all()), "q(x) = 0 < p(x): the draft must be accepted"
    logits[:, 0, 0] = float("-inf")
    verdict = Inputs(logits.to(device), x.to(device), q.to(device), sampling).run(verifier, 0)
    assert bool((verdict.num_accepted.cpu() == 0).all()), "p(x) = 0: the draft must be rejected"
    assert bool((verdict.tokens[:, 0].cpu() != 0).all()), "p(x) = 0: x must not be emitted"


def check_equal_p_q(verifier: Verifier, device: torch.device | str = "cpu", vocab: int = 16, gamma: int = 4) -> None:
    """``q == p`` at every position: every draft is accepted."""
    sampling = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)
    logits = 2 * torch.randn((32, gamma + 1, vocab), generator=torch.Generator().manual_seed(1))
    q = probs_from_logits(logits[:, :gamma], sampling)
    drafts = sample(q, torch.Generator().manual_seed(2))
    verdict = Inputs(logits.to(device), drafts.to(device), q.to(device), sampling).run(verifier, 0)
    assert bool((verdict.num_accepted.cpu() == gamma).all()), "p == q must always accept"


def check_zero_residual(verifier: Verifier, device: torch.device | str = "cpu", vocab: int = 8) -> None:
    """``q >= p`` everywhere (here q = 1.0005 p, within the sum tolerance: only rounding makes
    such a q): a rejected row's residual is all zero, so its token comes from ``p``. The
    rejection needs ``u > 1 / 1.0005``, so the noise is given (``verify_with_noise``); a
    verifier without it is only checked for a well-formed verdict."""
    logits, x = _one_step(vocab)
    logits[:, :, vocab // 2 :] = float("-inf")  # p's support: the first half
    sampling = SamplingParams(temperature=1.0)
    q = 1.0005 * probs_from_logits(logits[:, :1], sampling)
    inputs = Inputs(logits.to(device), x.to(device), q.to(device), sampling)
    if not isinstance(verifier, VerifiesWithNoise):
        check_verdict(inputs.run(verifier, 3), Inputs(logits, x, q, sampling))
        return
    batch = logits.shape[0]
    noise = Noise.draw(batch, 1, vocab, torch.Generator(device=device).manual_seed(3), device)
    noise = attrs.evolve(noise, uniform=torch.full((batch, 1), 0.99999, device=device))
    verdict = verifier.verify_with_noise(inputs.target_logits, inputs.draft_tokens, inputs.draft_probs, sampling, noise)
    check_verdict(verdict, Inputs(logits, x, q, sampling))
    assert bool((verdict.num_accepted.cpu() == 0).all()), "u q(x) > p(x) must reject every row"
    first = verdict.tokens[:, 0].cpu()
    assert bool((first < vocab // 2).all()), f"all-zero residual: token must come from p's support, got {first}"


def check_neg_inf_logits(
    verifier: Verifier, device: torch.device | str = "cpu", vocab: int = 12, gamma: int = 3
) -> None:
    """Tokens whose target logit is ``-inf`` are never emitted (accepted, recovered or bonus)."""
    for temperature in (0.0, 1.0):
        sampling = SamplingParams(temperature=temperature)
        inputs = random_inputs(32, gamma, vocab, seed=5, sampling=sampling, device=device)
        logits = inputs.target_logits.clone()
        banned = torch.zeros(vocab, dtype=torch.bool)
        banned[::2] = True  # even tokens: -inf at every position
        logits[..., banned.to(logits.device)] = float("-inf")
        inputs = attrs.evolve(inputs, target_logits=logits)
        verdict = inputs.run(verifier, 0)
        check_verdict(verdict, inputs)
        tokens = verdict.tokens.cpu()
        emitted = tokens[tokens >= 0]
        assert not bool(banned[emitted].any()), f"a -inf token was emitted (T={temperature})"


def check_greedy_ties(verifier: Verifier, device: torch.device | str = "cpu", vocab: int = 10) -> None:
    """Greedy: the lowest index among tied maxima is the target's choice."""
    logits = torch.zeros((4, 2, vocab))
    logits[:, :, 3] = logits[:, :, 7] = 5.0
    drafts = torch.tensor([[3], [7], [0], [3]])
    verdict = Inputs(logits.to(device), drafts.to(device), None, SamplingParams(temperature=0.0)).run(verifier, 0)
    assert verdict.num_accepted.cpu().tolist() == [1, 0, 0, 1], f"ties: {verdict.num_accepted.tolist()}"
    assert verdict.tokens.cpu().tolist() == [[3, 3], [3, -1], [3, -1], [3, 3]], f"ties: {verdict.tokens.tolist()}"


EDGE_CASES = (check_zero_q_draft, check_equal_p_q, check_zero_residual, check_neg_inf_logits, check_greedy_ties)


def check_noise_matches_reference(
    verifier: VerifiesWithNoise, device: torch.device | str = "cpu", vocab: int = 64, gamma: int = 3
) -> None:
    """``verify_with_noise`` emits the tokens of :func:`flashspec_core.sampling.verify_random`
    (``verify_greedy`` when greedy) given the same noise, with and without draft probs."""
    for sampling, deterministic in (
        (SamplingParams(temperature=1.0), False),
        (SamplingParams(temperature=0.7, top_k=20, top_p=0.9), True),
        (SamplingParams(temperature=0.0), True),
    ):
        inputs = random_inputs(3, gamma, vocab, seed=11, sampling=sampling, deterministic=deterministic, device=device)
        gen = torch.Generator(device=device).manual_seed(12)
        noise = Noise.draw(3, gamma, vocab, gen, device)
        logits, drafts, probs = inputs.target_logits, inputs.draft_tokens, inputs.draft_probs
        got = verifier.verify_with_noise(logits, drafts, probs, sampling, noise)
        if sampling.greedy:
            want = verify_greedy(logits, drafts, sampling)
        else:
            want = verify_random(logits, drafts, probs, sampling, noise)
        check_verdict(got, inputs)
        assert torch.equal(got.num_accepted.cpu(), want.num_accepted.cpu()), (
            f"{sampling}: num_accepted {got.num_accepted.tolist()}, the reference's {want.num_accepted.tolist()}"
        )
        assert torch.equal(got.tokens.cpu(), want.tokens.cpu()), (
            f"{sampling}: tokens {got.tokens.tolist()}, the reference's {want.tokens.tolist()}"
        )


def _bad_inputs(case: str, sampling: SamplingParams, vocab: int = 8, gamma: int = 2) -> tuple[Inputs, str]:
    """Three rows of valid inputs, then row 1 broken as ``case`` says; and the argument it breaks."""
    inputs = random_inputs(3, gamma, vocab, seed=7, sampling=sampling)
    logits, tokens = inputs.target_logits.clone(), inputs.draft_tokens.clone()
    q = inputs.draft_probs.clone() if inputs.draft_probs is not None else None
    assert q is not None
    argument = "draft_tokens" if case.startswith("id") else "draft_probs" if case.startswith("q") else "target_logits"
    if case == "id-vocab":
        tokens[1, 0] = vocab
    elif case == "id-negative":
        tokens[1, -1] = -1
    elif case == "q-nan":
        q[1, 0, 3] = float("nan")
    elif case == "q-negative":
        q[1, 0] = 0.0
        q[1, 0, 0], q[1, 0, 1] = -0.25, 1.25  # sums to 1, with a negative entry
    elif case == "q-sum":
        q[1, -1] = q[1, -1] * 1.5
    elif case == "logits-nan":
        logits[1, 1, 2] = float("nan")
    elif case == "logits-inf":
        logits[1, 0, 5] = float("inf")
    elif case == "logits-all-neg-inf":
        logits[1, -1] = float("-inf")
    else:
        raise ValueError(f"unknown bad-input case {case!r}")
    return Inputs(logits, tokens, q, sampling), argument


BAD_INPUTS = ("id-vocab", "id-negative", "q-nan", "q-negative", "q-sum", "logits-nan", "logits-inf",
              "logits-all-neg-inf")


def check_refuses_bad_inputs(verifier: Verifier, case: str, device: torch.device | str = "cpu") -> None:
    """Inputs broken as ``case`` (one of :data:`BAD_INPUTS`) in row 1 of 3 are refused with a
    ``ValueError`` naming the broken argument, or flagged in ``Verdict.flags`` on row 1 alone;
    greedy and sampled. A verifier never emits from such inputs as if nothing were wrong."""
    for temperature in (0.0, 1.0):
        inputs, argument = _bad_inputs(case, SamplingParams(temperature=temperature))
        inputs = Inputs(inputs.target_logits.to(device), inputs.draft_tokens.to(device),
                        None if inputs.draft_probs is None else inputs.draft_probs.to(device), inputs.sampling)
        try:
            verdict = inputs.run(verifier, 0)
        except VerifierInputError as exc:
            assert exc.argument == argument, f"{case}: refused naming {exc.argument!r}, not {argument!r}: {exc}"
            continue
        except ValueError as exc:
            assert argument in str(exc), f"{case}: a ValueError that does not name {argument!r}: {exc}"
            continue
        assert verdict.flags is not None, f"{case} (T={temperature}): neither refused nor flagged (Verdict.flags is None)"
        flags = verdict.flags.cpu().tolist()
        assert flags[1] != 0 and flags[0] == flags[2] == 0, f"{case} (T={temperature}): flags {flags}, not row 1 alone"
