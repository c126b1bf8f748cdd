"""SuffixDecoding: a counted suffix tree over past requests and the current batch, checked
against brute-force counts over the same sequences, and on the pipeline."""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny import one_arm_dict, tiny_lm
from hypothesis import given, settings
from hypothesis import strategies as st

from flashspec_core import SamplingParams
from flashspec_core.build import build_pipeline
from flashspec_core.config import ConfigError, parse_config
from flashspec_core.registry import build_registry
from flashspec_core.testing import draft_contract as dc
from flashspec_core.tree import fan_depths, fan_draft, fan_parents
from flashspec_suffix.suffix import SuffixConfig, SuffixDraft
from flashspec_suffix.tree import Proposed, Row, SuffixTree

GREEDY = SamplingParams(temperature=0.0)

# --- brute force over the sequences held: what the tree must answer -------------------

Corpus = dict[int, list[int]]  # rank -> ids


def _continuations(corpus: Corpus, x: list[int]) -> dict[int, tuple[int, tuple[int, int]]]:
    """token -> (occurrences of x followed by it, newest such occurrence as (rank, start))."""
    out: dict[int, tuple[int, tuple[int, int]]] = {}
    for rank, ids in corpus.items():
        for i in range(len(ids) - len(x)):
            if ids[i : i + len(x)] == x:
                n, newest = out.get(ids[i + len(x)], (0, (-1, -1)))
                out[ids[i + len(x)]] = (n + 1, max(newest, (rank, i)))
    return out


def _occurrences(corpus: Corpus, x: list[int]) -> int:
    """Where ``x`` starts in a sequence (the empty string: at every token)."""
    return sum(ids[i : i + len(x)] == x for ids in corpus.values() for i in range(len(ids) - max(len(x), 1) + 1))


def _greedy(corpus: Corpus, ctx: list[int], gamma: int, min_match: int, min_score: float, depth: int) -> list[int]:
    """The proposal by its definition (SuffixTree.propose's docstring), by brute force."""
    lengths = range(min(depth - 1, len(ctx)), min_match - 1, -1)
    x = next((ctx[len(ctx) - m :] for m in lengths if _continuations(corpus, ctx[len(ctx) - m :])), None)
    out: list[int] = []
    score = 1.0
    while x is not None and len(out) < gamma:
        x = x[1:] if len(x) == depth else x
        options = _continuations(corpus, x)
        if not options:
            break
        token, (n, _) = max(options.items(), key=lambda kv: kv[1])
        share = n / sum(v[0] for v in options.values())
        if score * share < min_score:
            break
        score *= share
        out.append(token)
        x = [*x, token]
    return out


def _brute_tree(corpus: Corpus, ctx: list[int], gamma: int, min_match: int, min_score: float, depth: int,
                branches: int) -> list[Proposed]:
    """The tree by its definition (SuffixTree.propose_tree's docstring), by brute force: each
    node's candidates are its pattern's ``branches`` most frequent continuations (ties: the
    newest occurrence), taken best score first (ties: the first offered)."""
    lengths = range(min(depth - 1, len(ctx)), min_match - 1, -1)
    x = next((ctx[len(ctx) - m :] for m in lengths if _continuations(corpus, ctx[len(ctx) - m :])), None)
    if x is None or gamma == 0:
        return []
    out: list[Proposed] = []
    heap: list[tuple[float, int, int, int, list[int]]] = []  # -score, offered, parent, token, its pattern

    def offer(parent: int, score: float, x: list[int]) -> None:
        x = x[1:] if len(x) == depth else x
        options = _continuations(corpus, x)
        total = sum(n for n, _ in options.values())
        for token, (n, _) in sorted(options.items(), key=lambda kv: kv[1], reverse=True)[:branches]:
            if score * (n / total) >= min_score:
                heapq.heappush(heap, (-score * (n / total), len(offered), parent, token, [*x, token]))
                offered.append(token)

    offered: list[int] = []
    offer(-1, 1.0, x)
    while heap and len(out) < gamma:
        minus, _, parent, token, pattern = heapq.heappop(heap)
        out.append(Proposed(parent, token, -minus))
        offer(len(out) - 1, -minus, pattern)
    return out


