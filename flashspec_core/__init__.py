"""FlashSpec core: contracts, hookspecs, registry, config and the decode loop."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flashspec_core.hookspecs import hookimpl

if TYPE_CHECKING:
    from flashspec_core.contracts import (
        ArmSelector,
        ComponentSpec,
        Draft,
        DraftProvider,
        SamplingParams,
        StepRecord,
        Verdict,
        Verifier,
    )

__all__ = [
    "ArmSelector",
    "ComponentSpec",
    "Draft",
    "DraftProvider",
    "SamplingParams",
    "StepRecord",
    "Verdict",
    "Verifier",
    "hookimpl",
]


def __getattr__(name: str) -> Any:
    # The contracts import torch, loaded on first use: the command line checks its
    # options and config file, and refuses bad ones, without waiting for torch.
    if name in __all__:
        from flashspec_core import contracts

        return getattr(contracts, name)
    raise AttributeError(f"module 'flashspec_core' has no attribute {name!r}")
