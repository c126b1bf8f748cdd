"""Exact laws a correct verifier must reproduce, computed in float64.

The oracle :func:`filtered_probs` is written from the documented order of
operations (temperature, top-k with ties kept, top-p with the top token kept,
softmax) independently of :mod:`flashspec_core.sampling`, so a bug there shows up
as a disagreement instead of being copied into the expected law.

Laws used by the exactness suite (Leviathan et al. 2023, Theorem 3.5 / Appendix A):

* every emitted token, given the emitted prefix, has the target's filtered law;
* position ``i`` accepts with probability ``alpha_i = sum_v min(p_i(v), q_i(v))``,
  which for a deterministic (one-hot) draft ``x_i`` is ``p_i(x_i)``;
* the number accepted ``N`` has ``P(N >= k) = prod_{i <= k} alpha_i`` when the
  positions are independent, and the forward recursion of :func:`markov_accept_law`
  when ``p_i`` and ``q_i`` depend on the previous token.
"""

from __future__ import annotations

import attrs
import torch

from flashspec_core.contracts import SamplingParams


def filtered_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The law a token is drawn from: [..., V] any float -> [..., V] float64 summing to 1."""
    x = logits.double()
    if not sampling.greedy:
        x = x / sampling.temperature
    vocab = x.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.sort(x, dim=-1, descending=True).values[..., sampling.top_k - 1 : sampling.top_k]
        x = torch.where(x >= kth, x, float("-inf"))
    if sampling.top_p < 1.0:
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        keep_sorted = before < sampling.top_p
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        x = torch.where(keep, x, float("-inf"))
    return torch.softmax(x, dim=-1)


def greedy_tokens(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """The greedy choice: the lowest index among the filtered maxima. [..., V] -> [...] int64."""
    return torch.argmax(filtered_probs(logits, attrs.evolve(sampling, temperature=0.0)), dim=-1)


def acceptance_mass(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor | None = None) -> torch.Tensor:
    """Probability that a position accepts: [..., V] -> [...] float64.

    ``sum_v min(p, q)`` for a draft sampled from ``q``; for a deterministic draft
    (``q is None``) it is ``p(draft)``.
    """
    if q is None:
        if draft is None:
            raise ValueError("a deterministic draft needs the drafted tokens")
        return p.double().gather(-1, draft[..., None].long()).squeeze(-1)
    return torch.minimum(p.double(), q.double()).sum(-1)


def num_accepted_law(alphas: torch.Tensor) -> torch.Tensor:
    """Law of the number accepted from independent per-position masses: [..., gamma] -> [..., gamma+1].

    ``P(N = k) = alpha_1 ... alpha_k (1 - alpha_{k+1})`` and ``P(N = gamma) = prod alpha``.
    """
    a = alphas.double()
    ones = torch.ones_like(a[..., :1])
    at_least = torch.cat([ones, torch.cumprod(a, dim=-1)], dim=-1)  # P(N >= k), k = 0..gamma
    return at_least - torch.cat([at_least[..., 1:], torch.zeros_like(ones)], dim=-1)


@attrs.frozen
class MarkovModel:
    """A toy language model whose next-token logits depend on ``previous token % contexts``.

    With ``contexts == V`` it is a full first-order Markov chain; with fewer
    contexts every conditional law is visited often, which keeps chi-square cells
    full at large V.
    """

    logits: torch.Tensor  # [S, V] float32 raw next-token logits per context

    @property
    def contexts(self) -> int:
        return self.logits.shape[0]

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]

    def context(self, tokens: torch.Tensor) -> torch.Tensor:
        """Context id of each previous token: [...] int64 -> [...] int64 in [0, S)."""
        return tokens.long() % self.contexts

    def next_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Raw logits of the token after each of ``tokens``: [...] -> [..., V] float32."""
        return self.logits[self.context(tokens)]

    def law(self, sampling: SamplingParams) -> torch.Tensor:
        """Exact next-token law per context: [S, V] float64."""
        return filtered_probs(self.logits, sampling)


def markov_accept_law(
    p: torch.Tensor,  # [S, V] float64 target law per context
    q: torch.Tensor,  # [S, V] draft law per context (drafts sampled from q)
    gamma: int,
    deterministic: bool,
) -> torch.Tensor:
    """Law of the number accepted given the starting context: [S, gamma+1] float64.

    ``m[s, w]`` is the probability of drafting ``w`` after context ``s`` *and*
    accepting it: ``min(p, q)`` when the verifier sees ``q``, ``q * p`` when it sees a
    one-hot draft. ``a_k(w) = P(N >= k, x_k = w)`` then follows
    ``a_{k+1}(w) = sum_s a_k(context s) m[s, w]``.
    """
    p, q = p.double(), q.double()
    contexts, vocab = p.shape
    m = q * p if deterministic else torch.minimum(p, q)  # [S, V]
    fold = torch.nn.functional.one_hot(torch.arange(vocab) % contexts, contexts).double()  # [V, S]
    at_least = [torch.ones(contexts, dtype=torch.float64)]
    a = m  # [S0, V]: a_1 for every starting context
    for _ in range(gamma):
        at_least.append(a.sum(-1))
        a = (a @ fold) @ m
    ge = torch.stack(at_least, dim=-1)  # [S, gamma+1]: P(N >= k)
    return ge - torch.cat([ge[:, 1:], torch.zeros(contexts, 1, dtype=torch.float64)], dim=-1)
