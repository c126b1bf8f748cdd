"""The fast target: one graph replay scores a step's ``gamma + 1`` slots per row.

Host traffic per step: one small host-to-device copy (each row's last token and
position, from a pinned buffer, asynchronous) and no device-to-host read at all;
the pipeline's single read of the verdict is the step's only sync. A tree step's
commit adds one such copy (the accepted paths) and one graph replay that moves
their keys and values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from flashspec_core.ragged import right_align
from flashspec_core.tree import MAX_MASK_NODES, TreeBlock, ancestor_bits, check_parents, node_depths
from flashspec_fast.graphs import GraphCache
from flashspec_fast.model import Transformer
from flashspec_fast.options import FastOptions, build_model
from flashspec_models.tokenizer import decode_ids, encode_prompt, load_tokenizer


def eos_ids(path: str | None, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    sources: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    for name in ("generation_config.json", "config.json"):
        if path is not None and (Path(path) / name).is_file():
            sources.append(json.loads((Path(path) / name).read_text()).get("eos_token_id"))
    for eos in sources:
        if isinstance(eos, int):
            ids.add(eos)
        elif eos is not None:
            ids.update(int(e) for e in eos)
    return ids


class HostInputs:
    """Small per-step index tensors, staged in pinned memory on CUDA and copied asynchronously.

    A pinned buffer is reused once the copy out of it has run (an event recorded after each
    copy says so): every step ends with the pipeline's sync, so across steps the one buffer
    per shape and dtype is always free, and a shape staged twice within a step (two runs of
    a join) gets a second buffer instead of overwriting the one the first copy may not have
    read yet.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: dict[tuple[object, ...], list[tuple[torch.Tensor, torch.cuda.Event]]] = {}

    def __call__(self, host: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return host.to(self.device)
        held = self._pinned.setdefault((*host.shape, host.dtype), [])
        free = next(((buf, done) for buf, done in held if done.query()), None)  # never recorded: free
        if free is None:
            free = (torch.empty(host.shape, dtype=host.dtype).pin_memory(), torch.cuda.Event())
            held.append(free)
        buf, done = free
        buf.copy_(host)
        out = buf.to(self.device, non_blocking=True)
        done.record()
        return out


def bucket(width: int, least: int = 4) -> int:
    """Widths are padded to a power of two (>= ``least``), so a few captured graphs serve every width."""
    return max(least, 1 << (width - 1).bit_length())


def ragged_inputs(tokens: torch.Tensor, starts: Sequence[int], stops: Sequence[int], width: int, scratch: int
                  ) -> torch.Tensor:
    """[3, B, width] int64: token ids, positions and cache write slots of ``tokens[b, starts[b]:stops[b]]``,
    right-aligned (each row's last token last); padding is token 0 at position 0 written to ``scratch``."""
    ids, pos = right_align(tokens, starts, stops, width)
    return torch.stack([ids, pos.clamp_min(0), torch.where(pos >= 0, pos, scratch)])


def ragged_forward(
    model: Transformer,
    tokens: torch.Tensor,
    starts: Sequence[int],
    stops: Sequence[int],
    stage: HostInputs,
    graphs: GraphCache | None = None,
) -> None:
    """Feed ``tokens[b, starts[b]:stops[b]]`` of every row at their positions (prefill and catch-up).

    Rows are right-aligned in one ``[B, W]`` forward, W a :func:`bucket`; padding writes go to
    the scratch slot. With ``graphs``, each (batch, W) is captured once and replayed.
    """
    batch = len(starts)
    need = max(max(e - s for s, e in zip(starts, stops, strict=True)), 0)
    if need == 0:
        return
    width = catch_up_width(need, model.scratch)
    dev = stage(ragged_inputs(tokens, starts, stops, width, model.scratch))
    span = model.span_for(max(stops))
    run = lambda d: model.forward(d[0], d[1], d[2], last_only=True, span=span)  # noqa: E731
    if graphs is None:
        run(dev)
    else:
        graphs(("ragged", batch, width, span), run, dev)


JOIN_ROWS = 8  # rows of one captured rows-forward (forward_rows): more are fed in several


def join_chunks(picked: Sequence[int], most: int = JOIN_ROWS) -> list[tuple[list[int], int]]:
    """``picked`` cut into runs of at most ``most`` rows, each with the power of two it is padded
    to (:func:`forward_rows`), so that a few captured graphs serve every number of rows."""
    out = []
    for i in range(0, len(picked), most):
        run = list(picked[i : i + most])
        out.append((run, padded_rows(len(run))))
    return out


def padded_rows(n: int) -> int:
    """The rows a run of ``n`` joining rows is padded to (:func:`join_chunks`): a power of two."""
    return 1 << (n - 1).bit_length()


def run_sizes(most: int = JOIN_ROWS) -> list[int]:
    """Every row count a run of :func:`join_chunks` can be padded to (1, 2, 4, ...): the
    rows-forward shapes a warm-up captures."""
    return sorted({padded_rows(n) for n in range(1, most + 1)})


def forward_rows(model: Transformer, tokens: torch.Tensor, picked: list[int], starts: Sequence[int],
                 stops: Sequence[int], width: int, stage: HostInputs, graphs: GraphCache | None = None) -> None:
    """Feed ``tokens[picked[i], starts[i]:stops[i]]`` into row ``picked[i]``'s own slots, in
    forwards over those rows alone, ``width`` wide: no other row is computed or written, so a
    few rows catch up without the whole batch padded to their width.

    The rows go in runs of at most :data:`JOIN_ROWS`, each padded to a power of two with
    entries that feed nothing (all padding, written to the first row's scratch slot), and with
    ``graphs`` each run is a replay of the graph captured for its (rows, width, span). As one
    eager forward, a join of one or two short prompts held the serving loop 30-50 ms between
    steps on the H100 at 32 clients, where a rebuild's captured prefill of ten took 6 ms."""
    span = model.span_for(max(stops))
    runs, parts, lo = join_chunks(picked), [], 0  # lo: the run's first index into picked, starts and stops
    for run, rows in runs:
        hi, pad = lo + len(run), rows - len(run)
        padded = run + [run[0]] * pad
        first, last = [*starts[lo:hi], *[0] * pad], [*stops[lo:hi], *[0] * pad]
        lo = hi
        host = ragged_inputs(tokens[padded], first, last, width, model.scratch)  # [3, R, W]
        parts.append(torch.cat([host.view(-1), torch.tensor(padded, dtype=torch.long)]))  # [3 R W + R]
    # every run's inputs in one host-to-device copy, sliced per run on the device
    staged, at = stage(torch.cat(parts)), 0
    for (_, rows), part in zip(runs, parts, strict=True):
        dev, at = staged[at : at + part.numel()], at + part.numel()
        run_fn = lambda d, r=rows: _rows_forward(model, d, r, width, span)  # noqa: E731
        if graphs is None:
            run_fn(dev)
        else:
            graphs(("rows", rows, width, span), run_fn, dev)


def _rows_forward(model: Transformer, dev: torch.Tensor, rows: int, width: int, span: int) -> None:
    inputs, index = dev[: 3 * rows * width].view(3, rows, width), dev[3 * rows * width :]
    model.forward(inputs[0], inputs[1], inputs[2], last_only=True, span=span, rows=index)


def catch_up_width(need: int, scratch: int) -> int:
    """The forward width that feeds ``need`` tokens per row: a :func:`bucket`, or the scratch
    slot's index (the widest forward, padding written to the scratch slot) where the bucket
    would reach it, so that a catch-up near the end of the cache uses one graph, not one per
    length."""
    return min(bucket(need), scratch)


PREFILL_MERGE = 512  # token positions of padding worth one more forward's fixed cost (prefill_groups)


def prefill_groups(stops: Sequence[int], scratch: int, merge_below: int = PREFILL_MERGE) -> list[tuple[int, list[int]]]:
    """Rows to prefill (``stops[b] > 0`` tokens each) grouped by the forward width that feeds them
    (:func:`catch_up_width`), narrowest first, as ``(width, rows)``. One forward right-aligns every
    row to the longest prompt's width: at 32 rows one prompt of 300 tokens among prompts of 50
    made the forward 32 x 512 positions, most of them padding. A group joins the next wider one
    where the padding that adds is under ``merge_below`` token positions (not worth a forward)."""
    by: dict[int, list[int]] = {}
    for b, n in enumerate(stops):
        if n > 0:
            by.setdefault(catch_up_width(n, scratch), []).append(b)
    widths = sorted(by)
    groups: list[tuple[int, list[int]]] = []
    carried: list[int] = []
    for i, width in enumerate(widths):
        rows = carried + by[width]
        if i + 1 < len(widths) and len(rows) * (widths[i + 1] - width) < merge_below:
            carried = rows
            continue
        groups.append((width, sorted(rows)))
        carried = []
    return groups


def tree_inputs(parents: Sequence[int]) -> torch.Tensor:
    """[2, N + 1] int64: each query's depth (0 for the root, the last committed token) and its
    ancestor bits over the tree block (0 for the root): a tree forward's per-shape inputs."""
    return torch.tensor([[0, *node_depths(parents)], [0, *ancestor_bits(parents)]], dtype=torch.long)


def path_moves(paths: torch.Tensor, starts: torch.Tensor, max_len: int, below: int | None = None) -> torch.Tensor:
    """The slot copies that compact each row's accepted tree nodes to a chain, on the device.

    Row ``b``'s tree block holds node ``n`` at slot ``starts[b] + n`` (``starts`` [B] int64);
    ``paths`` [B, D] int64 lists its accepted nodes in path order, -1 from its count on (with
    ``below``: a node ``>= below`` ends the kept prefix too). Kept node ``paths[b, i]`` moves to
    slot ``starts[b] + i``; every other column copies slot ``starts[b] + i`` onto itself, so the
    shape is fixed ([2, B * D]: a graph per (B, D)) and nothing is read back to the host.
    Returns flat ``b * max_len + slot`` sources then destinations for
    :meth:`~flashspec_fast.model.Transformer.move_slots`.
    """
    batch, depth = paths.shape
    ok = paths >= 0 if below is None else (paths >= 0) & (paths < below)
    keep = ok.long().cumprod(1) > 0  # [B, D]: the kept prefix
    cols = torch.arange(depth, device=paths.device)[None]  # [1, D]
    base = torch.arange(batch, device=paths.device)[:, None] * max_len + starts[:, None]  # [B, 1]
    src = base + torch.where(keep, paths, cols)
    return torch.stack([src.flatten(), (base + cols).expand(batch, -1).flatten()])


def kept_counts(paths: torch.Tensor, below: int | None = None) -> list[int]:
    """Per row, the nodes :func:`path_moves` keeps: ``paths`` is the pipeline's host copy of
    the verdict (CPU), so reading it costs no device sync."""
    stop = math.inf if below is None else below
    return [next((i for i, n in enumerate(row) if not 0 <= n < stop), len(row)) for row in paths.tolist()]


def move_path(model: Transformer, graphs: GraphCache, stage: HostInputs, paths: torch.Tensor, root: torch.Tensor,
              below: int | None = None) -> None:
    """Queue the compaction of ``paths`` [B, D] (host) after each row's ``root`` slot ([B] on the
    device: node ``n`` sits at ``root + 1 + n``): one staged copy and one graph replay per
    (B, D, below), no host read. ``stage`` must serve this call alone (one copy per step), so
    its pinned buffer is never rewritten while the previous step's copy may be in flight."""
    if paths.shape[1] == 0:
        return
    run = lambda p, r: model.move_slots(path_moves(p, r + 1, model.max_len, below))  # noqa: E731
    # Moving twice is not moving once (a slot a move filled is read again), so a capture warms
    # up on a path that keeps no node, whose moves copy each slot onto itself.
    idle = lambda p, r: (torch.full_like(p, -1), r)  # noqa: E731
    graphs(("path", *paths.shape, below), run, stage(paths), root, idle=idle)


def check_rows(rows: Sequence[int], batch: int, what: str) -> list[int]:
    """``rows`` as a list of distinct indices into a running batch of ``batch`` rows; a clear error if not."""
    picked = [int(b) for b in rows]
    if batch == 0:
        raise ValueError(f"{what}: no batch is running (prefill one first)")
    if not picked or len(set(picked)) != len(picked) or not all(0 <= b < batch for b in picked):
        raise ValueError(f"{what}: rows must be distinct indices in [0, {batch}), got {picked}")
    return picked


def check_room(model: Transformer, longest: int, what: str) -> None:
    if longest >= model.scratch:
        raise ValueError(
            f"{what}: a row reaches position {longest} but max_len = {model.max_len} "
            f"(one slot is scratch): raise max_len in the config"
        )


class FastTarget:
    """Target over a static KV cache; positions come from ``lengths`` each step.

    ``cached[b]``: slots ``0..cached[b]-1`` of row ``b`` hold the keys and values this target
    computed for the row's sequence, in every layer (its last token is fed by the next
    :meth:`score`). ``prefills`` counts the requests it started, ``allocations`` the caches
    it allocated. The self-speculative draft (:mod:`flashspec_fast.selfdraft`) reads them: it
    drafts on this cache, never writing below ``cached``, and drops its graphs over an old one.
    """

    def __init__(self, model: Transformer, tokenizer: Any, path: str | None, opts: FastOptions) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = opts.chat_template
        self.vocab = int(model.w.lm_head.shape[0])
        self.device = model.device
        self.eos_token_ids = eos_ids(path, tokenizer)
        self.graphs = GraphCache(model.device, opts.compile)
        self._stage = HostInputs(model.device)
        self._stage_path = HostInputs(model.device)  # commit_path's own: one copy per step
        self._root = torch.zeros(0, dtype=torch.long, device=model.device)  # [B]: the last score_tree's root slots
        self.cached: list[int] = []
        self.prefills = 0
        self.allocations = 0
        self._lengths: list[int] = []

    @property
    def max_context(self) -> int:
        """The longest sequence it scores (HasContext): ``max_len`` slots, one of them scratch."""
        return int(self.model.max_len) - 1

    @property
    def max_tree_nodes(self) -> int:
        """The most nodes of a tree it scores (LimitsTreeNodes): one int64 ancestor bitmask a node."""
        return MAX_MASK_NODES

    def fit(self, batch: int) -> None:
        """Make the cache hold ``batch`` rows; a reallocated (zeroed) cache drops the captured
        graphs and every cached row."""
        if self.model.allocate(batch):
            self.graphs.clear()
            self.cached = []
            self.allocations += 1

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.chat_template)

    def decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.tokenizer, ids)

    def prefill(self, tokens: torch.Tensor, lengths: Sequence[int]) -> None:
        """Write every prompt but its last token into the cache (ragged): one forward (a graph per
        shape) where the prompts need about one width, else forwards over each group of rows of about
        one length (:func:`prefill_groups`, :func:`forward_rows`), so short prompts are not padded
        to the longest."""
        self.fit(len(lengths))
        check_room(self.model, max(lengths), "prefill")
        self.cached = []
        stops = [n - 1 for n in lengths]
        groups = prefill_groups(stops, self.model.scratch, PREFILL_MERGE)
        if len(groups) <= 1:
            ragged_forward(self.model, tokens, [0] * len(lengths), stops, self._stage, self.graphs)
        else:
            for width, rows in groups:
                self._forward_rows(tokens, rows, [stops[b] for b in rows], width)
        self.cached = stops
        self.prefills += 1

    def _forward_rows(self, tokens: torch.Tensor, picked: list[int], stops: Sequence[int], width: int) -> None:
        """Feed the first ``stops[i]`` tokens of each row ``picked[i]`` into its own slots (:func:`forward_rows`)."""
        forward_rows(self.model, tokens, picked, [0] * len(picked), stops, width, self._stage, self.graphs)

    def prefill_rows(self, tokens: torch.Tensor, lengths: Sequence[int], rows: Sequence[int]) -> None:
        """Write the sequences of ``rows`` but their last tokens into those rows' slots
        (:class:`~flashspec_core.contracts.PrefillsRows`): forwards over those rows alone
        (:func:`forward_rows`, a captured graph per run of rows, width and span). No other
        row's slot is written and nothing is reallocated, so the captured graphs stay valid."""
        picked = check_rows(rows, len(self.cached), "prefill_rows")
        stops = [lengths[b] - 1 for b in picked]
        check_room(self.model, max(stops) + 1, "prefill_rows")
        need = max(stops)
        if need > 0:
            self._forward_rows(tokens, picked, stops, catch_up_width(need, self.model.scratch))
        for b, stop in zip(picked, stops, strict=True):
            self.cached[b] = stop

    def score(self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor) -> torch.Tensor:
        """Logits after each row's last token and after each draft token: [B, gamma+1, V]."""
        batch, gamma = draft_tokens.shape
        check_room(self.model, max(lengths) + gamma, "score")
        self._lengths = list(lengths)
        last = torch.tensor(lengths, dtype=torch.long) - 1
        host = torch.stack([tokens[:, : last.max() + 1].gather(1, last[:, None]).squeeze(1), last], dim=1)  # [B, 2]
        span = self.model.span_for(max(lengths) + gamma)
        run = lambda h, d: self._verify_forward(h, d, span)  # noqa: E731
        return self.graphs((batch, gamma, span), run, self._stage(host), draft_tokens)  # type: ignore[no-any-return]

    def _verify_forward(self, host: torch.Tensor, draft_tokens: torch.Tensor, span: int) -> torch.Tensor:
        gamma = draft_tokens.shape[1]
        ids = torch.cat([host[:, :1], draft_tokens], dim=1)  # [B, gamma+1]
        pos = host[:, 1:2] + torch.arange(gamma + 1, device=host.device)  # [B, gamma+1]
        return self.model.forward(ids, pos, pos, span=span)

    def score_tree(
        self, tokens: torch.Tensor, lengths: Sequence[int], draft_tokens: torch.Tensor, parents: torch.Tensor
    ) -> torch.Tensor:
        """Logits after each row's last token and after each tree node: [B, N+1, V].

        One forward (captured per batch, node count and span): the last token at its slot, node
        ``n`` at slot ``lengths[b] + n`` and position ``lengths[b] - 1 + depth``, each node seeing
        the row's sequence, its ancestors and itself (:class:`~flashspec_core.tree.TreeBlock`).
        The tree's shape (depths, ancestor bits) reaches the forward as data in the step's one
        staged copy, so a dynamic tree, whose shape changes at a fixed node count, replays one graph."""
        batch, nodes = draft_tokens.shape
        plist = check_parents(parents)
        if len(plist) != nodes or nodes == 0:
            raise ValueError(f"score_tree: parents has {len(plist)} nodes, draft_tokens {tuple(draft_tokens.shape)} "
                             "(at least one node)")
        check_room(self.model, max(lengths) + nodes, "score_tree")
        self._lengths = list(lengths)
        last = torch.tensor(lengths, dtype=torch.long) - 1
        ids = tokens[:, : last.max() + 1].gather(1, last[:, None]).squeeze(1)
        host = torch.cat([ids, last, tree_inputs(plist).flatten()])  # one staged copy: [2B + 2(N+1)]
        span = self.model.span_for(max(lengths) + nodes)
        run = lambda h, d: self._tree_forward(h, d, span)  # noqa: E731
        dev = self._stage(host)
        self._root = dev[batch : 2 * batch]  # commit_path's: no second copy of the lengths
        # no part of the shape in the key: it is data in dev, so every tree of N nodes shares a graph
        return self.graphs(("tree", batch, nodes, span), run, dev, draft_tokens)  # type: ignore[no-any-return]

    def _tree_forward(self, host: torch.Tensor, draft_tokens: torch.Tensor, span: int) -> torch.Tensor:
        batch, nodes = draft_tokens.shape
        last, shape = host[batch : 2 * batch], host[2 * batch :].view(2, nodes + 1)
        ids = torch.cat([host[:batch, None], draft_tokens], dim=1)  # [B, N+1]
        pos = last[:, None] + shape[0][None]  # the root at its position, a node at its depth's
        write = last[:, None] + torch.arange(nodes + 1, device=host.device)  # nodes after the root
        block = TreeBlock(start=last + 1, bits=shape[1][None].expand(batch, -1).contiguous(), nodes=nodes)
        return self.model.forward(ids, pos, write, span=span, tree=block)

    def commit_path(self, paths: torch.Tensor) -> None:
        """Keep the accepted path of the last :meth:`score_tree` (``paths`` [B, D] node ids, -1
        padded): its nodes' keys and values move, in every layer, to the slots right after each
        row's last token, where a chain forward of them would have written them; ``cached`` ends
        after them, so no later forward reads a slot of a rejected branch before rewriting it.

        ``paths`` is the pipeline's host copy of the verdict: the moves are computed and made on
        the device (:func:`move_path`), and only the kept counts are read here, on the host."""
        move_path(self.model, self.graphs, self._stage_path, paths, self._root)
        self.cached = [n + k for n, k in zip(self._lengths, kept_counts(paths), strict=True)]

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Nothing to move: the next :meth:`score` starts each row at ``lengths[b] - 1``,
        below any rejected slot, and rewrites what it reads (see :mod:`flashspec_fast.model`).
        Only ``cached`` advances, over the last token and the accepted drafts."""
        self.cached = [n + k for n, k in zip(self._lengths, num_accepted, strict=True)]


def make_target(opts: FastOptions) -> FastTarget:
    model, path = build_model(opts)
    tokenizer = load_tokenizer(path) if path is not None else None
    return FastTarget(model, tokenizer, path, opts)
