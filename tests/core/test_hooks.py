"""Every hook (datasette's style): a ``test_hook_<name>`` under tests/ that exercises it, its
exact signature in docs/plugins.md; and docs/plugins.md's lists of bundled components and
optional capabilities are the registry's and contracts' own.

The ``test_hook_*`` tests below drive each hook through a third-party style plugin whose
components have no model files (a bigram table as the target), and run the contract
suites of :mod:`flashspec_core.testing` over them as a plugin author would.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pluggy
import pytest
import torch
from _table import VOCAB, TableTarget

from flashspec_core import ComponentSpec, Draft, SamplingParams, hookimpl, hookspecs
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import CAPABILITIES, DraftContext, StepRecord
from flashspec_core.registry import (
    DOCS_BEGIN,
    DOCS_END,
    build_registry,
    components_markdown,
    main,
    with_components_block,
)
from flashspec_core.testing import draft_contract as dc
from flashspec_core.testing import selector_contract as sc
from flashspec_core.testing import target_contract as tc
from flashspec_core.testing import verifier_contract as vc
from flashspec_reference.plugin import ReferenceVerifier

ROOT = Path(__file__).resolve().parents[2]
PLUGINS_MD = ROOT / "docs" / "plugins.md"
_pm = pluggy.PluginManager(hookspecs.PROJECT)
HOOKS = [name for name, _ in inspect.getmembers(hookspecs, inspect.isfunction)
         if _pm.parse_hookspec_opts(hookspecs, name) is not None]


def signature(hook: str) -> str:
    """``name(args) -> return`` as written in hookspecs.py (its annotations are strings)."""
    return (hook + str(inspect.signature(getattr(hookspecs, hook)))).replace("'", "")


# ---------------------------------------------------------------- meta-tests


def test_hooks_are_found() -> None:
    assert {"flashspec_targets", "flashspec_step_end"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook: str) -> None:
    pattern = f"def test_hook_{hook}("
    assert any(pattern in p.read_text() for p in (ROOT / "tests").rglob("*.py")), (
        f"no test named test_hook_{hook} under tests/ exercises the hook {hook}"
    )


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook: str) -> None:
    assert f"### `{signature(hook)}`" in PLUGINS_MD.read_text(), (
        f"docs/plugins.md needs a heading ### `{signature(hook)}`"
    )


def test_the_component_lists_in_the_docs_are_the_registry_s() -> None:
    text = PLUGINS_MD.read_text()
    rendered = with_components_block(text, components_markdown(build_registry(autoload=False)))
    assert rendered == text, "docs/plugins.md is stale: run python -m flashspec_core.registry --write docs/plugins.md"
    assert main(["--check", str(PLUGINS_MD)]) == 0


def test_the_docs_block_check_fails_on_a_stale_page(tmp_path: Path) -> None:
    page = tmp_path / "plugins.md"
    page.write_text(f"intro\n{DOCS_BEGIN}\n| `gone` | old | list |\n{DOCS_END}\nrest\n")
    assert main(["--check", str(page)]) == 1
    assert main(["--write", str(page)]) == 0
    text = page.read_text()
    assert main(["--check", str(page)]) == 0
    assert "`gone`" not in text and "| `reference` | `flashspec_reference.plugin` |" in text
    assert text.startswith("intro\n") and text.endswith(f"{DOCS_END}\nrest\n")


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.__name__)
def test_every_capability_is_documented(capability: type) -> None:
    assert f"`{capability.__name__}`" in PLUGINS_MD.read_text(), f"docs/plugins.md does not name {capability.__name__}"


# ------------------------------------------- a plugin offering every component kind

class EchoDraft:
    """Proposes each row's last token ``gamma`` times (a one-hot draft)."""

    def reset(self) -> None:
        """Stateless."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        last = torch.tensor([int(tokens[b, n - 1]) for b, n in enumerate(lengths)])
        return Draft(tokens=last[:, None].repeat(1, gamma), probs=None)

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""


class RoundRobin:
    def __init__(self, config: None, num_arms: int) -> None:
        self.num_arms, self.t = num_arms, 0

    def select(self) -> int:
        return self.t % self.num_arms

    def update(self, arm: int, reward: float) -> None:
        self.t += 1


class Acme:
    """Third-party style: one component of each kind, and observers of the loop."""

    def __init__(self) -> None:
        self.built: list[object] = []
        self.records: list[StepRecord] = []

    @hookimpl
    def flashspec_targets(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("acme_table", "target", lambda config: TableTarget(), description="bigram table")]

    @hookimpl
    def flashspec_draft_providers(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("acme_echo", "draft", lambda config, context: EchoDraft(), description="echo")]

    @hookimpl
    def flashspec_verifiers(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("acme_reference", "verifier", lambda config, device: ReferenceVerifier())]

    @hookimpl
    def flashspec_arm_selectors(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("acme_round_robin", "selector", RoundRobin, description="each arm in turn")]

    @hookimpl
    def flashspec_pipeline_built(self, pipeline: object) -> None:
        self.built.append(pipeline)

    @hookimpl
    def flashspec_step_end(self, record: StepRecord) -> None:
        self.records.append(record)


def _config(**tables: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "target": {"use": "acme_table"},
        "arm": [{"use": "acme_echo", "gamma": 2, "name": "echo2"}, {"use": "acme_echo", "gamma": 3, "name": "echo3"}],
        "verifier": {"use": "reference"},
        "selector": {"use": "fixed"},
    }
    return config | tables


def _run(acme: Acme, config: dict[str, Any], temperature: float = 0.0) -> Any:
    pipeline = build_pipeline(config, build_registry(extra_plugins=[acme]))
    return pipeline, pipeline.generate(["1 2 3", "4 5"], max_new_tokens=12, temperature=temperature, seed=3)


def _greedy(prompt: list[int], steps: int) -> list[int]:
    table, out = TableTarget().table, list(prompt)
    for _ in range(steps):
        out.append(int(torch.argmax(table[out[-1]])))
        if out[-1] == VOCAB - 1:
            break
    return out[len(prompt) :]


def _provider(registry_name: str, kind: str) -> Callable[..., Any]:
    return build_registry(extra_plugins=[Acme()]).get(kind, registry_name).factory  # type: ignore[arg-type]


# ---------------------------------------------------------------- one test per hook


def test_hook_flashspec_targets() -> None:
    pipeline, result = _run(Acme(), _config())
    assert isinstance(pipeline.target, TableTarget)
    assert result.token_ids == [_greedy([1, 2, 3], 12), _greedy([4, 5], 12)]
    make = lambda: _provider("acme_table", "target")(None)  # noqa: E731
    tc.check_metadata(make())
    tc.check_encode_decode(make(), "3 1 4")
    tc.check_decode_script(make, tc.Script(seed=2), rtol=0, atol=0)


def test_hook_flashspec_draft_providers() -> None:
    pipeline, result = _run(Acme(), _config())
    assert all(isinstance(arm.provider, EchoDraft) for arm in pipeline.arms)
    assert {r.gamma for r in result.steps} == {2}  # the fixed selector plays the first arm
    context = DraftContext(target=TableTarget(), vocab=VOCAB, device=torch.device("cpu"))
    for sampling in dc.SAMPLINGS:
        dc.check_script(lambda: _provider("acme_echo", "draft")(None, context), VOCAB, sampling)


def test_hook_flashspec_verifiers() -> None:
    mine = _run(Acme(), _config(verifier={"use": "acme_reference"}), temperature=1.0)[1]
    bundled = _run(Acme(), _config(), temperature=1.0)[1]
    assert mine.token_ids == bundled.token_ids  # same verifier, same seed
    verifier = _provider("acme_reference", "verifier")(None, torch.device("cpu"))
    for check in vc.EDGE_CASES:
        check(verifier)


def test_hook_flashspec_arm_selectors() -> None:
    result = _run(Acme(), _config(selector={"use": "acme_round_robin", "draw_ahead": False}))[1]
    assert [r.arm_name for r in result.steps[:4]] == ["echo2", "echo3", "echo2", "echo3"]
    make = lambda seed: _provider("acme_round_robin", "selector")(None, 3)  # noqa: E731
    sc.check_play(make, 3)
    sc.check_deterministic(make, 3)


def test_hook_flashspec_pipeline_built() -> None:
    acme = Acme()
    pipeline, _ = _run(acme, _config())
    assert acme.built == [pipeline]


def test_hook_flashspec_step_end() -> None:
    acme = Acme()
    _, result = _run(acme, _config())
    assert acme.records == result.steps and len(result.steps) > 1