def _check_tree_shape(tree: list[Proposed], gamma: int, branches: int, min_score: float) -> None:
    assert len(tree) <= gamma
    for n, node in enumerate(tree):
        assert -1 <= node.parent < n, f"node {n}: parent {node.parent} is not earlier"
        assert min_score <= node.score <= (tree[node.parent].score if node.parent >= 0 else 1.0)
    for parent in {-1, *range(len(tree))}:
        assert sum(node.parent == parent for node in tree) <= branches


def _corpus(tree: SuffixTree) -> Corpus:
    return {rank: list(ids) for rank, ids in tree._seqs.items()}


# --- the structure ---------------------------------------------------------------------


def _tree(depth: int, *finished: list[int]) -> SuffixTree:
    tree = SuffixTree(depth)
    for ids in finished:
        row = tree.open()
        tree.append(row, ids)
        tree.close(row)
    return tree


def test_counts_every_occurrence_up_to_the_depth() -> None:
    tree = _tree(4, [1, 2, 3, 1, 2, 4], [2, 3, 1, 2, 3])
    corpus = _corpus(tree)
    for x in ([1], [1, 2], [1, 2, 3], [2, 3, 1, 2], [3, 1], [4], [5], [2, 4], [3, 1, 2, 4], []):
        assert tree.count(x) == _occurrences(corpus, x), x
    assert tree.count([1, 2, 3]) == 2 and tree.count([1, 2]) == 3 and tree.tokens == 11
    tree.check()
    with pytest.raises(ValueError, match="longer than the tree's depth 4"):
        tree.count([1, 2, 3, 1, 2])


def test_proposes_the_most_frequent_continuation_then_the_newest() -> None:
    tree = _tree(6, [7, 1, 2, 3, 9], [7, 1, 2, 3, 9], [8, 1, 2, 4, 5])
    row = tree.open()
    tree.append(row, [5, 1, 2])
    assert tree.propose(row, 4, 1, 0.1) == [3, 9]  # (1 2) went on to 3 twice, to 4 once
    assert tree.propose(row, 1, 1, 0.1) == [3]
    tie = _tree(6, [1, 2, 3], [1, 2, 4])
    row = tie.open()
    tie.append(row, [1, 2])
    assert tie.propose(row, 3, 1, 0.1) == [4]  # one each: the newer sequence wins


def test_the_longest_suffix_with_a_continuation_leads() -> None:
    tree = _tree(8, [4, 1, 2, 3, 5, 5], [9, 9, 2, 3, 6], [9, 9, 2, 3, 6])
    row = tree.open()
    tree.append(row, [4, 1, 2, 3])
    assert tree.propose(row, 1, 1, 0.1) == [5]  # (4 1 2 3) once beats (2 3) going to 6 twice
    tree.append(row, [8])  # nothing ends in 8 and goes on: no match
    assert tree.propose(row, 3, 1, 0.1) == []
    tree.append(row, [2, 3])
    assert tree.propose(row, 2, 3, 0.1) == []  # (8 2 3) is new; (2 3) is shorter than min_match = 3
    assert tree.propose(row, 2, 2, 0.1) == [6]  # (2 3) went on to 6 twice, to 5 and 8 once; (2 3 6) ends there


def test_the_score_threshold_cuts_the_proposal() -> None:
    # After (1 2): 3 in two of three; after (1 2 3): 4 in one of two.
    tree = _tree(8, [1, 2, 3, 4, 0], [1, 2, 3, 5, 0], [1, 2, 6, 0])
    row = tree.open()
    tree.append(row, [9, 1, 2])
    assert tree.propose(row, 4, 2, 0.3) == [3, 5, 0]  # 2/3, then 2/3 * 1/2 = 1/3 (ties: the newer 5), 1/3
    assert tree.propose(row, 4, 2, 0.5) == [3]
    assert tree.propose(row, 4, 2, 0.7) == []
    assert tree.propose(row, 0, 1, 0.1) == []


