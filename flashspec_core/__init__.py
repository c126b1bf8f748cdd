"""FlashSpec core: contracts, hookspecs, registry, config and the decode loop."""

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
from flashspec_core.hookspecs import hookimpl

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
