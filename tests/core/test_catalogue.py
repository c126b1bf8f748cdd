"""The light catalogue: component names and config keys checked before torch is imported.

Each bundled plugin lists its components in a keys module (attrs and the standard library);
the command line checks a config against them before its torch import, so a misspelt key or
name is one line within a second. A plugin without such a module leaves the catalogue
incomplete: names it might provide are checked at build time, as before. A keys module that
fails to import, or a name two keys modules list, is refused then, naming the plugins.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from flashspec_core.config import ConfigError, check_components
from flashspec_core.registry import (
    AUTOLOAD_ENV,
    BUILTIN_KEYS,
    BUILTIN_PLUGINS,
    KEYS_GROUP,
    PluginError,
    build_catalogue,
    build_registry,
)

HEAVY = ("torch", "transformers", "triton")
BAD_SELECTOR_KEY = '[target]\nmodel = "{model}"\n[[arm]]\nuse = "prompt_lookup"\n[selector]\nuse = "ucb1"\nwindo = 3\n'


def _checkpoint(path: Path) -> Path:
    """A directory the config check takes for a checkpoint (it holds a config.json and a weights file); nothing loads it here."""
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path


def test_a_bad_component_key_is_refused_without_importing_torch(tmp_path: Path) -> None:
    _checkpoint(tmp_path / "target")
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
    _checkpoint(tmp_path / "target")
    return {"target": {"model": str(tmp_path / "target")}, "arm": [{"use": "prompt_lookup"}], "selector": {"use": selector}}


def _entry_points(monkeypatch: pytest.MonkeyPatch, points: list[md.EntryPoint], site: Path) -> None:
    """``points`` as the installed entry points; each plugin module they name is an empty module in
    ``site`` (the catalogue reads a plugin module's source before torch, so it must exist)."""
    for ep in points:
        if ep.group == "flashspec":
            (site / f"{ep.value}.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(md, "entry_points", lambda group: [ep for ep in points if ep.group == group])


def test_a_plugin_without_keys_leaves_its_names_to_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _entry_points(monkeypatch, [md.EntryPoint("acme", "acme_plugin", "flashspec")], tmp_path)
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
                                md.EntryPoint("acme", "acme_keys", KEYS_GROUP)], tmp_path)
    catalogue = build_catalogue(autoload=True)
    assert catalogue.complete
    check_components(_config(tmp_path, "acme_bandit"), catalogue)
    with pytest.raises(ConfigError, match=r"\[selector\] key 'use': unknown selector component 'acme'; installed: .*acme_bandit"):
        check_components(_config(tmp_path, "acme"), catalogue)
    with pytest.raises(ConfigError, match=r"\[selector\] key 'c': unknown key: selector 'acme_bandit' takes no keys"):
        check_components({**_config(tmp_path, "x"), "selector": {"use": "acme_bandit", "c": 1}}, catalogue)


class _EntryPoint:
    """An entry point of distribution flashspec-acme 1.2.3."""

    def __init__(self, name: str, value: str, group: str) -> None:
        self.name, self.value, self.group = name, value, group
        self.dist = types.SimpleNamespace(name="flashspec-acme", version="1.2.3")