def test_a_tree_takes_the_most_frequent_continuations_best_score_first() -> None:
    # After (1 2): 3 three times, 4 twice, 5 once; after (1 2 3): 7 twice, 8 once; after (1 2 4): 9.
    tree = _tree(8, [1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 4, 9], [1, 2, 4, 9], [1, 2, 5])
    row = tree.open()
    tree.append(row, [0, 1, 2])
    got = tree.propose_tree(row, 8, 2, 0.1, 2)
    assert [(n.parent, n.token) for n in got] == [(-1, 3), (-1, 4), (0, 7), (1, 9), (0, 8)]  # 5 is third at the root
    assert [n.score for n in got] == pytest.approx([1 / 2, 1 / 3, 1 / 3, 1 / 3, 1 / 6])  # ties: the first offered
    assert [(n.parent, n.token) for n in tree.propose_tree(row, 8, 2, 0.1, 3)] == [
        (-1, 3), (-1, 4), (0, 7), (1, 9), (-1, 5), (0, 8)]
    assert [n.token for n in tree.propose_tree(row, 8, 2, 0.2, 3)] == [3, 4, 7, 9]  # each branch held to min_score
    assert tree.propose_tree(row, 3, 2, 0.1, 2) == got[:3]  # gamma bounds the nodes
    assert [n.token for n in tree.propose_tree(row, 8, 2, 0.1, 1)] == tree.propose(row, 8, 2, 0.1) == [3, 7]
    assert tree.propose_tree(row, 0, 2, 0.1, 2) == [] and tree.propose_tree(row, 8, 3, 0.1, 2) == []


def test_the_pattern_drops_its_oldest_token_at_the_depth() -> None:
    ids = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    tree = _tree(3, ids)
    row = tree.open()
    tree.append(row, [1, 2])
    assert tree.propose(row, 6, 2, 0.1) == [3, 4, 5, 6, 7, 8]
    assert tree.propose(row, 6, 2, 0.1) == _greedy(_corpus(tree), [1, 2], 6, 2, 0.1, 3)
    assert tree.propose_tree(row, 6, 2, 0.1, 2) == _brute_tree(_corpus(tree), [1, 2], 6, 2, 0.1, 3, 2)


def test_eviction_keeps_the_budget_oldest_first() -> None:
    requests = [[r, 1, 2, 3, 4, r] for r in range(10, 16)]
    tree = _tree(4, *requests)
    nodes = tree.nodes
    tree.evict(20)
    assert tree.tokens == 18 and tree.finished == 3  # three requests of six tokens fit in 20
    assert _corpus(tree) == {3: requests[3], 4: requests[4], 5: requests[5]}
    assert tree.count([1, 2, 3]) == 3 and tree.count([10]) == 0 and tree.count([15]) == 2
    assert tree.nodes < nodes
    tree.check()
    tree.evict(0)
    assert tree.tokens == 0 and tree.nodes == 1  # every node but the root is free again
    tree.check()


def test_eviction_spares_live_rows_and_what_is_newer_than_them() -> None:
    tree = _tree(4, [1, 2, 3])
    live = tree.open()
    tree.append(live, [1, 2, 3, 1, 2])
    row = tree.open()  # finished after the live row opened: it cannot go before the live row does
    tree.append(row, [1, 2, 4])
    tree.close(row)
    tree.evict(0)
    assert _corpus(tree) == {1: [1, 2, 3, 1, 2], 2: [1, 2, 4]}  # the old one went; the live row stays
    tree.check()
    tree.close(live)
    tree.evict(0)
    assert tree.tokens == 0 and tree.nodes == 1


def test_memory_is_linear_in_the_tokens_held() -> None:
    """At most two nodes per token, on repetitive text too (where a trie would hold one
    node per token and depth)."""
    tree = SuffixTree(33)
    text = [t % 7 for t in range(200)] + list(range(50)) + [t % 5 for t in range(300)]
    for copy in range(4):
        row = tree.open()
        tree.append(row, text[copy * 13 :])
        tree.append(row, text)
        assert tree.nodes <= 2 * tree.tokens + 1
        tree.close(row)
    tree.check()


