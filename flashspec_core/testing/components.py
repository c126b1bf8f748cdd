"""Registered components by name, built from a dict of their config keys (the contract suites' loader)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from flashspec_core.contracts import ComponentKind, ComponentSpec
from flashspec_core.registry import build_registry


def component_names(kind: ComponentKind) -> list[str]:
    """Every registered component of ``kind``: built-ins and (unless disabled) installed plugins."""
    return build_registry().names(kind)


def component_spec(kind: ComponentKind, name: str) -> ComponentSpec[Any]:
    return build_registry().get(kind, name)


def component_config(spec: ComponentSpec[Any], keys: Mapping[str, Any] | None = None) -> Any:
    """``spec``'s config class built from ``keys`` (its TOML keys); ``None`` for a component without keys."""
    if spec.config_cls is None:
        if keys:
            raise ValueError(f"{spec.kind} {spec.name!r} takes no config keys, got {dict(keys)}")
        return None
    return spec.config_cls(**(keys or {}))


def takes_seed(spec: ComponentSpec[Any]) -> bool:
    """Whether ``spec``'s config class has a ``seed`` key (a selector that draws random numbers)."""
    return spec.config_cls is not None and "seed" in inspect.signature(spec.config_cls).parameters
