"""The decode step's contract checks, computed on the device without a host sync.

:func:`step_flags` gives one :class:`~flashspec_core.contracts.Broken` bitmask per row
([B] int64, 0 = nothing broken). The pipeline concatenates it into the tensor the step
copies to the host anyway (the verdict), so the checks cost a few reductions and no
sync; after that copy :func:`blame` turns a nonzero flag into a
:class:`~flashspec_core.contracts.ContractViolation` that names the component. Shapes are
known on the host and checked there, at once (:func:`check_shapes`).

Verifiers that third parties may call directly refuse inputs outside their contract with
:func:`verifier_inputs` (shapes at once; values at once in host memory, or as per-row flags
to return in :attr:`Verdict.flags <flashspec_core.contracts.Verdict.flags>` on an accelerator).

The reductions read each large tensor once: the target logits ``[B, g+1, V]`` through one
maximum per position (NaN, ``+inf`` or all ``-inf`` make it non-finite), the draft ``q``
``[B, g, V]`` through a sum and a minimum per position.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import attrs
import torch

from flashspec_core.contracts import Broken, ContractViolation, Draft, Verdict, VerifierInputError

VERIFIER_SHIFT = 8  # a verifier's own Verdict.flags travel in the bits above the pipeline's
_ALL = sum(int(bit) for bit in Broken)


def prob_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a row of ``q`` may sum: float32 over 150k entries drifts by ~1e-6,
    a 16-bit ``q`` by up to ~1e-3 (its entries round to 8 or 11 bits)."""
    return 1e-3 if dtype in (torch.float32, torch.float64) else 2e-2


def draft_flags(tokens: torch.Tensor, probs: torch.Tensor | None, vocab: int) -> torch.Tensor:
    """DRAFT_TOKENS and DRAFT_PROBS per row: tokens [B, g] int64, probs [B, g, V] or None -> [B] int64."""
    flags = ((tokens < 0) | (tokens >= vocab)).any(dim=1).long() * int(Broken.DRAFT_TOKENS)
    if probs is not None and probs.shape[1] > 0:
        total = probs.sum(dim=-1, dtype=torch.float32)  # [B, g]: NaN or inf anywhere in a row shows here
        low = probs.amin(dim=-1)  # [B, g]
        bad = ~((total - 1.0).abs() <= prob_tolerance(probs.dtype)) | ~(low >= 0)  # NaN fails both tests
        flags = flags | bad.any(dim=1).long() * int(Broken.DRAFT_PROBS)
    return flags


def logits_flags(logits: torch.Tensor) -> torch.Tensor:
    """TARGET_LOGITS per row: logits [B, n, V] -> [B] int64.

    A ``-inf`` logit is allowed (a token the target rules out); NaN, ``+inf`` and a position
    whose logits are all ``-inf`` are not. The maximum shows all three (it propagates NaN).
    """
    top = logits.amax(dim=-1)  # [B, n]
    return (~torch.isfinite(top)).any(dim=1).long() * int(Broken.TARGET_LOGITS)


_CALLER_CHECKS = contextvars.ContextVar("flashspec_caller_checks", default=False)


@contextlib.contextmanager
def checked_by_caller() -> Iterator[None]:
    """Within this block the caller checks the step's values itself (the pipeline's
    :func:`step_flags`), so :func:`verifier_inputs` on an accelerator flags only the draft ids
    (kernels index by them) instead of reading the logits and ``q`` a second time."""
    token = _CALLER_CHECKS.set(True)
    try:
        yield
    finally:
        _CALLER_CHECKS.reset(token)


