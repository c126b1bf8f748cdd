"""Plugin discovery: built-ins like third parties, clashes named, listing."""

from __future__ import annotations

import json
import types

import pytest

from flashspec_core import ComponentSpec, hookimpl
from flashspec_core.cli import main
from flashspec_core.registry import PluginError, build_registry


def _plugin(name: str) -> types.SimpleNamespace:
    @hookimpl
    def flashspec_arm_selectors():
        return [ComponentSpec(name=name, kind="selector", factory=lambda c, k: None)]

    mod = types.ModuleType(f"acme_{name}")
    mod.flashspec_arm_selectors = flashspec_arm_selectors
    return mod


def test_builtins_present() -> None:
    reg = build_registry()
    assert {"reference", "triton"} <= set(reg.names("verifier"))
    assert {"fixed", "ucb1", "thompson", "sliding_window_ucb", "discounted_thompson"} <= set(reg.names("selector"))
    assert {"hf", "fast", "prompt_lookup", "none"} <= set(reg.names("draft"))
    assert {"hf", "fast"} <= set(reg.names("target"))


def test_third_party_component_is_found() -> None:
    reg = build_registry(extra_plugins=[_plugin("greedy_first")])
    assert "greedy_first" in reg.names("selector")


def test_name_clash_names_both_plugins() -> None:
    with pytest.raises(PluginError, match=r"'ucb1' is provided by two plugins: 'flashspec_selectors.plugin' \(flashspec-engine\) and 'acme_ucb1'"):
        build_registry(extra_plugins=[_plugin("ucb1")])


def test_entry_points_are_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = _plugin("from_entry_point")

    class EP:
        name, value = "acme", "acme.plugin"
        dist = types.SimpleNamespace(name="flashspec-acme", version="1.2.3")

        def load(self):
            return plugin

    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [EP()] if group == "flashspec" else [])
    reg = build_registry(autoload=True)
    found = {p.spec.name: p for _, p in reg.all()}
    assert found["from_entry_point"].distribution == "flashspec-acme"
    assert found["from_entry_point"].version == "1.2.3"


def test_plugins_command_lists_every_component(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plugins", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {(r["kind"], r["name"]) for r in rows}
    assert ("verifier", "reference") in names and ("draft", "prompt_lookup") in names
    assert all(r["distribution"].startswith("flashspec-engine ") for r in rows)


def test_a_misspelled_hookimpl_names_its_plugin() -> None:
    @hookimpl
    def flashspec_arm_selector():  # the hook is flashspec_arm_selectors
        return []

    mod = types.ModuleType("acme_typo")
    mod.flashspec_arm_selector = flashspec_arm_selector
    with pytest.raises(PluginError, match=r"plugin 'acme_typo': unknown hook 'flashspec_arm_selector'.*flashspec_arm_selectors"):
        build_registry(extra_plugins=[mod])


def test_a_hookimpl_with_an_argument_its_hookspec_lacks_names_its_plugin() -> None:
    class Observer:
        @hookimpl
        def flashspec_step_end(self, record, pipeline):  # type: ignore[no-untyped-def]
            pass

    with pytest.raises(PluginError, match=r"Plugin 'Observer' for hook 'flashspec_step_end'.*\{'pipeline'\}"):
        build_registry(extra_plugins=[Observer()])


def test_a_misspelled_entry_point_plugin_names_the_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    @hookimpl
    def flashspec_verifier():
        return []

    plugin = types.ModuleType("flashspec_acme.plugin")
    plugin.flashspec_verifier = flashspec_verifier

    class EP:
        name, value, dist = "acme", "flashspec_acme.plugin", None

        def load(self):
            return plugin

    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [EP()] if group == "flashspec" else [])
    with pytest.raises(PluginError, match=r"plugin 'acme': unknown hook 'flashspec_verifier'"):
        build_registry(autoload=True)


class _EntryPoint:
    """A third-party entry point of distribution flashspec-acme 1.2.3 whose ``load`` runs ``load``."""

    name, value = "acme", "flashspec_acme.plugin"
    dist = types.SimpleNamespace(name="flashspec-acme", version="1.2.3")

    def __init__(self, load: object) -> None:
        self._load = load

    def load(self) -> object:
        return self._load()  # type: ignore[operator]


def test_a_plugin_that_fails_to_import_names_its_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    def load() -> object:
        raise ModuleNotFoundError("No module named 'numpyy'")

    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group: [_EntryPoint(load)] if group == "flashspec" else [])
    with pytest.raises(PluginError, match=r"^cannot load flashspec plugin 'acme' \(flashspec_acme.plugin, "
                                          r"flashspec-acme 1.2.3\): ModuleNotFoundError: No module named 'numpyy'$"):
        build_registry(autoload=True)


def test_a_hook_that_raises_names_its_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    @hookimpl
    def flashspec_verifiers():
        raise KeyError("oops")

    plugin = types.ModuleType("flashspec_acme.plugin")
    plugin.flashspec_verifiers = flashspec_verifiers  # type: ignore[attr-defined]
    monkeypatch.setattr("importlib.metadata.entry_points",
                        lambda group: [_EntryPoint(lambda: plugin)] if group == "flashspec" else [])
    with pytest.raises(PluginError, match=r"^plugin 'acme' \(flashspec-acme 1.2.3\) raised in "
                                          r"flashspec_verifiers\(\): KeyError: 'oops'$"):
        build_registry(autoload=True)
