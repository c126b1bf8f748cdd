"""Tree verification in Triton: the launcher of :mod:`flashspec_kernels.verify_tree_jit`.

The math and its vocabulary (nodes, parents, siblings tried eldest first, ``p_cur``, the
residual after a rejected sibling, recovered and bonus tokens, the three ways a sibling
group is drawn) are :mod:`flashspec_core.tree`'s; :func:`verify_tree_ref` calls it, and the
kernels emit its tokens given the same :class:`~flashspec_core.sampling.Noise` (exact mode).

Kernels (random mode), ``R = B * (N + 1)`` rows of ``V`` logits:

1. the chain's ``_lse_partial_kernel`` (:mod:`flashspec_kernels.verify`): one pass over
   every row, the per-slice (max, sum exp) of ``x / temperature``; ``p`` at a node is then
   ``exp((x / T - max) - log sum)`` wherever it is read, never stored;
2. ``_tree_walk_kernel``, grid ``(cdiv(B, ROWS),)``: each program walks its rows' trees
   node by node in index order (topological, so siblings come eldest first). A live node
   (its parent is the current node) gathers ``p_cur(x)`` and ``q_i(x)`` and runs the accept
   test ``u q_i(x) < p_cur(x)``. A rejection writes ``max(p_cur - q_i, 0)`` to a ``[B, V]``
   scratch row and keeps its mass, which divides it wherever it is read (so ``p_cur`` is the
   reference's ``r / mass`` to the bit); there are two scratch rows per batch row so that an
   all-zero residual leaves ``p_cur`` as it was. An accept makes ``p_cur`` the node's ``p``.
   At the end one race ``argmax p_cur / E`` draws the recovered or bonus token.

Without replacement, ``q_i`` is the node's row less its elder siblings' tokens over that
row's mass (one extra pass over ``q``'s row per node that has an elder sibling).

Greedy: the chain's ``_argmax_partial_kernel`` over the ``R`` rows, then
``_tree_greedy_kernel`` descends to the eldest child equal to the argmax.

The tree's shape is known on the host: :func:`tree_tables` derives from ``parents`` the
``[3, N]`` node table (parent, depth, youngest-sibling flag) and the ``[N, W]`` elder-sibling
table, and the kernels read the shape only from them, as device data. So a step launches with
static shapes and reads nothing back (CUDA-graph capturable), and one captured graph serves
every tree of ``N`` nodes when its tables are graph inputs and its outputs are sized by a bound
on the depth (:func:`verify_tree_tables`; the ``triton`` verifier passes ``N``): a dynamic
tree, whose shape changes from step to step at a fixed node count, replays one graph. Philox
mode draws the uniforms and the race's exponentials from the ``(seed, counter)`` state as the
chain does, and advances the counter with one device add after the walk. Each row owns
``MAX_NODES`` offsets of the accept stream (row ``b``'s node ``n`` draws offset
``b * MAX_NODES + n``), so every node draws its own uniform; hence a tree has at most
``MAX_NODES`` (64) nodes, the most an arm drafts (``flashspec_core.config.MAX_GAMMA``).
:func:`check_inputs` holds greedy and exact mode to it too, so the verifier's limit
(:class:`~flashspec_core.contracts.LimitsTreeNodes`) does not depend on its noise.

Flags. Each row gets :class:`~flashspec_core.contracts.Broken` bits in
:attr:`TreeVerdict.flags <flashspec_core.tree.TreeVerdict.flags>` (``[B]`` int32, on the
device; the pipeline reads them with its one copy, as ``Verdict.flags``). Draft token ids
outside ``[0, V)`` (e.g. ``-1`` padding) are never gathered: the kernels clamp the index,
treat such a node as having ``p_cur(x) = 0`` (never accepted) and set ``DRAFT_TOKENS``.
``TARGET_LOGITS`` marks a position (root or node, on the path or not) whose logits hold a
NaN or ``+inf`` or are all ``-inf``: in random mode the walk reads it off the pass's
``(max, log sum)`` at no extra cost; the greedy pass's argmax skips NaN, so greedy mode
takes one ``amax`` over the logits for it. A flagged row's tokens are meaningless.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import torch
import triton

from flashspec_core.contracts import Broken, SamplingParams
from flashspec_core.cudagraph import to_device
from flashspec_core.sampling import Noise, filter_logits, probs_from_logits
from flashspec_core.tree import (
    TreeDraft,
    TreeVerdict,
    check_parents,
    elder_siblings,
    node_depths,
    verify_tree_greedy,
    verify_tree_random,
)
from flashspec_kernels import verify as chain
from flashspec_kernels.verify_jit import _argmax_partial_kernel, _lse_partial_kernel
from flashspec_kernels.verify_tree_jit import (
    _TREE_ACCEPT_STRIDE,
    BUG_SIBLING_RESIDUAL,
    BUG_ZERO_PROBABILITY,
    _tree_greedy_kernel,
    _tree_walk_kernel,
)

MAX_NODES = int(_TREE_ACCEPT_STRIDE)  # philox accept offsets per row: one uniform per node (module doc)
# Planted bugs the mutation tests switch on (flashspec_core.testing.tree_mutants); None in use.
Bug = Literal["sibling_residual_not_updated", "zero_probability_accepted"]
_BUGS = {None: 0, "sibling_residual_not_updated": BUG_SIBLING_RESIDUAL.value,
         "zero_probability_accepted": BUG_ZERO_PROBABILITY.value}  # fmt: skip


def tree_tables(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk's tables for a tree shape, on the host: the node table ``[3, N]`` int32 (parent,
    depth, 1 if the youngest of its siblings; ``[3, 1]`` of zeros, never read, for ``N = 0``) and
    the elder-sibling table ``[N, W]`` int32 (eldest first, -1 padded, ``W >= 1``)."""
    depths, elder = node_depths(parents), elder_siblings(parents)
    youngest = [int(all(parents[m] != p for m in range(n + 1, len(parents)))) for n, p in enumerate(parents)]
    width = max([1, *(len(e) for e in elder)])
    table = [list(e) + [-1] * (width - len(e)) for e in elder] or [[-1]]
    nodes = torch.tensor([list(parents), list(depths), youngest], dtype=torch.int32).reshape(3, len(parents))
    nodes = nodes if len(parents) else torch.zeros((3, 1), dtype=torch.int32)  # never read; no null pointer
    return nodes, torch.tensor(table, dtype=torch.int32)


