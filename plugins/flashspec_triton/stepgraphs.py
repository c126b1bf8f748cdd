"""Replay a captured verify step where launching it from Python costs more than running it.

A verify step is three Triton launches plus a few small tensor ops. On the H200 the
GPU work of a batch-1 step over 152k logits is ~35 us, while the launches from Python
take 100-250 us (docs/benchmarks/verify-kernels-h200.json: ``triton_graph_ms`` against
``triton_ms``). Two kinds of graph serve a step:

* *Pinned*: the engine's logits sit in the target's static output buffer, so the same
  address comes back step after step. The second call whose large inputs (at least
  :data:`PIN_MIN_BYTES`: logits, draft probabilities, exact-mode noise) have the same
  addresses, shapes, strides and dtypes captures a graph that reads them where they are;
  later calls with those addresses copy only the small inputs (draft tokens, uniforms,
  the philox state) and replay. Nothing is copied per logit, so this pays at any size.
  The graph keeps no reference to the caller's tensors: it is only replayed while a
  caller's live tensor occupies exactly the captured addresses with the captured layout,
  and then it reads that tensor.
* *Copied*: other calls with logits of up to :data:`GRAPH_MAX_BYTES` bytes capture a
  graph over static copies of every input once per shape; later calls copy their inputs
  in (cheap at these sizes) and replay.

Each kind is kept least recently used first, :data:`MAX_PINNED` pinned graphs and
:data:`MAX_GRAPHS` copied ones (these hold copies of their inputs).

Larger inputs seen for the first time, CPU tensors, and calls made while the caller is
itself capturing a graph run the kernels directly. Either way the outputs are copies
(the graph's own buffers are rewritten by the next replay).

The replayed graph is the same kernels with the same arguments, so its verdicts are
the direct launch's, token for token (benchmarks/verify_kernels.py checks this on the GPU,
including new contents at a pinned address).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs
import torch

from flashspec_core.cudagraph import capture

# Logits of up to this many bytes, at an address not seen before: copy in and replay. In the H200
# runs a graph replay plus a device copy of the logits beat the direct launches for every shape up
# to 93 MiB of logits; from 141 MiB some shapes won and some lost, and every shape from 282 MiB lost
# (verify-kernels-h200-analysis.json, graph_threshold, at 34a9907).
GRAPH_MAX_BYTES = 96 << 20
MAX_GRAPHS = 32  # copied graphs kept (least recently used dropped): each holds copies of its inputs
# Pinned graphs kept: they hold no input copies, and a server meets one per batch size, draft
# width and target span (each span's forward writes its logits at its own address), far more
# than 32: evicting them there meant a capture on every few steps.
MAX_PINNED = 512
# Inputs of at least this many bytes are read in place by a pinned graph and key it by address;
# smaller ones (tokens, uniforms, the philox state: a new tensor each step) are copied in.
PIN_MIN_BYTES = 1 << 20
SEEN = 1024  # pinned keys remembered after one sighting (least recently seen dropped)

# A step returns tensors, attrs records of tensors (Verdict, TreeVerdict), or tuples of these.
Step = Callable[..., Any]
# key -> (graph, static copies (None where a pinned graph reads the caller's input), outputs)
Graphs = OrderedDict[Hashable, tuple[Any, list[torch.Tensor | None], Any]]
Capture = Callable[[Step, Sequence[torch.Tensor], Any, int], tuple[Any, Any]]


def _clone(out: Any) -> Any:
    """A copy of a step's output whose tensors the next replay does not overwrite."""
    if out is None:  # an optional field (Verdict.flags) the step left unset
        return None
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_clone(x) for x in out)
    return attrs.evolve(out, **{f.name: _clone(getattr(out, f.name)) for f in attrs.fields(type(out))})


class StepGraphs:
    """``graphs(key, step, *inputs)``: ``step(*inputs)``, replayed from a graph when it pays."""

    def __init__(
        self,
        max_bytes: int = GRAPH_MAX_BYTES,
        max_graphs: int = MAX_GRAPHS,
        pin: bool = True,
        capture_fn: Capture = capture,
        max_pinned: int = MAX_PINNED,
    ) -> None:
        self.max_bytes = max_bytes  # 0: never replay a graph
        self.max_graphs = max_graphs
        self.max_pinned = max_pinned
        self.pin = pin
        self._capture_fn = capture_fn
        self._graphs: Graphs = OrderedDict()  # copied graphs
        self._pinned: Graphs = OrderedDict()
        self._seen: OrderedDict[Hashable, None] = OrderedDict()
        self._pool: Any = None
        self.pinned_replays = 0  # counters for benchmarks and tests
        self.copied_replays = 0
        # What a :class:`~flashspec_core.contracts.CapturesGraphs` cache exposes: a step that
        # captures is not learned from by the selector, and a server logs captures while serving.
        self.captures = 0
        self.captured: list[Hashable] = []

    def __len__(self) -> int:
        return len(self._graphs) + len(self._pinned)

    @property
    def keys(self) -> set[Hashable]:
        """Every key replayed or captured: a key is captured before it is replayed."""
        return set(self.captured)

    def usable(self, logits: torch.Tensor) -> bool:
        """Whether this call may replay a graph at all."""
        return self.max_bytes > 0 and logits.is_cuda and not torch.cuda.is_current_stream_capturing()

    def wanted(self, logits: torch.Tensor) -> bool:
        """Whether a call with these logits copies its inputs into a graph when not pinned."""
        return self.usable(logits) and logits.numel() * logits.element_size() <= self.max_bytes

    def __call__(self, key: Hashable, step: Step, *inputs: torch.Tensor) -> Any:
        if not self.usable(inputs[0]):
            return step(*inputs)
        layout = (key, *((tuple(t.shape), t.stride(), t.dtype, t.device) for t in inputs))
        big = [i for i, t in enumerate(inputs) if t.numel() * t.element_size() >= PIN_MIN_BYTES] if self.pin else []
        if big:
            pin_key = (layout, tuple(inputs[i].data_ptr() for i in big))
            if pin_key in self._pinned or pin_key in self._seen:
                self.pinned_replays += 1
                return self._replay(self._pinned, self.max_pinned, pin_key, step, inputs, big)
            self._seen[pin_key] = None
            while len(self._seen) > SEEN:
                self._seen.popitem(last=False)
        if not self.wanted(inputs[0]):
            return step(*inputs)
        self.copied_replays += 1
        return self._replay(self._graphs, self.max_graphs, (layout, None), step, inputs, [])

    def _replay(self, graphs: Graphs, most: int, key: Hashable, step: Step, inputs: Sequence[torch.Tensor],
                pinned: list[int]) -> Any:
        entry = graphs.get(key)
        if entry is None:
            static = [None if i in pinned else t.clone() for i, t in enumerate(inputs)]
            args = [t if s is None else s for s, t in zip(static, inputs, strict=True)]
            # the warm-up compiles the kernels; the graph reads args' addresses, not the tensors
            graph, out = self._capture_fn(step, args, self._pool, 1)
            self._pool = graph.pool()
            entry = (graph, static, out)
            graphs[key] = entry
            self.captures += 1
            self.captured.append(key)
            self._seen.pop(key, None)
            while len(graphs) > most:
                graphs.popitem(last=False)
        else:
            graphs.move_to_end(key)
        graph, static, out = entry
        for dst, src in zip(static, inputs, strict=True):
            if dst is not None:
                dst.copy_(src, non_blocking=True)
        graph.replay()
        return _clone(out)
