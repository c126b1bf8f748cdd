"""Meta-tests: every hook is documented with its exact signature and exercised by a
test; every bundled component's config key is in the configuration reference; the tables
that README.md and docs/bandits.md quote are what the committed JSON gives; the docs name
no commits and no issue numbers (they state what is true now; history is git's)."""

from __future__ import annotations

import inspect
import re
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


def test_bandit_tables_come_from_the_committed_json() -> None:
    from _scripts import load_benchmark

    assert load_benchmark("render_bandit_tables").main(["--check"]) == 0


COMMIT = re.compile(r"`(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}`|\bcommits? [0-9a-f]{7,40}\b")
ISSUE = re.compile(r"\bissues? #?[0-9]+", re.IGNORECASE)


def history_refs(text: str) -> list[str]:
    """Commit hashes and issue numbers named in ``text``."""
    return [m.group(0) for m in (*COMMIT.finditer(text), *ISSUE.finditer(text))]


def test_docs_name_no_commits_or_issues() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {str(p.relative_to(ROOT)): refs for p in pages if (refs := history_refs(p.read_text()))}
    assert not found, f"docs should state what is true now, not cite history: {found}"


def test_history_refs_are_found() -> None:
    text = "as of `0fa63b4`, at commit 1024280, see issue 5 and Issue #12; not `0.9975`, `100663296` or `gamma`"
    assert history_refs(text) == ["`0fa63b4`", "commit 1024280", "issue 5", "Issue #12"]
