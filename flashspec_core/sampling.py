"""Pure sampling math shared by every verifier and draft provider.

Randomness is always an argument: :class:`Noise` holds the uniforms of the accept
test and the exponential noise of the one categorical draw each row makes, so the
same noise gives the same tokens from every verifier (the Triton kernel's exact
mode included).

Order of operations, identical for the target ``p`` and the draft ``q``:
``logits / temperature`` -> top-k (ties with the k-th value kept) -> top-p (the
smallest prefix of the descending-sorted distribution whose mass reaches
``top_p``; the top token always kept) -> softmax.

Categorical draws use the exponential race ``argmax_v w_v / E_v`` with
``E_v ~ Exp(1)``, which samples ``v`` with probability ``w_v / sum(w)`` for any
non-negative ``w`` without normalising ``w`` and without a host sync.
"""

from __future__ import annotations

import attrs
import torch

from flashspec_core.contracts import SamplingParams, Verdict

# Exp(1) noise is clamped away from zero so that 0 / 0 never yields NaN.
_TINY = torch.finfo(torch.float32).tiny


@attrs.frozen
class Noise:
    """The randomness one verify step consumes."""

    uniform: torch.Tensor  # [B, gamma] float32 in [0, 1)
    exponential: torch.Tensor  # [B, V] float32 > 0, Exp(1)

    @classmethod
    def draw(
        cls, batch: int, gamma: int, vocab: int, generator: torch.Generator | None, device: torch.device | str
    ) -> Noise:
        uniform = torch.rand((batch, gamma), generator=generator, device=device, dtype=torch.float32)
        expo = torch.empty((batch, vocab), device=device, dtype=torch.float32).exponential_(generator=generator)
        return cls(uniform=uniform, exponential=expo.clamp_min_(_TINY))


def filter_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p, as float32 logits with -inf for removed tokens.

    logits: [..., V] any float dtype. Greedy params (temperature 0) only filter.
    """
    x = logits.float()
    if not sampling.greedy:
        x = x / sampling.temperature
    if sampling.top_k > 0 and sampling.top_k < x.shape[-1]:
        kth = torch.topk(x, sampling.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return x


def probs_from_logits(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The distribution tokens are drawn from: [..., V] float32, rows sum to 1."""
    return torch.softmax(filter_logits(logits, sampling), dim=-1)


def race(weights: torch.Tensor, exponential: torch.Tensor) -> torch.Tensor:
    """Sample ``v ~ weights / sum(weights)`` per row: [..., V] -> [...] int64."""
    return torch.argmax(weights / exponential, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row of ``probs`` ([..., V]) with fresh Exp(1) noise."""
    expo = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    return race(probs.float(), expo.clamp_min_(_TINY))


def emit(draft_tokens: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> Verdict:
    """Assemble a Verdict: accepted prefix, then ``last`` at index ``num_accepted``, then -1.

    draft_tokens: [B, gamma] int64; num_accepted: [B] int64; last: [B] int64.
    """
    batch, gamma = draft_tokens.shape
    pos = torch.arange(gamma + 1, device=draft_tokens.device)
    padded = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), -1)], dim=1)
    tokens = torch.where(pos < num_accepted[:, None], padded, -1)
    tokens = torch.where(pos == num_accepted[:, None], last[:, None], tokens)
    return Verdict(tokens=tokens, num_accepted=num_accepted)


def first_rejection(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading True values per row: [B, gamma] bool -> [B] int64."""
    return torch.cumprod(accept.long(), dim=1).sum(dim=1)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor, sampling: SamplingParams) -> Verdict:
    """Accept while the draft equals the target argmax (lowest index on ties)."""
    best = torch.argmax(filter_logits(target_logits, sampling), dim=-1)  # [B, gamma+1]
    gamma = draft_tokens.shape[1]
    num_accepted = first_rejection(draft_tokens == best[:, :gamma])
    return emit(draft_tokens, num_accepted, best.gather(1, num_accepted[:, None]).squeeze(1))


def verify_random(
    target_logits: torch.Tensor,  # [B, gamma+1, V]
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    draft_probs: torch.Tensor | None,  # [B, gamma, V] or None (one-hot q)
    sampling: SamplingParams,
    noise: Noise,
) -> Verdict:
    """Speculative sampling (Leviathan et al. 2023, Algorithm 1), batched, no host sync.

    Accept ``x_i`` iff ``log u_i + log q(x_i) < log p(x_i)`` (``u q < p``: a token
    with ``q = 0`` and ``p > 0`` is accepted, one with ``p = 0`` never). At the first
    rejection emit from ``norm(max(0, p - q))`` (from ``p`` if that is all zero,
    which only rounding can cause); if all are accepted emit the bonus from ``p``.
    """
    batch, gamma = draft_tokens.shape
    logp = torch.log_softmax(filter_logits(target_logits, sampling), dim=-1)  # [B, gamma+1, V]
    idx = draft_tokens[..., None]
    logp_x = logp[:, :gamma].gather(-1, idx).squeeze(-1)  # [B, gamma]
    if draft_probs is None:
        logq_x = torch.zeros_like(logp_x)
    else:
        logq_x = torch.log(draft_probs.float().gather(-1, idx).squeeze(-1))
    accept = torch.log(noise.uniform) + logq_x < logp_x
    num_accepted = first_rejection(accept)
    rows = torch.arange(batch, device=draft_tokens.device)
    p_n = logp[rows, num_accepted].exp()  # [B, V]
    at = num_accepted.clamp_max(gamma - 1) if gamma > 0 else num_accepted
    if gamma == 0:
        q_n = torch.zeros_like(p_n)
    elif draft_probs is None:
        q_n = torch.nn.functional.one_hot(draft_tokens[rows, at], p_n.shape[-1]).float()
    else:
        q_n = draft_probs[rows, at].float()
    q_n = torch.where((num_accepted < gamma)[:, None], q_n, 0.0)
    residual = (p_n - q_n).clamp_min(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    return emit(draft_tokens, num_accepted, race(residual, noise.exponential))
