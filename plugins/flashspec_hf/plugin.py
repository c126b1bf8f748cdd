"""Registers the Hugging Face target back-end, its causal-LM draft provider and its self-speculative draft."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from flashspec_core import ComponentSpec, DraftProvider, hookimpl
from flashspec_core.contracts import DraftContext, HasTokenizer, Target
from flashspec_hf.draft import DraftOptions, HFDraft, check_same_tokenizer
from flashspec_hf.loading import ModelOptions, load_model
from flashspec_hf.selfdraft import SelfOptions, make_self_draft
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
    return HFDraft(model, context.vocab, config.tree_width, config.tree_children)


@hookimpl
def flashspec_targets() -> Iterable[ComponentSpec[Target]]:
    return [
        ComponentSpec(
            name="hf",
            kind="target",
            factory=make_target,
            config_cls=ModelOptions,
            description="any transformers AutoModelForCausalLM",
        )
    ]


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [
        ComponentSpec(
            name="hf",
            kind="draft",
            factory=make_draft,
            config_cls=DraftOptions,
            description="a smaller causal LM with the target's tokenizer, own KV cache",
        ),
        ComponentSpec(
            name="hf-self",
            kind="draft",
            factory=make_self_draft,
            config_cls=SelfOptions,
            description="self-speculative: the hf target's first `layers` layers draft, on its weights and KV cache",
        ),
    ]
