"""The decode step trusts no component: a draft, target or verifier that breaks its contract
is a ContractViolation naming it (plugin and distribution), never silent output or a hang.

Components here are third-party style (no model files): a bigram table as the target and
drafts and verifiers that break one rule each.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from _table import VOCAB, TableTarget
from _tiny import tiny_lm

from flashspec_core import ComponentSpec, Draft, SamplingParams, Verdict, hookimpl
from flashspec_core.build import build_pipeline
from flashspec_core.contracts import ContractViolation
from flashspec_core.registry import build_registry
from flashspec_reference.plugin import ReferenceVerifier


class UniformDraft:
    """Proposes token 1 with a uniform ``q`` that ``scale`` multiplies, and ``ids`` in place of 1 if given."""

    def __init__(self, scale: float = 1.0, bad_id: int | None = None) -> None:
        self.scale, self.bad_id = scale, bad_id

    def reset(self) -> None:
        """Stateless."""

    def propose(self, tokens: torch.Tensor, lengths: Sequence[int], gamma: int, sampling: SamplingParams,
                generator: torch.Generator | None) -> Draft:
        batch = len(lengths)
        ids = torch.full((batch, gamma), 1 if self.bad_id is None else self.bad_id, dtype=torch.long)
        return Draft(tokens=ids, probs=torch.full((batch, gamma, VOCAB), self.scale / VOCAB))

    def rollback(self, num_accepted: Sequence[int]) -> None:
        """Stateless."""


class NegativeCount(ReferenceVerifier):
    """Says it accepted -1 tokens: without the check the loop would never end."""

    def verify(self, *args: Any, **kwargs: Any) -> Verdict:
        verdict = super().verify(*args, **kwargs)
        return Verdict(tokens=verdict.tokens, num_accepted=torch.full_like(verdict.num_accepted, -1))


class Faulty:
    """One plugin offering each broken component."""

    @hookimpl
    def flashspec_targets(self) -> list[ComponentSpec[Any]]:
        def nan(logits: torch.Tensor) -> None:
            logits[:, 0, 2] = float("nan")

        return [ComponentSpec("table", "target", lambda config: TableTarget()),
                ComponentSpec("nan_table", "target", lambda config: TableTarget(nan))]

    @hookimpl
    def flashspec_draft_providers(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("uniform", "draft", lambda config, context: UniformDraft()),
                ComponentSpec("heavy", "draft", lambda config, context: UniformDraft(scale=3.0)),
                ComponentSpec("outside", "draft", lambda config, context: UniformDraft(bad_id=VOCAB + 3))]

    @hookimpl
    def flashspec_verifiers(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("negative", "verifier", lambda config, device: NegativeCount())]


def _generate(target: str = "table", draft: str = "uniform", verifier: str = "reference",
              temperature: float = 1.0) -> Any:
    config = {
        "target": {"use": target},
        "arm": [{"use": draft, "gamma": 2, "name": "a"}],
        "verifier": {"use": verifier},
        "selector": {"use": "fixed"},
    }
    pipeline = build_pipeline(config, build_registry(extra_plugins=[Faulty()]))
    return pipeline.generate(["1 2 3", "4 5"], max_new_tokens=6, temperature=temperature, seed=1)


def test_components_that_keep_the_contract_pass() -> None:
    result = _generate()
    assert all(1 <= len(ids) <= 6 for ids in result.token_ids)


@pytest.mark.parametrize(
    ("component", "words"),
    [
        ({"draft": "heavy"}, ["arm 'a'", "draft 'heavy'", "not a distribution"]),
        ({"draft": "outside"}, ["arm 'a'", "draft 'outside'", "draft token ids outside [0, vocab)"]),
        ({"target": "nan_table"}, ["target 'nan_table'", "NaN"]),
        ({"verifier": "negative"}, ["verifier 'negative'", "num_accepted outside [0, draft width]"]),
    ],
    ids=["q-sums-to-3", "ids-outside-the-vocabulary", "nan-logits", "negative-num-accepted"],
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_broken_component_is_named(component: dict[str, str], words: list[str], temperature: float) -> None:
    with pytest.raises(ContractViolation) as info:
        _generate(**component, temperature=temperature)
    message = str(info.value)
    assert "broke its contract" in message and "plugin" in message, message
    for word in words:
        assert message.count(word) == 1, message  # named once: a verifier's refusal is not repeated


def test_a_verifier_inside_the_pipeline_reads_logits_and_q_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an accelerator (here the meta device, which has no values) a verifier called inside
    checked_by_caller flags only the draft ids: the pipeline's own step_flags read the rest."""
    from flashspec_core import checks

    read: list[str] = []
    real = checks.logits_flags
    monkeypatch.setattr(checks, "logits_flags", lambda logits: read.append("logits") or real(logits))
    logits = torch.zeros((2, 3, VOCAB), device="meta")
    ids = torch.zeros((2, 2), dtype=torch.long, device="meta")
    q = torch.zeros((2, 2, VOCAB), device="meta")
    flags = checks.verifier_inputs(logits, ids, q)
    assert read == ["logits"] and flags is not None and flags.shape == (2,)
    with checks.checked_by_caller():
        flags = checks.verifier_inputs(logits, ids, q)
    assert read == ["logits"] and flags is not None and flags.shape == (2,)
    assert checks.verifier_inputs(logits, ids, q) is not None and read == ["logits", "logits"]  # the block ended


def test_values_in_host_memory_are_refused_inside_the_pipeline_too() -> None:
    """On the CPU a refusal costs no sync, and a verifier must not index by a bad id: still refused."""
    from flashspec_core import checks
    from flashspec_core.contracts import VerifierInputError

    logits = torch.zeros((1, 2, VOCAB))
    with checks.checked_by_caller(), pytest.raises(VerifierInputError, match="^draft_probs: "):
        checks.verifier_inputs(logits, torch.zeros((1, 1), dtype=torch.long), torch.full((1, 1, VOCAB), 0.5))


class OutsideDrafts:
    """Drafts whose ids are outside the vocabulary, for a target with a real embedding."""

    @hookimpl
    def flashspec_draft_providers(self) -> list[ComponentSpec[Any]]:
        return [ComponentSpec("above", "draft", lambda config, context: UniformDraft(bad_id=VOCAB + 3)),
                ComponentSpec("padding", "draft", lambda config, context: UniformDraft(bad_id=-1))]


@pytest.mark.parametrize("draft", ["above", "padding"])
def test_ids_outside_the_vocabulary_never_reach_the_targets_embedding(draft: str, tmp_path: Path) -> None:
    """The table target above indexes nothing; a model's embedding would raise IndexError (a device
    assert on CUDA) before the step's check could name the draft."""
    target = tiny_lm(tmp_path / "target", vocab=VOCAB, dtype=torch.float32)
    config = {
        "target": {"model": str(target), "dtype": "float32", "chat_template": False},
        "arm": [{"use": draft, "gamma": 2, "name": "a"}],
        "verifier": {"use": "reference"},
        "selector": {"use": "fixed"},
    }
    pipeline = build_pipeline(config, build_registry(extra_plugins=[OutsideDrafts()]))
    with pytest.raises(ContractViolation, match=rf"arm 'a' \(draft '{draft}'.*draft token ids outside \[0, vocab\)"):
        pipeline.generate(["t1 t2"], max_new_tokens=3, temperature=0.0)