def verifier_inputs(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                    draft_probs: torch.Tensor | None) -> torch.Tensor | None:
    """A verifier's own check of its inputs: ``None`` when nothing is wrong, or on an
    accelerator each row's :class:`Broken` flags ([B] int64) for :func:`flagged`.

    Reading the values there would cost a host sync inside the step, so the flags go back
    with the verdict instead (the pipeline reads them with its one copy); inside
    :func:`checked_by_caller` only the draft ids are flagged there.

    :raises ValueError: a shape or dtype off, naming the argument.
    :raises VerifierInputError: inputs in host memory with values outside the contract,
        naming the argument and the rows.
    """
    _check_verifier_shapes(target_logits, draft_tokens, draft_probs)
    vocab = target_logits.shape[-1]
    on_host = target_logits.device.type == "cpu"
    if not on_host and _CALLER_CHECKS.get():
        return draft_flags(draft_tokens, None, vocab)
    flags = draft_flags(draft_tokens, draft_probs, vocab) | logits_flags(target_logits)
    if not on_host:
        return flags
    rows = flags.nonzero().flatten().tolist()
    if rows:
        found = Broken(int(flags[rows[0]]))
        bit = next(b for b in (Broken.DRAFT_TOKENS, Broken.DRAFT_PROBS, Broken.TARGET_LOGITS) if b in found)
        argument = {Broken.DRAFT_TOKENS: "draft_tokens", Broken.DRAFT_PROBS: "draft_probs"}.get(bit, "target_logits")
        raise VerifierInputError(argument, bit, f"{bit.describe()} (rows {rows})")
    return None


def flagged(verdict: Verdict, flags: torch.Tensor | None) -> Verdict:
    """``verdict`` carrying :func:`verifier_inputs`' flags, if any."""
    return verdict if flags is None else attrs.evolve(verdict, flags=flags)


def _check_verifier_shapes(target_logits: torch.Tensor, draft_tokens: torch.Tensor,
                           draft_probs: torch.Tensor | None) -> None:
    if draft_tokens.dim() != 2 or draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be [B, g] int64, got {tuple(draft_tokens.shape)} {draft_tokens.dtype}")
    batch, g = draft_tokens.shape
    if target_logits.dim() != 3 or target_logits.shape[:2] != (batch, g + 1) or not target_logits.is_floating_point():
        raise ValueError(f"target_logits must be [B, g + 1, V] = [{batch}, {g + 1}, V] floating point, "
                         f"got {tuple(target_logits.shape)} {target_logits.dtype}")
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, g, target_logits.shape[2]):
        raise ValueError(f"draft_probs must be [B, g, V] = [{batch}, {g}, {target_logits.shape[2]}] or None, "
                         f"got {tuple(draft_probs.shape)}")


def verdict_flags(verdict: Verdict, width: int, vocab: int, path: torch.Tensor | None = None,
                  nodes: int = 0) -> torch.Tensor:
    """VERDICT_COUNT, VERDICT_TOKENS (and VERDICT_PATH for a tree) per row -> [B] int64.

    :param width: the most tokens the verdict may accept (a chain's g; a tree's depth).
    :param path: a tree's accepted nodes [B, D], -1 padded; its entries must be in [-1, nodes).
    """
    n = verdict.num_accepted.long()
    flags = ((n < 0) | (n > width)).long() * int(Broken.VERDICT_COUNT)
    tokens = verdict.tokens
    emitted = torch.arange(tokens.shape[1], device=tokens.device) <= n.clamp(0, width)[:, None]  # [B, w+1]
    outside = (tokens < 0) | (tokens >= vocab)
    flags = flags | (emitted & outside).any(dim=1).long() * int(Broken.VERDICT_TOKENS)
    if path is not None and path.shape[1] > 0:
        flags = flags | ((path < -1) | (path >= nodes)).any(dim=1).long() * int(Broken.VERDICT_PATH)
    if verdict.flags is not None:
        flags = flags | (verdict.flags.long() << VERIFIER_SHIFT)
    return flags


