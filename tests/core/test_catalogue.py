"""The light catalogue: component names and config keys checked before torch is imported.

Each bundled plugin lists its components in a keys module (attrs and the standard library);
the command line checks a config against them before its torch import, so a misspelt key or
name is one line within a second. A plugin without such a module leaves the catalogue
incomplete: names it might provide are checked at build time, as before.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashspec_core.config import ConfigError, check_components
from flashspec_core.registry import BUILTIN_KEYS, BUILTIN_PLUGINS, KEYS_GROUP, build_catalogue, build_registry

HEAVY = ("torch", "transformers", "triton")
BAD_SELECTOR_KEY = '[target]\nmodel = "{model}"\n[[arm]]\nuse = "prompt_lookup"\n[selector]\nuse = "ucb1"\nwindo = 3\n'


def test_a_bad_component_key_is_refused_without_importing_torch(tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    path = tmp_path / "bad.toml"
    path.write_text(BAD_SELECTOR_KEY.format(model=tmp_path / "target"))
    code = ("import sys; from flashspec_core.cli import main; "
            f"rc = main(['generate', 't1', '--config', {str(path)!r}]); "
            f"print(rc, [m for m in {HEAVY!r} if m in sys.modules])")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert out.stdout == "2 []\n", out
    assert out.stderr.startswith(f"flashspec: error: {path}: [selector] key 'windo': unknown key for selector 'ucb1'"), out
    assert out.stderr.count("\n") == 1, out.stderr
    assert took < 5, took  # about 0.4 s; torch's import alone takes several


def test_the_catalogue_lists_what_the_plugins_register() -> None:
    """Each plugin.py builds its ComponentSpecs from its keys module: same names, classes, descriptions."""
    assert set(BUILTIN_KEYS) == set(BUILTIN_PLUGINS)
    catalogue = build_catalogue(autoload=False)
    assert catalogue.complete
    registered = {(kind, p.spec.name): (p.spec.config_cls, p.spec.description) for kind, p in build_registry(autoload=False).all()}
    listed = {at: (k.config_cls, k.description) for at, k in catalogue.components.items()}
    assert listed == registered


def test_the_dtype_names_are_the_loaders() -> None:
    from flashspec_fast import keys as fast_keys
    from flashspec_fast.options import DTYPES as FAST_DTYPES
    from flashspec_hf import keys as hf_keys
    from flashspec_hf.loading import DTYPES as HF_DTYPES

    assert hf_keys.DTYPE_NAMES == tuple(HF_DTYPES)
    assert fast_keys.DTYPE_NAMES == tuple(FAST_DTYPES)


def _config(tmp_path: Path, selector: str) -> dict[str, object]:
    (tmp_path / "target").mkdir(exist_ok=True)
    return {"target": {"model": str(tmp_path / "target")}, "arm": [{"use": "prompt_lookup"}], "selector": {"use": selector}}


def _entry_points(monkeypatch: pytest.MonkeyPatch, points: list[md.EntryPoint]) -> None:
    monkeypatch.setattr(md, "entry_points", lambda group: [ep for ep in points if ep.group == group])


def test_a_plugin_without_keys_leaves_its_names_to_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch, [md.EntryPoint("acme", "acme_plugin", "flashspec")])
    catalogue = build_catalogue(autoload=True)
    assert not catalogue.complete
    check_components(_config(tmp_path, "acme_bandit"), catalogue)  # acme may provide it: not refused here
    with pytest.raises(ConfigError, match=r"\[selector\] key 'windo': unknown key for selector 'ucb1'"):
        check_components({**_config(tmp_path, "ucb1"), "selector": {"use": "ucb1", "windo": 3}}, catalogue)


def test_a_plugin_with_keys_completes_the_catalogue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "acme_keys.py").write_text(
        "from flashspec_core.config import ComponentKeys\n"
        "COMPONENTS = (ComponentKeys('selector', 'acme_bandit', None, 'a third party'),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch, [md.EntryPoint("acme", "acme_plugin", "flashspec"),
                                md.EntryPoint("acme", "acme_keys", KEYS_GROUP)])
    catalogue = build_catalogue(autoload=True)
    assert catalogue.complete
    check_components(_config(tmp_path, "acme_bandit"), catalogue)
    with pytest.raises(ConfigError, match=r"\[selector\] key 'use': unknown selector component 'acme'; installed: .*acme_bandit"):
        check_components(_config(tmp_path, "acme"), catalogue)
    with pytest.raises(ConfigError, match=r"\[selector\] key 'c': unknown key: selector 'acme_bandit' takes no keys"):
        check_components({**_config(tmp_path, "x"), "selector": {"use": "acme_bandit", "c": 1}}, catalogue)


def test_names_two_plugins_claim_are_left_to_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "clash_keys.py").write_text(
        "from flashspec_core.config import ComponentKeys\n"
        "COMPONENTS = (ComponentKeys('selector', 'ucb1', None, 'a second ucb1'),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch, [md.EntryPoint("clash", "clash_plugin", "flashspec"),
                                md.EntryPoint("clash", "clash_keys", KEYS_GROUP)])
    catalogue = build_catalogue(autoload=True)
    check_components({**_config(tmp_path, "x"), "selector": {"use": "ucb1", "windo": 3}}, catalogue)  # the build names both
