"""Registers the SuffixDecoding draft: continuations counted over past requests' sequences."""

from __future__ import annotations

from collections.abc import Iterable

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_suffix.keys import COMPONENTS
from flashspec_suffix.suffix import make


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [ComponentSpec(k.name, "draft", make, k.config_cls, k.description) for k in COMPONENTS]
