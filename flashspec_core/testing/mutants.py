"""Planted bugs the exactness gate must catch (mutation testing of the statistics).

Each mutant is a realistic one-line bug in speculative sampling. Verifier-side
mutants run :func:`verify_random_mutant`, a copy of
:func:`flashspec_core.sampling.verify_random` with the bug switched in (with no bug
it gives the same tokens from the same noise, which a test checks); draft-side
mutants change what a draft provider reports, through the gate's ``report``
argument. Pipeline-level mutants (KV cache not rolled back, a selector that peeks
at the current draft) belong to the pipeline tests, which feed their emitted
streams to :func:`flashspec_core.testing.exactness.transition_test`.

Some bugs are invisible to the exponential race and are therefore *not* bugs
here: sampling the residual from unnormalised weights, or from ``p - q`` without
clamping (a negative weight never wins the race against a positive one). The
"unnormalised residual" mutant is the form that does bite: inverse-CDF sampling
against the unnormalised cumulative sum, where the missing mass lands on the last
token.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from flashspec_core.contracts import SamplingParams, Verdict
from flashspec_core.sampling import Noise, emit, filter_logits, first_rejection, race, verify_greedy
from flashspec_core.testing.exactness import Case

MUTANTS: dict[str, str] = {
    "temperature_after_softmax": "temperature applied to the target's probabilities after the softmax "
    "(probs / T, renormalised), which cancels it: p is taken at T = 1 while q has T",
    "residual_from_p": "the recovered token is sampled from p instead of norm(max(0, p - q))",
    "residual_unnormalised": "the recovered token is sampled by inverse CDF against the unnormalised "
    "cumulative sum of max(0, p - q); the missing mass goes to the last token",
    "bonus_wrong_position": "when every draft is accepted the bonus is sampled from p at position gamma - 1 "
    "(the last draft's) instead of gamma",
    "accept_reversed": "the accept test uses q / p instead of p / q (accept iff u * p < q)",
    "residual_when_all_accepted": "a residual is emitted even when every draft was accepted: the bonus comes "
    "from norm(max(0, p_gamma - q_last)) instead of p_gamma",
    "q_unfiltered": "the draft samples from its top-k/top-p filtered q but reports the unfiltered "
    "softmax(logits / T) as draft_probs, while p is filtered",
    "draft_probs_wrong_position": "draft probabilities shifted by one position: the accept test and the "
    "residual at position i use q of position i - 1",
}

_IN_VERIFIER = {
    "temperature_after_softmax",
    "residual_from_p",
    "residual_unnormalised",
    "bonus_wrong_position",
    "accept_reversed",
    "residual_when_all_accepted",
}


def verify_random_mutant(
    target_logits: torch.Tensor,  # [B, gamma+1, V]
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
    sampling: SamplingParams,
    noise: Noise,
    bug: str | None = None,
) -> Verdict:
    """:func:`flashspec_core.sampling.verify_random` with the verifier-side ``bug`` planted."""
    batch, gamma = draft_tokens.shape
    target_sampling = attrs.evolve(sampling, temperature=1.0) if bug == "temperature_after_softmax" else sampling
    logp = torch.log_softmax(filter_logits(target_logits, target_sampling), dim=-1)
    idx = draft_tokens[..., None]
    logp_x = logp[:, :gamma].gather(-1, idx).squeeze(-1)
    logq_x = (
        torch.zeros_like(logp_x) if draft_probs is None else torch.log(draft_probs.float().gather(-1, idx).squeeze(-1))
    )
    if bug == "accept_reversed":
        accept = torch.log(noise.uniform) + logp_x < logq_x
    else:
        accept = torch.log(noise.uniform) + logq_x < logp_x
    num_accepted = first_rejection(accept)
    rows = torch.arange(batch, device=draft_tokens.device)
    at_p = num_accepted
    if bug == "bonus_wrong_position":
        at_p = torch.where(num_accepted == gamma, gamma - 1, num_accepted)
    p_n = logp[rows, at_p].exp()
    at = num_accepted.clamp_max(gamma - 1)
    if draft_probs is None:
        q_n = torch.nn.functional.one_hot(draft_tokens[rows, at], p_n.shape[-1]).float()
    else:
        q_n = draft_probs[rows, at].float()
    if bug != "residual_when_all_accepted":
        q_n = torch.where((num_accepted < gamma)[:, None], q_n, 0.0)
    residual = p_n if bug == "residual_from_p" else (p_n - q_n).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    if bug == "residual_unnormalised":
        uniform = 1.0 - torch.exp(-noise.exponential[:, :1])  # [B, 1] in (0, 1)
        last = torch.searchsorted(torch.cumsum(residual, dim=-1), uniform).squeeze(-1).clamp_max(p_n.shape[-1] - 1)
    else:
        last = race(residual, noise.exponential)
    return emit(draft_tokens, num_accepted, last)


@attrs.frozen
class MutantVerifier:
    """A verifier with one planted bug (the reference's noise and greedy path otherwise)."""

    bug: str | None

    def verify(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        sampling: SamplingParams,
        generator: torch.Generator | None,
    ) -> Verdict:
        if sampling.greedy:
            return verify_greedy(target_logits, draft_tokens, sampling)
        batch, gamma = draft_tokens.shape
        noise = Noise.draw(batch, gamma, target_logits.shape[-1], generator, target_logits.device)
        if self.bug == "draft_probs_wrong_position" and draft_probs is not None:
            draft_probs = torch.cat([draft_probs[:, :1], draft_probs[:, :-1]], dim=1)
        bug = self.bug if self.bug in _IN_VERIFIER else None
        return verify_random_mutant(target_logits, draft_tokens, draft_probs, sampling, noise, bug)


def report_sampling(bug: str | None) -> Callable[[SamplingParams], SamplingParams] | None:
    """For draft-side mutants: the params the draft *reports* its q with, given the true ones."""
    if bug == "q_unfiltered":
        return lambda s: attrs.evolve(s, top_k=0, top_p=1.0)
    return None


def mutant(bug: str | None) -> tuple[MutantVerifier, Callable[[SamplingParams], SamplingParams] | None]:
    """The verifier and the draft-report override that together plant ``bug`` (None: no bug)."""
    if bug is not None and bug not in MUTANTS:
        raise KeyError(f"unknown mutant {bug!r}; known: {', '.join(MUTANTS)}")
    return MutantVerifier(bug), report_sampling(bug)


# The case every mutant is measured on: temperature != 1, top-k cutting real mass from
# q, gamma >= 2 and position-dependent p and q, so that each bug above is active.
POWER_CASE = Case("power_v24_g4_t0.6_topk5", 24, 4, SamplingParams(temperature=0.6, top_k=5), contexts=4)
