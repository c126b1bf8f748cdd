"""Manual CUDA-graph capture, one graph per input shape (batch bucket, width).

A captured function reads only its tensor arguments and the model's persistent
buffers (weights, KV cache), so replaying it after copying new inputs into the
captured ones re-runs the whole forward with one launch and no host work per
kernel. Off the GPU, or with capture disabled, the function simply runs.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from flashspec_core.cudagraph import capture


class GraphCache:
    """``cache(key, fn, *args)``: run ``fn(*args)`` through the graph captured for ``key``.

    All graphs of one cache share a memory pool; they never run concurrently and
    each one's outputs stay alive (held here). A returned output is the graph's own
    buffer: it is valid until the same key is replayed again, and until any other graph
    of the cache replays, since a graph captured later may have been given memory that
    an earlier one uses for its temporaries. Read an output before the next replay of
    the same cache, or keep the graphs whose outputs must outlive it in a cache of their
    own (as a draft does beside its target).
    """

    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.enabled = enabled and device.type == "cuda"
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]] = {}
        self._pool: Any = None
        self.captures = 0  # graphs captured so far, kept across clear(): a capture inside a timed run costs 0.1-0.5 s
        self.keys: set[Hashable] = set()  # every key asked for, captured or (off the GPU) run directly
        self.captured: list[Hashable] = []  # the key of each capture, in order: a server names what it missed

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pool = None  # freed with its last graph: a capture into it would fail an allocator assert

    def __call__(self, key: Hashable, fn: Callable[..., Any], *args: torch.Tensor,
                 idle: Callable[..., Sequence[torch.Tensor]] | None = None) -> Any:
        """``idle(*args)``: inputs on which ``fn`` changes nothing, for an ``fn`` that changes state
        in place and is not idempotent (a slot move): a capture's warm-ups run ``fn``, so on
        ``args`` the first call would make the change three times; on ``idle`` they make none
        and the replay makes it once."""
        if not self.enabled:
            self.keys.add(key)
            return fn(*args)
        entry = self._graphs.get(key)
        if entry is None:  # a key asked for is captured or already held: record it here, off the replay path
            self.keys.add(key)
            entry = self._graphs[key] = self._capture(fn, args if idle is None else tuple(idle(*args)))
            self.captures += 1
            self.captured.append(key)
        graph, inputs, out = entry
        for dst, src in zip(inputs, args, strict=True):
            dst.copy_(src, non_blocking=True)
        graph.replay()
        return out

    def _capture(self, fn: Callable[..., Any], args: tuple[torch.Tensor, ...]) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor], Any]:
        inputs = [a.clone() for a in args]
        graph, out = capture(fn, inputs, self._pool, warmups=2)
        self._pool = graph.pool()
        return graph, inputs, out


def reach(top: int, longest: int | None) -> int:
    """The furthest slot a prewarm bounded to sequences of ``longest`` tokens warms, in a
    cache of ``top`` usable slots; the spans up to it are those such sequences meet."""
    if longest is not None and longest < 1:
        raise ValueError(f"prewarm: longest {longest} must be >= 1 (None: every span of the cache)")
    return top if longest is None else min(top, longest)
