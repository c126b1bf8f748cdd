"""The Triton programs of the verify step; the host launchers, their launch settings and the
vocabulary (accepted, recovered and bonus tokens; the race; Philox draws) are in
:mod:`flashspec_kernels.verify`, which imports these."""

import triton
import triton.language as tl

_ACCEPT_STREAM = tl.constexpr(1 << 31)  # philox offsets below this race, above it the accept uniforms
_ACCEPT_STRIDE = tl.constexpr(32)  # accept offsets per row (>= MAX_GAMMA)


# --------------------------------------------------------------------------- kernels


@triton.jit
def _lse_tiles(base, lo, V, blocks_per_split, scale, BLOCK_V: tl.constexpr, TILE: tl.constexpr):
    """One row's slice as [BLOCK_V // TILE, TILE] tiles: a running max and sum per tile row
    (in-thread when TILE logits are one thread's load), folded once at the end. Returns
    the slice's max of the raw logits and its sum of exp2((x - max) * scale)."""
    offs0 = tl.arange(0, BLOCK_V // TILE)[:, None] * TILE + tl.arange(0, TILE)[None, :]
    s = tl.zeros((BLOCK_V // TILE,), tl.float32)
    m = tl.full((BLOCK_V // TILE,), float("-inf"), tl.float32)
    for blk in range(blocks_per_split):
        offs = lo + blk * BLOCK_V + offs0
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        # the factor is exactly 1 while the max stays, so no rounding compounds over blocks
        s = s * tl.math.exp2((m - m_safe) * scale) + tl.sum(tl.math.exp2((x - m_safe[:, None]) * scale), axis=1)
        m = m_new
    top = tl.max(m, axis=0)
    top_safe = tl.where(top == float("-inf"), 0.0, top)
    return top, tl.sum(s * tl.math.exp2((m - top_safe) * scale), axis=0)


@triton.jit(do_not_specialize=["blocks_per_split", "n_rows"])
def _lse_partial_kernel(
    logits_ptr,  # [R, V] float32 / bfloat16 / float16 logits, R = B * (gamma + 1)
    part_ptr,  # [2, R, S1] float32: slice max of x, slice sum of exp(x - max)
    inv_t,  # float32: 1 / temperature (1 when the logits are pre-filtered)
    V,
    blocks_per_split,
    BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr = 1,  # rows per program (module doc, "Rows per program")
    n_rows=1 << 62,  # R; the default means one row per program of the grid
    TILE: tl.constexpr = 0,  # > 0 only with ROWS = 1 (module doc, kernel 1)
):
    rows = tl.minimum(n_rows, tl.num_programs(0) * ROWS)
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # [ROWS]
    live = row < rows
    row = tl.minimum(row, rows - 1)  # rows past R redo row R - 1; their stores are masked
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    lo = split * blocks_per_split * BLOCK_V
    scale = inv_t * 1.4426950408889634  # log2(e) / temperature
    if TILE > 0:
        top, total = _lse_tiles(logits_ptr + tl.program_id(0).to(tl.int64) * V, lo, V, blocks_per_split, scale,
                                BLOCK_V, TILE)  # fmt: skip
        m = tl.zeros((ROWS,), tl.float32) + top
        s_row = tl.zeros((ROWS,), tl.float32) + total
    else:
        base = logits_ptr + row[:, None] * V  # [ROWS, 1]
        offs0 = tl.arange(0, BLOCK_V)
        # online log-sum-exp: the running max is one scalar per row (one max-reduction per
        # block), the sum stays per lane (reduced once at the end); one exp2 per logit. Maxima
        # are kept in raw-logit units: max(x) * inv_t == max(x * inv_t) exactly, as inv_t > 0.
        # (A per-lane max instead, merged once at the end, was measured 17-23% slower on the H200
        # and removed.)
        s = tl.zeros((ROWS, BLOCK_V), tl.float32)
        m = tl.full((ROWS,), float("-inf"), tl.float32)
        for blk in range(blocks_per_split):
            offs = lo + blk * BLOCK_V + offs0
            x = tl.load(base + offs[None, :], mask=(offs < V)[None, :], other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all -inf so far: adds nothing
            s = s * tl.math.exp2((m - m_safe) * scale)[:, None] + tl.math.exp2((x - m_safe[:, None]) * scale)
            m = m_new
        s_row = tl.sum(s, axis=1)
    m_row = m * inv_t
    out = row * nsplit + split
    tl.store(part_ptr + out, m_row, mask=live)
    tl.store(part_ptr + rows * nsplit + out, s_row, mask=live)


@triton.jit
def _philox_uniform(seed, counter, local):
    # One philox call per offset; offsets [0, 2**31) race, [2**31, 2**32) accept.
    r0, r1, r2, r3 = tl.randint4x(seed, (counter << 32) | local)
    return tl.uint_to_uniform_float(r0), r1, r2, r3


@triton.jit
def _race_quarter(
    x,  # [ROWS, QB] float32 logits * inv_t of row n
    offs,  # [1, QB] int32 token ids
    e,  # [ROWS, QB] float32 Exp(1) noise
    m_n,  # [ROWS, 1]
    log_s_n,  # [ROWS, 1]
    q,  # [ROWS, QB] float32 q_n (zero at the bonus position)
    best_r,  # [ROWS, QB] per-lane running best residual score, and its token id
    idx_r,
    best_p,  # [ROWS, QB] per-lane running best p score, and its token id
    idx_p,
    res_max,  # [ROWS, QB] per-lane running max of the residual
    EXACT: tl.constexpr,
):
    p = tl.exp((x - m_n) - log_s_n)
    res = tl.maximum(p - q, 0.0)
    if EXACT:  # IEEE division, as torch's weights / exponential
        score_r = tl.math.div_rn(res, e)
        score_p = tl.math.div_rn(p, e)
    else:
        inv_e = 1.0 / e
        score_r = res * inv_e
        score_p = p * inv_e
    # strict >: each lane sees its token ids in increasing order, so ties keep the lowest.
    # Lanes past V score exactly 0 (p = 0) with ids >= V, so they lose every tie.
    take_r = score_r > best_r
    take_p = score_p > best_p
    best_r = tl.where(take_r, score_r, best_r)
    idx_r = tl.where(take_r, offs, idx_r)
    best_p = tl.where(take_p, score_p, best_p)
    idx_p = tl.where(take_p, offs, idx_p)
    res_max = tl.maximum(res_max, res)
    return best_r, idx_r, best_p, idx_p, res_max


@triton.jit
def _lowest_argmax(best, idx):
    """Per row: (max, lowest id holding it) over a [ROWS, N] block of per-lane (score, id)."""
    top = tl.max(best, axis=1)
    return top, tl.min(tl.where(best == top[:, None], idx, 2147483647), axis=1)


@triton.jit
def _load_quarter(logits_row, q_row, offs, vm, inv_t, tok_n, q_end, HAS_Q: tl.constexpr):
    # [ROWS, 1] row pointers and [1, QB] offsets; q_end: V when row n was rejected, 0 at
    # the bonus position (q = 0 there); tok_n: the rejected draft token, -1 at the bonus
    x = tl.load(logits_row + offs, mask=vm, other=float("-inf")).to(tl.float32) * inv_t
    if HAS_Q:
        q = tl.load(q_row + offs, mask=offs < q_end, other=0.0).to(tl.float32)
    else:
        q = tl.where(offs == tok_n, 1.0, 0.0)
    return x, q


@triton.jit
def _race_block(
    logits_row,  # [ROWS, 1] pointer to row n's logits
    q_row,  # [ROWS, 1] pointer to q_n (HAS_Q)
    e_row,  # [ROWS, 1] pointer to E's row (EXACT)
    seed,
    counter,
    quad_row,  # [ROWS, 1] this row's first philox quad id
    start,  # first token of the block: a scalar, or [ROWS, 1]
    V,
    inv_t,
    tok_n,
    q_end,
    m_n,
    log_s_n,
    best_r,
    idx_r,
    best_p,
    idx_p,
    res_max,
    HAS_Q: tl.constexpr,
    EXACT: tl.constexpr,
    QB: tl.constexpr,
):
    """The race over one block of ``4 QB`` tokens of row ``n``, in four quarters."""
    o0 = start + tl.arange(0, QB)[None, :]
    o1 = o0 + QB
    o2 = o1 + QB
    o3 = o2 + QB
    if EXACT:
        e0 = tl.load(e_row + o0, mask=o0 < V, other=1.0)
        e1 = tl.load(e_row + o1, mask=o1 < V, other=1.0)
        e2 = tl.load(e_row + o2, mask=o2 < V, other=1.0)
        e3 = tl.load(e_row + o3, mask=o3 < V, other=1.0)
    else:
        # one philox call per 4 tokens; quad ids are unique per (row, counter)
        r0, r1, r2, r3 = tl.randint4x(seed, (counter << 32) | (quad_row + start // 4 + tl.arange(0, QB)[None, :]))
        # E = -log(u) may round to 0 for u near 1: its score is then inf (or NaN, never taken)
        e0 = -tl.log(tl.uint_to_uniform_float(r0))
        e1 = -tl.log(tl.uint_to_uniform_float(r1))
        e2 = -tl.log(tl.uint_to_uniform_float(r2))
        e3 = -tl.log(tl.uint_to_uniform_float(r3))
    x, q = _load_quarter(logits_row, q_row, o0, o0 < V, inv_t, tok_n, q_end, HAS_Q)
    best_r, idx_r, best_p, idx_p, res_max = _race_quarter(
        x, o0, e0, m_n, log_s_n, q, best_r, idx_r, best_p, idx_p, res_max, EXACT
    )
    x, q = _load_quarter(logits_row, q_row, o1, o1 < V, inv_t, tok_n, q_end, HAS_Q)
    best_r, idx_r, best_p, idx_p, res_max = _race_quarter(
        x, o1, e1, m_n, log_s_n, q, best_r, idx_r, best_p, idx_p, res_max, EXACT
    )
    x, q = _load_quarter(logits_row, q_row, o2, o2 < V, inv_t, tok_n, q_end, HAS_Q)
    best_r, idx_r, best_p, idx_p, res_max = _race_quarter(
        x, o2, e2, m_n, log_s_n, q, best_r, idx_r, best_p, idx_p, res_max, EXACT
    )
    x, q = _load_quarter(logits_row, q_row, o3, o3 < V, inv_t, tok_n, q_end, HAS_Q)
    best_r, idx_r, best_p, idx_p, res_max = _race_quarter(
        x, o3, e3, m_n, log_s_n, q, best_r, idx_r, best_p, idx_p, res_max, EXACT
    )
    return best_r, idx_r, best_p, idx_p, res_max


@triton.jit
def _mass_block(logits_row, q_row, start, V, inv_t, tok_n, q_end, m_n, log_s_n, HAS_Q: tl.constexpr,
                QB: tl.constexpr):  # fmt: skip
    """One block's residual mass ``sum max(p - q, 0)`` and p mass ``sum p`` per row, with
    ``p`` computed exactly as the race computes it."""
    sum_r = tl.zeros((m_n.shape[0], QB), tl.float32)
    sum_p = tl.zeros((m_n.shape[0], QB), tl.float32)
    for i in tl.static_range(4):
        o = start + i * QB + tl.arange(0, QB)[None, :]
        x, q = _load_quarter(logits_row, q_row, o, o < V, inv_t, tok_n, q_end, HAS_Q)
        p = tl.exp((x - m_n) - log_s_n)
        sum_r += tl.maximum(p - q, 0.0)
        sum_p += p
    return tl.sum(sum_r, axis=1), tl.sum(sum_p, axis=1)


@triton.jit
def _batch_rows(n_rows, ROWS: tl.constexpr):
    """This program's rows ``[ROWS]`` (clamped to ``n_rows - 1``) and which are real."""
    b = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    return tl.minimum(b, n_rows - 1), b < n_rows


@triton.jit
def _flat_rows(n_rows, ROWS: tl.constexpr, G_PAD: tl.constexpr):
    """This program's (row, position) pairs, flattened to ``[ROWS * G_PAD]``: row (clamped
    to ``n_rows - 1``), position, and whether the row is real."""
    k = tl.arange(0, ROWS * G_PAD)
    b = tl.program_id(0).to(tl.int64) * ROWS + k // G_PAD
    return tl.minimum(b, n_rows - 1), k % G_PAD, b < n_rows


@triton.jit(do_not_specialize=["B", "gamma", "nsplit1", "blocks_per_split"])
def _accept_race_kernel(
    logits_ptr,  # [B, gamma+1, V] logits (same tensor as pass 1)
    draft_ptr,  # [B, gamma] int64 drafted tokens
    q_ptr,  # [B, gamma, V] float draft probs (HAS_Q) else any pointer
    u_ptr,  # [B, gamma] float32 uniforms (EXACT) else any pointer
    e_ptr,  # [B, V] float32 Exp(1) noise (EXACT) else any pointer
    state_ptr,  # [2] int64 philox (seed, counter) (not EXACT) else any pointer
    part_ptr,  # [2, B*(gamma+1), nsplit1] float32 from pass 1
    stats_ptr,  # [B, 2*(gamma+1)] float32 out: lse per position, then log p(x_i)
    nacc_ptr,  # [B] int64 out: num_accepted
    race_f_ptr,  # [3, B, S2] float32 out (EXACT): best residual score, best p score, residual max
    race_i_ptr,  # [2, B, S2] int32 out (EXACT): their token ids
    mass_ptr,  # [2, B, NB] float32 out (not EXACT): residual and p mass of each race block of row n
    rowstat_ptr,  # [2, B] float32 out (not EXACT): max and log sum of row n
    state_copy_ptr,  # [2] int64 out (not EXACT): the philox state this step reads
    inv_t,
    V,
    B,
    gamma,
    nsplit1,
    blocks_per_split,
    HAS_Q: tl.constexpr,
    EXACT: tl.constexpr,
    TWO_STAGE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    G_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    b, live = _batch_rows(B, ROWS)  # [ROWS]; rows past B redo row B - 1, stores masked
    split = tl.program_id(1)
    nsplit2 = tl.num_programs(1)
    g1 = gamma + 1
    # (row, position) pairs flattened to [ROWS * G_PAD], row-major: with ROWS = 1 these are
    # the [G_PAD] vectors of one row, and only the per-row reductions reshape to 2-D.
    bf, jf, live_f = _flat_rows(B, ROWS, G_PAD)
    sl = tl.arange(0, S_PAD)
    pos = bf * g1 + jf  # logits row of each position
    # --- fold pass-1 slices into (max, log sum) per position
    pm_mask = (jf[:, None] < g1) & (sl[None, :] < nsplit1)
    pidx = pos[:, None] * nsplit1 + sl[None, :]
    pm = tl.load(part_ptr + pidx, mask=pm_mask, other=float("-inf"))
    ps = tl.load(part_ptr + B * g1 * nsplit1 + pidx, mask=pm_mask, other=0.0)
    m = tl.max(pm, axis=1)  # [ROWS * G_PAD]
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    log_s = tl.log(tl.sum(ps * tl.exp(pm - m_safe[:, None]), axis=1))
    # --- accept scan
    jm = jf < gamma
    drafted = bf * gamma + jf
    tok = tl.load(draft_ptr + drafted, mask=jm, other=0)
    # a draft id outside [0, V) is never accepted, and its gathers are clamped into the row:
    # no read out of bounds whatever the ids (callers of this module may skip the plugin's checks)
    in_vocab = (tok >= 0) & (tok < V)
    tok_c = tl.minimum(tl.maximum(tok, 0), V - 1)
    x_tok = tl.load(logits_ptr + pos * V + tok_c, mask=jm, other=0.0).to(tl.float32) * inv_t
    logp_x = (x_tok - m) - log_s  # as torch's log_softmax: (x - max) - log(sum)
    if HAS_Q:
        logq_x = tl.log(tl.load(q_ptr + drafted * V + tok_c, mask=jm, other=1.0).to(tl.float32))
    else:
        logq_x = tl.zeros((ROWS * G_PAD,), tl.float32)
    if EXACT:
        u = tl.load(u_ptr + drafted, mask=jm, other=0.5)
        seed = 0
        counter = 0
    else:
        seed = tl.load(state_ptr)
        counter = tl.load(state_ptr + 1)
        u, _r1, _r2, _r3 = _philox_uniform(seed, counter, _ACCEPT_STREAM + bf * _ACCEPT_STRIDE + jf)
    accept = ((tl.log(u) + logq_x < logp_x) & in_vocab) | (jf >= gamma)
    first_reject = tl.reshape(tl.where(accept, G_PAD, jf), (ROWS, G_PAD))
    n = tl.minimum(tl.min(first_reject, axis=1), gamma)  # [ROWS]
    if split == 0:
        tl.store(nacc_ptr + b, n.to(tl.int64), mask=live)
        at = bf * 2 * g1 + jf
        tl.store(stats_ptr + at, m + log_s, mask=live_f & (jf < g1))
        tl.store(stats_ptr + at + g1, logp_x, mask=live_f & jm)
    # --- race over this program's slice of row n
    at_n = tl.arange(0, G_PAD)[None, :] == n[:, None]  # [ROWS, G_PAD]
    m_n = tl.max(tl.where(at_n, tl.reshape(m, (ROWS, G_PAD)), float("-inf")), axis=1)[:, None]  # [ROWS, 1]
    log_s_n = tl.sum(tl.where(at_n, tl.reshape(log_s, (ROWS, G_PAD)), 0.0), axis=1)[:, None]
    # the rejected draft (one-hot q_n), -1 at the bonus position: loaded again (8 bytes)
    # rather than picked out of tok, whose reshape costs the GPU build ~80 registers
    tok_n = tl.load(draft_ptr + b * gamma + n, mask=n < gamma, other=-1)[:, None]
    q_end = tl.where(n < gamma, V, 0)[:, None]
    logits_row = logits_ptr + ((b * g1 + n) * V)[:, None]  # [ROWS, 1]
    q_row = q_ptr + ((b * gamma + tl.minimum(n, gamma - 1)) * V)[:, None]
    QB: tl.constexpr = BLOCK_V // 4
    lo = split * blocks_per_split * BLOCK_V
    if EXACT or not TWO_STAGE:
        best_r = tl.full((ROWS, QB), -1.0, tl.float32)
        best_p = tl.full((ROWS, QB), -1.0, tl.float32)
        res_max = tl.zeros((ROWS, QB), tl.float32)
        idx_r = tl.zeros((ROWS, QB), tl.int32)
        idx_p = tl.zeros((ROWS, QB), tl.int32)
        e_row = e_ptr + (b * V)[:, None]  # [ROWS, 1]
        # philox quad ids: row b owns [b * row_quads, (b + 1) * row_quads), its blocks' quads
        quad_row = (b * (tl.cdiv(V, BLOCK_V) * QB))[:, None]  # [ROWS, 1]
        for blk in range(blocks_per_split):
            best_r, idx_r, best_p, idx_p, res_max = _race_block(
                logits_row, q_row, e_row, seed, counter, quad_row, lo + blk * BLOCK_V, V, inv_t, tok_n, q_end,
                m_n, log_s_n, best_r, idx_r, best_p, idx_p, res_max, HAS_Q, EXACT, QB,
            )  # fmt: skip
        top_r, tok_r = _lowest_argmax(best_r, idx_r)
        top_p, tok_p = _lowest_argmax(best_p, idx_p)
        out = b * nsplit2 + split
        plane = B * nsplit2
        tl.store(race_f_ptr + out, top_r, mask=live)
        tl.store(race_f_ptr + plane + out, top_p, mask=live)
        tl.store(race_f_ptr + 2 * plane + out, tl.max(res_max, axis=1), mask=live)
        tl.store(race_i_ptr + out, tok_r, mask=live)
        tl.store(race_i_ptr + plane + out, tok_p, mask=live)
    else:
        # stage 1 of the philox draw: the mass of every race block of row n; the finalize
        # picks one block by its mass and races inside it (module doc, "Philox draws")
        nb = tl.cdiv(V, BLOCK_V)
        for blk in range(blocks_per_split):
            k = split * blocks_per_split + blk
            mass_r, mass_p = _mass_block(logits_row, q_row, lo + blk * BLOCK_V, V, inv_t, tok_n, q_end, m_n,
                                         log_s_n, HAS_Q, QB)  # fmt: skip
            stored = live & ((b * 0 + k) < nb)  # [ROWS] bool (a scalar compare is no mask in the interpreter)
            tl.store(mass_ptr + b * nb + k, mass_r, mask=stored)
            tl.store(mass_ptr + (B + b) * nb + k, mass_p, mask=stored)
        if split == 0:
            tl.store(rowstat_ptr + b, tl.reshape(m_n, (ROWS,)), mask=live)
            tl.store(rowstat_ptr + B + b, tl.reshape(log_s_n, (ROWS,)), mask=live)
            if tl.program_id(0) == 0:  # the finalize reads this copy: its program 0 advances the state
                tl.store(state_copy_ptr, seed)
                tl.store(state_copy_ptr + 1, counter)


@triton.jit
def _write_row(out_ptr, draft_ptr, b, live, n, last, gamma, G_PAD: tl.constexpr):
    # b, live, n, last: [ROWS]
    j = tl.arange(0, G_PAD)[None, :]
    drafted = tl.load(draft_ptr + b[:, None] * gamma + j, mask=j < gamma, other=-1)
    row = tl.where(j < n[:, None], drafted, -1)
    row = tl.where(j == n[:, None], last.to(tl.int64)[:, None], row)
    tl.store(out_ptr + b[:, None] * (gamma + 1) + j, row, mask=live[:, None] & (j <= gamma))


@triton.jit(do_not_specialize=["B", "gamma", "nsplit2"])
def _finalize_kernel(
    logits_ptr,  # [B, gamma+1, V] logits (not EXACT: the race inside the chosen block)
    draft_ptr,  # [B, gamma] int64
    q_ptr,  # [B, gamma, V] float draft probs (HAS_Q) else any pointer
    race_f_ptr,  # [3, B, nsplit2] float32 (EXACT)
    race_i_ptr,  # [2, B, nsplit2] int32 (EXACT)
    mass_ptr,  # [2, B, NB] float32 (not EXACT)
    rowstat_ptr,  # [2, B] float32 (not EXACT)
    state_copy_ptr,  # [2] int64 (not EXACT): the step's philox state
    nacc_ptr,  # [B] int64
    tokens_ptr,  # [B, gamma+1] int64 out
    state_ptr,  # [2] int64 philox (seed, counter) (not EXACT): its counter is advanced
    inv_t,
    V,
    B,
    gamma,
    nsplit2,
    HAS_Q: tl.constexpr,
    EXACT: tl.constexpr,
    TWO_STAGE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    G_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
    NB_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    b, live = _batch_rows(B, ROWS)
    n = tl.load(nacc_ptr + b)
    if EXACT or not TWO_STAGE:
        plane = B * nsplit2
        sl = tl.arange(0, S_PAD)[None, :]
        sm = sl < nsplit2
        at = b[:, None] * nsplit2 + sl  # [ROWS, S_PAD]
        score_r = tl.load(race_f_ptr + at, mask=sm, other=-2.0)
        score_p = tl.load(race_f_ptr + plane + at, mask=sm, other=-2.0)
        res_max = tl.max(tl.load(race_f_ptr + 2 * plane + at, mask=sm, other=0.0), axis=1)
        win_r = tl.argmax(score_r, axis=1, tie_break_left=True)[:, None]
        win_p = tl.argmax(score_p, axis=1, tie_break_left=True)[:, None]
        tok_r = tl.sum(tl.where(sl == win_r, tl.load(race_i_ptr + at, mask=sm, other=0), 0), axis=1)
        tok_p = tl.sum(tl.where(sl == win_p, tl.load(race_i_ptr + plane + at, mask=sm, other=0), 0), axis=1)
        last = tl.where(res_max > 0.0, tok_r, tok_p)  # all-zero residual: draw from p
    else:
        # stage 2 of the philox draw: one uniform picks a block in proportion to its mass
        # (the p masses if the residual's are all zero), then the race runs in that block
        # only: P(token) = mass_k / total * w_token / mass_k
        seed = tl.load(state_copy_ptr)
        counter = tl.load(state_copy_ptr + 1)
        nb = tl.cdiv(V, BLOCK_V)
        kk = tl.arange(0, NB_PAD)[None, :]
        km = kk < nb
        mass_r = tl.load(mass_ptr + b[:, None] * nb + kk, mask=km, other=0.0)  # [ROWS, NB_PAD]
        mass_p = tl.load(mass_ptr + (B + b[:, None]) * nb + kk, mask=km, other=0.0)
        use_p = tl.sum(mass_r, axis=1) <= 0.0  # [ROWS]
        mass = tl.where(use_p[:, None], mass_p, mass_r)
        u, _r1, _r2, _r3 = _philox_uniform(seed, counter, _ACCEPT_STREAM + b * _ACCEPT_STRIDE + _ACCEPT_STRIDE - 1)
        target = u * tl.sum(mass, axis=1)
        # the first block whose running mass passes the target; rounding can leave the target
        # at or past the total, so never past the last block with mass
        k = tl.sum((tl.cumsum(mass, axis=1) <= target[:, None]).to(tl.int32), axis=1)
        k = tl.minimum(k, tl.max(tl.where(mass > 0.0, kk, 0), axis=1))
        g1 = gamma + 1
        m_n = tl.load(rowstat_ptr + b)[:, None]
        log_s_n = tl.load(rowstat_ptr + B + b)[:, None]
        tok_n = tl.load(draft_ptr + b * gamma + n, mask=n < gamma, other=-1)[:, None]
        q_end = tl.where(n < gamma, V, 0)[:, None]
        logits_row = logits_ptr + ((b * g1 + n) * V)[:, None]
        q_row = q_ptr + ((b * gamma + tl.minimum(n, gamma - 1)) * V)[:, None]
        QB: tl.constexpr = BLOCK_V // 4
        best_r, idx_r, best_p, idx_p, res_max = _race_block(
            logits_row, q_row, logits_row, seed, counter, (b * (nb * QB))[:, None], (k * BLOCK_V)[:, None], V, inv_t,
            tok_n, q_end, m_n, log_s_n, tl.full((ROWS, QB), -1.0, tl.float32), tl.zeros((ROWS, QB), tl.int32),
            tl.full((ROWS, QB), -1.0, tl.float32), tl.zeros((ROWS, QB), tl.int32), tl.zeros((ROWS, QB), tl.float32),
            HAS_Q, False, QB,
        )  # fmt: skip
        tok_r = _lowest_argmax(best_r, idx_r)[1]
        tok_p = _lowest_argmax(best_p, idx_p)[1]
        last = tl.where(use_p, tok_p, tok_r)
    _write_row(tokens_ptr, draft_ptr, b, live, n, last, gamma, G_PAD)
    if not EXACT:
        if tl.program_id(0) == 0:
            tl.store(state_ptr + 1, tl.load(state_ptr + 1) + 1)


@triton.jit(do_not_specialize=["blocks_per_split", "n_rows"])
def _argmax_partial_kernel(
    logits_ptr,  # [R, V] logits (raw, or top-p filtered float32)
    part_f_ptr,  # [R, S1] float32 out: slice max
    part_i_ptr,  # [R, S1] int32 out: its lowest token id
    V,
    blocks_per_split,
    n_rows,  # R
    BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr,
):
    row, live = _batch_rows(n_rows, ROWS)
    split = tl.program_id(1)
    nsplit = tl.num_programs(1)
    base = logits_ptr + row[:, None] * V  # [ROWS, 1]
    lo = split * blocks_per_split * BLOCK_V
    offs0 = tl.arange(0, BLOCK_V)[None, :]
    best = tl.full((ROWS, BLOCK_V), float("-inf"), tl.float32)
    # an all -inf slice points at its first token, as torch.argmax does
    idx = tl.broadcast_to(lo + offs0, (ROWS, BLOCK_V))
    for blk in range(blocks_per_split):
        offs = lo + blk * BLOCK_V + offs0
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        take = x > best  # strict, and each lane sees increasing ids: ties keep the lowest
        best = tl.where(take, x, best)
        idx = tl.where(take, offs, idx)
    best, idx = _lowest_argmax(best, idx)
    tl.store(part_f_ptr + row * nsplit + split, best, mask=live)
    tl.store(part_i_ptr + row * nsplit + split, idx, mask=live)


@triton.jit(do_not_specialize=["B", "gamma", "nsplit1"])
def _greedy_finalize_kernel(
    draft_ptr,  # [B, gamma] int64
    part_f_ptr,  # [B*(gamma+1), nsplit1] float32
    part_i_ptr,  # [B*(gamma+1), nsplit1] int32
    tokens_ptr,  # [B, gamma+1] int64 out
    nacc_ptr,  # [B] int64 out
    B,
    gamma,
    nsplit1,
    G_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    b, live = _batch_rows(B, ROWS)
    g1 = gamma + 1
    bf, jf, _live_f = _flat_rows(B, ROWS, G_PAD)  # [ROWS * G_PAD], as in _accept_race_kernel
    sl = tl.arange(0, S_PAD)
    msk = (jf[:, None] < g1) & (sl[None, :] < nsplit1)
    pidx = (bf * g1 + jf)[:, None] * nsplit1 + sl[None, :]
    val = tl.load(part_f_ptr + pidx, mask=msk, other=float("-inf"))
    ids = tl.load(part_i_ptr + pidx, mask=msk, other=0)
    # lowest slice among equal maxima = lowest token id (slices are in token order)
    win = tl.argmax(tl.where(msk, val, float("-inf")), axis=1, tie_break_left=True)
    best = tl.sum(tl.where(sl[None, :] == win[:, None], ids, 0), axis=1)  # [ROWS * G_PAD]
    tok = tl.load(draft_ptr + bf * gamma + jf, mask=jf < gamma, other=-1)
    accept = (tok == best.to(tl.int64)) | (jf >= gamma)
    n = tl.minimum(tl.min(tl.reshape(tl.where(accept, G_PAD, jf), (ROWS, G_PAD)), axis=1), gamma)  # [ROWS]
    j = tl.arange(0, G_PAD)[None, :]
    last = tl.sum(tl.where(j == n[:, None], tl.reshape(best, (ROWS, G_PAD)), 0), axis=1)
    tl.store(nacc_ptr + b, n.to(tl.int64), mask=live)
    _write_row(tokens_ptr, draft_ptr, b, live, n, last, gamma, G_PAD)


# --------------------------------------------------------------------------- host side