def _shape(tree: SuffixTree, rows: list[Row]) -> tuple[dict[tuple[int, ...], tuple[int, int, int]], list[list[tuple[int, ...]]]]:
    """The tree as path -> (count, ref rank, ref start) per node, and each row's cursors as
    paths: what stays the same whatever order the occurrences came in."""
    nodes, todo = {}, [(0, ())]
    while todo:
        node, path = todo.pop()
        nodes[path] = (tree._count[node], tree._ref[node], tree._start[node])
        for kid in (tree._kids[node] or {}).values():
            todo.append((kid, path + tuple(tree._token(kid, d) for d in range(tree._lo[kid], tree._hi[kid]))))
    where = {node: path for path, node in _node_paths(tree)}
    return nodes, [[where[c] for c in row.cursors] for row in rows]


def _node_paths(tree: SuffixTree) -> list[tuple[tuple[int, ...], int]]:
    out, todo = [], [(0, ())]
    while todo:
        node, path = todo.pop()
        out.append((path, node))
        for kid in (tree._kids[node] or {}).values():
            todo.append((kid, path + tuple(tree._token(kid, d) for d in range(tree._lo[kid], tree._hi[kid]))))
    return out


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=5),
    cut=st.integers(0, 30),
    depth=st.sampled_from([2, 3, 5, 17]),
)
def test_a_prompt_fed_whole_makes_the_tree_fed_token_by_token_makes(seqs: list[list[int]], cut: int,
                                                                    depth: int) -> None:
    """An empty row's first tokens go in suffix by suffix; the nodes, counts, refs and cursors
    are the same as when the row gets them one at a time, next to finished and live rows, newer
    ones among them."""
    built = []
    for whole in (False, True):
        tree = SuffixTree(depth)
        rows = [tree.open() for _ in seqs]
        for row, ids in reversed(list(zip(rows, seqs, strict=True))):  # newer rows first: older refs come later
            for piece in ([ids[:cut], ids[cut:]] if whole else [[t] for t in ids]):
                tree.append(row, piece)
            if len(ids) % 2:
                tree.close(row)
        tree.check()
        built.append(_shape(tree, rows))
    assert built[0] == built[1]


def _same_as_brute_force(tree: SuffixTree, rows: list[Row], patterns: list[list[int]]) -> None:
    corpus = _corpus(tree)
    for row in rows:
        for min_match, min_score in ((1, 0.1), (2, 0.5), (1, 1.0)):
            want = _greedy(corpus, list(row.ids), 5, min_match, min_score, tree.depth)
            assert tree.propose(row, 5, min_match, min_score) == want
            for branches in (2, 3):
                got = tree.propose_tree(row, 6, min_match, min_score, branches)
                assert got == _brute_tree(corpus, list(row.ids), 6, min_match, min_score, tree.depth, branches)
                _check_tree_shape(got, 6, branches, min_score)
    for x in patterns:
        assert tree.count(x[: tree.depth]) == _occurrences(corpus, x[: tree.depth])


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(st.tuples(st.sampled_from("aaaaooce"), st.integers(0, 3), st.lists(st.integers(0, 3), max_size=6)),
                 max_size=40),
    depth=st.sampled_from([2, 3, 5, 9]),
    budget=st.integers(0, 40),
)
def test_any_history_answers_what_brute_force_does(ops: list[tuple[str, int, list[int]]], depth: int,
                                                   budget: int) -> None:
    """Rows open, grow, close and are evicted in any order: every count and every proposal
    equals brute force over the sequences still held, and the structure stays sound; then
    the sequences go one by one, oldest first, until nothing is left."""
    tree = SuffixTree(depth)
    rows = [tree.open()]
    for op, pick, tokens in ops:
        if op == "o":
            rows.append(tree.open())
        elif op == "c" and rows:
            tree.close(rows.pop(pick % len(rows)))
        elif op == "e":
            tree.evict(budget)
        elif rows:
            tree.append(rows[pick % len(rows)], tokens)
        _same_as_brute_force(tree, rows, [[], [0], [1, 1], [0, 1, 2], tokens])
        assert tree.nodes <= 2 * tree.tokens + 1
    tree.check()
    for row in rows:
        tree.close(row)
    probe = tree.open()  # newer than every finished sequence, so it holds no eviction up
    while tree.finished:
        tree.evict(tree.tokens - 1)  # the oldest sequence only
        tree.check()
        tree.append(probe, [budget % 4])
        _same_as_brute_force(tree, [probe], [[0], [1, 2], [3, 0, 1]])
    tree.close(probe)
    tree.evict(0)
    assert tree.tokens == 0 and tree.nodes == 1


