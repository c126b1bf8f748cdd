"""A bounded-depth suffix tree with occurrence counts, over many token sequences at once.

The corpus of SuffixDecoding (Oliaro et al. 2024, "SuffixDecoding: Extreme Speculative
Decoding for Emerging AI Applications"; shipped in Snowflake's Arctic Inference): every
suffix of every sequence, cut at ``depth`` tokens, is a path from the root, and a
position on a path knows how many suffixes pass through it. So for any string ``X`` of
at most ``depth`` tokens, :meth:`SuffixTree.count` is the number of positions where ``X``
occurs in the sequences held, and the tree answers "what followed ``X``, how often?" in
time independent of how many tokens it holds.

Vocabulary:

* *sequence* -- one row's token ids (prompt and output), held from :meth:`~SuffixTree.open`
  until evicted; *live* while its row still grows, *finished* after :meth:`~SuffixTree.close`;
* *occurrence* -- a suffix ``ids[start:]`` of a sequence, cut at ``depth`` tokens; it
  *ends* at the node of its last token (a live sequence's shorter suffixes still grow);
* *count* of a node -- the occurrences that pass through or end at it;
* *continuation* of a string -- the token after one of its occurrences (an occurrence at
  a sequence's end has none);
* *rank* -- a sequence's age: ranks grow in the order sequences are opened, and eviction
  takes finished sequences in rank order (oldest first).

Edges are path-compressed: a node stands for the tokens at depths ``[lo, hi)`` of its
path, read from one occurrence that passes through it (its *ref*: a sequence's rank and
the suffix's start), and every occurrence ends at a node, so a count holds along the
whole edge; no node but the root has a single kid and no occurrence ending at it. A
node's ref is always the newest occurrence through it (highest rank, then latest start):
eviction removes the oldest sequence, so a node whose ref it removes has no other
occurrence and goes too, and refs never need repair. The newest occurrence also breaks
ties between equally frequent continuations.

Nodes are integer ids into flat arrays, and the kid tables are dicts of ints, which
Python's cyclic garbage collector does not track: a million-token corpus adds no
objects for a full collection to walk.

Costs: appending a token to a live sequence extends its ``depth - 1`` growing suffixes by
one step each, but an empty sequence's first tokens (a prompt) go in suffix by suffix, a
node at a time rather than a token at a time (the tree does not depend on the order its
occurrences came in); evicting a sequence walks each of its suffixes from the root once; each
token held adds at most two nodes (tested).
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterable, Sequence
from typing import NamedTuple

ROOT = 0


class Row:
    """A live sequence: its rank, its ids and the nodes where its growing suffixes end
    (longest first: lengths ``min(len(ids), depth - 1)`` down to 1)."""

    __slots__ = ("cursors", "ids", "rank")

    def __init__(self, rank: int, ids: array[int]) -> None:
        self.rank, self.ids = rank, ids
        self.cursors: list[int] = []


class Proposed(NamedTuple):
    """A node of a proposed tree: its parent's index in the proposal (-1: the root), its
    token, and its score (the product of its path's shares of the continuations)."""

    parent: int
    token: int
    score: float


class SuffixTree:
    """Every suffix of the sequences it holds, up to ``depth`` tokens, with counts."""

    def __init__(self, depth: int) -> None:
        if depth < 2:
            raise ValueError(f"depth must be >= 2 (a match and its next token), got {depth}")
        self.depth = depth
        # Node fields, indexed by node id; node 0 is the root, whose count is every token held.
        self._count = array("q", [0])
        self._lo = array("q", [0])  # the edge holds the path's tokens at depths [lo, hi)
        self._hi = array("q", [0])
        self._parent = array("q", [-1])
        self._ref = array("q", [-1])  # rank of the sequence the edge's tokens are read from
        self._start = array("q", [0])  # ... and the start of that occurrence in it
        self._kids: list[dict[int, int] | None] = [None]  # first token of a kid's edge -> kid; None: a leaf
        self._free: list[int] = []  # ids of deleted nodes, for reuse
        self._seqs: dict[int, array[int]] = {}  # rank -> ids, live and finished
        self._ranks = 0
        self._live: set[int] = set()
        self._finished: list[int] = []  # ranks, a heap

    @property
    def tokens(self) -> int:
        """Tokens held, live and finished sequences together."""
        return self._count[ROOT]

    @property
    def nodes(self) -> int:
        """Nodes in the tree, the root included."""
        return len(self._count) - len(self._free)

    @property
    def finished(self) -> int:
        """Finished sequences not evicted yet."""
        return len(self._finished)

    # ------------------------------------------------------------------ sequences

    def open(self) -> Row:
        """A new, empty live sequence, newer than every sequence opened before."""
        rank, ids = self._ranks, array("q")
        self._ranks += 1
        self._seqs[rank] = ids
        self._live.add(rank)
        return Row(rank, ids)

    def append(self, row: Row, tokens: Iterable[int]) -> None:
        """Grow a live sequence: each token extends its growing suffixes and starts one."""
        if not row.ids:
            self._fill(row, tokens)
            return
        count, hi, depth, extend = self._count, self._hi, self.depth, self._extend
        ids, cursors = row.ids, row.cursors
        for token in tokens:
            ids.append(token)
            start = len(ids) - len(cursors) - 1  # where the longest growing suffix starts
            count[ROOT] += 1
            grown = []
            for node in cursors:
                if count[node] == 1:  # a leaf only this occurrence reaches: lengthen its edge
                    hi[node] += 1
                else:
                    node = extend(node, row.rank, start, token)
                if hi[node] < depth:
                    grown.append(node)
                start += 1
            grown.append(extend(ROOT, row.rank, start, token))  # depth >= 2: a one-token suffix grows on
            cursors = row.cursors = grown

    def _fill(self, row: Row, tokens: Iterable[int]) -> None:
        """An empty row's first tokens (a prompt, mostly): each suffix goes in whole, from the
        root, a node at a time rather than a token at a time.

        The tree is the same as :meth:`append`'s token by token would make: its nodes are the
        root, the ends of occurrences and the branch points, each with its count and newest
        ref, whatever order the occurrences came in.
        """
        ids, rank = row.ids, row.rank
        ids.extend(tokens)
        n, depth = len(ids), self.depth
        count, lo, hi, ref, first, table, seqs = (self._count, self._lo, self._hi, self._ref, self._start,
                                                  self._kids, self._seqs)
        count[ROOT] += n
        ends = []
        for start in range(n):  # occurrence ids[start : start + end] goes in, to end at node
            node, d, end = ROOT, 0, min(depth, n - start)
            while d < end:  # the occurrence's first d tokens are node's path, d == hi[node]
                kids, token = table[node], ids[start + d]
                kid = kids.get(token, -1) if kids is not None else -1
                if kid < 0:
                    leaf = self._new(node, d, end, 1, rank, start)
                    if kids is None:
                        table[node] = {token: leaf}
                    else:
                        kids[token] = leaf
                    node = leaf
                    break
                assert kids is not None
                src, at, h = seqs[ref[kid]], first[kid], min(hi[kid], end)
                m = d + 1  # the first depth where kid's edge and the occurrence part, or h
                if src[at + m : at + h] == ids[start + m : start + h]:
                    m = h
                else:
                    while src[at + m] == ids[start + m]:
                        m += 1
                if m < hi[kid]:  # it ends or parts inside kid's edge: split the edge there
                    mid = self._new(node, d, m, count[kid] + 1, ref[kid], at)
                    lo[kid], self._parent[kid] = m, mid
                    table[mid] = {src[at + m]: kid}
                    kids[token] = kid = mid
                else:
                    count[kid] += 1
                if rank > ref[kid] or (rank == ref[kid] and start >= first[kid]):
                    ref[kid], first[kid] = rank, start
                node, d = kid, hi[kid]
            ends.append(node)
        row.cursors = ends[max(0, n - depth + 1) :]  # the growing suffixes: shorter than depth, longest first

    def close(self, row: Row) -> None:
        """The row's sequence is finished: it stays in the corpus until evicted."""
        if row.rank not in self._live:
            return
        self._live.discard(row.rank)
        row.cursors = []
        if row.ids:
            heapq.heappush(self._finished, row.rank)
        else:
            del self._seqs[row.rank]

    def evict(self, max_tokens: int) -> None:
        """Remove finished sequences, oldest first, until at most ``max_tokens`` are held.

        Live sequences stay: a live one older than the oldest finished one stops the
        eviction, and the live ones alone may hold more than ``max_tokens``.
        """
        oldest_live = min(self._live, default=None)
        while self._count[ROOT] > max_tokens and self._finished:
            if oldest_live is not None and oldest_live < self._finished[0]:
                break
            self._remove(heapq.heappop(self._finished))

    # ------------------------------------------------------------------ queries

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (at most ``depth`` tokens) in the sequences held."""
        if len(pattern) > self.depth:
            raise ValueError(f"pattern of {len(pattern)} tokens is longer than the tree's depth {self.depth}")
        at = self._locate(pattern)
        return 0 if at is None else self._count[at[0]]

    def propose(self, row: Row, gamma: int, min_match: int, min_score: float) -> list[int]:
        """Greedy continuation of the row's longest matched suffix, up to ``gamma`` tokens.

        The pattern is the longest suffix of the row, ``min_match`` to ``depth - 1``
        tokens, that has a continuation. Each step takes the pattern's most frequent
        continuation (ties: the newest) and multiplies a score by its share of the
        pattern's continuations; it stops before the score would fall below
        ``min_score`` or where the pattern has no continuation. The pattern grows by each
        token proposed; at ``depth`` tokens it drops its oldest one. This is
        :meth:`propose_tree` with one branch, walked without its heap: every row runs it at
        every step.
        """
        start = self._match(row, min_match)
        if start is None or gamma == 0:
            return []
        return self._walk(row, [], start, self._hi[start], 1.0, gamma, min_score)

    def propose_fan(self, row: Row, depths: Sequence[int], min_match: int, min_score: float) -> list[list[int]]:
        """Up to ``len(depths)`` chains, one per most frequent continuation of the row's longest
        matched suffix (matched as :meth:`propose` matches it), best first.

        Chain ``i`` begins with the ``i``-th most frequent continuation (ties: the newest),
        scored with its share of them, dropped below ``min_score``, and goes on as
        :meth:`propose` goes on from there, up to ``depths[i]`` tokens. The first chain is
        :meth:`propose`'s proposal (up to ``depths[0]`` tokens).
        """
        start = self._match(row, min_match)
        if start is None or not depths:
            return []
        d = self._hi[start]
        chains = []
        for (kid, share), depth in zip(self._most_frequent(start, len(depths)), depths, strict=False):
            if share < min_score or depth == 0:
                break
            chains.append(self._walk(row, [self._token(kid, d)], kid, d + 1, share, depth, min_score))
        return chains

    def _walk(self, row: Row, out: list[int], node: int, d: int, score: float, gamma: int,
              min_score: float) -> list[int]:
        """``out`` grown greedily to ``gamma`` tokens from a pattern that ends at depth ``d`` of
        ``node``'s edge, with the score so far."""
        hi = self._hi
        while len(out) < gamma:
            if d == self.depth:
                node, d = self._reanchor(row, out)
            if d == hi[node]:  # at a node: choose among its kids
                best, share = self._best(node)
                if best < 0 or score * share < min_score:
                    break
                node, score = best, score * share
            # else inside an edge: every occurrence goes on the same way, the score stays
            out.append(self._token(node, d))
            d += 1
        return out

    def propose_tree(self, row: Row, gamma: int, min_match: int, min_score: float, branches: int) -> list[Proposed]:
        """A tree of up to ``gamma`` continuations of the row's longest matched suffix, best first.

        The pattern is matched as :meth:`propose` matches it, and a node's pattern is it
        followed by the tokens of the node's path. A node's candidate children are its
        pattern's ``branches`` most frequent continuations (ties: the newest), each scored
        with its parent's score times its share of the pattern's continuations (the root
        scores 1); a candidate below ``min_score`` is dropped. The tree takes the
        best-scored candidate left (ties: the one offered first) until it has ``gamma``
        nodes. A child never outscores its parent, so parents come before children, and
        siblings come in the order of their frequency.
        """
        start = self._match(row, min_match)
        if start is None or gamma == 0:
            return []
        out: list[Proposed] = []
        heap: list[tuple[float, int, int, int, int, int]] = []  # -score, offered, parent, token, node, depth
        offered = self._offer(heap, 0, row, out, -1, 1.0, start, self._hi[start], branches, min_score)
        while heap and len(out) < gamma:
            minus, _, parent, token, node, d = heapq.heappop(heap)
            out.append(Proposed(parent, token, -minus))
            offered = self._offer(heap, offered, row, out, len(out) - 1, -minus, node, d, branches, min_score)
        return out

    def _offer(self, heap: list[tuple[float, int, int, int, int, int]], offered: int, row: Row, out: list[Proposed],
               parent: int, score: float, node: int, d: int, branches: int, min_score: float) -> int:
        """Push the candidate children of proposal node ``parent`` (-1: the root), whose pattern
        ends at depth ``d`` of ``node``'s edge; returns the count of candidates offered so far."""
        if d == self.depth:
            node, d = self._reanchor(row, _path(out, parent))
        if d < self._hi[node]:  # inside an edge: every occurrence goes on the same way, the score stays
            heapq.heappush(heap, (-score, offered, parent, self._token(node, d), node, d + 1))
            return offered + 1
        for kid, share in self._most_frequent(node, branches):
            if score * share < min_score:
                break
            heapq.heappush(heap, (-score * share, offered, parent, self._token(kid, d), kid, d + 1))
            offered += 1
        return offered

    def _match(self, row: Row, min_match: int) -> int | None:
        """The node where the row's longest suffix of at least ``min_match`` tokens with a
        continuation ends; None if there is none."""
        hi, kids = self._hi, self._kids
        return next((c for c in row.cursors if hi[c] >= min_match and kids[c]), None)

    def _reanchor(self, row: Row, proposed: list[int]) -> tuple[int, int]:
        """A pattern as deep as the tree drops its oldest token: find the last ``depth - 1``
        tokens of the row followed by ``proposed`` from the root."""
        at = self._locate(_tail(row.ids, proposed, self.depth - 1))
        assert at is not None, "the tree held this string one token ago"
        return at

    def check(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant of the structure
        (see the module docstring); walks the whole tree, for tests."""
        todo: list[tuple[int, list[int]]] = [(ROOT, [])]
        seen = 0
        while todo:
            node, path = todo.pop()
            seen += 1
            table = self._kids[node]
            assert table is None or table, f"node {node}: an empty kid table"
            below = sum(self._count[k] for k in (table or {}).values())
            assert self._count[node] >= below, f"node {node}: count {self._count[node]} < its kids' {below}"
            if node != ROOT:
                self._check_edge(node, path)
                assert not (table and len(table) == 1 and below == self._count[node]), f"node {node}: uncompressed"
            for token, kid in (table or {}).items():
                assert self._parent[kid] == node and self._lo[kid] == self._hi[node], f"node {kid}: not below {node}"
                todo.append((kid, [*path, *(self._token(kid, d) for d in range(self._lo[kid], self._hi[kid]))]))
                assert todo[-1][1][self._lo[kid]] == token, f"node {kid}: filed under {token}"
        assert seen == self.nodes, f"{self.nodes - seen} nodes unreachable and not free"
        assert self.tokens == sum(len(s) for s in self._seqs.values()), "root count is not the tokens held"

    def _check_edge(self, node: int, path: list[int]) -> None:
        rank, start, hi = self._ref[node], self._start[node], self._hi[node]
        assert self._count[node] > 0 and self._lo[node] < hi <= self.depth, f"node {node}: count or span"
        assert rank in self._seqs, f"node {node}: ref to an evicted sequence {rank}"
        ids = self._seqs[rank]
        assert start + hi <= len(ids) and list(ids[start : start + hi]) == path, f"node {node}: ref is not its path"

    # ------------------------------------------------------------------ the structure

    def _token(self, node: int, d: int) -> int:
        """The token at depth ``d`` of ``node``'s path (``lo <= d < hi``)."""
        return self._seqs[self._ref[node]][self._start[node] + d]

    def _new(self, parent: int, lo: int, hi: int, count: int, rank: int, start: int) -> int:
        if self._free:
            node = self._free.pop()
            self._count[node], self._lo[node], self._hi[node] = count, lo, hi
            self._parent[node], self._ref[node], self._start[node] = parent, rank, start
            self._kids[node] = None
            return node
        self._count.append(count)  # one call per field: a prompt makes a node or two per token
        self._lo.append(lo)
        self._hi.append(hi)
        self._parent.append(parent)
        self._ref.append(rank)
        self._start.append(start)
        self._kids.append(None)
        return len(self._kids) - 1

    def _delete(self, node: int) -> None:
        self._kids[node] = None
        self._free.append(node)

    def _claim(self, node: int, rank: int, start: int) -> None:
        """Occurrence ``(rank, start)`` passes through ``node``: the ref if it is the newest."""
        ref = self._ref[node]
        if rank > ref or (rank == ref and start >= self._start[node]):
            self._ref[node], self._start[node] = rank, start

    def _extend(self, node: int, rank: int, start: int, token: int) -> int:
        """Occurrence ``(rank, start)``, which ends at ``node``, grows by ``token``: returns
        the node where it ends now, keeping the edges compressed."""
        count, lo, hi = self._count, self._lo, self._hi
        kids = self._kids[node]
        kid = kids.get(token, -1) if kids is not None else -1
        inner = node != ROOT
        if kid < 0:
            if inner and count[node] == 1:  # a leaf only this occurrence reaches: lengthen its edge
                hi[node] += 1
                return node
            leaf = self._new(node, hi[node], hi[node] + 1, 1, rank, start)
            if kids is None:
                self._kids[node] = {token: leaf}
            else:
                kids[token] = leaf
            return leaf
        assert kids is not None
        if inner and count[node] == count[kid] + 1:  # only this occurrence ends here; the others go on to kid
            if hi[kid] - lo[kid] == 1:  # kid takes node's place
                parent = self._parent[node]
                self._replace(parent, node, kid)
                count[kid] += 1
                self._claim(kid, rank, start)
                self._delete(node)
                return kid
            hi[node] += 1  # node takes kid's first token (its ref reaches as deep as kid's or ours)
            lo[kid] += 1
            del kids[token]
            kids[self._token(kid, lo[kid])] = kid
            return node
        if hi[kid] - lo[kid] == 1:
            count[kid] += 1
            self._claim(kid, rank, start)
            return kid
        mid = self._new(node, lo[kid], lo[kid] + 1, count[kid] + 1, self._ref[kid], self._start[kid])  # split kid
        self._claim(mid, rank, start)
        lo[kid] += 1
        self._parent[kid] = mid
        self._kids[mid] = {self._token(kid, lo[kid]): kid}
        kids[token] = mid
        return mid

    def _replace(self, parent: int, node: int, kid: int) -> None:
        """``kid``, the only kid of ``node``, takes its place under ``parent`` (its ref
        passes through ``node``, so it can read ``node``'s tokens too)."""
        self._lo[kid], self._parent[kid] = self._lo[node], parent
        table = self._kids[parent]
        assert table is not None
        table[self._token(kid, self._lo[kid])] = kid

    def _remove(self, rank: int) -> None:
        """Take every occurrence of a finished sequence out of the tree."""
        ids = self._seqs[rank]
        count, hi, kids, depth = self._count, self._hi, self._kids, self.depth
        count[ROOT] -= len(ids)
        for start in range(len(ids)):
            end = min(depth, len(ids) - start)
            node, d = ROOT, 0
            while d < end:
                table = kids[node]
                assert table is not None
                kid = table[ids[start + d]]
                count[kid] -= 1
                if count[kid] == 0:  # it held only this occurrence, so it was a leaf
                    assert kids[kid] is None, "a node of count 1 with kids"
                    del table[ids[start + d]]
                    if not table:
                        kids[node] = None
                    self._delete(kid)
                    break
                node, d = kid, hi[kid]
            assert d <= end, "an occurrence ends inside an edge"
            self._merge(node)
        del self._seqs[rank]

    def _merge(self, node: int) -> None:
        """After a removal at ``node``: if all its occurrences go on to one kid, the kid
        takes its place."""
        table = self._kids[node]
        if node == ROOT or table is None or len(table) != 1:
            return
        (kid,) = table.values()
        if self._count[kid] == self._count[node]:
            self._replace(self._parent[node], node, kid)
            self._delete(node)

    def _best(self, node: int) -> tuple[int, float]:
        """:meth:`_most_frequent`'s first kid in one pass, without a list: every row's chain
        asks this for each proposed token. ``(-1, 0.0)`` for a leaf."""
        count, ref, start = self._count, self._ref, self._start
        best, total = -1, 0
        for kid in (self._kids[node] or {}).values():
            total += count[kid]
            if best < 0 or (count[kid], ref[kid], start[kid]) > (count[best], ref[best], start[best]):
                best = kid
        return (best, count[best] / total) if best >= 0 else (-1, 0.0)

    def _most_frequent(self, node: int, most: int) -> list[tuple[int, float]]:
        """Up to ``most`` kids, the highest count first (ties: the newest ref), each with its
        share of the kids' total count; none for a leaf."""
        count, ref, start = self._count, self._ref, self._start
        table = self._kids[node] or {}
        total = sum(count[kid] for kid in table.values())
        ranked = heapq.nlargest(most, table.values(), key=lambda kid: (count[kid], ref[kid], start[kid]))
        return [(kid, count[kid] / total) for kid in ranked]

    def _locate(self, pattern: Sequence[int]) -> tuple[int, int] | None:
        """The node whose edge holds ``pattern``'s last token, and that token's depth."""
        node, d = ROOT, 0
        for token in pattern:
            if d == self._hi[node]:
                table = self._kids[node]
                kid = table.get(token, -1) if table is not None else -1
                if kid < 0:
                    return None
                node = kid
            elif self._token(node, d) != token:
                return None
            d += 1
        return node, d


def _path(out: list[Proposed], node: int) -> list[int]:
    """The tokens from the root's child down to proposal node ``node`` (-1: none)."""
    path = []
    while node >= 0:
        path.append(out[node].token)
        node = out[node].parent
    return path[::-1]


def _tail(ids: array[int], out: list[int], n: int) -> list[int]:
    """The last ``n`` tokens of ``ids + out``."""
    if len(out) >= n:
        return out[len(out) - n :]
    return ids[len(ids) - (n - len(out)) :].tolist() + out
