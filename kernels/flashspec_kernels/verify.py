"""Speculative-decoding verification in Triton, beside its plain-torch reference.

Vocabulary (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Algorithm 1; Chen et al. 2023): the draft proposes ``x_1..x_gamma`` from
``q``; the target scores ``gamma + 1`` positions with ``p``.

* an *accepted* token is a drafted token with ``log u_i + log q(x_i) < log p(x_i)``
  (``q = 1`` for deterministic drafts, ``draft_probs is None``);
* ``n = num_accepted`` counts the leading accepts;
* the *recovered* token is drawn from ``norm(max(0, p_n - q_n))`` at the first
  rejection ``n < gamma`` (for deterministic drafts: ``p_n`` with the drafted token
  removed; if the residual is all zero, which only rounding can cause, from ``p_n``);
* the *bonus* token is drawn from ``p_gamma`` when all ``gamma`` were accepted.

Every draw is the exponential race ``argmax_v w_v / E_v`` (``E_v ~ Exp(1)``, lowest
index on ties), so no softmax is ever normalised into memory and no host sync is
needed. The semantics are exactly those of :func:`flashspec_core.sampling.verify_random`
and :func:`~flashspec_core.sampling.verify_greedy`; :func:`verify_ref` calls them.

Kernels (random mode), ``R = B * (gamma + 1)`` rows of ``V`` logits:

1. ``_lse_partial_kernel``, grid ``(R, S1)``: each program streams one slice of a row
   in ``BLOCK_V`` blocks with an online log-sum-exp of ``x * (1 / temperature)`` and
   writes the slice's ``(max, sum exp)``. This is the one full pass over the logits.
   With ``TILE > 0`` (2-byte logits on a GPU: ``PASS_TILE``) a block is read as
   ``[BLOCK_V / TILE, TILE]`` and the running max and sum are kept per tile row of
   ``TILE`` logits, which one thread holds: no reduction across warps (and no barrier)
   per block, and a few registers per thread instead of ``BLOCK_V / threads`` sums.
2. ``_accept_race_kernel``, grid ``(B, S2)``: each program folds the slices into
   ``lse`` for the ``gamma + 1`` positions, gathers ``log p(x_i) = (x_i - max) - log sum``,
   runs the accept test and finds ``n`` (every program of a row recomputes the same
   ``n``: it is a few dozen scalars), then works on its slice of row ``n`` only: it
   re-reads the ``V`` logits of that row (and ``q_n`` and, in exact mode, ``E``). The
   one-stage race runs there; the two-stage draw instead writes the residual mass
   ``sum max(p - q, 0)`` and the p mass of each race block of ``RACE_BLOCK_V`` tokens
   ("Philox draws" below).
3. ``_finalize_kernel``, grid ``(B,)``: after the one-stage race it picks the winner over
   the slices; in the two-stage draw it picks a block by its mass and races inside it.
   Both write ``tokens`` and ``num_accepted``; in philox mode it also advances the counter.

Philox draws. The race ``argmax w / E`` over all ``V`` tokens of row ``n`` needs one
exponential, so one Philox number, per token, and drawing them bounds the whole step at
large ``B`` and ``V`` (docs/kernels.md). There philox mode draws in two stages
(:func:`two_stage_wanted`): a uniform picks block ``k`` with probability
``mass_k / sum mass`` (the residual's masses, or p's where the residual is all zero), then
the race runs over block ``k`` only, which picks a token with probability ``w / mass_k``:
the product is ``w / sum mass``, the same law, with ``RACE_BLOCK_V`` Philox numbers per row
instead of ``V``. It costs a launch's worth of latency more (the block race runs after the
mass stage instead of beside the other slices), so below ``TWO_STAGE_MIN_BATCH`` rows or
``TWO_STAGE_MIN_VOCAB`` tokens philox mode keeps the one-stage race. Exact mode always races
in one stage over the reference's ``E``. Either form gives fresh noise per call; for one
``(seed, counter)`` the two forms give different tokens with the same law.

Logits bytes read: ``B * (gamma + 1) * V * s`` (pass 1) ``+ B * V * s`` (row ``n``; the
two-stage draw reads one block of it again), ``s`` = bytes per logit; plus ``B * V * sq``
for ``q_n`` with draft probs and ``4 * B * V`` for ``E`` in exact mode. Extra memory is
``O(B * (gamma + 1) * S1 + B * V / RACE_BLOCK_V)`` floats: there is no
``[B, gamma + 1, V]`` temporary, except that top-k / top-p
filtering runs :func:`flashspec_core.sampling.filter_logits` on the device first
(sort-based, one fp32 ``[B, gamma + 1, V]`` tensor; only when filtering is on).

Greedy mode: ``_argmax_partial_kernel`` (grid ``(R, S1)``, one pass) and
``_greedy_finalize_kernel`` (grid ``(B,)``): argmax per position, lowest index on ties,
accept while equal. top-k never changes the argmax, so only top-p filters first.

Rows per program. Every kernel takes a ``ROWS`` constexpr and handles ``ROWS``
consecutive rows as ``[ROWS, BLOCK]`` tiles (rows past the end masked), so the grids
above are ``(cdiv(R, ROWS), S1)``, ``(cdiv(B, ROWS), S2)`` and ``(cdiv(B, ROWS),)``.
On a GPU ``ROWS = 1``. Triton's interpreter (``TRITON_INTERPRET=1``) runs the programs
of a grid one by one in Python and each op as numpy on the whole tile, so there the
launcher takes many rows per program (tiles up to ``INTERPRET_TILE`` elements) and trims
the blocks and pads to the vocabulary and gamma: ~0.1 ms per row instead of ~0.1 s,
which is what lets the statistical suite run the kernels on the CPU.

Noise. *Exact* mode takes :class:`flashspec_core.sampling.Noise` (the reference's
tensors) and then emits the reference's tokens: both compute the same float32
quantities, so they can differ only where two candidates are within rounding of each
other (about one draw in a million). *Philox* mode draws the uniforms and the race's
exponentials in-kernel (``tl.randint4x``) from a device ``int64[2]`` state
``(seed, counter)`` (offsets unique per row and token, independent of ``ROWS``);
``_accept_race_kernel`` copies the state for the finalize, whose program 0 then
increments the counter, so a caller that keeps
one state gets fresh noise on every call and CUDA-graph replay without the host knowing
the counter (the ``triton`` verifier instead draws a new state from the step's generator
each call: see :mod:`flashspec_triton.plugin`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Literal

import torch
import triton

from flashspec_core.contracts import SamplingParams, Verdict
from flashspec_core.sampling import Noise, filter_logits, verify_greedy, verify_random
from flashspec_kernels.verify_jit import (  # the programs, launched below
    _accept_race_kernel,
    _argmax_partial_kernel,
    _finalize_kernel,
    _greedy_finalize_kernel,
    _lse_partial_kernel,
)

# Launch settings: the fastest in benchmarks/verify_kernels.py's sweeps on an H200
# (docs/kernels.md, "Launch settings"; docs/reports/2026-12-03-verify-kernels-investigation.md).
# full pass: bytes per logit -> (logits per block, warps per program)
PASS_CONFIG = {2: (4096, 8), 4: (2048, 4)}
# greedy argmax pass: bytes per logit -> (logits per block, warps per program)
ARGMAX_CONFIG = {2: (4096, 4), 4: (2048, 4)}
# full pass: bytes per logit -> logits per tile row (0: one running max per block). One
# thread loads 16 bytes = 8 bf16 logits, so 8 keeps each tile row's max and sum in-thread;
# in fp32 the tile form was slower, so fp32 keeps one running max per block.
PASS_TILE = {2: 8, 4: 0}
RACE_BLOCK_V = 8192  # logits per block in the race (four quarters, one philox call per quad)
RACE_WARPS = 8
# Programs the launcher aims for per SM: the pass sweep's pick in both dtypes.
PROGRAMS_PER_SM = 32
# The race's own target: with 32 per SM a bf16 step at B >= 128 and large vocabularies spent
# 12-31% more outside the pass than with 16.
RACE_PROGRAMS_PER_SM = 16
# Register cap of the race on CUDA (the interpreter ignores it). The one-row race compiled
# to ~128 registers in philox mode; its [1, N]-tile form compiles to ~167 uncapped, one
# program fewer per SM and up to 15% slower; exact mode gains 25-30% from the cap.
RACE_MAX_REGISTERS = 128
G_PAD = 32  # >= gamma + 1 for gamma <= 16
S_PAD = 128  # most slices per row
NB_PAD = 32  # race blocks per row the finalize's pad covers without recompiling (V <= 262144)
# Philox mode's two-stage draw, from this many rows and tokens (module doc, "Philox draws"): on
# the H200 it took 0.84x-0.96x the one-stage step at B >= 128 with V >= 128256 and 1.2x-1.9x
# at B <= 32 or V = 32000, so the one-stage race stays below these.
TWO_STAGE_MIN_BATCH = 128
TWO_STAGE_MIN_VOCAB = 100_000
Draw = Literal["auto", "one_stage", "two_stage"]
DRAWS: tuple[Draw, ...] = ("auto", "one_stage", "two_stage")
MAX_GAMMA = 16
# Most elements in one program's tile in Triton's interpreter (see "Rows per program").
INTERPRET_TILE = 1 << 18




@functools.lru_cache(maxsize=16)
def _programs_wanted(device: torch.device) -> int:
    """Programs that fill the device a few times over (1 on the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def logsumexp_pass(logits: torch.Tensor, inverse_temperature: float = 1.0) -> Callable[[], torch.Tensor]:
    """The verifier's full pass over ``logits`` alone ([B, G, V]), launched as the verifier
    launches it: returns a callable that runs the pass and returns its per-slice partial
    (max, sum) pairs, [2, B * G, nsplit] float32. For benchmarks that time the pass alone."""
    block, warps = PASS_CONFIG[logits.element_size()]
    tile = PASS_TILE[logits.element_size()]
    b, g1, v = logits.shape
    nsplit, per = _split(b * g1, v, block, _programs_wanted(logits.device))
    part = torch.empty((2, b * g1, nsplit), dtype=torch.float32, device=logits.device)

    def run() -> torch.Tensor:
        _lse_partial_kernel[(b * g1, nsplit)](logits, part, inverse_temperature, v, per, BLOCK_V=block, TILE=tile,
                                              num_warps=warps)
        return part

    return run


def two_stage_wanted(batch: int, vocab: int) -> bool:
    """Whether philox mode draws the residual / bonus token in two stages (module doc,
    "Philox draws"): only from ``TWO_STAGE_MIN_BATCH`` rows and ``TWO_STAGE_MIN_VOCAB``
    tokens, where drawing one Philox number per token bounds the step."""
    return batch >= TWO_STAGE_MIN_BATCH and vocab >= TWO_STAGE_MIN_VOCAB


@functools.lru_cache(maxsize=16)
def _race_programs_wanted(device: torch.device) -> int:
    """The race's programs (RACE_PROGRAMS_PER_SM per SM; 1 on the CPU interpreter)."""
    if device.type != "cuda":
        return 1
    return RACE_PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def _interpreting(device: torch.device) -> bool:
    """Whether the kernels run in Triton's interpreter (numpy on the host), not compiled."""
    return device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _blocks(device: torch.device, vocab: int, block: int) -> tuple[int, int]:
    """Logits per block of the full pass (``block`` from PASS_CONFIG) and of the race.

    In the interpreter a block never spans more than the vocabulary: a program's ops are
    numpy calls on its whole tile, and padding lanes cost as much as real ones."""
    if not _interpreting(device):
        return block, RACE_BLOCK_V
    fit = max(16, triton.next_power_of_2(vocab))
    return min(block, fit), min(RACE_BLOCK_V, fit)


def _pads(device: torch.device, gamma: int, slices: int) -> tuple[int, int]:
    """(G_PAD, S_PAD): the fixed pads on a GPU, the least that fits in the interpreter."""
    if not _interpreting(device):
        return G_PAD, S_PAD
    return triton.next_power_of_2(gamma + 1), triton.next_power_of_2(slices)


def _rows_per_program(device: torch.device, rows: int, width: int) -> int:
    """ROWS for a kernel whose per-row tiles hold ``width`` elements: 1 on a GPU; in the
    interpreter the most rows (a power of two) within ``INTERPRET_TILE`` elements."""
    if not _interpreting(device):
        return 1
    return max(1, min(triton.next_power_of_2(rows), INTERPRET_TILE // width))


@functools.lru_cache(maxsize=64)
def _inverse_temperature(temperature: float) -> float:
    # torch divides by a Python scalar on CUDA as x * (1.0f / t) in float32: do the same
    return (torch.tensor(1.0, dtype=torch.float32) / torch.tensor(temperature, dtype=torch.float32)).item()


def _split(rows: int, vocab: int, block: int, wanted: int) -> tuple[int, int]:
    """(slices per row, blocks per slice): enough programs to fill the device."""
    nblocks = triton.cdiv(vocab, block)
    nsplit = max(1, min(S_PAD, nblocks, triton.cdiv(wanted, rows)))
    per = triton.cdiv(nblocks, nsplit)
    return triton.cdiv(nblocks, per), per


def _carve(dev: torch.device, dtype: torch.dtype, *sizes: int) -> list[torch.Tensor]:
    """Flat views of one allocation, each starting 16-byte aligned (one allocator call
    instead of several, and alignment that never changes the kernels' specialisation)."""
    align = 16 // dtype.itemsize
    starts, end = [], 0
    for n in sizes:
        starts.append(end)
        end += triton.cdiv(n, align) * align
    buf = torch.empty((end,), dtype=dtype, device=dev)
    return [buf[a : a + n] for a, n in zip(starts, sizes, strict=True)]


def _check(target_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None) -> None:
    if target_logits.dim() != 3 or draft_tokens.dim() != 2:
        raise ValueError("target_logits must be [B, gamma+1, V] and draft_tokens [B, gamma]")
    batch, gamma = draft_tokens.shape
    if not 0 <= gamma <= MAX_GAMMA:  # gamma 0: the no-speculation arm, a plain sample
        raise ValueError(f"gamma must be in 0..{MAX_GAMMA}, got {gamma}")
    if tuple(target_logits.shape[:2]) != (batch, gamma + 1):
        raise ValueError(f"target_logits {tuple(target_logits.shape)} does not match draft_tokens {(batch, gamma)}")
    if not target_logits.dtype.is_floating_point or draft_tokens.dtype != torch.int64:
        raise TypeError("target_logits must be a float tensor and draft_tokens int64")
    if draft_probs is not None and tuple(draft_probs.shape) != (batch, gamma, target_logits.shape[-1]):
        raise ValueError(f"draft_probs must be [B, gamma, V], got {tuple(draft_probs.shape)}")


def readable(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` as the kernels read them: float64 (a float64 target's) cast to float32 first. The
    kernels compute in float32 and their launch settings are per 2- and 4-byte logits; the
    reference verifier casts to float32 too (``filter_logits``), so the tokens are the same."""
    return logits.float() if logits.dtype == torch.float64 else logits


def _prepare(target_logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, float]:
    """Logits the kernels read and the factor they scale them by."""
    if sampling.filtered:
        return filter_logits(target_logits, sampling).contiguous(), 1.0  # temperature already applied
    return target_logits.contiguous(), _inverse_temperature(sampling.temperature)


def verify_triton(
    target_logits: torch.Tensor,  # [B, gamma+1, V] float32 / bfloat16 / float16 (float64: read as float32)
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    draft_probs: torch.Tensor | None,  # [B, gamma, V] float or None (one-hot q)
    sampling: SamplingParams,
    *,
    noise: Noise | None = None,
    state: torch.Tensor | None = None,  # [2] int64 (seed, counter), advanced in place
    programs: int | None = None,
    draw: Draw = "auto",
) -> Verdict:
    """Verify one step on the device. Exactly one of ``noise`` (exact) and ``state``
    (philox) is needed in random mode; greedy needs neither. ``programs`` overrides the
    number of programs the launcher aims for (tests use it to force several slices).
    ``draw`` picks philox mode's draw of the residual / bonus token: ``"auto"``
    (:func:`two_stage_wanted`), ``"one_stage"`` or ``"two_stage"`` (module doc, "Philox
    draws"); the law is the same, the tokens for one state differ."""
    if draw not in DRAWS:
        raise ValueError(f"draw must be one of {', '.join(DRAWS)}, got {draw!r}")
    return _verify(target_logits, draft_tokens, draft_probs, sampling, noise, state, programs, draw)[0]


def log_probs_at_draft(
    target_logits: torch.Tensor,  # [B, gamma+1, V]
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    sampling: SamplingParams,
    programs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' ``lse`` ([B, gamma+1] float32) and ``log p(x_i)`` ([B, gamma] float32)."""
    batch, gamma = draft_tokens.shape
    noise = Noise(
        uniform=torch.full((batch, gamma), 0.5, device=draft_tokens.device),
        exponential=torch.ones((batch, target_logits.shape[-1]), device=draft_tokens.device),
    )
    stats = _verify(target_logits, draft_tokens, None, sampling, noise, None, programs)[1]
    return stats[:, : gamma + 1], stats[:, gamma + 1 : 2 * gamma + 1]


def _verify(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingParams,
    noise: Noise | None,
    state: torch.Tensor | None,
    programs: int | None,
    draw: Draw = "auto",
) -> tuple[Verdict, torch.Tensor | None]:
    _check(target_logits, draft_tokens, draft_probs)
    target_logits = readable(target_logits)
    batch, gamma = draft_tokens.shape
    vocab = target_logits.shape[-1]
    dev = target_logits.device
    wanted = programs or _programs_wanted(dev)
    draft_tokens = draft_tokens.contiguous()
    if gamma == 0:  # an empty tensor may have a null pointer; the kernels never read it
        draft_tokens = torch.zeros((batch, 1), dtype=torch.int64, device=dev)
    # state_copy: the philox state the two-stage finalize reads (2 int64s; unused otherwise)
    tokens, nacc, state_copy = _carve(dev, torch.int64, batch * (gamma + 1), batch, 2)
    tokens = tokens.view(batch, gamma + 1)
    rows = batch * (gamma + 1)
    if sampling.greedy:
        logits = filter_logits(target_logits, sampling) if sampling.top_p < 1.0 else target_logits.contiguous()
        block, warps = ARGMAX_CONFIG[logits.element_size()]
        block = _blocks(dev, vocab, block)[0]
        nsplit1, per1 = _split(rows, vocab, block, wanted)
        g_pad, s_pad = _pads(dev, gamma, nsplit1)
        part_f, part_i = _carve(dev, torch.float32, rows * nsplit1, rows * nsplit1)
        part_i = part_i.view(torch.int32)
        rpp = _rows_per_program(dev, rows, block)
        _argmax_partial_kernel[(triton.cdiv(rows, rpp), nsplit1)](
            logits, part_f, part_i, vocab, per1, rows, BLOCK_V=block, ROWS=rpp, num_warps=warps
        )
        rpp = _rows_per_program(dev, batch, g_pad * s_pad)
        _greedy_finalize_kernel[(triton.cdiv(batch, rpp),)](
            draft_tokens, part_f, part_i, tokens, nacc, batch, gamma, nsplit1,
            G_PAD=g_pad, S_PAD=s_pad, ROWS=rpp, num_warps=4,
        )  # fmt: skip
        return Verdict(tokens=tokens, num_accepted=nacc), None
    if (noise is None) == (state is None):
        raise ValueError("random mode needs exactly one of noise (exact) or state (philox)")
    logits, inv_t = _prepare(target_logits, sampling)
    exact = noise is not None
    if exact:
        uniform = noise.uniform.contiguous()
        expo = noise.exponential.contiguous()
        if tuple(uniform.shape) != (batch, gamma) or tuple(expo.shape) != (batch, vocab):
            raise ValueError("noise must hold uniform [B, gamma] and exponential [B, V]")
        if gamma == 0:
            uniform = expo  # never read; avoids a null pointer for the empty tensor
        state = tokens  # unused pointer
    else:
        uniform = expo = tokens  # unused pointers
    q = draft_probs.contiguous() if draft_probs is not None else tokens
    block, warps = PASS_CONFIG[logits.element_size()]
    block, race_block = _blocks(dev, vocab, block)
    nsplit1, per1 = _split(rows, vocab, block, wanted)
    nsplit2, per2 = _split(batch, vocab, race_block, programs or _race_programs_wanted(dev))
    g_pad, s_pad = _pads(dev, gamma, max(nsplit1, nsplit2))
    two_stage = not exact and (draw == "two_stage" or (draw == "auto" and two_stage_wanted(batch, vocab)))
    nb = triton.cdiv(vocab, race_block)  # race blocks per row
    nb_pad = triton.next_power_of_2(nb) if _interpreting(dev) else max(NB_PAD, triton.next_power_of_2(nb))
    staged = batch if two_stage else 0  # rows of the two-stage draw's mass and row statistics
    part, stats, race_f, race_i, mass, rowstat = _carve(
        dev, torch.float32, 2 * rows * nsplit1, 2 * rows, 3 * batch * nsplit2, 2 * batch * nsplit2, 2 * staged * nb,
        2 * staged,
    )  # fmt: skip
    stats = stats.view(batch, 2 * (gamma + 1))
    race_i = race_i.view(torch.int32)
    rpp = _rows_per_program(dev, rows, block)
    tile = PASS_TILE[logits.element_size()] if rpp == 1 else 0
    _lse_partial_kernel[(triton.cdiv(rows, rpp), nsplit1)](
        logits, part, inv_t, vocab, per1, BLOCK_V=block, ROWS=rpp, n_rows=rows, TILE=tile, num_warps=warps,
    )  # fmt: skip
    rpp = _rows_per_program(dev, batch, max(race_block // 4, g_pad * s_pad))
    _accept_race_kernel[(triton.cdiv(batch, rpp), nsplit2)](
        logits, draft_tokens, q, uniform, expo, state, part, stats, nacc, race_f, race_i, mass, rowstat,
        state_copy, inv_t, vocab, batch, gamma, nsplit1, per2,
        HAS_Q=draft_probs is not None, EXACT=exact, TWO_STAGE=two_stage, BLOCK_V=race_block, G_PAD=g_pad,
        S_PAD=s_pad, ROWS=rpp, num_warps=RACE_WARPS, maxnreg=RACE_MAX_REGISTERS,
    )  # fmt: skip
    # the one-stage finalize only picks among the slices' winners; the two-stage one races a block
    width, fin = (max(g_pad, s_pad, nb_pad, race_block // 4), {"num_warps": RACE_WARPS, "maxnreg": RACE_MAX_REGISTERS}) \
        if two_stage else (max(g_pad, s_pad), {"num_warps": 4})  # fmt: skip
    rpp = _rows_per_program(dev, batch, width)
    _finalize_kernel[(triton.cdiv(batch, rpp),)](
        logits, draft_tokens, q, race_f, race_i, mass, rowstat, state_copy, nacc, tokens, state,
        inv_t, vocab, batch, gamma, nsplit2,
        HAS_Q=draft_probs is not None, EXACT=exact, TWO_STAGE=two_stage, BLOCK_V=race_block, G_PAD=g_pad,
        S_PAD=s_pad, NB_PAD=nb_pad, ROWS=rpp, **fin,
    )  # fmt: skip
    return Verdict(tokens=tokens, num_accepted=nacc), stats


def new_philox_state(generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """A device ``[2] int64`` philox state ``(seed, counter)``, both drawn from
    ``generator`` by one ``torch.randint`` on the device (no host sync; graph-safe with
    the default generator)."""
    return torch.randint(0, 2**31, (2,), generator=generator, device=device, dtype=torch.int64)


def verify_ref(
    target_logits: torch.Tensor,  # [B, gamma+1, V]
    draft_tokens: torch.Tensor,  # [B, gamma] int64
    draft_probs: torch.Tensor | None,  # [B, gamma, V] or None
    sampling: SamplingParams,
    noise: Noise | None = None,
) -> Verdict:
    """The plain-torch reference the kernels must match token for token."""
    if sampling.greedy:
        return verify_greedy(target_logits, draft_tokens, sampling)
    if noise is None:
        raise ValueError("random mode needs noise")
    return verify_random(target_logits, draft_tokens, draft_probs, sampling, noise)