# --- the provider ------------------------------------------------------------------------


def _batch(*rows: list[int]) -> tuple[torch.Tensor, list[int]]:
    width = max(len(r) for r in rows) + 4
    return torch.tensor([r + [0] * (width - len(r)) for r in rows]), [len(r) for r in rows]


def _propose(draft: SuffixDraft, *rows: list[int], gamma: int = 4) -> list[list[int]]:
    return draft.propose(*_batch(*rows), gamma, GREEDY, None).tokens.tolist()  # type: ignore[no-any-return]


def test_outputs_enter_the_corpus_when_the_request_ends() -> None:
    draft = SuffixDraft(SuffixConfig())
    assert _propose(draft, [5, 6, 7, 8]) == [[]]  # nothing seen before: a plain step
    _propose(draft, [5, 6, 7, 8, 9, 10, 11])  # the row grew: caught up from the sequences
    draft.reset()
    assert _propose(draft, [1, 6, 7]) == [[8, 9, 10, 11]]
    assert _propose(draft, [1, 6, 7], gamma=2) == [[8, 9]]
    draft.reset()
    assert _propose(draft, [2, 2], [3, 6, 7]) == [[2, 2, 2, 2], [8, 9, 10, 11]]  # no match: repeat the last token
    assert draft.tree.finished == 2


def test_a_proposal_is_a_function_of_the_sequences_whatever_was_accepted() -> None:
    """Rollback keeps nothing of a proposal; steps of other arms are caught up on: each
    proposal equals that of a provider fed only the sequences, in one piece."""
    history = [9, 1, 2, 3, 4, 1, 2, 3, 5, 1, 2]
    seen = SuffixDraft(SuffixConfig(min_match=1))
    for n, accepted in ((3, 0), (5, 2), (6, 1), (9, 4), (11, 0)):
        got = _propose(seen, history[:n])
        seen.rollback([accepted])
        fresh = SuffixDraft(SuffixConfig(min_match=1))
        assert got == _propose(fresh, history[:n]), n


def _fed_whole(config: SuffixConfig, requests: list[list[list[int]]], now: list[list[int]], gamma: int) -> Any:
    """A provider built from scratch: each earlier request's rows given in one piece (as the
    incremental provider last saw them), then the current rows."""
    fresh = SuffixDraft(config)
    for rows in requests:
        fresh.propose(*_batch(*rows), gamma, GREEDY, None)
        fresh.reset()
    return fresh, fresh.propose(*_batch(*now), gamma, GREEDY, None)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.lists(st.lists(st.lists(st.integers(0, 3), max_size=5), min_size=1, max_size=6),
                               min_size=1, max_size=3), min_size=1, max_size=3),
    max_match=st.sampled_from([2, 4, 16]),
    branches=st.sampled_from([1, 2]),
    max_tokens=st.sampled_from([0, 30, 1 << 20]),
    gamma=st.integers(0, 5),
)
def test_fed_step_by_step_a_row_proposes_what_one_fed_whole_does(
        requests: list[list[list[list[int]]]], max_match: int, branches: int, max_tokens: int, gamma: int) -> None:
    """Requests of a few rows, each row growing by a chunk of any size (none too) per step:
    at every step the provider that was fed only each step's new tokens proposes exactly
    what one built from the whole sequences proposes, and holds the same corpus; a token
    missed or fed twice changes the sequences it holds."""
    config = SuffixConfig(max_match=max_match, min_match=1, max_tokens=max_tokens, branches=branches)
    stepped = SuffixDraft(config)
    done: list[list[list[int]]] = []
    for chunks in requests:  # chunks[step][row]: the tokens a row gains at that step
        rows = max(len(c) for c in chunks)
        seqs: list[list[int]] = [[7 + b] for b in range(rows)]  # a row is never empty
        for step in chunks:
            for b, gained in enumerate(step):
                seqs[b] += gained
            got = stepped.propose(*_batch(*seqs), gamma, GREEDY, None)
            stepped.rollback([0] * rows)
            fresh, want = _fed_whole(config, done, seqs, gamma)
            assert torch.equal(got.tokens, want.tokens)
            assert (got.parents is None) == (want.parents is None)
            assert got.parents is None or torch.equal(got.parents, want.parents)
            assert _corpus(stepped.tree) == _corpus(fresh.tree)
            assert [list(r.ids) for r in stepped._rows] == seqs
        stepped.reset()
        done.append([list(s) for s in seqs])
    stepped.tree.check()


