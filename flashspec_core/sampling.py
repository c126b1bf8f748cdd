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

from collections.abc import Callable, Sequence

import attrs
import torch

from flashspec_core.contracts import RowSampling, SamplingParams, Verdict

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


# ------------------------------------------------------------------ per-row sampling

UNIT = SamplingParams(temperature=1.0)  # what a verifier applies to logits already warped per row


def warp_logits(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Each row's :func:`filter_logits` under its own params: ``[B, T, V]`` -> ``[B, T, V]`` float32.

    Under :data:`UNIT` the result is row ``b``'s ``p`` (softmax of it): temperature, top-k and
    top-p of ``params[b]``. A greedy row becomes one-hot at its filtered argmax (0 there,
    ``-inf`` elsewhere), so an exact verifier emits that argmax whatever its noise.
    Rows with equal params are filtered together, one call per distinct setting.
    """
    if len(params) != logits.shape[0]:
        raise ValueError(f"warp_logits: {len(params)} params for a batch of {logits.shape[0]} rows")
    out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    groups: dict[SamplingParams, list[int]] = {}
    for b, p in enumerate(params):
        groups.setdefault(p, []).append(b)
    for p, rows in groups.items():
        index = torch.tensor(rows, device=logits.device)
        x = filter_logits(logits.index_select(0, index), p)
        if p.greedy:
            best = torch.argmax(x, dim=-1, keepdim=True)
            x = torch.full_like(x, float("-inf")).scatter_(-1, best, 0.0)
        out.index_copy_(0, index, x)
    return out


_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash (lowbias32) of int64 values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def gumbel_noise(seeds: torch.Tensor, starts: torch.Tensor, width: int, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise keyed by (seed, sequence index, token): ``[B, width, V]`` float32.

    Entry ``[b, i, v]`` is a function of ``seeds[b]``, ``starts[b] + i`` and ``v`` only, so a
    seeded row draws the same noise at the same sequence index in any batch, on any device.
    seeds, starts: ``[B]`` int64 (seeds taken modulo 2^64). Uniforms have 23 bits: with 24,
    the top value plus a half rounds to 2^24 in float32, so u = 1 and the noise is +inf.
    """
    seed = seeds.to(torch.int64)
    key = _mix32(_mix32((seed >> 32) & _MASK32) ^ (seed & _MASK32))  # [B]
    index = starts.to(torch.int64)[:, None] + torch.arange(width, device=seeds.device)  # [B, width]
    key = _mix32(key[:, None] ^ _mix32(index & _MASK32))  # [B, width]
    token = _mix32(torch.arange(vocab, device=seeds.device, dtype=torch.int64) * 0x9E3779B9 & _MASK32)  # [V]
    bits = _mix32(_mix32(key[..., None] ^ token) ^ 0x2545F491)  # [B, width, V]
    u = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))  # in (0, 1), 1 - u >= 2^-24
    return -torch.log(-torch.log(u))


def verify_seeded(warped: torch.Tensor, draft_tokens: torch.Tensor, gumbel: torch.Tensor) -> Verdict:
    """Gumbel-max coupling: the target's token at each slot is ``argmax(warped + gumbel)``;
    accept a draft token iff it equals that token, emit the token at the first mismatch
    (or the bonus slot's). The output is the target's Gumbel-max sample whatever the draft.

    warped: ``[B, gamma+1, V]`` from :func:`warp_logits`; gumbel: the same shape.
    """
    return verify_greedy(warped + gumbel, draft_tokens, SamplingParams(temperature=0.0))


VerifyFn = Callable[
    [torch.Tensor, torch.Tensor, "torch.Tensor | None", SamplingParams, "torch.Generator | None"], Verdict
]


def verify_rows(
    target_logits: torch.Tensor,  # [B, gamma+1, V] raw target logits
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    draft_probs: torch.Tensor | None,  # [B, gamma, V] or None (one-hot q)
    rows: RowSampling,
    generator: torch.Generator | None,
    verify: VerifyFn,
) -> Verdict:
    """:meth:`~flashspec_core.contracts.VerifiesRows.verify_rows` over an exact ``verify``.

    A uniform unseeded ``rows`` is ``verify`` with its one setting. Otherwise the logits are
    warped per row (:func:`warp_logits`) and ``verify`` runs under :data:`UNIT`, which keeps
    its exactness proof: each row's ``p`` is its own warped distribution and ``q`` is what
    the draft reports. Seeded rows then take :func:`verify_seeded`'s verdict instead.
    """
    plain = rows.uniform
    if plain is not None:
        return verify(target_logits, draft_tokens, draft_probs, plain, generator)
    warped = warp_logits(target_logits, rows.params)
    verdict = verify(warped, draft_tokens, draft_probs, UNIT, generator)
    if not rows.seeded:
        return verdict
    if len(rows.starts) != len(rows.params):
        raise ValueError("RowSampling with seeds needs starts (each row's sequence length) to key its noise")
    seeded = [b for b, s in enumerate(rows.seeds) if s is not None]
    device = target_logits.device
    index = torch.tensor(seeded, device=device)
    seeds = torch.tensor([_as_int64(rows.seeds[b]) for b in seeded], dtype=torch.int64, device=device)
    starts = torch.tensor([rows.starts[b] for b in seeded], dtype=torch.int64, device=device)
    noise = gumbel_noise(seeds, starts, warped.shape[1], warped.shape[2])
    coupled = verify_seeded(warped.index_select(0, index), draft_tokens.index_select(0, index), noise)
    return attrs.evolve(verdict, tokens=verdict.tokens.index_copy(0, index, coupled.tokens),
                        num_accepted=verdict.num_accepted.index_copy(0, index, coupled.num_accepted))


class RowsOverVerify:
    """Mixin for a verifier whose ``verify`` is exact: its ``verify_rows``
    (:class:`~flashspec_core.contracts.VerifiesRows`) is :func:`verify_rows` over that ``verify``."""

    verify: VerifyFn

    def verify_rows(
        self,
        target_logits: torch.Tensor,  # [B, gamma+1, V]
        draft_tokens: torch.Tensor,  # [B, gamma] int64
        draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
        rows: RowSampling,
        generator: torch.Generator | None,
    ) -> Verdict:
        """Per-row settings and seeds (:func:`verify_rows` over ``self.verify``)."""
        return verify_rows(target_logits, draft_tokens, draft_probs, rows, generator, self.verify)


def _as_int64(seed: int | None) -> int:
    """A seed as a signed 64-bit value (seeds are taken modulo 2^64)."""
    value = int(seed or 0) & ((1 << 64) - 1)
    return value - (1 << 64) if value >= 1 << 63 else value
