"""Plugin manager: built-in plugins and entry points, component name -> spec.

Built-in plugins are listed by module name in :data:`BUILTIN_PLUGINS` and are
registered exactly like third-party ones, which are found through the entry-point
group ``flashspec``. ``FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points
(tests use it so that whatever happens to be installed cannot change them).
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import os
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import attrs
import pluggy

from flashspec_core import hookspecs
from flashspec_core.contracts import ComponentKind, ComponentSpec

BUILTIN_PLUGINS: tuple[str, ...] = (
    "flashspec_reference.plugin",
    "flashspec_selectors.plugin",
    "flashspec_hf.plugin",
    "flashspec_lookup.plugin",
    "flashspec_triton.plugin",
    "flashspec_fast.plugin",
)
ENTRY_POINT_GROUP = "flashspec"
AUTOLOAD_ENV = "FLASHSPEC_DISABLE_PLUGIN_AUTOLOAD"

_HOOK_OF_KIND: dict[ComponentKind, str] = {
    "target": "flashspec_targets",
    "draft": "flashspec_draft_providers",
    "verifier": "flashspec_verifiers",
    "selector": "flashspec_arm_selectors",
}


class PluginError(Exception):
    """A plugin could not be loaded, or two plugins clash."""


@attrs.frozen
class Provided:
    """A component together with the plugin that provides it."""

    spec: ComponentSpec[Any]
    plugin: str  # plugin name as registered (module or entry-point name)
    distribution: str
    version: str


class Registry:
    """Every installed component by kind and name."""

    def __init__(self, manager: pluggy.PluginManager, dists: dict[str, tuple[str, str]]) -> None:
        self.manager = manager
        self._components: dict[ComponentKind, dict[str, Provided]] = {k: {} for k in _HOOK_OF_KIND}
        for kind, hook_name in _HOOK_OF_KIND.items():
            hook = getattr(manager.hook, hook_name)
            for impl in hook.get_hookimpls():
                plugin_name = manager.get_name(impl.plugin) or repr(impl.plugin)
                dist, version = dists.get(plugin_name, ("unknown", "unknown"))
                for spec in impl.function() or ():
                    self._add(kind, Provided(spec, plugin_name, dist, version))

    def _add(self, kind: ComponentKind, item: Provided) -> None:
        if item.spec.kind != kind:
            raise PluginError(f"plugin {item.plugin!r} returned {item.spec.kind} {item.spec.name!r} from the {kind} hook")
        table = self._components[kind]
        if item.spec.name in table:
            other = table[item.spec.name]
            raise PluginError(
                f"{kind} component name {item.spec.name!r} is provided by two plugins: "
                f"{other.plugin!r} ({other.distribution}) and {item.plugin!r} ({item.distribution})"
            )
        table[item.spec.name] = item

    def get(self, kind: ComponentKind, name: str) -> ComponentSpec[Any]:
        table = self._components[kind]
        if name not in table:
            known = ", ".join(sorted(table)) or "none"
            raise KeyError(f"unknown {kind} component {name!r}; installed: {known}")
        return table[name].spec

    def names(self, kind: ComponentKind) -> list[str]:
        return sorted(self._components[kind])

    def all(self) -> Iterable[tuple[ComponentKind, Provided]]:
        for kind, table in self._components.items():
            for name in sorted(table):
                yield kind, table[name]


def _own_version() -> str:
    try:
        return md.version("flashspec")
    except md.PackageNotFoundError:
        return "0+unknown"


def build_registry(extra_plugins: Iterable[object] = (), autoload: bool | None = None) -> Registry:
    """Register built-ins, entry points (unless disabled) and ``extra_plugins``."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    dists: dict[str, tuple[str, str]] = {}
    own = ("flashspec", _own_version())
    for modname in BUILTIN_PLUGINS:
        module = _import_plugin(modname)
        pm.register(module, name=modname)
        dists[modname] = own
    if autoload is None:
        autoload = not os.environ.get(AUTOLOAD_ENV)
    if autoload:
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must name itself
                raise PluginError(f"cannot load flashspec plugin {ep.name!r} ({ep.value}): {exc}") from exc
            pm.register(plugin, name=ep.name)
            dist = ep.dist
            dists[ep.name] = (dist.name, dist.version) if dist is not None else ("unknown", "unknown")
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        pm.register(plugin, name=name)
        dists[name] = ("(registered in code)", "-")
    return Registry(pm, dists)


def _import_plugin(modname: str) -> ModuleType:
    try:
        return importlib.import_module(modname)
    except ImportError as exc:
        raise PluginError(f"built-in plugin {modname!r} failed to import: {exc}") from exc
