"""The lookup drafts' names and config keys, without torch (:class:`~flashspec_core.config.ComponentKeys`)."""

from __future__ import annotations

import attrs

from flashspec_core.config import ComponentKeys


@attrs.frozen
class LookupConfig:
    """``fill = false`` proposes only what a match provides: fewer than gamma tokens
    when the continuation is shorter, none (a plain decoding step) without a match of
    at least ``min_ngram`` tokens. ``fill = true`` pads to gamma by repeating."""

    max_ngram: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    min_ngram: int = attrs.field(default=1, validator=attrs.validators.ge(1))
    window: int = attrs.field(default=4096, validator=attrs.validators.ge(2))
    fill: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    branches: int = attrs.field(default=1, validator=[attrs.validators.instance_of(int), attrs.validators.ge(1)])

    def __attrs_post_init__(self) -> None:
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram ({self.min_ngram}) must be <= max_ngram ({self.max_ngram})")


COMPONENTS = (
    ComponentKeys("draft", "prompt_lookup", LookupConfig,
                  "copies the continuation of the longest recent n-gram match (no weights)"),
    ComponentKeys("draft", "none", None, "no speculation: the gamma = 0 arm (plain target decoding)"),
)
