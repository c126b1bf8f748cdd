"""Registers the fast device path: target ``fast``, drafts ``fast`` and ``self``, verifier ``synthetic``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from flashspec_core import ComponentSpec, DraftProvider, Verifier, hookimpl
from flashspec_core.contracts import Target
from flashspec_fast.draft import make_draft
from flashspec_fast.keys import COMPONENTS
from flashspec_fast.selfdraft import make_self_draft
from flashspec_fast.synthetic import make_synthetic
from flashspec_fast.tp import make_fast_target

_FACTORIES: dict[tuple[str, str], Callable[..., Any]] = {
    ("target", "fast"): make_fast_target,
    ("draft", "fast"): make_draft,
    ("draft", "self"): make_self_draft,
    ("verifier", "synthetic"): make_synthetic,
}


@hookimpl
def flashspec_targets() -> Iterable[ComponentSpec[Target]]:
    return [ComponentSpec(k.name, "target", _FACTORIES["target", k.name], k.config_cls, k.description)
            for k in COMPONENTS if k.kind == "target"]


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [ComponentSpec(k.name, "draft", _FACTORIES["draft", k.name], k.config_cls, k.description)
            for k in COMPONENTS if k.kind == "draft"]


@hookimpl
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    return [ComponentSpec(k.name, "verifier", _FACTORIES["verifier", k.name], k.config_cls, k.description)
            for k in COMPONENTS if k.kind == "verifier"]