@functools.lru_cache(maxsize=64)
def tree_index(parents: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_tables` on ``device``, once per shape and device (cached: a static tree's
    steps copy nothing)."""
    nodes, elder = tree_tables(parents)
    return to_device(nodes, device), to_device(elder, device)


def parents_tuple(parents: torch.Tensor | Sequence[int]) -> tuple[int, ...]:
    """The tree shape as a tuple (a cache and graph key), checked (:func:`check_parents`)."""
    if isinstance(parents, torch.Tensor) and (parents.dim() != 1 or parents.device.type != "cpu"):
        raise ValueError(f"parents must be a [N] CPU tensor, got {tuple(parents.shape)} on {parents.device}")
    return tuple(check_parents(parents))


def check_inputs(logits: torch.Tensor, tokens: torch.Tensor, given: int, probs: torch.Tensor | None) -> None:
    """Shapes and dtypes, each error naming the argument and what it got; ``given``: the node
    count of the tree's ``parents``."""
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be [B, N] int64, got {tuple(tokens.shape)} {tokens.dtype}")
    batch, nodes = tokens.shape
    if given != nodes:
        raise ValueError(f"parents has {given} nodes, draft_tokens {tuple(tokens.shape)} has {nodes}")
    if nodes > MAX_NODES:
        raise ValueError(f"a tree has at most {MAX_NODES} nodes, draft_tokens {tuple(tokens.shape)} has {nodes}")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (batch, nodes + 1) or not logits.dtype.is_floating_point:
        raise ValueError(
            f"target_logits must be [B, N + 1, V] float with B, N = {batch}, {nodes}; "
            f"got {tuple(logits.shape)} {logits.dtype}"
        )
    if probs is not None and (tuple(probs.shape) != (batch, nodes, logits.shape[2]) or not probs.dtype.is_floating_point):
        raise ValueError(
            f"draft_probs must be [B, N, V] float = {(batch, nodes, logits.shape[2])}, "
            f"got {tuple(probs.shape)} {probs.dtype}"
        )
    devices = {t.device for t in (logits, tokens, probs) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"target_logits, draft_tokens and draft_probs must share a device, got {devices}")


def _check_noise(noise: Noise, batch: int, nodes: int, vocab: int) -> None:
    if tuple(noise.uniform.shape) != (batch, nodes) or tuple(noise.exponential.shape) != (batch, vocab):
        raise ValueError(
            f"noise must be uniform [B, N] = {(batch, nodes)} and exponential [B, V] = {(batch, vocab)}; "
            f"got {tuple(noise.uniform.shape)} and {tuple(noise.exponential.shape)}"
        )
    if noise.uniform.dtype != torch.float32 or noise.exponential.dtype != torch.float32:
        raise ValueError(f"noise must be float32, got {noise.uniform.dtype} and {noise.exponential.dtype}")


def verify_tree_triton(
    target_logits: torch.Tensor,  # [B, N+1, V] float (float64 read as float32): the root, then each node
    draft_tokens: torch.Tensor,  # [B, N] int64 node tokens
    parents: torch.Tensor | Sequence[int],  # [N] int64 CPU, -1 = a child of the root
    draft_probs: torch.Tensor | None,  # [B, N, V] float or None (every node deterministic)
    sampling: SamplingParams,
    *,
    noise: Noise | None = None,
    state: torch.Tensor | None = None,  # [2] int64 (seed, counter), counter advanced on the device
    without_replacement: bool = False,
    flags: torch.Tensor | None = None,  # [B] int32 out (else allocated): Broken bits, module doc "Flags"
    programs: int | None = None,
    bug: Bug | None = None,
) -> TreeVerdict:
    """Verify a draft tree on the device (module doc). Random mode needs exactly one of
    ``noise`` (exact: the reference's tokens) and ``state`` (philox); greedy neither.
    ``without_replacement``: each sibling was drawn from its row less its elder siblings'
    tokens (:class:`flashspec_core.tree.TreeDraft`); it needs ``draft_probs``."""
    plist = parents_tuple(parents)
    check_inputs(target_logits, draft_tokens, len(plist), draft_probs)
    node_table, elder = tree_index(plist, target_logits.device)
    return verify_tree_tables(
        target_logits, draft_tokens, node_table, elder, max(node_depths(plist), default=0), draft_probs, sampling,
        noise=noise, state=state, without_replacement=without_replacement, flags=flags, programs=programs, bug=bug,
    )  # fmt: skip


def _check_tables(nodes: int, node_table: torch.Tensor, elder: torch.Tensor | None, depth: int, dev: torch.device
                  ) -> None:
    rows = max(nodes, 1)
    if tuple(node_table.shape) != (3, rows) or node_table.dtype != torch.int32 or node_table.device != dev:
        raise ValueError(f"node_table must be [3, N] int32 on {dev} with N = {nodes} (1 for no node), got "
                         f"{tuple(node_table.shape)} {node_table.dtype} on {node_table.device}")  # fmt: skip
    if elder is not None and (elder.dim() != 2 or elder.shape[0] != rows or elder.dtype != torch.int32
                              or elder.device != dev):
        raise ValueError(f"elder must be [N, W] int32 on {dev} with N = {nodes} (1 for no node), got "
                         f"{tuple(elder.shape)} {elder.dtype} on {elder.device}")  # fmt: skip
    if not (0 if nodes == 0 else 1) <= depth <= nodes:
        raise ValueError(f"depth {depth} must bound the depth of a tree of {nodes} nodes: 1..{nodes}, 0 for none")


def verify_tree_tables(
    target_logits: torch.Tensor,  # [B, N+1, V] float (float64 read as float32): the root, then each node
    draft_tokens: torch.Tensor,  # [B, N] int64 node tokens
    node_table: torch.Tensor,  # [3, N] int32 on the device (tree_tables): the tree's shape, as data
    elder: torch.Tensor | None,  # [N, W] int32 on the device (tree_tables); only without replacement reads it
    depth: int,  # the outputs' depth D: at least the tree's depth, at most N
    draft_probs: torch.Tensor | None,  # [B, N, V] float or None (every node deterministic)
    sampling: SamplingParams,
    *,
    noise: Noise | None = None,
    state: torch.Tensor | None = None,  # [2] int64 (seed, counter), counter advanced on the device
    without_replacement: bool = False,
    flags: torch.Tensor | None = None,  # [B] int32 out (else allocated): Broken bits, module doc "Flags"
    programs: int | None = None,
    bug: Bug | None = None,
) -> TreeVerdict:
    """:func:`verify_tree_triton` with the tree's shape as device tables: nothing launched
    depends on the shape beyond ``N``, ``W`` and ``depth``, so a graph captured here replays for
    any tree of ``N`` nodes, its tables copied into the captured ones. The verdict's ``path``
    is ``[B, depth]`` and ``tokens`` ``[B, depth + 1]``: the tree's depth's verdict, -1 padded
    (slice them to it). A ``depth`` below the tree's would drop deeper accepts: the caller
    guarantees it (``N`` always does)."""
    batch, nodes = draft_tokens.shape
    vocab, dev = target_logits.shape[2], target_logits.device
    check_inputs(target_logits, draft_tokens, nodes, draft_probs)
    _check_tables(nodes, node_table, elder, depth, dev)
    target_logits = chain.readable(target_logits)
    if without_replacement and draft_probs is None:
        raise ValueError("without_replacement needs draft_probs: deterministic (None) siblings are not draws")
    if without_replacement and elder is None:
        raise ValueError("without_replacement needs the elder-sibling table (tree_tables)")
    elder = node_table if elder is None else elder  # never read then: any [N, W] int32 pointer
    if flags is not None and (tuple(flags.shape) != (draft_tokens.shape[0],) or flags.dtype != torch.int32):
        raise ValueError(f"flags must be [B] int32 with B = {draft_tokens.shape[0]}, got "
                         f"{tuple(flags.shape)} {flags.dtype}")  # fmt: skip
    if bug not in _BUGS:
        raise ValueError(f"bug must be one of {sorted(b for b in _BUGS if b)} or None, got {bug!r}")
    tokens = draft_tokens.contiguous() if nodes else torch.zeros((batch, 1), dtype=torch.int64, device=dev)
    path = torch.empty((batch, max(depth, 1)), dtype=torch.int64, device=dev)
    out = torch.empty((batch, depth + 1), dtype=torch.int64, device=dev)
    nacc = torch.empty((batch,), dtype=torch.int64, device=dev)
    flags = flags if flags is not None else torch.empty((batch,), dtype=torch.int32, device=dev)
    d_pad = triton.next_power_of_2(depth + 1)
    rows = batch * (nodes + 1)
    wanted = programs or chain._programs_wanted(dev)
    if sampling.greedy:
        logits = filter_logits(target_logits, sampling) if sampling.top_p < 1.0 else target_logits.contiguous()
        block, warps = chain.ARGMAX_CONFIG[logits.element_size()]
        block = chain._blocks(dev, vocab, block)[0]
        nsplit1, per1 = chain._split(rows, vocab, block, wanted)
        s_pad = chain._pads(dev, 0, nsplit1)[1]
        part_f = torch.empty((rows * nsplit1,), dtype=torch.float32, device=dev)
        part_i = torch.empty((rows * nsplit1,), dtype=torch.int32, device=dev)
        rpp = chain._rows_per_program(dev, rows, block)
        _argmax_partial_kernel[(triton.cdiv(rows, rpp), nsplit1)](
            logits, part_f, part_i, vocab, per1, rows, BLOCK_V=block, ROWS=rpp, num_warps=warps
        )
        rpp = chain._rows_per_program(dev, batch, s_pad * d_pad)
        _tree_greedy_kernel[(triton.cdiv(batch, rpp),)](
            tokens, part_f, part_i, node_table, path, nacc, out, flags, vocab, batch, nodes, depth, nsplit1,
            S_PAD=s_pad, D_PAD=d_pad, ROWS=rpp, num_warps=4,
        )  # fmt: skip
        broken = ~torch.isfinite(target_logits.amax(dim=-1)).all(dim=1)  # [B]; amax propagates NaN
        flags.bitwise_or_(broken.int() * int(Broken.TARGET_LOGITS))
        return TreeVerdict(path=path[:, :depth], num_accepted=nacc, tokens=out, flags=flags)
    if (noise is None) == (state is None):
        raise ValueError("random mode needs exactly one of noise (exact) or state (philox)")
    logits, inv_t = chain._prepare(target_logits, sampling)
    exact = noise is not None
    if noise is not None:
        _check_noise(noise, batch, nodes, vocab)
        uniform, expo, state = (noise.uniform.contiguous() if nodes else out), noise.exponential.contiguous(), out
    else:
        if batch * max(vocab, MAX_NODES) >= 1 << 31:  # the race's and the accept stream's offsets
            raise ValueError(f"philox mode needs B * V < 2**31 and B * {MAX_NODES} < 2**31, got {batch} * {vocab}")
        uniform = expo = out  # unused pointers
    q = draft_probs.contiguous() if draft_probs is not None else out
    block, warps = chain.PASS_CONFIG[logits.element_size()]
    block, race_block = chain._blocks(dev, vocab, block)
    nsplit1, per1 = chain._split(rows, vocab, block, wanted)
    s_pad = chain._pads(dev, 0, nsplit1)[1]
    part = torch.empty((2 * rows * nsplit1,), dtype=torch.float32, device=dev)
    rpp = chain._rows_per_program(dev, rows, block)
    tile = chain.PASS_TILE[logits.element_size()] if rpp == 1 else 0
    _lse_partial_kernel[(triton.cdiv(rows, rpp), nsplit1)](
        logits, part, inv_t, vocab, per1, BLOCK_V=block, ROWS=rpp, n_rows=rows, TILE=tile, num_warps=warps,
    )  # fmt: skip
    scratch = torch.empty((2 * batch * vocab,), dtype=torch.float32, device=dev)
    walk_block = min(race_block, chain.RACE_BLOCK_V // 4)
    rpp = chain._rows_per_program(dev, batch, max(walk_block, s_pad, d_pad))
    _tree_walk_kernel[(triton.cdiv(batch, rpp),)](
        logits, tokens, q, uniform, expo, state, part, node_table, elder, scratch, path, nacc, out, flags,
        inv_t, vocab, batch, nodes, depth, elder.shape[1], nsplit1,
        HAS_Q=draft_probs is not None, EXACT=exact, WITHOUT=without_replacement, BUG=_BUGS[bug],
        BLOCK_V=walk_block, S_PAD=s_pad, D_PAD=d_pad, ROWS=rpp, num_warps=4,
    )  # fmt: skip
    if state is not None and not exact:
        state[1:].add_(1)  # after the walk read it: fresh noise next call, no host sync
    return TreeVerdict(path=path[:, :depth], num_accepted=nacc, tokens=out, flags=flags)


def verify_tree_ref(
    target_logits: torch.Tensor,  # [B, N+1, V]
    draft_tokens: torch.Tensor,  # [B, N] int64
    parents: torch.Tensor | Sequence[int],  # [N] int64 CPU
    draft_probs: torch.Tensor | None,  # [B, N, V] or None
    sampling: SamplingParams,
    noise: Noise | None = None,
    without_replacement: bool = False,
) -> TreeVerdict:
    """The plain-torch reference the kernels must match token for token."""
    plist = torch.tensor(parents_tuple(parents), dtype=torch.int64)
    q = None if draft_probs is None else draft_probs.float()
    tree = TreeDraft(draft_tokens, plist, q, without_replacement)
    if sampling.greedy:
        return verify_tree_greedy(filter_logits(target_logits, sampling), tree)
    if noise is None:
        raise ValueError("random mode needs noise")
    return verify_tree_random(probs_from_logits(target_logits, sampling), tree, noise)
