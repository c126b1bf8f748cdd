"""One CUDA-graph capture, shared by the fast back-end's graphs and the Triton verifier's step graphs,
and the host-to-device copy that does not wait for the device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def capture(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], pool: Any, warmups: int
            ) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Capture ``fn(*inputs)`` into a graph on ``pool`` (None: a new one; the graph's
    ``pool()`` serves the next capture) after ``warmups`` runs on a side stream (lazy inits,
    compiled kernels, cuBLAS workspaces); returns the graph and the outputs it writes."""
    side = torch.cuda.Stream(device=inputs[0].device)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*inputs)
    return graph, out


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` on ``device`` without a host sync: on CUDA through pinned memory, copied
    asynchronously (the caching host allocator keeps the pinned block until the copy is done).

    A plain ``host.to("cuda")`` from pageable memory waits until every kernel queued on the
    stream has run, so inside a step it stalls the host behind the device's queued work."""
    if device.type != "cuda" or host.device.type != "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
