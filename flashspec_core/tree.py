"""Tree speculative verification: the exact math of multi-draft verification, in plain torch.

Vocabulary (as in :mod:`flashspec_core.sampling`). A draft *tree* holds ``N`` *nodes*
(drafted tokens) in topological order; node ``n``'s parent is ``parents[n]``, or the
*root* (``-1``: the last committed token). The *children* of a node are the candidates
for the next position given the path to it, tried in index order (eldest first). A
chain is the width-1 tree ``parents = [-1, 0, 1, ...]``.

Verification walks down from the root. At the current node, with ``p_cur`` the
target's distribution there, each child ``x_i`` (drawn from ``q_i``) is *accepted* iff
``u_i q_i(x_i) < p_cur(x_i)`` (strict: a token with ``p_cur(x) = 0`` is never accepted,
even when ``u_i = 0``); on a rejection ``p_cur <- norm(max(p_cur - q_i, 0))`` and the
next sibling is tried. After an accept the walk descends with ``p_cur = p`` at the
accepted node. It stops at a node with no children left: the row emits the accepted
path's tokens and one more, drawn from ``p_cur``: the *recovered* token (from the
residual, after every child was rejected) or the *bonus* token (``p`` at a leaf).

What ``q_i`` is depends on how the siblings were drawn (:class:`TreeDraft`):

* with replacement (independent draws; SpecInfer's multi-step speculative sampling,
  Miao et al. 2024): ``q_i`` is node ``i``'s own row of ``q``;
* without replacement (Jeon et al. 2024, recursive rejection sampling): ``q_i`` is
  node ``i``'s row with its elder siblings' tokens removed, renormalised (a drafter may
  instead report those laws as the rows, as :func:`sample_children` does);
* deterministic (``q is None``, e.g. lookup branches, or a one-hot row of ``q``):
  ``q_i = delta(x_i)``, i.e. accept iff ``u_i < p_cur(x_i)``, and on a rejection
  ``p_cur`` loses ``x_i`` and is renormalised.

The proof that the emitted tokens have exactly the target's law is in
``docs/exactness-tree.md``. Randomness is an argument (:class:`~flashspec_core.sampling.Noise`
with one uniform per node and one Exp(1) vector per row), so the same noise gives the same
tokens from every implementation; for a chain the tokens are those of
:func:`~flashspec_core.sampling.verify_random` given the same noise.

The attention helpers at the end (:func:`tree_attention_mask`, :func:`tree_positions`,
:func:`accepted_cache_indices`) describe how a target scores a tree in one forward and
compacts its KV cache afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import torch

# How a model draft's tree_width picks a node's children on a sampling step: its top-k tokens
# (deterministic nodes), or draws without replacement from its q (sample_children). Defined
# beside the config keys, which are checked before torch loads.
from flashspec_core.config import TREE_CHILDREN as TREE_CHILDREN
from flashspec_core.contracts import Draft, Verdict
from flashspec_core.sampling import Noise, emit, race

ROOT = -1
# Keeps 0 / 0 out of renormalisations: an all-zero row stays all zero.
_TINY = torch.finfo(torch.float32).tiny

Parents = torch.Tensor | Sequence[int]


def _as_list(parents: Parents) -> list[int]:
    if isinstance(parents, torch.Tensor):
        return [int(a) for a in parents.tolist()]
    return [int(a) for a in parents]


def check_parents(parents: Parents) -> list[int]:
    """The parents as a list, or ValueError unless each is -1 (root) or an earlier node."""
    plist = _as_list(parents)
    for node, parent in enumerate(plist):
        if not ROOT <= parent < node:
            raise ValueError(
                f"parents[{node}] = {parent}: a node's parent must be -1 (the root) or an earlier "
                f"node (0..{node - 1}); nodes must be in topological order"
            )
    return plist


def node_depths(parents: Parents) -> tuple[int, ...]:
    """Depth of each node: 1 for the root's children."""
    depth: list[int] = []
    for parent in check_parents(parents):
        depth.append(1 if parent == ROOT else depth[parent] + 1)
    return tuple(depth)


