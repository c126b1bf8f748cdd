"""``flashspec generate`` announces the torch and transformers import, and a mistake found
while it lasts is still the run's only line, on a terminal and off one."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from _tiny import tiny_lm

from flashspec_core import build
from flashspec_core.cli import LOADING, main

ERASE = "\r\033[K"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def shown(written: str) -> list[str]:
    """The lines a terminal shows for ``written``: what a line holds after its last erase."""
    lines = written.split("\n")  # not splitlines(): a carriage return does not start a line
    return [line.rsplit(ERASE, 1)[-1] for line in (lines[:-1] if lines[-1] == "" else lines)]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cold")
    tiny_lm(root / "target", vocab=16, scale=4.0)
    return root


def _config(models: Path, tmp_path: Path, selector: str = "", target: str = "") -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[target]\nmodel = "{models / "target"}"\ndtype = "float32"\n{target}'
                    f'[[arm]]\nuse = "prompt_lookup"\ngamma = 2\n[selector]\nuse = "ucb1"\n{selector}'
                    "[generation]\nmax_new_tokens = 3\n")
    return str(path)


def test_off_a_terminal_the_line_comes_once_the_wait_ends_well(models: Path, tmp_path: Path, capsys: Any) -> None:
    assert main(["generate", "t1 t2", "--config", _config(models, tmp_path)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert re.fullmatch(rf"\[flashspec\] {re.escape(LOADING)}: done in \d+\.\d s", lines[0]), lines
    assert lines[1].startswith("[flashspec] loading target"), lines


def test_on_a_terminal_the_line_shows_before_the_import(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    load = build.load_pipeline
    seen: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> Any:  # the registry, so the plugins' imports, are built in here
        seen.append(terminal.getvalue())
        return load(*args, **kwargs)

    monkeypatch.setattr(build, "load_pipeline", spy)
    assert main(["generate", "t1 t2", "--config", _config(models, tmp_path)]) == 0
    assert seen == [f"[flashspec] {LOADING}"]
    lines = shown(terminal.getvalue())
    assert lines[0] == f"[flashspec] {LOADING}" and lines[1].startswith("[flashspec] loading target"), lines


def test_on_a_terminal_a_mistake_found_during_the_wait_is_the_only_line(
    models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device the machine lacks is found once torch is imported: the announcement gives way to the error."""
    from flashspec_core import machine

    monkeypatch.setattr(machine, "no_cuda", lambda: None)  # not sure before torch: torch finds it
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    path = _config(models, tmp_path, target='device = "cuda:99"\n')
    assert main(["generate", "t1", "--config", path]) == 2
    written = terminal.getvalue()
    assert written.startswith(f"[flashspec] {LOADING}{ERASE}"), written  # it was shown, then erased
    (line,) = shown(written)
    assert line.startswith(f"flashspec: error: {path}: [target] key 'device': device 'cuda:99' is not on this machine"), line


def test_a_component_key_is_refused_before_the_wait(models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Component names and keys are checked against the plugins' light keys modules: no announcement, no import."""
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setattr(build, "load_pipeline", lambda *args, **kwargs: pytest.fail("the plugins were loaded"))
    path = _config(models, tmp_path, selector="window = 3\n")
    assert main(["generate", "t1", "--config", path]) == 2
    (line,) = shown(terminal.getvalue())
    assert line.startswith(f"flashspec: error: {path}: [selector] key 'window': unknown key"), line


def test_a_mistake_found_before_the_wait_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["generate", "t1", "--config", "/nowhere.toml"]) == 2
    assert terminal.getvalue() == "flashspec: error: /nowhere.toml: [-]: file not found\n"