def test_a_row_that_is_not_the_same_sequence_starts_over() -> None:
    draft = SuffixDraft(SuffixConfig(min_match=1, max_tokens=0))
    _propose(draft, [4, 5, 6, 4, 5])
    assert _propose(draft, [4, 5, 7]) == _propose(SuffixDraft(SuffixConfig(min_match=1)), [4, 5, 7]) == [[]]
    assert list(draft._rows[0].ids) == [4, 5, 7]
    _propose(draft, [4, 5, 7, 1, 9])  # as long as before, but another token where it ended
    assert _propose(draft, [4, 5, 7, 1, 8, 1]) == _propose(SuffixDraft(SuffixConfig(min_match=1)), [4, 5, 7, 1, 8, 1])
    assert list(draft._rows[0].ids) == [4, 5, 7, 1, 8, 1] and draft.tree.tokens == 6


def test_rows_of_a_batch_read_each_other() -> None:
    draft = SuffixDraft(SuffixConfig())
    tokens, lengths = _batch([1, 2, 3, 4, 5, 6], [9, 1, 2])
    assert draft.propose(tokens, lengths, 3, GREEDY, None).tokens.tolist() == [[6, 6, 6], [3, 4, 5]]
    assert draft.propose(tokens, lengths, 0, GREEDY, None).tokens.shape == (2, 0)


def test_without_a_corpus_the_draft_meets_the_per_request_contract() -> None:
    """``max_tokens = 0`` forgets each request: a fresh provider then proposes the same."""
    for sampling in dc.SAMPLINGS:
        dc.check_script(lambda: SuffixDraft(SuffixConfig(min_match=1, max_tokens=0)), 16, sampling, token_range=3)


def test_with_a_corpus_earlier_requests_change_the_proposal() -> None:
    """Why the shared contract script compares this draft only without a corpus."""
    with pytest.raises(AssertionError, match="a fresh provider proposes"):
        dc.check_script(lambda: SuffixDraft(SuffixConfig(min_match=1)), 16, GREEDY, token_range=3)


def test_the_batch_shares_the_smallest_fan_holding_every_rows_chains() -> None:
    """The fan's first j chains, j the most any row has; a row lacking a slot repeats its
    parent's token (or, for a whole chain, its own last token) there."""
    assert fan_depths(6, 2) == (3, 3) and fan_depths(8, 3) == (4, 2, 2) and fan_depths(2, 3) == (1, 1)
    assert fan_depths(5, 1) == (5,) and fan_depths(0, 2) == ()
    assert fan_parents((3, 2)) == [-1, 0, 1, -1, 3]
    draft = fan_draft([[[3, 7], [4]], [[5, 6, 1, 2, 9]]], [10, 11], (4, 2, 2))
    assert draft.parents is not None and draft.parents.tolist() == [-1, 0, 1, 2, -1, 4]
    assert draft.tokens.tolist() == [[3, 7, 7, 7, 4, 4], [5, 6, 1, 2, 11, 11]] and draft.probs is None
    chain = fan_draft([[[3, 4]], []], [10, 11], (4, 2, 2))
    assert chain.parents is None and chain.tokens.tolist() == [[3, 4, 4, 4], [11, 11, 11, 11]]
    assert fan_draft([[], []], [10, 11], (4, 2, 2)).tokens.shape == (2, 0)