def children(parents: Parents, node: int = ROOT) -> tuple[int, ...]:
    """The children of ``node`` (``-1``: the root), eldest first."""
    plist = check_parents(parents)
    if not ROOT <= node < len(plist):
        raise ValueError(f"node {node} is out of range for a tree of {len(plist)} nodes")
    return tuple(n for n, parent in enumerate(plist) if parent == node)


def path_to(parents: Parents, node: int) -> tuple[int, ...]:
    """The nodes from the root's child down to ``node`` (inclusive); ``()`` for the root."""
    plist = check_parents(parents)
    if not ROOT <= node < len(plist):
        raise ValueError(f"node {node} is out of range for a tree of {len(plist)} nodes")
    path = []
    while node != ROOT:
        path.append(node)
        node = plist[node]
    return tuple(reversed(path))


def elder_siblings(parents: Parents) -> tuple[tuple[int, ...], ...]:
    """For each node, its siblings with a smaller index (those tried before it)."""
    plist = check_parents(parents)
    return tuple(tuple(s for s in range(n) if plist[s] == plist[n]) for n in range(len(plist)))


def chain_parents(n: int) -> torch.Tensor:
    """The parents of a chain of ``n`` nodes: ``[-1, 0, 1, ..., n - 2]``, [n] int64."""
    return torch.arange(n, dtype=torch.int64) - 1


def tree_shape(widths: Sequence[int], gamma: int) -> list[int]:
    """The parents of the tree with ``widths[d]`` children per node at depth ``d + 1``, in
    level order, cut to ``gamma`` nodes (the draft models' ``tree_width`` option)."""
    parents: list[int] = []
    level = [ROOT]
    for width in widths:
        start = len(parents)
        parents += [p for p in level for _ in range(width)][: max(gamma - start, 0)]
        level = list(range(start, len(parents)))
        if not level:
            break
    return parents


def fan_depths(gamma: int, branches: int) -> tuple[int, ...]:
    """Chain lengths of the widest *fan* of ``gamma`` nodes: up to ``branches`` chains from the root.

    A fan is the shape of a deterministic tree draft (prompt lookup's and suffix decoding's
    ``branches``): one chain per alternative next token, best first. The chains after the
    first take ``gamma // chains`` nodes each and the first takes the rest, so the best
    alternative looks furthest ahead. :func:`fan_draft` proposes only the first ``j``
    chains of it (``j = 1 .. len(fan_depths(...))``): nested shapes, at most ``branches``
    of them, so a target that captures one CUDA graph per tree shape stops capturing after
    a few steps instead of meeting a new shape nearly every step.
    """
    if gamma <= 0:
        return ()
    chains = max(1, min(branches, gamma))
    rest = gamma // chains
    return (gamma - rest * (chains - 1),) + (rest,) * (chains - 1)


def fan_parents(depths: Sequence[int]) -> list[int]:
    """The parents of chains of ``depths[i]`` nodes from the root, chain after chain."""
    parents: list[int] = []
    for depth in depths:
        start = len(parents)
        parents += [ROOT] + list(range(start, start + depth - 1))
    return parents


def fan_draft(rows: Sequence[Sequence[Sequence[int]]], last: Sequence[int], depths: Sequence[int]) -> Draft:
    """The batch's deterministic draft in the smallest fan that holds every row's chains.

    ``rows[b]`` holds row ``b``'s chains, best first (chain ``i`` is cut to ``depths[i]``
    tokens, and chains past ``len(depths)`` are dropped); ``last[b]`` is its last token.
    The fan has as many chains as the row with the most. Every slot a row leaves empty
    repeats its parent's token (a missing chain repeats ``last[b]``): a real deterministic
    proposal, so ``q`` stays one-hot and the output law the target's. One chain is proposed
    as a chain (``parents`` None); no chain in any row is an empty draft (a plain step).
    """
    width = min(max((len(r) for r in rows), default=0), len(depths))
    if width == 0:
        return Draft(tokens=torch.empty((len(rows), 0), dtype=torch.long), probs=None)
    tokens = []
    for b, row in enumerate(rows):
        out: list[int] = []
        for i in range(width):
            chain = list(row[i][: depths[i]]) if i < len(row) else []
            chain = chain or [int(last[b])]
            out += chain + [chain[-1]] * (depths[i] - len(chain))
        tokens.append(out)
    parents = None if width == 1 else torch.tensor(fan_parents(depths[:width]), dtype=torch.long)
    return Draft(tokens=torch.tensor(tokens, dtype=torch.long), probs=None, parents=parents)


