"""The ``triton`` verifier's name and config keys, without torch or triton
(:class:`~flashspec_core.config.ComponentKeys`)."""

from __future__ import annotations

import os
from typing import Literal

import attrs

from flashspec_core import machine
from flashspec_core.config import ComponentKeys


@attrs.frozen
class TritonVerifierConfig:
    """``[verifier] use = "triton"`` keys."""

    noise: Literal["exact", "philox"] = attrs.field(
        default="philox", validator=attrs.validators.in_(("exact", "philox"))
    )
    # philox mode's draw of the recovered / bonus token: "auto" takes the two-stage draw at
    # large batch and vocabulary only (flashspec_kernels.verify, "Philox draws"); same law either way
    philox_draw: Literal["auto", "one_stage", "two_stage"] = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "one_stage", "two_stage"))
    )
    programs: int = attrs.field(default=0, converter=int, validator=attrs.validators.ge(0))  # 0 = auto
    graph_max_bytes: int = attrs.field(default=96 << 20, converter=int, validator=attrs.validators.ge(0))  # 0 = never
    # replay without copying the logits when they come back at the same address (stepgraphs)
    graph_pin: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))


def _unusable_here() -> str | None:
    """Told before torch only where CUDA is certainly absent; the build still checks the target's device."""
    absent = None if os.environ.get("TRITON_INTERPRET") == "1" else machine.no_cuda()
    if absent is None:
        return None
    return (f"its Triton kernels need a CUDA GPU and {absent}: use = \"reference\" (or \"auto\", which takes "
            "triton only on CUDA), or set TRITON_INTERPRET=1 to run them through Triton's interpreter")


COMPONENTS = (
    ComponentKeys("verifier", "triton", TritonVerifierConfig,
                  "Triton rejection sampler: one pass over the logits, no host sync", _unusable_here),
)
