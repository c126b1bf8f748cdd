"""TOML -> frozen :class:`PipelineConfig`, with errors that name file, table and key.

``use = "name"`` picks a registered component; the table's other keys (besides the
pipeline's own: ``gamma``, ``name``, ``fallback`` and ``select`` for arms; ``reward``,
``speculate_max_batch``, ``first`` and ``draw_ahead`` for the selector) go to
that component's config class, so an unknown key or a bad value fails at load time.

.. code-block:: toml

    [target]
    model = "qwen2.5-coder-1.5b-instruct"   # use = "hf" is the default

    [[arm]]
    use = "hf"
    model = "qwen2.5-coder-0.5b-instruct"
    gamma = 4

    [[arm]]
    use = "prompt_lookup"
    gamma = 8

    [selector]
    use = "thompson"
    reward = "throughput"
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import attrs

from flashspec_core.contracts import ComponentKind, SamplingParams
from flashspec_core.registry import Registry

REWARDS = ("acceptance", "throughput")
MAX_GAMMA = 64
_TOP_LEVEL = {"target", "arm", "verifier", "selector", "generation"}


class ConfigError(ValueError):
    """A config file or dict is invalid; the message names where."""

    def __init__(self, source: str, table: str, key: str | None, message: str) -> None:
        where = f"[{table}]" + (f" key {key!r}" if key else "")
        super().__init__(f"{source}: {where}: {message}")
        self.source, self.table, self.key = source, table, key


@attrs.frozen
class ComponentChoice:
    use: str
    config: Any  # the component's config instance, or None


@attrs.frozen
class ArmConfig:
    name: str
    draft: ComponentChoice
    gamma: int
    fallback: str | None = None  # another arm's name: proposes when this arm's proposal is empty
    select: bool = True  # False: the arm serves only as another arm's fallback, or as the first arm


@attrs.frozen
class GenerationDefaults:
    max_new_tokens: int = attrs.field(default=128, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=0.0, converter=float)
    top_k: int = 0
    top_p: float = attrs.field(default=1.0, converter=float)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        SamplingParams(self.temperature, self.top_k, self.top_p)  # same checks as at run time


@attrs.frozen
class PipelineConfig:
    source: str
    target: ComponentChoice
    arms: tuple[ArmConfig, ...]
    verifier: ComponentChoice
    selector: ComponentChoice
    reward: str
    generation: GenerationDefaults
    speculate_max_batch: int | None = None  # [selector] key: more live rows than this decode without drafting
    first: str | None = None  # [selector] key: an arm tried before the selector; it chooses only when that proposes nothing
    draw_ahead: bool = True  # [selector] key: draw the next step's choice while the device runs this one


def load_config(path: str | os.PathLike[str], registry: Registry) -> PipelineConfig:
    source = str(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(source, "-", None, "file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "-", None, f"not valid TOML: {exc}") from None
    return parse_config(data, registry, source, base_dir=Path(path).parent)


def parse_config(
    data: dict[str, Any], registry: Registry, source: str = "<dict>", base_dir: Path | None = None
) -> PipelineConfig:
    for key in data:
        if key not in _TOP_LEVEL:
            raise ConfigError(source, key, None, f"unknown table; expected one of {sorted(_TOP_LEVEL)}")
    arms_data = data.get("arm", [])
    if not isinstance(arms_data, list) or not arms_data:
        raise ConfigError(source, "arm", None, "at least one [[arm]] table is required")
    target = _choice(registry, "target", _table(data, "target", source), source, "target", "hf", base_dir)
    arms = tuple(_arm(registry, a, source, f"arm.{i}", base_dir) for i, a in enumerate(arms_data))
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise ConfigError(source, "arm", "name", f"arm names must be unique, got {names}")
    by_name = {a.name: a for a in arms}
    for i, a in enumerate(arms):
        if a.fallback is None:
            continue
        other = by_name.get(a.fallback)
        if other is None or other is a:
            raise ConfigError(source, f"arm.{i}", "fallback",
                              f"must name another arm ({', '.join(n for n in names if n != a.name)}), got {a.fallback!r}")
        if other.fallback is not None:
            raise ConfigError(source, f"arm.{i}", "fallback",
                              f"arm {other.name!r} has a fallback of its own; fallbacks do not chain")
    if not any(a.select for a in arms):
        raise ConfigError(source, "arm", "select", "every arm has select = false: the selector needs at least one arm")
    verifier = _choice(registry, "verifier", _table(data, "verifier", source), source, "verifier", "auto", base_dir)
    sel_table = dict(_table(data, "selector", source))
    first = sel_table.pop("first", None)
    if first is not None:
        gate = by_name.get(first) if isinstance(first, str) else None
        if gate is None:
            raise ConfigError(source, "selector", "first", f"must name an arm ({', '.join(names)}), got {first!r}")
        if gate.fallback is not None or gate.draft.use == "none":
            why = "has a fallback" if gate.fallback is not None else "is the 'none' arm, whose proposal is always empty"
            raise ConfigError(source, "selector", "first",
                              f"arm {first!r} {why}; the first arm's empty proposal is where the selector chooses")
    fallbacks = {a.fallback for a in arms} | {first}
    for i, a in enumerate(arms):
        if not a.select and a.name not in fallbacks:
            raise ConfigError(source, f"arm.{i}", "select",
                              f"arm {a.name!r} has select = false and is neither an arm's fallback nor [selector] first, "
                              "so it would never run")
    reward = sel_table.pop("reward", "acceptance")
    if reward not in REWARDS:
        raise ConfigError(source, "selector", "reward", f"must be one of {REWARDS}, got {reward!r}")
    limit = sel_table.pop("speculate_max_batch", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(source, "selector", "speculate_max_batch",
                          f"must be an integer >= 1 (live rows up to which steps speculate), got {limit!r}")
    draw_ahead = sel_table.pop("draw_ahead", True)
    if not isinstance(draw_ahead, bool):
        raise ConfigError(source, "selector", "draw_ahead", f"must be true or false, got {draw_ahead!r}")
    selector = _choice(registry, "selector", sel_table, source, "selector", "fixed", base_dir)
    gen_table = _table(data, "generation", source)
    generation = _build(GenerationDefaults, gen_table, source, "generation", "generation settings")
    return PipelineConfig(source, target, arms, verifier, selector, reward, generation, limit, first, draw_ahead)


def _table(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(source, name, None, f"must be a table, got {type(table).__name__}")
    return table


def _arm(registry: Registry, table: Any, source: str, where: str, base_dir: Path | None) -> ArmConfig:
    if not isinstance(table, dict):
        raise ConfigError(source, where, None, "each [[arm]] must be a table")
    keys = dict(table)
    gamma = keys.pop("gamma", None)
    name = keys.pop("name", None)
    fallback = keys.pop("fallback", None)
    select = keys.pop("select", True)
    if not isinstance(select, bool):
        raise ConfigError(source, where, "select", f"must be true or false, got {select!r}")
    if fallback is not None and not isinstance(fallback, str):
        raise ConfigError(source, where, "fallback", f"must be another arm's name, got {fallback!r}")
    draft = _choice(registry, "draft", keys, source, where, None, base_dir)
    if gamma is None:
        gamma = 0 if draft.use == "none" else 4
    if not isinstance(gamma, int) or isinstance(gamma, bool):
        raise ConfigError(source, where, "gamma", f"must be an integer, got {gamma!r}")
    if draft.use == "none" and gamma != 0:
        raise ConfigError(source, where, "gamma", f"the 'none' arm drafts nothing: gamma must be 0, got {gamma}")
    if draft.use != "none" and not 1 <= gamma <= MAX_GAMMA:
        raise ConfigError(
            source, where, "gamma", f"must be in 1..{MAX_GAMMA} for draft {draft.use!r}, got {gamma} "
            "(use = \"none\" is the gamma = 0 arm)"
        )
    if name is None:
        model = getattr(draft.config, "model", None)
        name = f"{Path(model).name if model else draft.use}-g{gamma}"
    if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
        raise ConfigError(source, where, "name", f"must be a word (letters, digits, _ . -), got {name!r}")
    if fallback is not None and draft.use == "none":
        raise ConfigError(source, where, "fallback", "the 'none' arm's proposal is always empty: give it no fallback")
    return ArmConfig(name=name, draft=draft, gamma=gamma, fallback=fallback, select=select)


def _choice(
    registry: Registry,
    kind: ComponentKind,
    table: dict[str, Any],
    source: str,
    where: str,
    default: str | None,
    base_dir: Path | None,
) -> ComponentChoice:
    keys = dict(table)
    use = keys.pop("use", default)
    if use is None:
        raise ConfigError(source, where, "use", f"missing: name a {kind} component ({', '.join(registry.names(kind))})")
    if kind == "verifier" and use == "auto":
        return ComponentChoice(use="auto", config=None)
    try:
        spec = registry.get(kind, use)
    except KeyError as exc:
        raise ConfigError(source, where, "use", str(exc.args[0])) from None
    if base_dir is not None and isinstance(keys.get("model"), str):
        keys["model"] = _relative(keys["model"], base_dir)
    if spec.config_cls is None:
        if keys:
            raise ConfigError(source, where, next(iter(keys)), f"unknown key: {kind} {use!r} takes no keys")
        return ComponentChoice(use=use, config=None)
    return ComponentChoice(use=use, config=_build(spec.config_cls, keys, source, where, f"{kind} {use!r}"))


def _relative(model: str, base_dir: Path) -> str:
    """Model paths in a file are relative to that file (known names stay as they are)."""
    candidate = base_dir / Path(model).expanduser()
    return str(candidate) if not Path(model).is_absolute() and candidate.is_dir() else model


def _build(cls: type, keys: dict[str, Any], source: str, where: str, what: str) -> Any:
    allowed = [f.alias for f in attrs.fields(cls)]
    for key in keys:
        if key not in allowed:
            raise ConfigError(source, where, key, f"unknown key for {what}; allowed: {', '.join(allowed)}")
    try:
        return cls(**keys)
    except TypeError as exc:
        missing = re.findall(r"'(\w+)'", str(exc))
        raise ConfigError(
            source, where, missing[0] if missing else None, f"missing required key for {what}" if missing else str(exc)
        ) from None
    except ValueError as exc:
        bad = next((k for k in keys if re.search(rf"\b{re.escape(k)}\b", str(exc))), None)
        raise ConfigError(source, where, bad, str(exc)) from None