def without_replacement_rows(q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The law each sibling of a group drawn without replacement was drawn from.

    q: [..., V] the group's distribution, tokens: [..., w] int64 its siblings eldest first
    -> [..., w, V] float32: row ``i`` is ``q`` with ``tokens[..., :i]`` removed, renormalised
    (all zero where nothing is left). Reported as a draft's per-node ``q`` and verified
    with replacement, these rows are exactly what :func:`sibling_q` computes from ``q``
    without replacement, so a drafter needs no flag to say how its siblings were drawn.
    """
    left, rows = q.float(), []
    for i in range(tokens.shape[-1]):
        rows.append(left / left.sum(-1, keepdim=True).clamp_min(_TINY))
        left = left.scatter(-1, tokens[..., i : i + 1], 0.0)
    return torch.stack(rows, dim=-2)


def sample_children(
    q: torch.Tensor,  # [..., V] float32 the group's distribution given the path to its parent
    width: int,
    exponential: torch.Tensor,  # [..., V] Exp(1) noise, > 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw a sibling group of ``width`` tokens from ``q`` without replacement, and their laws.

    The exponential race's top ``width`` (``q / E`` in decreasing order; Gumbel-top-k in log
    space) is a sequential draw without replacement: the second-fastest of competing
    exponential clocks, given the fastest, is a race among the rest. Returns the tokens
    [..., width] int64 and each one's law given its elder siblings [..., width, V] float32
    (:func:`without_replacement_rows`). Where ``q`` has fewer than ``width`` tokens, each
    sibling past its support repeats the eldest's token with a one-hot law: a deterministic
    proposal given the elder siblings, which (D) of ``docs/exactness-tree.md`` allows and
    the verifier never accepts (the eldest's rejection leaves its token no target mass).
    """
    keys = q.float().log() - exponential.log()  # -inf exactly where q = 0, so those rank last
    top = torch.topk(keys, width, dim=-1)
    spent = torch.isneginf(top.values)  # [..., width] past q's support
    tokens = torch.where(spent, top.indices[..., :1], top.indices)
    rows = without_replacement_rows(q, tokens)
    one_hot = torch.nn.functional.one_hot(tokens, q.shape[-1]).float()
    return tokens, torch.where(spent[..., None], one_hot, rows)


def _check_tokens(instance: Any, attribute: attrs.Attribute[Any], tokens: torch.Tensor) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.int64:
        raise ValueError(f"TreeDraft.tokens must be [B, N] int64, got {tuple(tokens.shape)} {tokens.dtype}")


def _check_parent_tensor(instance: TreeDraft, attribute: attrs.Attribute[Any], parents: torch.Tensor) -> None:
    if parents.dim() != 1 or parents.dtype != torch.int64 or parents.device.type != "cpu":
        raise ValueError(
            f"TreeDraft.parents must be a [N] int64 CPU tensor (the step's tree shape), "
            f"got {tuple(parents.shape)} {parents.dtype} on {parents.device}"
        )
    if parents.shape[0] != instance.tokens.shape[1]:
        raise ValueError(f"TreeDraft.parents has {parents.shape[0]} nodes, tokens {tuple(instance.tokens.shape)}")
    check_parents(parents)


def _check_q(instance: TreeDraft, attribute: attrs.Attribute[Any], q: torch.Tensor | None) -> None:
    if q is None:
        return
    if q.dim() != 3 or q.shape[:2] != instance.tokens.shape or q.dtype != torch.float32:
        raise ValueError(
            f"TreeDraft.q must be [B, N, V] float32 with [B, N] = {tuple(instance.tokens.shape)}, "
            f"got {tuple(q.shape)} {q.dtype}"
        )


def _check_replacement(instance: TreeDraft, attribute: attrs.Attribute[Any], without: bool) -> None:
    if without and instance.q is None:
        raise ValueError("TreeDraft.without_replacement needs q: deterministic (q = None) siblings are not draws")


@attrs.frozen
class TreeDraft:
    """A draft tree per row, with one tree shape shared by the batch.

    ``q[b, n]`` is the distribution node ``n``'s sibling group was drawn from (given
    the path to its parent). With replacement each sibling is an independent draw
    from its own row (equal rows for i.i.d. siblings; a one-hot row makes that sibling
    deterministic). Without replacement every sibling carries the group's distribution
    before any removal, and sibling ``i`` was drawn from it with its elder siblings'
    tokens removed. ``q is None``: every node is deterministic (one-hot).
    """

    tokens: torch.Tensor = attrs.field(validator=_check_tokens)  # [B, N] int64
    parents: torch.Tensor = attrs.field(validator=_check_parent_tensor)  # [N] int64 CPU, -1: root's child
    q: torch.Tensor | None = attrs.field(default=None, validator=_check_q)  # [B, N, V] float32 or None
    without_replacement: bool = attrs.field(default=False, validator=_check_replacement)

    @classmethod
    def chain(cls, tokens: torch.Tensor, q: torch.Tensor | None = None) -> TreeDraft:
        """The width-1 tree of a chain draft: tokens [B, gamma] int64, q [B, gamma, V] or None."""
        return cls(tokens, chain_parents(tokens.shape[1]), q)

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def depths(self) -> tuple[int, ...]:
        return node_depths(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int = ROOT) -> tuple[int, ...]:
        return children(self.parents, node)

    def path_to(self, node: int) -> tuple[int, ...]:
        return path_to(self.parents, node)


@attrs.frozen
class TreeVerdict:
    """What tree verification decides, per row.

    Row ``b`` emits ``tokens[b, : num_accepted[b] + 1]``: the tokens of the accepted
    path followed by one recovered or bonus token; the rest of the row is ``-1``.
    """

    path: torch.Tensor  # [B, D] int64 accepted node at depth d + 1, -1 from num_accepted on
    num_accepted: torch.Tensor  # [B] int64 in [0, D]
    tokens: torch.Tensor  # [B, D + 1] int64, padded with -1
    # [B] int32 or int64 Broken bits a verifier found in its inputs on the device, as Verdict.flags
    flags: torch.Tensor | None = None

    def as_verdict(self) -> Verdict:
        """The chain :class:`~flashspec_core.contracts.Verdict` of the emitted tokens (and the flags)."""
        return Verdict(tokens=self.tokens, num_accepted=self.num_accepted, flags=self.flags)


def _check_inputs(p: torch.Tensor, draft: TreeDraft, noise: Noise | None) -> None:
    batch, n = draft.tokens.shape
    if p.dim() != 3 or p.shape[:2] != (batch, n + 1):
        raise ValueError(f"p must be [B, N + 1, V] with B, N = {batch}, {n}; got {tuple(p.shape)}")
    vocab = p.shape[2]
    if draft.q is not None and draft.q.shape[2] != vocab:
        raise ValueError(f"draft q has V = {draft.q.shape[2]}, p has V = {vocab}")
    if noise is not None and (noise.uniform.shape != (batch, n) or noise.exponential.shape != (batch, vocab)):
        raise ValueError(
            f"noise must be uniform [B, N] = {(batch, n)} and exponential [B, V] = {(batch, vocab)}; "
            f"got {tuple(noise.uniform.shape)} and {tuple(noise.exponential.shape)}"
        )


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))`` per row, or ``p`` where that is all zero (only rounding causes it).

    p, q: [..., V] float32 -> [..., V] float32.
    """
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(_TINY), p)


def sibling_q(draft: TreeDraft, node: int, elder: Sequence[int], vocab: int) -> torch.Tensor:
    """The distribution ``q_i`` node ``node`` was drawn from: [B, V] float32.

    One-hot for deterministic drafts; without replacement, the node's row with the
    ``elder`` siblings' tokens removed and renormalised (all zero if nothing is left).
    """
    if draft.q is None:
        return torch.nn.functional.one_hot(draft.tokens[:, node], vocab).float()
    q = draft.q[:, node].float()
    if not draft.without_replacement or not elder:
        return q
    q = q.scatter(1, draft.tokens[:, list(elder)], 0.0)
    return q / q.sum(-1, keepdim=True).clamp_min(_TINY)


def _gather(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, V], index [B] -> [B]."""
    return x.gather(1, index[:, None]).squeeze(1)


