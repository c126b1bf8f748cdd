"""Hook specifications: discovery of components, observation of the decode loop.

The hot loop never calls a hook per token: it calls the chosen component's
protocol methods directly. The only per-step hook, ``flashspec_step_end``, gets a
record whose numbers the loop already had on the host.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from flashspec_core.contracts import ArmSelector, ComponentSpec, DraftProvider, StepRecord, Target, Verifier

PROJECT = "flashspec"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def flashspec_targets() -> Iterable[ComponentSpec[Target]]:
    """Return the Target components (model back-ends) this plugin provides.

    Called once when the registry is built; names are unique as for drafts.

    :returns: component specs whose factory is called as ``factory(config)``.
    """


@hookspec
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    """Return the DraftProvider components this plugin provides.

    Called once when the registry is built. Names must be unique across installed
    plugins; a clash is an error naming both plugins.

    :returns: component specs whose factory is called as
        ``factory(config, context)`` with a :class:`flashspec_core.contracts.DraftContext`.
    """


@hookspec
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    """Return the Verifier components this plugin provides.

    Called once when the registry is built; names are unique as for drafts.

    :returns: component specs whose factory is called as ``factory(config, device)``.
    """


@hookspec
def flashspec_arm_selectors() -> Iterable[ComponentSpec[ArmSelector]]:
    """Return the ArmSelector components this plugin provides.

    Called once when the registry is built; names are unique as for drafts.

    :returns: component specs whose factory is called as ``factory(config, num_arms)``.
    """


@hookspec
def flashspec_pipeline_built(pipeline: Any) -> None:
    """Observe a pipeline once it is assembled, before its first step.

    :param pipeline: the :class:`flashspec_core.pipeline.Pipeline`.
    """


@hookspec
def flashspec_step_end(record: StepRecord) -> None:
    """Observe one finished decode step.

    Called once per step after the step's single host read; implementations must
    be cheap and must not touch device tensors.

    :param record: the step's :class:`flashspec_core.contracts.StepRecord`.
    """
