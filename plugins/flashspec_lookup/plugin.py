"""Registers the weightless drafts: prompt lookup (n-gram) and ``none`` (gamma = 0)."""

from __future__ import annotations

from collections.abc import Iterable

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_lookup.lookup import LookupConfig, make, make_none


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [
        ComponentSpec(
            name="prompt_lookup",
            kind="draft",
            factory=make,
            config_cls=LookupConfig,
            description="copies the continuation of the longest recent n-gram match (no weights)",
        ),
        ComponentSpec(
            name="none",
            kind="draft",
            factory=make_none,
            description="no speculation: the gamma = 0 arm (plain target decoding)",
        ),
    ]
