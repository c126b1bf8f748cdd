"""Registers the weightless drafts: prompt lookup (n-gram) and ``none`` (gamma = 0)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_lookup.keys import COMPONENTS
from flashspec_lookup.lookup import make, make_none

_FACTORIES: dict[str, Callable[..., DraftProvider]] = {"prompt_lookup": make, "none": make_none}


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [ComponentSpec(k.name, "draft", _FACTORIES[k.name], k.config_cls, k.description) for k in COMPONENTS]
