"""The Triton programs of tree verification; the host launcher, the index tensors they read
and the walk's vocabulary are in :mod:`flashspec_kernels.verify_tree` (the math in
:mod:`flashspec_core.tree`). Both programs take ``ROWS`` rows per program as
``[ROWS, BLOCK_V]`` tiles, as the chain's programs do (:mod:`flashspec_kernels.verify`,
"Rows per program")."""

import triton
import triton.language as tl

from flashspec_core.contracts import Broken
from flashspec_kernels.verify_jit import _ACCEPT_STREAM, _batch_rows, _lowest_argmax, _philox_uniform

# Philox accept offsets per tree row: node n of row b draws offset _ACCEPT_STREAM + b * stride + n,
# so a tree of at most this many nodes gives every (row, node) its own uniform. 64 holds the most
# nodes a config's arm drafts (flashspec_core.config.MAX_GAMMA); the chain's rows keep 32 each.
_TREE_ACCEPT_STRIDE = tl.constexpr(64)

# Planted bugs for the mutation tests (flashspec_core.testing.tree_mutants); 0 in the product.
BUG_NONE = tl.constexpr(0)
BUG_SIBLING_RESIDUAL = tl.constexpr(1)  # only the youngest sibling's rejection updates the residual
BUG_ZERO_PROBABILITY = tl.constexpr(2)  # accept iff u * q(x) <= p(x)
# The Broken bits the kernels set in a row's flags
FLAG_IDS = tl.constexpr(int(Broken.DRAFT_TOKENS))
FLAG_LOGITS = tl.constexpr(int(Broken.TARGET_LOGITS))


@triton.jit
def _broken_lse(m, ls):
    """Whether a position's logits are not fine: NaN or ``+inf`` make ``ls`` (or ``m``) NaN or
    inf, all ``-inf`` makes ``m`` ``-inf``; a finite maximum gives ``log sum >= 0``, finite."""
    fine = (tl.abs(m) < float("inf")) & (tl.abs(ls) < float("inf"))
    return fine == 0


