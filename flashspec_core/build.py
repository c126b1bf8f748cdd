"""Assemble a :class:`Pipeline` from a config file, a dict or a parsed config."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from flashspec_core.config import ComponentChoice, ConfigError, PipelineConfig, load_config, parse_config
from flashspec_core.contracts import (
    ComponentKind,
    DraftContext,
    DraftProvider,
    ObservesSteps,
    StepRecord,
    Target,
    Verifier,
)
from flashspec_core.logs import run_logger
from flashspec_core.pipeline import Pipeline
from flashspec_core.policy import Arm, PolicySettings, StepPolicy
from flashspec_core.registry import Registry, build_registry
from flashspec_core.rewards import make_reward

Progress = Callable[[str], None]


HEARTBEAT_S = 8.0  # a load that has printed nothing for this long says it is still running


@contextlib.contextmanager
def _beating(progress: Progress | None, doing: str) -> Iterator[None]:
    """While ``doing`` runs, tell ``progress`` that it still runs after every :data:`HEARTBEAT_S`
    seconds in which neither this nor the model cache (its downloads and builds, which beat on
    their own) printed a line: reading gigabytes of weights is otherwise a silent minute."""
    if progress is None:
        yield
        return
    from flashspec_models.weights import beat_while, last_output

    with beat_while(progress, doing, HEARTBEAT_S, last_output):
        yield


def load_pipeline(path: str | os.PathLike[str], registry: Registry | None = None, progress: Progress | None = None) -> Pipeline:
    registry = registry or build_registry()
    return build_pipeline(load_config(path, registry), registry, progress)


def build_pipeline(
    config: Mapping[str, Any] | PipelineConfig, registry: Registry | None = None, progress: Progress | None = None
) -> Pipeline:
    """Load the models, make every component and wire them up.

    ``progress`` gets one human-readable line per loading stage (the CLI prints them).
    """
    registry = registry or build_registry()
    if not isinstance(config, PipelineConfig):
        config = parse_config(dict(config), registry)
    _check_selector_buckets(config, registry)
    say = progress or (lambda _msg: None)
    say(f"loading target ({_describe(config.target)})")
    with _beating(progress, "loading target"):
        target: Target = registry.get("target", config.target.use).factory(config.target.config)
    context = DraftContext(target=target, vocab=target.vocab, device=target.device)
    arms = []
    index = {a.name: i for i, a in enumerate(config.arms)}
    loaded: dict[Any, tuple[str, DraftProvider]] = {}  # one provider per distinct draft table
    runs_for_others = {a.fallback for a in config.arms} | {config.first}
    for arm in config.arms:
        key = _provider_key(arm.draft)
        if key in loaded:
            owner, provider = loaded[key]
            say(f"arm {arm.name} (gamma={arm.gamma}) shares arm {owner}'s {_describe(arm.draft)}")
        else:
            say(f"loading arm {arm.name} ({_describe(arm.draft)}, gamma={arm.gamma})")
            with _beating(progress, f"loading arm {arm.name}"):
                provider = registry.get("draft", arm.draft.use).factory(arm.draft.config, context)
            if key is not None:
                loaded[key] = (arm.name, provider)
        if not arm.select and arm.name not in runs_for_others:
            say(f"arm {arm.name} has select = false and is neither a fallback nor [selector] first: generate and serve "
                "never run it (flashspec bench times it alone)")
        fallback = index[arm.fallback] if arm.fallback is not None else None
        arms.append(Arm(name=arm.name, provider=provider, gamma=arm.gamma, fallback=fallback, selectable=arm.select,
                        origin=_origin(registry, "draft", arm.draft.use)))
    verifier_use, verifier = _verifier(registry, config.verifier, target.device)
    selector_spec, choosable = registry.get("selector", config.selector.use), sum(a.selectable for a in arms)
    make_selector = lambda: selector_spec.factory(config.selector.config, choosable)  # noqa: E731  (one per batch bucket)
    hook = registry.manager.hook
    logger = run_logger(target=_describe(config.target), selector=config.selector.use)
    on_step: Callable[[StepRecord], None] | None = None
    if hook.flashspec_step_end.get_hookimpls():
        on_step = lambda record: hook.flashspec_step_end(record=record)  # noqa: E731
    settings = PolicySettings(speculate_max_batch=config.speculate_max_batch, draw_ahead=config.draw_ahead,
                              first=index[config.first] if config.first is not None else None,
                              batch_buckets=config.batch_buckets, first_explore=config.first_explore,
                              first_tokens=config.first_tokens)
    policy = StepPolicy(arms, make_selector(), make_reward(config.reward), settings, make_selector)
    origins = {"target": _origin(registry, "target", config.target.use),
               "verifier": _origin(registry, "verifier", verifier_use)}
    pipeline = Pipeline(target, verifier, policy, config, logger, on_step, origins)
    hook.flashspec_pipeline_built(pipeline=pipeline)
    # Everything alive now (modules, tokenizers, registries) lives as long as the pipeline. Moving it
    # out of the cyclic collector's reach keeps a full collection from walking it inside a decode
    # step (a full pass over 170k objects takes ~200 ms on the CPU); refcounting still frees it.
    # Unfrozen again at exit, so that interpreter teardown collects it as usual (frozen, triton's
    # bindings report every object they still hold as leaked).
    gc.collect()
    gc.freeze()
    _unfreeze_at_exit()
    return pipeline


@functools.cache
def _unfreeze_at_exit() -> None:
    atexit.register(gc.unfreeze)


def _check_selector_buckets(config: PipelineConfig, registry: Registry) -> None:
    """Refuse, before any model loads, a selector that sees every step's live rows split by batch_buckets:
    one copy per bucket would divide what it learns across batch sizes."""
    if len(config.batch_buckets) < 2:
        return
    probe = registry.get("selector", config.selector.use).factory(config.selector.config,
                                                                  max(sum(a.select for a in config.arms), 1))
    if isinstance(probe, ObservesSteps):
        raise ConfigError(config.source, "selector", "batch_buckets",
                          f"selector {config.selector.use!r} conditions on the batch size itself (it sees every "
                          f"step's live rows): drop batch_buckets (got {list(config.batch_buckets)})")


def _verifier(registry: Registry, choice: ComponentChoice, device: torch.device) -> tuple[str, Verifier]:
    name = choice.use
    if name == "auto":
        name = "triton" if device.type == "cuda" and "triton" in registry.names("verifier") else "reference"
        spec = registry.get("verifier", name)
        return name, spec.factory(spec.default_config(), device)
    return name, registry.get("verifier", name).factory(choice.config, device)


def _origin(registry: Registry, kind: ComponentKind, name: str) -> str:
    """A component as errors name it: kind, name, plugin and distribution (ContractViolation)."""
    found = [p for k, p in registry.all() if k == kind and p.spec.name == name]
    if not found:
        return f"{kind} {name!r}"
    return f"{kind} {name!r} (plugin {found[0].plugin}, {found[0].distribution} {found[0].version})"


def _provider_key(choice: ComponentChoice) -> Any:
    """Arms whose draft tables are equal (same ``use``, same options; ``gamma``, ``name``,
    ``fallback`` and ``select`` belong to the arm) share one provider: one copy of the draft
    model and one cache that every gamma keeps up to date, so switching between them costs
    no catch-up. A provider gets ``gamma`` with each call and keeps state only about the
    sequences. ``None`` (an options object that cannot be hashed): the arm gets its own."""
    key = (choice.use, choice.config)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _describe(choice: ComponentChoice) -> str:
    model = getattr(choice.config, "model", None)
    return f"{choice.use}: {model}" if model else choice.use
