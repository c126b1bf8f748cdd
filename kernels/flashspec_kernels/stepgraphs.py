"""Replay a captured verify step where launching it from Python costs more than running it.

A verify step is three Triton launches plus a few small tensor ops. On the H200 the
GPU work of a batch-1 step over 152k logits is ~35 us, while the launches from Python
take 100-250 us (docs/benchmarks/verify-kernels-h200.json: ``triton_graph_ms`` against
``triton_ms``). For logits of up to :data:`GRAPH_MAX_BYTES` bytes, the first call of a
shape captures the step in a CUDA graph over static inputs; later calls copy their
inputs in (cheap at these sizes), replay, and return copies of the outputs. Larger
inputs, CPU tensors, and calls made while the caller is itself capturing a graph run
the kernels directly.

The replayed graph is the same kernels with the same arguments, so its verdicts are
the direct launch's, token for token (the GPU script checks this).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import torch

from flashspec_core.contracts import Verdict
from flashspec_core.cudagraph import capture

# Logits of up to this many bytes: copy in and replay. In the H200 runs a graph replay plus a
# device copy of the logits beat the direct launches for every shape up to 93 MiB of logits and
# lost for every shape from 185 MiB (verify-kernels-h200-analysis.json, graph_threshold).
GRAPH_MAX_BYTES = 96 << 20
MAX_GRAPHS = 32  # captured shapes kept (least recently used dropped)

Step = Callable[..., Verdict]


class StepGraphs:
    """``graphs(key, step, *inputs)``: ``step(*inputs)``, replayed from a graph when it pays."""

    def __init__(self, max_bytes: int = GRAPH_MAX_BYTES, max_graphs: int = MAX_GRAPHS) -> None:
        self.max_bytes = max_bytes
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Verdict]] = OrderedDict()
        self._pool: Any = None

    def __len__(self) -> int:
        return len(self._graphs)

    def wanted(self, logits: torch.Tensor) -> bool:
        return (
            self.max_bytes > 0
            and logits.is_cuda
            and logits.numel() * logits.element_size() <= self.max_bytes
            and not torch.cuda.is_current_stream_capturing()
        )

    def __call__(self, key: Hashable, step: Step, *inputs: torch.Tensor) -> Verdict:
        full_key = (key, *((tuple(t.shape), t.dtype, t.device) for t in inputs))
        entry = self._graphs.get(full_key)
        if entry is None:
            entry = self._capture(step, inputs)
            self._graphs[full_key] = entry
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(full_key)
        graph, static, out = entry
        for dst, src in zip(static, inputs, strict=True):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return Verdict(tokens=out.tokens.clone(), num_accepted=out.num_accepted.clone())

    def _capture(self, step: Step, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Verdict]:
        static = [t.clone() for t in inputs]
        graph, out = capture(step, static, self._pool, warmups=1)  # the warm-up compiles the kernels
        self._pool = graph.pool()
        return graph, static, out
