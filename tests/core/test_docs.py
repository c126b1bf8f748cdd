"""Meta-tests: every hook is documented with its exact signature and exercised by a
test; every bundled component's config key is in the configuration reference."""

from __future__ import annotations

import inspect
from pathlib import Path

import attrs
import pytest

from flashspec_core import hookspecs
from flashspec_core.registry import build_registry

ROOT = Path(__file__).resolve().parents[2]
HOOKS = [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("flashspec_")]


def _signature(name: str) -> str:
    return (name + str(inspect.signature(getattr(hookspecs, name)))).replace("'", "")


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_documented_with_signature(hook: str) -> None:
    assert f"`{_signature(hook)}`" in (ROOT / "docs" / "plugins.md").read_text()


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_exercised_by_a_test(hook: str) -> None:
    me = Path(__file__).name
    texts = [p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != me]
    assert any(f"def {hook}(" in t for t in texts), f"no test implements {hook}"


def test_every_config_key_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for kind, provided in build_registry().all():
        if provided.spec.config_cls is None:
            continue
        for field in attrs.fields(provided.spec.config_cls):
            assert f"`{field.alias}`" in doc, f"{kind} {provided.spec.name!r} key {field.alias!r} is not documented"


def test_readme_results_come_from_the_committed_json() -> None:
    from _scripts import load_benchmark

    assert load_benchmark("render_readme").main(["--check"]) == 0