def emit_tree(tokens: torch.Tensor, path: torch.Tensor, last: torch.Tensor) -> TreeVerdict:
    """Assemble a TreeVerdict from node tokens [B, N], the accepted path [B, D] (-1 padded)
    and the recovered or bonus token [B] int64."""
    num_accepted = (path >= 0).sum(dim=1)
    path_tokens = tokens.gather(1, path.clamp_min(0))
    return TreeVerdict(path=path, num_accepted=num_accepted, tokens=emit(path_tokens, num_accepted, last).tokens)


def verify_tree_random(
    p: torch.Tensor,  # [B, N + 1, V] target probabilities at the root and at every node
    draft: TreeDraft,
    noise: Noise,  # uniform [B, N] (one per node), exponential [B, V]
) -> TreeVerdict:
    """Multi-draft recursive rejection sampling over the tree (see the module docstring)."""
    _check_inputs(p, draft, noise)
    batch, vocab = p.shape[0], p.shape[2]
    p = p.float()
    depths, elder = draft.depths, elder_siblings(draft.parents)
    cur = torch.full((batch,), ROOT, dtype=torch.int64, device=p.device)  # node whose children are tried
    p_cur = p[:, 0]  # [B, V]
    path = torch.full((batch, max(depths, default=0)), -1, dtype=torch.int64, device=p.device)
    for node, parent in enumerate(draft.parents.tolist()):
        x = draft.tokens[:, node]
        q_i = sibling_q(draft, node, elder[node], vocab)
        live = cur == parent
        accept = live & (noise.uniform[:, node] * _gather(q_i, x) < _gather(p_cur, x))
        reject = live & ~accept
        p_cur = torch.where(reject[:, None], residual(p_cur, q_i), p_cur)
        p_cur = torch.where(accept[:, None], p[:, node + 1], p_cur)
        cur = torch.where(accept, node, cur)
        path[:, depths[node] - 1] = torch.where(accept, node, path[:, depths[node] - 1])
    return emit_tree(draft.tokens, path, race(p_cur, noise.exponential))