@triton.jit
def _fold_lse(part_ptr, n_rows, nsplit1, row, S_PAD: tl.constexpr):
    """(max, log sum) of the logits rows ``row`` ([ROWS]) from the pass's slice partials."""
    sl = tl.arange(0, S_PAD)[None, :]
    msk = sl < nsplit1
    at = row[:, None] * nsplit1 + sl
    pm = tl.load(part_ptr + at, mask=msk, other=float("-inf"))
    ps = tl.load(part_ptr + n_rows * nsplit1 + at, mask=msk, other=0.0)
    m = tl.max(pm, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.log(tl.sum(ps * tl.exp(pm - m_safe[:, None]), axis=1))


@triton.jit
def _fold_argmax(part_f_ptr, part_i_ptr, nsplit1, row, S_PAD: tl.constexpr):
    """The argmax (lowest id on ties) of the logits rows ``row`` ([ROWS]) from the slices'."""
    sl = tl.arange(0, S_PAD)[None, :]
    msk = sl < nsplit1
    at = row[:, None] * nsplit1 + sl
    val = tl.load(part_f_ptr + at, mask=msk, other=float("-inf"))
    ids = tl.load(part_i_ptr + at, mask=msk, other=0)
    win = tl.argmax(val, axis=1, tie_break_left=True)  # slices are in token order
    return tl.sum(tl.where(sl == win[:, None], ids, 0), axis=1).to(tl.int64)


@triton.jit
def _p_cur(logits_ptr, res_ptr, lrow, rrow, offs, vm, fresh, m, ls, d, inv_t):
    """``p_cur`` at ``offs``: p at the current node from its logits (``fresh`` rows), else
    the stored residual over its mass, divided here as the reference divides it."""
    x = tl.load(logits_ptr + lrow + offs, mask=vm & (fresh != 0), other=float("-inf")).to(tl.float32) * inv_t
    r = tl.load(res_ptr + rrow + offs, mask=vm & (fresh == 0), other=0.0)
    return tl.where(fresh != 0, tl.exp((x - m) - ls), r / d)


@triton.jit
def _elder_hit(draft_ptr, elder_ptr, b, n, offs, N, W):
    """Whether ``offs`` is an elder sibling's token of node ``n`` (``[ROWS, *]`` bool)."""
    hit = (offs < 0) & (b[:, None] < 0)  # all False, [ROWS, *]
    for k in range(W):
        e = tl.load(elder_ptr + n * W + k)
        tok_e = tl.load(draft_ptr + b * N + tl.maximum(e, 0))[:, None]
        hit = hit | ((offs == tok_e) & (e >= 0))
    return hit


@triton.jit
def _q_block(q_ptr, draft_ptr, elder_ptr, b, n, offs, vm, x_raw, q_sum, N, W, V,
             HAS_Q: tl.constexpr, WITHOUT: tl.constexpr):  # fmt: skip
    """``q_i`` at ``offs`` for node ``n``: one-hot, its row, or (without replacement) its
    row less the elder siblings' tokens over ``q_sum`` (1 where it has no elder)."""
    if HAS_Q:
        q = tl.load(q_ptr + (b * N + n)[:, None] * V + offs, mask=vm, other=0.0).to(tl.float32)
        if WITHOUT:
            hit = _elder_hit(draft_ptr, elder_ptr, b, n, offs, N, W)
            has_elder = q_sum[:, None] > 0.0
            q = tl.where(has_elder, tl.where(hit, 0.0, q) / tl.where(has_elder, q_sum[:, None], 1.0), q)
    else:
        q = tl.where(offs == x_raw[:, None], 1.0, 0.0)
    return q


@triton.jit
def _without_sum(q_ptr, draft_ptr, elder_ptr, b, n, V, N, W, ROWS: tl.constexpr, BLOCK_V: tl.constexpr):
    """The mass of node ``n``'s row less its elder siblings' tokens, clamped to the
    smallest normal float; 0 marks a node with no elder sibling (its row is used as is)."""
    acc = tl.zeros((ROWS, BLOCK_V), tl.float32)
    for blk in range(tl.cdiv(V, BLOCK_V)):
        offs = blk * BLOCK_V + tl.arange(0, BLOCK_V)[None, :]
        q = tl.load(q_ptr + (b * N + n)[:, None] * V + offs, mask=offs < V, other=0.0).to(tl.float32)
        acc += tl.where(_elder_hit(draft_ptr, elder_ptr, b, n, offs, N, W), 0.0, q)
    has_elder = tl.load(elder_ptr + n * W) >= 0
    return tl.where(has_elder, tl.maximum(tl.sum(acc, axis=1), 1.1754943508222875e-38), 0.0)


@triton.jit(do_not_specialize=["B", "N", "D", "W", "nsplit1"])
def _tree_walk_kernel(
    logits_ptr,  # [B, N+1, V] logits (the pass's tensor)
    draft_ptr,  # [B, N] int64 node tokens
    q_ptr,  # [B, N, V] float draft probs (HAS_Q) else any pointer
    u_ptr,  # [B, N] float32 uniforms (EXACT) else any pointer
    e_ptr,  # [B, V] float32 Exp(1) noise (EXACT) else any pointer
    state_ptr,  # [2] int64 philox (seed, counter) (not EXACT) else any pointer
    part_ptr,  # [2, B*(N+1), nsplit1] float32 from the logsumexp pass
    node_ptr,  # [3, N] int32: parent (-1: root), depth (1: root's child), 1 if youngest sibling
    elder_ptr,  # [N, W] int32: elder siblings, eldest first, -1 padded
    res_ptr,  # [2, B, V] float32 scratch: the residual rows (two, so a zero residual keeps the last)
    path_ptr,  # [B, D] int64 out: accepted node at depth d + 1, -1 padded
    nacc_ptr,  # [B] int64 out
    tokens_ptr,  # [B, D+1] int64 out
    flags_ptr,  # [B] int32 out: Broken bits (a node's token outside [0, V), logits not fine)
    inv_t,
    V,
    B,
    N,
    D,
    W,
    nsplit1,
    HAS_Q: tl.constexpr,
    EXACT: tl.constexpr,
    WITHOUT: tl.constexpr,
    BUG: tl.constexpr,
    BLOCK_V: tl.constexpr,
    S_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    b, live_b = _batch_rows(B, ROWS)  # [ROWS]; rows past B redo row B - 1, stores masked
    n_rows = B * (N + 1)
    offs0 = tl.arange(0, BLOCK_V)[None, :]
    col = tl.arange(0, D_PAD)[None, :]
    if EXACT:
        seed = 0
        counter = 0
    else:
        seed = tl.load(state_ptr)
        counter = tl.load(state_ptr + 1)
    cur = tl.full((ROWS,), -1, tl.int32)  # node whose children are tried
    fresh = tl.full((ROWS,), 1, tl.int32)  # 1: p_cur is p at node cur (else the residual buf / d)
    buf = tl.zeros((ROWS,), tl.int64)
    d = tl.full((ROWS,), 1.0, tl.float32)
    m, ls = _fold_lse(part_ptr, n_rows, nsplit1, b * (N + 1), S_PAD)
    path = tl.full((ROWS, D_PAD), -1, tl.int64)
    flags = tl.where(_broken_lse(m, ls), FLAG_LOGITS, 0)
    for n in range(N):
        parent = tl.load(node_ptr + n)
        depth = tl.load(node_ptr + N + n)
        live = (cur == parent) & live_b
        x_raw = tl.load(draft_ptr + b * N + n)
        bad = (x_raw < 0) | (x_raw >= V)
        flags = flags | tl.where(bad, FLAG_IDS, 0)
        x = tl.minimum(tl.maximum(x_raw, 0), V - 1)[:, None]  # clamped: every gather stays in the row
        lrow = ((b * (N + 1) + cur + 1) * V)[:, None]
        rrow = ((buf * B + b) * V)[:, None]
        p_x = tl.sum(_p_cur(logits_ptr, res_ptr, lrow, rrow, x, x >= 0, fresh[:, None], m[:, None], ls[:, None],
                            d[:, None], inv_t), axis=1)  # fmt: skip
        p_x = tl.where(bad, 0.0, p_x)
        q_sum = tl.zeros((ROWS,), tl.float32)
        if WITHOUT:
            q_sum = _without_sum(q_ptr, draft_ptr, elder_ptr, b, n, V, N, W, ROWS, BLOCK_V)
        q_x = tl.sum(_q_block(q_ptr, draft_ptr, elder_ptr, b, n, x, x >= 0, x_raw, q_sum, N, W, V, HAS_Q, WITHOUT),
                     axis=1)  # fmt: skip
        if EXACT:
            u = tl.load(u_ptr + b * N + n)
        else:
            u, _r1, _r2, _r3 = _philox_uniform(seed, counter, _ACCEPT_STREAM + b * _TREE_ACCEPT_STRIDE + n)
        if BUG == BUG_ZERO_PROBABILITY:
            accept = live & (u * q_x <= p_x)
        else:
            accept = live & (u * q_x < p_x)
        reject = live & (accept == 0)
        if BUG == BUG_SIBLING_RESIDUAL:
            reject = reject & ((tl.load(node_ptr + 2 * N + n) + tl.zeros((ROWS,), tl.int32)) != 0)  # [ROWS] bool
        if tl.sum(reject.to(tl.int32), axis=0) > 0:
            # p_cur <- norm(max(p_cur - q_i, 0)) into the other buffer; its mass divides later
            nrow = (((1 - buf) * B + b) * V)[:, None]
            acc = tl.zeros((ROWS, BLOCK_V), tl.float32)
            for blk in range(tl.cdiv(V, BLOCK_V)):
                offs = blk * BLOCK_V + offs0
                vm = offs < V
                pc = _p_cur(logits_ptr, res_ptr, lrow, rrow, offs, vm, fresh[:, None], m[:, None], ls[:, None], d[:, None],
                            inv_t)  # fmt: skip
                qb = _q_block(q_ptr, draft_ptr, elder_ptr, b, n, offs, vm, x_raw, q_sum, N, W, V, HAS_Q, WITHOUT)
                r = tl.where(vm, tl.maximum(pc - qb, 0.0), 0.0)
                tl.store(res_ptr + nrow + offs, r, mask=vm & reject[:, None])
                acc += r
            tl.debug_barrier()  # the next gather may read a lane another thread wrote
            mass = tl.sum(acc, axis=1)
            moved = reject & (mass > 0.0)  # an all-zero residual (rounding only) keeps p_cur
            buf = tl.where(moved, 1 - buf, buf)
            d = tl.where(moved, mass, d)
            fresh = tl.where(moved, 0, fresh)
        # after an accept p_cur is p at the node
        m_n, ls_n = _fold_lse(part_ptr, n_rows, nsplit1, b * (N + 1) + n + 1, S_PAD)
        flags = flags | tl.where(_broken_lse(m_n, ls_n), FLAG_LOGITS, 0)  # every node's row, live or not
        m = tl.where(accept, m_n, m)
        ls = tl.where(accept, ls_n, ls)
        d = tl.where(accept, 1.0, d)
        fresh = tl.where(accept, 1, fresh)
        cur = tl.where(accept, n, cur)
        path = tl.where(accept[:, None] & (col == depth - 1), n, path)
    # the recovered / bonus token: the race argmax p_cur / E over the row
    lrow = ((b * (N + 1) + cur + 1) * V)[:, None]
    rrow = ((buf * B + b) * V)[:, None]
    best = tl.full((ROWS, BLOCK_V), -1.0, tl.float32)
    idx = tl.zeros((ROWS, BLOCK_V), tl.int32)
    for blk in range(tl.cdiv(V, BLOCK_V)):
        offs = blk * BLOCK_V + offs0
        vm = offs < V
        w = _p_cur(logits_ptr, res_ptr, lrow, rrow, offs, vm, fresh[:, None], m[:, None], ls[:, None], d[:, None], inv_t)
        if EXACT:
            e = tl.load(e_ptr + b[:, None] * V + offs, mask=vm, other=1.0)
            score = tl.math.div_rn(w, e)  # IEEE division, as torch's weights / exponential
        else:
            r0, _r1, _r2, _r3 = tl.randint4x(seed, (counter << 32) | (b[:, None] * V + offs))
            score = w * (1.0 / -tl.log(tl.uint_to_uniform_float(r0)))
        take = score > best  # strict: each lane sees increasing ids, so ties keep the lowest
        best = tl.where(take, score, best)
        idx = tl.where(take, offs, idx)
    last = _lowest_argmax(best, idx)[1].to(tl.int64)
    _write_tree(draft_ptr, path_ptr, nacc_ptr, tokens_ptr, flags_ptr, b, live_b, path, last, flags, N, D, D_PAD)


@triton.jit
def _write_tree(draft_ptr, path_ptr, nacc_ptr, tokens_ptr, flags_ptr, b, live_b, path, last, flags, N, D,
                D_PAD: tl.constexpr):  # fmt: skip
    """Store the path ``[ROWS, D_PAD]``, its length, the emitted tokens and the flags."""
    col = tl.arange(0, D_PAD)[None, :]
    nacc = tl.sum((path >= 0).to(tl.int64), axis=1)
    path_tok = tl.load(draft_ptr + b[:, None] * N + tl.maximum(path, 0), mask=path >= 0, other=-1)
    row = tl.where(col == nacc[:, None], last[:, None], path_tok)
    tl.store(path_ptr + b[:, None] * D + col, path, mask=live_b[:, None] & (col < D))
    tl.store(tokens_ptr + b[:, None] * (D + 1) + col, row, mask=live_b[:, None] & (col <= D))
    tl.store(nacc_ptr + b, nacc, mask=live_b)
    tl.store(flags_ptr + b, flags.to(tl.int32), mask=live_b)


@triton.jit(do_not_specialize=["B", "N", "D", "nsplit1"])
def _tree_greedy_kernel(
    draft_ptr,  # [B, N] int64
    part_f_ptr,  # [B*(N+1), nsplit1] float32 slice maxima
    part_i_ptr,  # [B*(N+1), nsplit1] int32 their token ids
    node_ptr,  # [3, N] int32 (as _tree_walk_kernel)
    path_ptr,  # [B, D] int64 out
    nacc_ptr,  # [B] int64 out
    tokens_ptr,  # [B, D+1] int64 out
    flags_ptr,  # [B] int32 out: Broken bits (ids only; the launcher adds the logits')
    V,
    B,
    N,
    D,
    nsplit1,
    S_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    ROWS: tl.constexpr,
):
    """Descend to the eldest child equal to the target's argmax at the current node."""
    b, live_b = _batch_rows(B, ROWS)
    col = tl.arange(0, D_PAD)[None, :]
    cur = tl.full((ROWS,), -1, tl.int32)
    best = _fold_argmax(part_f_ptr, part_i_ptr, nsplit1, b * (N + 1), S_PAD)
    path = tl.full((ROWS, D_PAD), -1, tl.int64)
    flags = tl.zeros((ROWS,), tl.int32)
    for n in range(N):
        parent = tl.load(node_ptr + n)
        depth = tl.load(node_ptr + N + n)
        x = tl.load(draft_ptr + b * N + n)
        flags = flags | tl.where((x < 0) | (x >= V), FLAG_IDS, 0)
        accept = (cur == parent) & (x == best)
        best = tl.where(accept, _fold_argmax(part_f_ptr, part_i_ptr, nsplit1, b * (N + 1) + n + 1, S_PAD), best)
        cur = tl.where(accept, n, cur)
        path = tl.where(accept[:, None] & (col == depth - 1), n, path)
    _write_tree(draft_ptr, path_ptr, nacc_ptr, tokens_ptr, flags_ptr, b, live_b, path, best, flags, N, D, D_PAD)
