"""A CPU stand-in for CUDA's sync debug mode: reading a tensor's values into Python raises."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

READS = ("cpu", "item", "tolist", "numpy", "__int__", "__index__", "__float__", "__bool__")


@contextmanager
def no_host_reads(allowed: torch.Tensor) -> Iterator[None]:
    """Make every read of a tensor's values into Python raise, except of ``allowed`` (the
    pipeline's host copy) and its views: on CPU this stands in for CUDA's sync debug mode."""
    ptr = allowed.untyped_storage().data_ptr()
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def guard(name: str) -> Callable[..., object]:
        def read(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            if self.untyped_storage().data_ptr() != ptr:
                raise AssertionError(f"Tensor.{name} on a tensor other than the host copy {tuple(self.shape)}")
            return saved[name](self, *args, **kwargs)
        return read

    try:
        for name in READS:
            setattr(torch.Tensor, name, guard(name))
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)
