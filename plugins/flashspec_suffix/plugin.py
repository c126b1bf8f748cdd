"""Registers the SuffixDecoding draft: continuations counted over past requests' sequences."""

from __future__ import annotations

from collections.abc import Iterable

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_suffix.suffix import SuffixConfig, make


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [
        ComponentSpec(
            name="suffix",
            kind="draft",
            factory=make,
            config_cls=SuffixConfig,
            description="proposes the most frequent continuation of the longest suffix matched in "
            "a suffix tree over past requests and the current batch (SuffixDecoding; no weights)",
        ),
    ]