def step_flags(draft: Draft, logits: torch.Tensor, verdict: Verdict, path: torch.Tensor | None) -> torch.Tensor:
    """Every check of one step, per row: [B] int64 on the verdict's device."""
    vocab = logits.shape[-1]
    ids = draft.tokens.to(logits.device)
    flags = draft_flags(ids, draft.probs, vocab).to(logits.device) | logits_flags(logits)
    if draft.parents is None:
        width, tree_path, nodes = ids.shape[1], None, 0
    else:
        width, tree_path, nodes = verdict.tokens.shape[1] - 1, path, ids.shape[1]
    return flags.to(verdict.tokens.device) | verdict_flags(verdict, width, vocab, tree_path, nodes)


@attrs.frozen
class Names:
    """Who to blame: each component as the message names it."""

    drafter: str  # e.g. "arm 'lookup' (draft 'prompt_lookup' from plugin flashspec_lookup.plugin, ...)"
    target: str
    verifier: str


def check_shapes(draft: Draft, logits: torch.Tensor, verdict: Verdict, names: Names) -> None:
    """Shapes and dtypes, known on the host: a ContractViolation at once where one is off."""
    batch, g = draft.tokens.shape
    tree = draft.parents is not None
    if logits.dim() != 3 or logits.shape[:2] != (batch, g + 1) or not logits.is_floating_point():
        raise ContractViolation(names.target, f"logits of shape {tuple(logits.shape)} {logits.dtype}, "
                                f"not [B, g + 1, V] = [{batch}, {g + 1}, V] floating point")
    vocab = logits.shape[2]
    if draft.probs is not None and tuple(draft.probs.shape) != (batch, g, vocab):
        raise ContractViolation(names.drafter, f"probs of shape {tuple(draft.probs.shape)}, "
                                f"not [B, g, V] = [{batch}, {g}, {vocab}]")
    if draft.tokens.dtype != torch.int64:
        raise ContractViolation(names.drafter, f"tokens of dtype {draft.tokens.dtype}, not int64")
    tokens, n = verdict.tokens, verdict.num_accepted
    good = tokens.dim() == 2 and tokens.shape[0] == batch and (1 <= tokens.shape[1] <= g + 1 if tree
                                                                 else tokens.shape[1] == g + 1)
    if not good or tuple(n.shape) != (batch,) or tokens.dtype != torch.int64 or n.dtype != torch.int64:
        raise ContractViolation(names.verifier, f"a verdict with tokens {tuple(tokens.shape)} {tokens.dtype} and "
                                f"num_accepted {tuple(n.shape)} {n.dtype}, not [B, g + 1] = [{batch}, {g + 1}] "
                                f"and [B] = [{batch}], both int64")


def blame(flags: list[int], rows: list[int], names: Names) -> None:
    """Raise the ContractViolation the host copy of :func:`step_flags` shows, if any.

    :param flags: each row's flag, as copied to the host; ``rows``: the live rows checked.
    """
    if not any(flags):  # every step but a broken one: no per-row Flag arithmetic (~70 us at 32 rows)
        return
    own = [flags[b] & ((1 << VERIFIER_SHIFT) - 1) for b in range(len(flags))]
    theirs = [flags[b] >> VERIFIER_SHIFT for b in range(len(flags))]
    culprits = [
        (Broken.DRAFT_TOKENS | Broken.DRAFT_PROBS, names.drafter, own),
        (Broken.TARGET_LOGITS, names.target, own),
        (Broken.VERDICT_COUNT | Broken.VERDICT_TOKENS | Broken.VERDICT_PATH, names.verifier, own),
    ]
    for mask, component, values in culprits:
        hit = [b for b in rows if values[b] & mask]
        if hit:
            found = Broken(0)
            for b in hit:
                found |= Broken(values[b] & mask)
            raise ContractViolation(component, found.describe(), hit)
    hit = [b for b in rows if theirs[b]]
    if hit:
        known = Broken(theirs[hit[0]] & _ALL)
        raise ContractViolation(names.verifier, f"it flagged its own inputs as broken (flags "
                                f"{theirs[hit[0]]:#x}: {known.describe()})", hit)