def test_a_fan_begins_with_the_chain_and_takes_the_most_frequent_continuations() -> None:
    # After (1 2): 3 three times, 4 twice, 5 once; after (1 2 3): 7 twice, 8 once; after (1 2 4): 9.
    tree = _tree(8, [1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 4, 9], [1, 2, 4, 9], [1, 2, 5])
    row = tree.open()
    tree.append(row, [0, 1, 2])
    assert tree.propose_fan(row, (3, 2, 2), 2, 0.1) == [[3, 7], [4, 9], [5]]
    assert tree.propose_fan(row, (3, 2, 2), 2, 0.1)[0] == tree.propose(row, 3, 2, 0.1)
    assert tree.propose_fan(row, (3, 2, 2), 2, 0.2) == [[3, 7], [4, 9]]  # each chain held to min_score
    assert tree.propose_fan(row, (3, 2, 2), 2, 0.4) == [[3]]
    assert tree.propose_fan(row, (1, 1), 2, 0.1) == [[3], [4]]
    assert tree.propose_fan(row, (), 2, 0.1) == [] and tree.propose_fan(row, (3, 2), 3, 0.1) == []


def test_a_tree_draft_is_deterministic_and_each_row_keeps_its_own_tree() -> None:
    draft = SuffixDraft(SuffixConfig(branches=2, min_match=1))
    assert draft.proposes_trees and not SuffixDraft(SuffixConfig()).proposes_trees
    _propose(draft, [1, 2, 3, 7], [1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 4, 9])  # the corpus, one request
    draft.reset()
    tokens, lengths = _batch([5, 1, 2], [6, 4])
    got = draft.propose(tokens, lengths, 6, GREEDY, None)
    # Row 0 after (1 2): 3 (3/4) then 7 (2/3), and 4 (1/4) then 9; row 1 after (4): 9 (1).
    assert got.parents is not None and got.parents.tolist() == [-1, 0, 1, -1, 3, 4]
    assert got.tokens.tolist() == [[3, 7, 7, 4, 9, 9], [9, 9, 9, 4, 4, 4]]  # row 1 repeats 9, then its 4
    assert got.probs is None
    again = draft.propose(tokens, lengths, 6, SamplingParams(temperature=0.7), torch.Generator().manual_seed(1))
    assert torch.equal(got.tokens, again.tokens) and again.parents is not None
    assert torch.equal(got.parents, again.parents)
    draft.rollback_path(torch.tensor([[2, 4], [-1, -1]]))  # nothing to undo: the same sequences propose the same
    assert torch.equal(draft.propose(tokens, lengths, 6, GREEDY, None).tokens, got.tokens)
    narrow = draft.propose(tokens, lengths, 3, GREEDY, None)
    assert narrow.parents is not None and narrow.parents.tolist() == [-1, 0, -1]  # gamma bounds the fan


def test_a_tree_draft_meets_the_per_request_contract() -> None:
    for sampling in dc.SAMPLINGS:
        dc.check_script(lambda: SuffixDraft(SuffixConfig(min_match=1, max_tokens=0, branches=2)), 16, sampling,
                        token_range=3)


# --- config --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"max_match": 0}, "max_match must be an integer in 1..256, got 0"),
        ({"max_match": 2.5}, "max_match must be an integer in 1..256, got 2.5"),
        ({"min_match": True}, "min_match must be an integer in 1..256, got True"),
        ({"min_score": 0}, r"min_score must be a number in \(0, 1\], got 0.0"),
        ({"min_score": "high"}, r"min_score must be a number in \(0, 1\], got 'high'"),
        ({"max_tokens": -1}, "max_tokens must be an integer >= 0, got -1"),
        ({"max_match": 2, "min_match": 3}, r"min_match \(3\) must be <= max_match \(2\)"),
        ({"branches": 0}, "branches must be an integer in 1..64, got 0"),
    ],
)
def test_bad_config_values_name_the_key(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SuffixConfig(**keys)


def _config(arm: dict[str, Any], model: Path) -> dict[str, Any]:
    (model / "model.safetensors").write_bytes(b"")
    (model / "config.json").write_text("{}")  # a checkpoint directory to the config check; nothing loads it
    return {"target": {"model": str(model)}, "arm": [{"use": "suffix", **arm}]}


def test_toml_keys_reach_the_config_and_errors_name_the_table_key(tmp_path: Path) -> None:
    registry = build_registry()
    parsed = parse_config(_config({"gamma": 6, "max_match": 8, "min_score": 1, "max_tokens": 1000}, tmp_path), registry)
    assert parsed.arms[0].draft.config == SuffixConfig(max_match=8, min_score=1.0, max_tokens=1000)
    assert parsed.arms[0].gamma == 6 and parsed.arms[0].name == "suffix-g6"
    with pytest.raises(ConfigError, match=r"\[arm.0\] key 'max_macth': unknown key for draft 'suffix'; allowed: max_match"):
        parse_config(_config({"max_macth": 8}, tmp_path), registry)
    with pytest.raises(ConfigError, match=r"\[arm.0\] key 'min_score': min_score must be a number in \(0, 1\]"):
        parse_config(_config({"min_score": 2}, tmp_path), registry)


# --- on the pipeline -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A context-dependent V = 16 model (init 0.3), saved in float32."""
    return tiny_lm(tmp_path_factory.mktemp("suffix") / "target", vocab=16, seed=0, init=0.3, dtype=torch.float32)


def _pipeline(target: Path, arm: dict[str, Any]) -> Any:
    return build_pipeline(one_arm_dict(target, arm))


PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [3, 4], [7, 8, 9, 1, 2, 3, 4, 5, 6, 2, 11]]