def verify_tree_greedy(
    scores: torch.Tensor,  # [B, N + 1, V] target probabilities or filtered logits (only the argmax counts)
    draft: TreeDraft,
) -> TreeVerdict:
    """Temperature 0: descend to the eldest child equal to the target's argmax (lowest index on ties).

    This is the sampled rule's limit for a one-hot ``p``; the subtree of a younger
    sibling with the same token is not searched.
    """
    _check_inputs(scores, draft, None)
    batch = scores.shape[0]
    best = torch.argmax(scores, dim=-1)  # [B, N + 1]
    depths = draft.depths
    cur = torch.full((batch,), ROOT, dtype=torch.int64, device=scores.device)
    path = torch.full((batch, max(depths, default=0)), -1, dtype=torch.int64, device=scores.device)
    for node, parent in enumerate(draft.parents.tolist()):
        accept = (cur == parent) & (draft.tokens[:, node] == best[:, parent + 1])
        cur = torch.where(accept, node, cur)
        path[:, depths[node] - 1] = torch.where(accept, node, path[:, depths[node] - 1])
    return emit_tree(draft.tokens, path, _gather(best, cur + 1))


def verify_tree(
    p: torch.Tensor,  # [B, N + 1, V] target probabilities (sampling.probs_from_logits)
    draft: TreeDraft,
    noise: Noise | torch.Generator | None = None,
    *,
    greedy: bool = False,
) -> TreeVerdict:
    """Verify a draft tree: greedy for temperature 0, else multi-draft rejection sampling.

    ``noise`` is the step's :class:`~flashspec_core.sampling.Noise` (uniform [B, N],
    exponential [B, V]), or a generator (or None) to draw it from.
    """
    if greedy:
        return verify_tree_greedy(p, draft)
    if not isinstance(noise, Noise):
        noise = Noise.draw(p.shape[0], draft.num_nodes, p.shape[2], noise, p.device)
    return verify_tree_random(p, draft, noise)


