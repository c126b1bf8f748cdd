"""The ``suffix`` draft's name and config keys, without torch (:class:`~flashspec_core.config.ComponentKeys`)."""

from __future__ import annotations

import math
from typing import Any

import attrs

from flashspec_core.config import ComponentKeys

MAX_MATCH = 256  # longest allowed max_match: each token a row appends costs O(max_match)
MAX_BRANCHES = 64  # as many as an arm's largest gamma has nodes


def _whole(lo: int, hi: int | None = None) -> Any:
    """An attrs validator: an integer (not a bool) in ``lo..hi``."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            span = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"{attr.name} must be an integer {span}, got {value!r}")

    return check


def _as_float(value: object) -> object:
    """Ints become floats; anything else is left for the validator to refuse."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _score(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, float) or not (0.0 < value <= 1.0) or not math.isfinite(value):
        raise ValueError(f"{attr.name} must be a number in (0, 1], got {value!r}")


@attrs.frozen
class SuffixConfig:
    """``max_match``: longest suffix matched (the tree holds ``max_match + 1`` tokens per
    suffix); ``min_match``: shortest suffix that may start a proposal; ``min_score``: a
    token is proposed only while the product of the count ratios up to it is at least
    this; ``max_tokens``: corpus budget in tokens (0: forget each request when the next
    starts, keeping only the current batch's rows); ``branches``: with ``k > 1``, propose a
    tree whose nodes have up to ``k`` children, the most frequent continuations."""

    max_match: int = attrs.field(default=16, validator=_whole(1, MAX_MATCH))
    min_match: int = attrs.field(default=2, validator=_whole(1, MAX_MATCH))
    min_score: float = attrs.field(default=0.1, converter=_as_float, validator=_score)
    max_tokens: int = attrs.field(default=1 << 20, validator=_whole(0))
    branches: int = attrs.field(default=1, validator=_whole(1, MAX_BRANCHES))

    def __attrs_post_init__(self) -> None:
        if self.min_match > self.max_match:
            raise ValueError(f"min_match ({self.min_match}) must be <= max_match ({self.max_match})")


COMPONENTS = (
    ComponentKeys("draft", "suffix", SuffixConfig,
                  "proposes the most frequent continuation of the longest suffix matched in "
                  "a suffix tree over past requests and the current batch (SuffixDecoding; no weights)"),
)
