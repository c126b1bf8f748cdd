"""Registers the Hugging Face target back-end, its causal-LM draft provider and its self-speculative draft."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_core.contracts import DraftContext, HasTokenizer, Target
from flashspec_hf.draft import HFDraft, check_same_tokenizer
from flashspec_hf.keys import COMPONENTS, DraftOptions, ModelOptions
from flashspec_hf.loading import load_model
from flashspec_hf.selfdraft import make_self_draft
from flashspec_hf.target import HFTarget


def make_target(config: ModelOptions) -> HFTarget:
    model, tokenizer = load_model(config)
    return HFTarget(model, tokenizer, chat_template=config.chat_template)


def make_draft(config: DraftOptions, context: DraftContext) -> HFDraft:
    if config.device == "auto":
        config = attrs.evolve(config, device=str(context.device))
    model, tokenizer = load_model(config)
    target_tokenizer = context.target.tokenizer if isinstance(context.target, HasTokenizer) else None
    check_same_tokenizer(tokenizer, target_tokenizer, config.model)
    return HFDraft(model, context.vocab, config.tree_width, config.tree_children, config.tree_depth,
                   config.tree_expand)


_FACTORIES: dict[tuple[str, str], Callable[..., Any]] = {("target", "hf"): make_target, ("draft", "hf"): make_draft, ("draft", "hf-self"): make_self_draft}


@hookimpl
def flashspec_targets() -> Iterable[ComponentSpec[Target]]:
    return [ComponentSpec(k.name, "target", _FACTORIES["target", k.name], k.config_cls, k.description)
            for k in COMPONENTS if k.kind == "target"]


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [ComponentSpec(k.name, "draft", _FACTORIES["draft", k.name], k.config_cls, k.description)
            for k in COMPONENTS if k.kind == "draft"]