def ancestor_matrix(parents: Parents, device: torch.device | str | None = None) -> torch.Tensor:
    """``a[i, j]``: node ``j`` is node ``i`` or one of its ancestors. [N, N] bool."""
    plist = check_parents(parents)
    anc = torch.eye(len(plist), dtype=torch.bool)
    for node, parent in enumerate(plist):
        if parent != ROOT:
            anc[node] |= anc[parent]
    return anc.to(device) if device is not None else anc


def tree_attention_mask(parents: Parents, prefix_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Which keys each node's query may see when a tree is scored in one forward.

    The keys are ``prefix_len`` cached positions (the root, the last committed token,
    is the last of them if it is in the cache) followed by the ``N`` nodes. A node sees
    the whole prefix, its ancestors and itself. [N, prefix_len + N] bool, True = attend.
    """
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    anc = ancestor_matrix(parents, device)
    prefix = torch.ones((anc.shape[0], prefix_len), dtype=torch.bool, device=anc.device)
    return torch.cat([prefix, anc], dim=1)


def tree_positions(parents: Parents, start: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids of the nodes: ``start + depth - 1`` ([N] int64), ``start`` being the
    position of the token after the root; a node sits where it would in its own chain."""
    depths = torch.tensor(node_depths(parents), dtype=torch.int64)
    return (start + depths - 1).to(device) if device is not None else start + depths - 1


def accepted_cache_indices(path: torch.Tensor, prefix_len: int = 0) -> torch.Tensor:
    """Cache slots to keep after verification, in order: ``prefix_len + path`` (-1 kept).

    path: [..., D] int64 accepted node indices (:attr:`TreeVerdict.path`), -1 padded.
    With the nodes cached at ``prefix_len + n``, gathering these slots into
    ``prefix_len .. prefix_len + num_accepted - 1`` leaves the cache a chain forward of
    the accepted tokens would have written (positions come from :func:`tree_positions`).
    """
    if path.dtype != torch.int64:
        raise ValueError(f"path must be int64, got {path.dtype}")
    return torch.where(path >= 0, path + prefix_len, -1)


MAX_MASK_NODES = 63  # nodes an ancestor bitmask holds (int64 bits, the sign bit unused)


def ancestor_bits(parents: Parents) -> list[int]:
    """Each node's row of :func:`ancestor_matrix` as an integer: bit ``j`` set iff node ``j``
    is the node or one of its ancestors (at most :data:`MAX_MASK_NODES` nodes), the form a
    kernel reads as one int64 per query."""
    plist = check_parents(parents)
    if len(plist) > MAX_MASK_NODES:
        raise ValueError(f"a tree of {len(plist)} nodes has no int64 ancestor bitmask (at most {MAX_MASK_NODES})")
    bits: list[int] = []
    for node, parent in enumerate(plist):
        bits.append((1 << node) | (bits[parent] if parent != ROOT else 0))
    return bits


@attrs.frozen
class TreeBlock:
    """A draft tree's block of cache slots in a forward: row ``b``'s nodes ``0 .. nodes - 1``
    sit at slots ``start[b] + j``; query ``(b, t)`` sees block slot ``start[b] + j`` iff bit ``j``
    of ``bits[b, t]`` is set (:func:`ancestor_bits`; 0 for a query that is
    no node), and below the block the slots up to its position."""

    start: torch.Tensor  # [B] int64, on the device
    bits: torch.Tensor  # [B, T] int64, on the device
    nodes: int  # <= MAX_MASK_NODES

    def check(self, batch: int, width: int) -> None:
        if (tuple(self.start.shape) != (batch,) or tuple(self.bits.shape) != (batch, width)
                or self.start.dtype != torch.int64 or self.bits.dtype != torch.int64
                or not 1 <= self.nodes <= MAX_MASK_NODES):
            raise ValueError(f"TreeBlock: start {tuple(self.start.shape)} {self.start.dtype} must be [B] = [{batch}], "
                             f"bits {tuple(self.bits.shape)} {self.bits.dtype} [B, T] = [{batch}, {width}], both "
                             f"int64; nodes {self.nodes} in 1..{MAX_MASK_NODES}")


def tree_causal_mask(
    pos: torch.Tensor,  # [B, T] int64 query positions
    span: int,
    start: torch.Tensor,  # [B] int64 first slot of each row's tree block
    bits: torch.Tensor,  # [B, T] int64 ancestor bits of each query over the block (0: not a node)
    nodes: int,
) -> torch.Tensor:
    """Which of ``span`` cache slots each query sees when a static-cache forward holds a tree
    block at slots ``start .. start + nodes - 1``: a slot below the block iff it is at most the
    query's position (the chain rule), a block slot ``start + j`` iff bit ``j`` of the query's
    ``bits`` is set (:func:`ancestor_bits`), nothing above the block. [B, T, span] bool.

    It is :func:`tree_attention_mask` with the nodes at their cache slots, in a form computed
    on the device from tensors a captured graph can be fed anew each step.
    """
    slots = torch.arange(span, device=pos.device)
    off = slots[None, :] - start[:, None]  # [B, span] offset into the block
    in_tree = (off >= 0) & (off < nodes)
    bit = (bits[:, :, None] >> off.clamp(0, MAX_MASK_NODES - 1)[:, None, :]) & 1  # [B, T, span]
    before = (slots[None, None, :] <= pos[:, :, None]) & (off < 0)[:, None, :]
    return torch.where(in_tree[:, None, :], bit != 0, before)


# Dynamic trees (EAGLE-2, Li et al. 2024): the draft grows a wide candidate tree level by
# level, expanding only its most likely frontier nodes, and the step keeps the candidates whose
# whole path the draft finds most likely. Every choice reads the draft's probabilities alone,
# so with deterministic (top-k) children the tree is a function of the context: the verifier's
# one-hot rule keeps the target's law under sampling as it does for a static top-k tree.


@attrs.frozen
class Feed:
    """One level's draft forward in :func:`grow_tree`: its expanded nodes, fed as a tree block
    whose slot ``first + j`` holds ``tokens[:, j]`` (the block's slots ``0 .. first - 1`` hold the
    earlier levels' expanded nodes)."""

    tokens: torch.Tensor  # [B, k] int64 the expanded nodes
    parents: torch.Tensor  # [k] int64 each node's parent's block slot, -1: a child of the root
    bits: torch.Tensor  # [k] int64 ancestor bits over the block, the node's own slot included
    depth: int  # the nodes' depth (1: the root's children)
    first: int  # the block slot of tokens[:, 0]


@attrs.frozen
class GrownTree:
    """A dynamic tree in parents-first order: ``tokens`` and ``parents`` as a :class:`TreeDraft`'s
    (``parents`` on the tokens' device), and where each node sits in the draft's fed block."""

    tokens: torch.Tensor  # [B, N] int64
    parents: torch.Tensor  # [N] int64, -1: a child of the root; each parent before its children
    fed: torch.Tensor  # [N] int64 the node's block slot (Feed.first + j), -1: never fed


def tree_candidates(expand: int, depth: int) -> int:
    """How many candidates :func:`grow_tree` scores: ``expand`` children of the root, then
    ``expand`` children of each of ``expand`` expanded nodes per further level."""
    return expand + (depth - 1) * expand * expand if depth > 0 else 0


def batch_scores(logp: torch.Tensor, parent: torch.Tensor | None = None) -> torch.Tensor:
    """One score per candidate for a batch sharing the tree shape: the log of its path
    probabilities' sum over rows (the expected number of rows that accept it, if the draft is
    right), cut to the parent's score so that rounding never ranks a child above its parent.

    logp: [B, C] each row's cumulative path log-probability; parent: [C] the parents' scores
    -> [C] float32."""
    score = torch.logsumexp(logp.float(), dim=0)
    return score if parent is None else torch.minimum(score, parent)


def best_first(score: torch.Tensor, count: int) -> torch.Tensor:
    """The indices of the ``count`` highest scores, ties to the lower index. [C] -> [count] int64.

    Candidates are scored in generation order (a parent before its children), so on a tie the
    parent ranks first: a kept node's ancestors are always kept."""
    return torch.sort(score, descending=True, stable=True).indices[:count]


def keep_best(score: torch.Tensor, parent: torch.Tensor, budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``budget`` best candidates, best first, and their parents as indices into that order.

    score: [M] float32 in generation order, no child above its parent; parent: [M] int64 each
    candidate's parent candidate (-1: the root). Returns the kept candidates [N] and the parents
    [N] int64 (-1: the root), each an earlier index: best first is parents first."""
    keep = best_first(score, budget)
    rank = torch.full_like(parent, -1).scatter(0, keep, torch.arange(keep.shape[0], device=keep.device))
    up = parent[keep]
    return keep, torch.where(up >= 0, rank[up.clamp_min(0)], up)


def grow_tree(
    root: torch.Tensor,  # [B, V] float32 the draft's log-probabilities after each row's last token
    feed: Callable[[Feed], torch.Tensor],  # a level's draft forward -> [B, k, V] log-probabilities
    expand: int,
    depth: int,
    budget: int,
) -> GrownTree:
    """A dynamic draft tree of ``min(budget, tree_candidates(expand, depth))`` nodes.

    Level 1 is the root's top ``expand`` tokens. Each further level feeds the previous level's
    ``expand`` best candidates (one draft forward of fixed width, :class:`Feed`) and proposes each
    one's top ``expand`` tokens. A candidate scores its path's cumulative log-probability
    (:func:`batch_scores` for a batch); the tree keeps the best ``budget`` candidates overall
    (:func:`keep_best`), so the node count, hence the verify forward's width, is fixed. Shapes
    and ops are fixed too: the whole growth can be one captured graph.
    """
    batch, dev = root.shape[0], root.device
    top = torch.topk(root.float(), expand, dim=-1)  # [B, k]
    tokens = [top.indices]
    parent = [torch.full((expand,), ROOT, dtype=torch.int64, device=dev)]  # candidate ids
    score = [batch_scores(top.values)]
    fed_cand, bits = [], torch.zeros(0, dtype=torch.int64, device=dev)  # fed candidates; bits per block slot
    level, first_cand, up_slot = top.values, 0, parent[0]  # the level's log-probs, first id, parents' slots
    for d in range(1, depth):
        pick = best_first(score[-1], expand)  # [k] into the level
        first = (d - 1) * expand
        slots = torch.arange(first, first + expand, device=dev)
        up = up_slot[pick]
        own = torch.ones_like(slots) << slots
        if d > 1:  # the level's parents were fed: the node sees their ancestors too
            own = own | bits[up]
        bits = torch.cat([bits, own])
        out = feed(Feed(tokens=tokens[-1][:, pick], parents=up, bits=own, depth=d, first=first))
        kids = torch.topk(out.float(), expand, dim=-1)  # [B, k, k]
        level = (level[:, pick, None] + kids.values).reshape(batch, -1)  # [B, k * k]
        cand = first_cand + pick  # [k] candidate ids of the fed nodes
        fed_cand.append(cand)
        parent.append(cand.repeat_interleave(expand))
        score.append(batch_scores(level, torch.cat(score)[parent[-1]]))
        tokens.append(kids.indices.reshape(batch, -1))
        first_cand += score[-2].shape[0]
        up_slot = slots.repeat_interleave(expand)
    keep, parents = keep_best(torch.cat(score), torch.cat(parent), budget)
    fed = torch.full((first_cand + score[-1].shape[0],), -1, dtype=torch.int64, device=dev)
    if fed_cand:
        fed = fed.scatter(0, torch.cat(fed_cand), torch.arange(len(fed_cand) * expand, device=dev))
    return GrownTree(tokens=torch.cat(tokens, dim=1)[:, keep], parents=parents, fed=fed[keep])