def test_greedy_output_is_the_target_alone(target: Path) -> None:
    alone = _pipeline(target, {"use": "none"})
    suffix = _pipeline(target, {"use": "suffix", "gamma": 4, "min_match": 1})
    accepted = 0
    for batch in ([PROMPTS[0]], PROMPTS, PROMPTS[1:], PROMPTS):  # later requests draw on earlier ones
        want = alone.generate(batch, max_new_tokens=40).token_ids
        result = suffix.generate(batch, max_new_tokens=40)
        assert result.token_ids == want
        accepted += sum(n for step in result.steps for n in step.accepted)
    assert accepted > 40  # the draft was not idle


@pytest.mark.parametrize("branches", [2, 3])
def test_greedy_tree_output_is_the_target_alone(target: Path, branches: int) -> None:
    """The hf target scores the suffix trees and the reference verifier walks them."""
    alone = _pipeline(target, {"use": "none"})
    suffix = _pipeline(target, {"use": "suffix", "gamma": 6, "min_match": 1, "branches": branches})
    trees, score_tree, shapes = [0], suffix.target.score_tree, set()

    def counted(*args: Any) -> Any:
        trees[0] += 1
        shapes.add(tuple(args[3].tolist()))
        return score_tree(*args)

    suffix.target.score_tree = counted
    accepted = 0
    for batch in ([PROMPTS[0]], PROMPTS, PROMPTS[1:], PROMPTS):
        want = alone.generate(batch, max_new_tokens=40).token_ids
        result = suffix.generate(batch, max_new_tokens=40)
        assert result.token_ids == want
        accepted += sum(n for step in result.steps for n in step.accepted)
    assert trees[0] > 10 and accepted > 40  # trees ran, and were accepted along their paths
    # a target capturing a graph per tree shape meets only the fan's first j chains, j >= 2
    assert shapes <= {tuple(fan_parents(fan_depths(6, branches)[:j])) for j in range(2, branches + 1)}
    sampled = suffix.generate(PROMPTS, max_new_tokens=12, temperature=0.9, top_k=6, seed=3)
    assert all(0 < len(ids) <= 12 and all(0 <= t < 16 for t in ids) for ids in sampled.token_ids)


def _mean_accepted(result: Any) -> float:
    accepted = [n for step in result.steps for n in step.accepted]
    return sum(accepted) / len(accepted)


def test_a_repeated_request_is_drafted_from_the_first(target: Path) -> None:
    """The second request repeats the first's output: drafted from the corpus, most of
    each proposal is accepted; without a corpus (max_tokens = 0) far less is."""
    prompt = [[5, 9, 2, 12, 7]]
    with_corpus = _pipeline(target, {"use": "suffix", "gamma": 4})
    without = _pipeline(target, {"use": "suffix", "gamma": 4, "max_tokens": 0})
    first = with_corpus.generate(prompt, max_new_tokens=48)
    without.generate(prompt, max_new_tokens=48)
    again, alone = with_corpus.generate(prompt, max_new_tokens=48), without.generate(prompt, max_new_tokens=48)
    assert again.token_ids == alone.token_ids == first.token_ids
    assert _mean_accepted(again) > 3.0
    assert _mean_accepted(again) > _mean_accepted(alone) + 1.0