def test_names_two_plugins_claim_are_refused_before_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry would refuse the pair once both plugins are imported: the keys modules tell it first."""
    (tmp_path / "clash_keys.py").write_text(
        "from flashspec_core.config import ComponentKeys\n"
        "COMPONENTS = (ComponentKeys('selector', 'ucb1', None, 'a second ucb1'),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch, [_EntryPoint("clash", "clash_plugin", "flashspec"),  # type: ignore[list-item]
                                _EntryPoint("clash", "clash_keys", KEYS_GROUP)], tmp_path)
    with pytest.raises(PluginError, match=r"^selector component name 'ucb1' is provided by two plugins: "
                                          r"'flashspec_selectors.plugin' \(flashspec-engine\) and 'clash' \(flashspec-acme\)$"):
        build_catalogue(autoload=True)


def test_a_keys_module_that_fails_to_import_names_its_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_keys.py").write_text("import numpyy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_points(monkeypatch, [_EntryPoint("acme", "acme_plugin", "flashspec"),  # type: ignore[list-item]
                                _EntryPoint("acme", "broken_keys", KEYS_GROUP)], tmp_path)
    with pytest.raises(PluginError, match=r"^cannot load flashspec plugin 'acme' \(broken_keys, flashspec-acme 1.2.3\): "
                                          r"ModuleNotFoundError: No module named 'numpyy'$"):
        build_catalogue(autoload=True)


# An installed distribution, as importlib.metadata finds it on sys.path, whose keys module is {keys}.
ACME_DIST = {
    "flashspec_acme-1.2.3.dist-info/METADATA": "Metadata-Version: 2.1\nName: flashspec-acme\nVersion: 1.2.3\n",
    "flashspec_acme-1.2.3.dist-info/entry_points.txt": ("[flashspec]\nacme = flashspec_acme.plugin\n"
                                                        "[flashspec.keys]\nacme = flashspec_acme.keys\n"),
    "flashspec_acme/__init__.py": "",
    "flashspec_acme/plugin.py": "import torch\n",  # what a plugin does; the keys module's fault comes first
}


GOOD_KEYS = "from flashspec_core.config import ComponentKeys\nCOMPONENTS = ()\n"


@pytest.mark.parametrize(("files", "message"), [
    ({"flashspec_acme/keys.py": "import numpyy\n"},
     "cannot load flashspec plugin 'acme' (flashspec_acme.keys, flashspec-acme 1.2.3): "
     "ModuleNotFoundError: No module named 'numpyy'"),
    ({"flashspec_acme/keys.py": "from flashspec_core.config import ComponentKeys\n"
                                "COMPONENTS = (ComponentKeys('selector', 'ucb1'),)\n"},
     "selector component name 'ucb1' is provided by two plugins: 'flashspec_selectors.plugin' (flashspec-engine) "
     "and 'acme' (flashspec-acme)"),
    # the plugin module itself, read but never run (it would import torch first)
    ({"flashspec_acme/keys.py": GOOD_KEYS, "flashspec_acme/plugin.py": "import torch\nimport numpyy.sub\n"},
     "cannot load flashspec plugin 'acme' (flashspec_acme.plugin, flashspec-acme 1.2.3): "
     "ModuleNotFoundError: No module named 'numpyy'"),
    ({"flashspec_acme/keys.py": GOOD_KEYS, "flashspec_acme/plugin.py": "import torch\ndef hook(:\n"},
     "cannot load flashspec plugin 'acme' (flashspec_acme.plugin, flashspec-acme 1.2.3): SyntaxError: "),
    ({"flashspec_acme/keys.py": GOOD_KEYS, "flashspec_acme/plugin.py": None},
     "cannot load flashspec plugin 'acme' (flashspec_acme.plugin, flashspec-acme 1.2.3): "
     "ModuleNotFoundError: No module named 'flashspec_acme.plugin'"),
], ids=["keys-fail-to-import", "duplicate-name", "plugin-imports-a-missing-module", "plugin-does-not-parse",
        "plugin-module-missing"])
def test_an_installed_plugin_fault_is_named_before_torch(
    tmp_path: Path, files: dict[str, str | None], message: str,
) -> None:
    site = tmp_path / "site"
    for name, text in {**ACME_DIST, **files}.items():
        if text is None:
            continue
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    config = tmp_path / "run.toml"
    config.write_text(f'[target]\nmodel = "{_checkpoint(tmp_path / "target")}"\n[[arm]]\nuse = "prompt_lookup"\n')
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV} | {"PYTHONPATH": str(site)}
    cmd = [sys.executable, "-X", "importtime", "-m", "flashspec_core.cli", "generate", "t1", "--config", str(config)]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - start
    imported = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    said = [line for line in out.stderr.splitlines() if not line.startswith("import time:")]
    assert out.returncode == 1 and took < 2.0, (out.returncode, took, said)
    assert len(said) == 1 and said[0].startswith(f"flashspec: error: PluginError: {message}"), said
    assert said[0].endswith(" (FLASHSPEC_DEBUG=1 shows the traceback)"), said
    assert not set(HEAVY) & imported
