"""Registers the fast device path: target ``fast``, drafts ``fast`` and ``self``, verifier ``synthetic``."""

from __future__ import annotations

from collections.abc import Iterable

from flashspec_core import ComponentSpec, DraftProvider, Verifier, hookimpl
from flashspec_core.contracts import Target
from flashspec_fast.draft import FastDraftOptions, make_draft
from flashspec_fast.options import FastTargetOptions
from flashspec_fast.selfdraft import SelfOptions, make_self_draft
from flashspec_fast.synthetic import SyntheticOptions, make_synthetic
from flashspec_fast.tp import make_fast_target


@hookimpl
def flashspec_targets() -> Iterable[ComponentSpec[Target]]:
    return [
        ComponentSpec(
            name="fast",
            kind="target",
            factory=make_fast_target,
            config_cls=FastTargetOptions,
            description="own Qwen2/Llama decoder: static KV cache, CUDA-graph verify forward",
        )
    ]


@hookimpl
def flashspec_draft_providers() -> Iterable[ComponentSpec[DraftProvider]]:
    return [
        ComponentSpec(
            name="fast",
            kind="draft",
            factory=make_draft,
            config_cls=FastDraftOptions,
            description="own Qwen2/Llama draft: static KV cache, the gamma-token loop (or a tree_width tree) as one CUDA graph",
        ),
        ComponentSpec(
            name="self",
            kind="draft",
            factory=make_self_draft,
            config_cls=SelfOptions,
            description="self-speculative: the fast target's first `layers` layers draft, on its weights and KV cache",
        ),
    ]


@hookimpl
def flashspec_verifiers() -> Iterable[ComponentSpec[Verifier]]:
    return [
        ComponentSpec(
            name="synthetic",
            kind="verifier",
            factory=make_synthetic,
            config_cls=SyntheticOptions,
            description="TIMING ONLY: accepts each draft token with a fixed probability",
        )
    ]
