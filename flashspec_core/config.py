"""TOML -> frozen :class:`PipelineConfig`, with errors that name file, table and key.

``use = "name"`` picks a registered component; the table's other keys (besides the
pipeline's own: ``gamma``, ``name``, ``fallback`` and ``select`` for arms; ``reward``,
``speculate_max_batch``, ``batch_buckets``, ``first`` and ``draw_ahead`` for the selector) go to
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

This module imports neither torch nor any plugin, so the command line checks its options
and a config file without waiting for torch. :func:`check_config` holds every check that
needs no plugin: the tables, ``[generation]`` (through :func:`check_generation`, the one
check of generation settings behind the CLI, a config and ``Pipeline.generate``), the
``[selector]`` keys the pipeline reads, and each arm's ``gamma``, ``name``, ``fallback``,
``select`` and ``use`` types. :func:`parse_config` runs it, then resolves components and
their own keys, and the cross-references (fallback, first), which need the registry and
so the plugins, which import torch. :func:`check_components` runs :func:`parse_config`
against the plugins' light keys modules instead (:class:`ComponentKeys`, gathered by
:func:`flashspec_core.registry.build_catalogue`), so a component's name and keys are
checked before torch too, up to a name only a plugin without such a module may provide.
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
import re
import sys
import tomllib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs

from flashspec_core import machine

if TYPE_CHECKING:  # imports torch
    from flashspec_core.contracts import ComponentKind

REWARDS = ("acceptance", "throughput")
TREE_CHILDREN = ("topk", "sample")  # how a sampling draft step picks a tree node's children
MAX_GAMMA = 64  # the triton verifier takes trees of this many nodes (flashspec_kernels.verify_tree.MAX_NODES)
_TOP_LEVEL = {"target", "arm", "verifier", "selector", "generation"}
GENERATION_KEYS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed")
_FLOAT_MAX = sys.float_info.max  # a finite temperature is at most this: inf is refused


class ConfigError(ValueError):
    """A config file or dict is invalid; the message names where."""

    def __init__(self, source: str, table: str, key: str | None, message: str) -> None:
        where = f"[{table}]" + (f" key {key!r}" if key else "")
        super().__init__(f"{source}: {where}: {message}")
        self.source, self.table, self.key = source, table, key


class BoundsError(ValueError):
    """A generation setting is out of bounds or of the wrong type; ``key`` names it."""

    def __init__(self, key: str, label: str, rule: str, value: object) -> None:
        super().__init__(f"{label} {rule}, got {value!r}")
        self.key = key


@attrs.frozen
class ComponentKeys:
    """What a config is checked against without importing the component: a plugin's light
    keys module (attrs and the standard library only) lists one per component in
    ``COMPONENTS``, and its ``plugin.py`` builds the ComponentSpecs from the same list."""

    kind: Literal["target", "draft", "verifier", "selector"]  # contracts.ComponentKind
    name: str
    config_cls: type | None = None  # None: the component takes no keys
    description: str = ""
    # Why the component certainly cannot run on this machine, told without torch (None: it may,
    # and its build decides); checked with the config, so the user need not wait for torch.
    unusable_here: Callable[[], str | None] | None = None


# Set while check_components runs: validators that would need torch (check_device) check names,
# and a machine only where it certainly lacks what they name.
_BEFORE_TORCH: ContextVar[bool] = ContextVar("before_torch", default=False)


class Undecided(Exception):  # noqa: N818 (not an error: the check stops and the build decides)
    """A light check cannot tell: the name may come from a plugin that has no keys module."""


class Components(Protocol):
    """What :func:`parse_config` reads from a registry or a light catalogue."""

    def get(self, kind: ComponentKind, name: str) -> Any:  # has ``config_cls``; KeyError if unknown
        ...

    def names(self, kind: ComponentKind) -> list[str]:
        ...


@attrs.frozen
class _Bound:
    rule: str
    integer: bool
    low: float
    high: float
    low_open: bool = False

    def check(self, value: object) -> int | float | None:
        """``value`` as an int or float if it is within bounds, else None (NaN never is)."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None
        if self.integer:
            if not isinstance(value, numbers.Integral):
                return None
            number: int | float = int(value)
        else:
            number = float(value)
        above = self.low < number if self.low_open else self.low <= number
        return number if above and number <= self.high else None


_BOUNDS = {
    "max_new_tokens": _Bound("must be an integer >= 1", True, 1, math.inf),
    "temperature": _Bound("must be a finite number >= 0", False, 0.0, _FLOAT_MAX),
    "top_k": _Bound("must be an integer >= 0 (0 = off)", True, 0, math.inf),
    "top_p": _Bound("must be a number in (0, 1]", False, 0.0, 1.0, low_open=True),
    "seed": _Bound("must be an integer in [0, 2**64)", True, 0, 2**64 - 1),  # torch.Generator.manual_seed's range
}


def check_generation(values: Mapping[str, object], label: Callable[[str], str] = str) -> dict[str, Any]:
    """Check generation settings against their bounds.

    The one check behind the command line's options, a config's ``[generation]`` table and
    :meth:`~flashspec_core.pipeline.Pipeline.generate`'s arguments.

    :param values: some of :data:`GENERATION_KEYS` with their values.
    :param label: how the caller's user names a key (``"--top-p"`` on the command line).
    :returns: the values, integers as ``int`` and the others as ``float``.
    :raises BoundsError: for the first value of the wrong type or out of bounds.
    """
    checked: dict[str, Any] = {}
    for key, value in values.items():
        bound = _BOUNDS[key]
        number = bound.check(value)
        if number is None:
            raise BoundsError(key, label(key), bound.rule, value)
        checked[key] = number
    return checked


def check_prompt(prompt: str, label: str = "the prompt") -> None:
    """Refuse text that is not valid UTF-8: lone surrogates, which is what command-line bytes
    that were not UTF-8 become. Control characters pass to the tokenizer as they are.

    :raises ValueError: naming the first bad character's position.
    """
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(prompt[exc.start])
        what = f"byte {code - 0xDC00:#04x}" if 0xDC80 <= code <= 0xDCFF else f"lone surrogate U+{code:04X}"
        raise ValueError(f"{label} is not valid UTF-8 ({what} at character {exc.start})") from None


def check_prompt_text(prompt: str, label: str = "the prompt") -> None:
    """:func:`check_prompt`, and refuse a prompt that is empty or only whitespace: a chat
    template would turn it into tokens, so the model would answer a question nobody asked.

    :raises ValueError: naming the prompt as ``label``.
    """
    check_prompt(prompt, label)
    if not prompt.strip():
        what = "empty" if not prompt else f"only whitespace ({len(prompt)} characters)"
        raise ValueError(f"{label} is {what}: give the text to continue")


DEVICE_TYPES = ("cpu", "cuda", "mps", "xpu")  # torch device types a model runs on (ROCm's is "cuda")


def check_device(value: str) -> None:
    """Refuse a torch device this machine lacks (``cuda`` on a CPU build, ``cuda:7`` with two
    GPUs) when the config is read, not when a loaded model moves there. ``auto`` passes.
    Within :func:`check_components`, before torch is imported, the name's form is checked, and
    a ``cuda`` device only where :func:`flashspec_core.machine.no_cuda` is sure there is none.

    :raises ValueError: naming the device and what the machine has.
    """
    if value == "auto":
        return
    if not re.fullmatch(r"[a-z_]+(:\d+)?", value) or value.partition(":")[0] not in DEVICE_TYPES:
        # torch knows "meta", "tpu"-like names too, but no model computes there
        raise ValueError(f"device {value!r} is not a torch device FlashSpec runs on "
                         f"({', '.join(repr(t) for t in DEVICE_TYPES)}, with an index such as \"cuda:1\", or \"auto\")")
    if _BEFORE_TORCH.get():  # the machine is checked again at build, once torch is imported
        absent = machine.no_cuda() if value.partition(":")[0] == "cuda" else None
        if absent is not None:
            raise ValueError(f"device {value!r} is not on this machine: {absent}, so torch sees no cuda device "
                             f"(use \"cpu\" or \"auto\")")
        return
    import torch  # the plugins that call this have imported it already

    try:
        device = torch.device(value)
    except RuntimeError as exc:
        raise ValueError(f"device {value!r} is not a torch device ({exc})") from None
    backend = getattr(torch, device.type, None) if device.type in ("cuda", "mps", "xpu") else None
    if backend is None:
        return
    count = backend.device_count() if backend.is_available() else 0
    if count == 0:
        raise ValueError(f"device {value!r} is not on this machine: torch sees no {device.type} device "
                         f"(use \"cpu\" or \"auto\")")
    if device.index is not None and device.index >= count:
        names = ", ".join(f"{device.type}:{i}" for i in range(count))
        raise ValueError(f"device {value!r} is not on this machine: it has {count} {device.type} "
                         f"device{'s' if count > 1 else ''} ({names})")


def _float_if_real(value: Any) -> Any:
    """TOML's ``temperature = 1`` is a float; anything else is left for the check to name."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


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
    select: bool = True  # False: never the selector's; runs as a fallback, as the first arm, or alone in `flashspec bench`


@attrs.frozen
class GenerationDefaults:
    max_new_tokens: int = 128
    temperature: float = attrs.field(default=0.0, converter=_float_if_real)
    top_k: int = 0
    top_p: float = attrs.field(default=1.0, converter=_float_if_real)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        check_generation(attrs.asdict(self))  # the same check as the CLI's and Pipeline.generate's


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
    batch_buckets: tuple[int, ...] = (1,)  # [selector] key: smallest live-row count of each bucket (one selector each)
    first_explore: int = 8  # [selector] key: one of every N first-arm proposals goes against its gate (0: no gate)
    first_tokens: int | None = None  # [selector] key: positions a first-arm step verifies over the batch, about


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The TOML in a config file; a missing, unreadable or malformed file is a :class:`ConfigError`."""
    source = str(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(source, "-", None, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(source, "-", None, "is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(source, "-", None, f"cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(source, "-", None, f"not valid UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, "-", None, f"not valid TOML: {exc}") from None


def load_config(path: str | os.PathLike[str], registry: Components) -> PipelineConfig:
    return parse_config(read_config(path), registry, str(path), base_dir=Path(path).parent)


def check_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a config file and run :func:`check_config` on it (no plugin, no torch); return its data."""
    data = read_config(path)
    check_config(data, str(path))
    return data


def check_config(data: dict[str, Any], source: str = "<dict>") -> None:
    """Every check that needs no plugin (see the module docstring); :func:`parse_config` runs it first."""
    for i, arm in enumerate(_arm_tables(data, source)):
        _use_type(_arm_keys(arm, source, f"arm.{i}")[4], source, f"arm.{i}")
    for name in ("target", "verifier"):
        _use_type(_table(data, name, source), source, name)
    selector = dict(_table(data, "selector", source))
    _use_type(selector, source, "selector")
    _selector_keys(selector, source)
    _generation(data, source)


def check_components(
    data: dict[str, Any], catalogue: Components, source: str = "<dict>", base_dir: Path | None = None
) -> None:
    """:func:`parse_config` against a light catalogue: every check it can make before torch loads.

    :raises ConfigError: the first mistake found; nothing when a name is :class:`Undecided`
        (the checks after it run at build time).
    """
    token = _BEFORE_TORCH.set(True)
    try:
        parse_config(data, catalogue, source, base_dir)
    except Undecided:
        pass
    finally:
        _BEFORE_TORCH.reset(token)


def parse_config(
    data: dict[str, Any], registry: Components, source: str = "<dict>", base_dir: Path | None = None
) -> PipelineConfig:
    check_config(data, source)
    arms_data = data["arm"]
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
    reward, limit, draw_ahead, buckets, first_explore, first_tokens = _selector_keys(sel_table, source)
    if first_tokens is not None and first is None:
        raise ConfigError(source, "selector", "first_tokens",
                          "caps the proposals of the first arm, but [selector] names no first arm (first = ...)")
    selector = _choice(registry, "selector", sel_table, source, "selector", "fixed", base_dir)
    arms_problem = getattr(selector.config, "arms_problem", None)  # a keys class's check against the arm count
    if callable(arms_problem):
        found = arms_problem(sum(a.select for a in arms))
        if found is not None:
            raise ConfigError(source, "selector", found[0], found[1])
    generation = _generation(data, source)
    return PipelineConfig(source, target, arms, verifier, selector, reward, generation, limit, first, draw_ahead, buckets,
                          first_explore, first_tokens)


def _arm_tables(data: dict[str, Any], source: str) -> list[dict[str, Any]]:
    for key in data:
        if key not in _TOP_LEVEL:
            raise ConfigError(source, key, None, f"unknown table; expected one of {sorted(_TOP_LEVEL)}")
    arms = data.get("arm", [])
    if not isinstance(arms, list) or not arms:
        raise ConfigError(source, "arm", None, "at least one [[arm]] table is required "
                          "(one with use = \"none\" alone decodes with the target only)")
    for i, arm in enumerate(arms):
        if not isinstance(arm, dict):
            raise ConfigError(source, f"arm.{i}", None, "each [[arm]] must be a table")
    return arms


def _selector_keys(sel_table: dict[str, Any], source: str
                   ) -> tuple[str, int | None, bool, tuple[int, ...], int, int | None]:
    """Pop and check the [selector] keys the pipeline reads: reward, speculate_max_batch, draw_ahead,
    batch_buckets, first_explore, first_tokens."""
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
    buckets = sel_table.pop("batch_buckets", [1])
    problem = batch_buckets_problem(buckets)
    if problem is not None:
        raise ConfigError(source, "selector", "batch_buckets", f"{problem}, got {buckets!r}")
    first_explore = sel_table.pop("first_explore", 8)
    if isinstance(first_explore, bool) or not isinstance(first_explore, int) or first_explore < 0:
        raise ConfigError(source, "selector", "first_explore",
                          f"must be an integer >= 0 (one of every N first-arm proposals explores; 0: the first arm "
                          f"always plays), got {first_explore!r}")
    first_tokens = sel_table.pop("first_tokens", None)
    if first_tokens is not None and (isinstance(first_tokens, bool) or not isinstance(first_tokens, int)
                                     or first_tokens < 2):
        raise ConfigError(source, "selector", "first_tokens",
                          f"must be an integer >= 2 (positions a step of the first arm verifies over the batch: "
                          f"at most first_tokens // rows - 1 draft tokens a row), got {first_tokens!r}")
    return reward, limit, draw_ahead, tuple(buckets), first_explore, first_tokens


def batch_buckets_problem(buckets: object) -> str | None:
    """What is wrong with ``batch_buckets`` (None: nothing): a non-empty list of increasing
    integers starting at 1, each the smallest live-row count of its bucket."""
    if not isinstance(buckets, list | tuple) or not buckets:
        return "must be a non-empty list of live-row counts, such as [1, 2, 4, 8, 16, 32]"
    if any(isinstance(b, bool) or not isinstance(b, int) for b in buckets):
        return "must hold integers (the smallest live-row count of each bucket)"
    if buckets[0] != 1:
        return "must start at 1, so that every live-row count has a bucket"
    if any(a >= b for a, b in zip(buckets, buckets[1:], strict=False)):
        return "must be strictly increasing"
    return None


def _generation(data: dict[str, Any], source: str) -> GenerationDefaults:
    table = _table(data, "generation", source)
    # check_generation names type and bounds in one message, the one the CLI and the API give too
    return _build(GenerationDefaults, table, source, "generation", "generation settings",  # type: ignore[no-any-return]
                  typed=False)


def _use_type(table: dict[str, Any], source: str, where: str) -> None:
    use = table.get("use")
    if use is not None and not isinstance(use, str):
        raise ConfigError(source, where, "use", f"must be a component's name (a string), got {use!r}")


def _table(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(source, name, None, f"must be a table, got {type(table).__name__}")
    return table


ARM_KEYS = ("gamma", "name", "fallback", "select")  # an arm's keys the pipeline reads, not its draft


def _arm_keys(table: dict[str, Any], source: str, where: str) -> tuple[Any, Any, Any, bool, dict[str, Any]]:
    """Pop and type-check an arm's own keys: ``(gamma, name, fallback, select, the draft's keys)``."""
    keys = dict(table)
    gamma = keys.pop("gamma", None)
    name = keys.pop("name", None)
    fallback = keys.pop("fallback", None)
    select = keys.pop("select", True)
    if not isinstance(select, bool):
        raise ConfigError(source, where, "select", f"must be true or false, got {select!r}")
    if fallback is not None and not isinstance(fallback, str):
        raise ConfigError(source, where, "fallback", f"must be another arm's name, got {fallback!r}")
    if gamma is not None and (not isinstance(gamma, int) or isinstance(gamma, bool)):
        raise ConfigError(source, where, "gamma", f"must be an integer, got {gamma!r}")
    if name is not None:
        _check_arm_name(name, source, where)
    return gamma, name, fallback, select, keys


def _check_arm_name(name: Any, source: str, where: str) -> None:
    if not isinstance(name, str) or not re.fullmatch(r"[\w.\-]+", name):
        raise ConfigError(source, where, "name", f"must be a word (letters, digits, _ . -), got {name!r}")


def _arm(registry: Components, table: dict[str, Any], source: str, where: str, base_dir: Path | None) -> ArmConfig:
    gamma, name, fallback, select, keys = _arm_keys(table, source, where)
    draft = _choice(registry, "draft", keys, source, where, None, base_dir)
    if gamma is None:
        gamma = 0 if draft.use == "none" else 4
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
        _check_arm_name(name, source, where)
    if fallback is not None and draft.use == "none":
        raise ConfigError(source, where, "fallback", "the 'none' arm's proposal is always empty: give it no fallback")
    return ArmConfig(name=name, draft=draft, gamma=gamma, fallback=fallback, select=select)


def _choice(
    registry: Components,
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
    unusable = getattr(spec, "unusable_here", None) if _BEFORE_TORCH.get() else None
    reason = unusable() if unusable is not None else None
    if reason is not None:
        raise ConfigError(source, where, "use", f"{kind} {use!r} cannot run on this machine: {reason}")
    if base_dir is not None and isinstance(keys.get("model"), str):
        keys["model"] = _relative(keys["model"], base_dir)
    if spec.config_cls is None:
        if keys:
            key = next(iter(keys))
            near = difflib.get_close_matches(key, ARM_KEYS if kind == "draft" else (), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(source, where, key, f"unknown key: {kind} {use!r} takes no keys{hint}")
        return ComponentChoice(use=use, config=None)
    own = ("use", *ARM_KEYS) if kind == "draft" else ()
    return ComponentChoice(use=use, config=_build(spec.config_cls, keys, source, where, f"{kind} {use!r}", own))


def _relative(model: str, base_dir: Path) -> str:
    """Model paths in a file are relative to that file (known names stay as they are)."""
    if not model.strip():  # "" would name the config's own directory
        return model
    candidate = base_dir / Path(model).expanduser()
    return str(candidate) if not Path(model).is_absolute() and candidate.is_dir() else model


def _build(
    cls: type, keys: dict[str, Any], source: str, where: str, what: str, own: Sequence[str] = (), typed: bool = True
) -> Any:
    """``cls(**keys)``, its errors as ConfigErrors; ``own``: an arm's keys the pipeline reads
    itself (``gamma``...), listed after the component's and offered for a misspelt key;
    ``typed``: each key's value is first checked against its field's annotation."""
    allowed = [f.alias for f in attrs.fields(cls)]
    for key in keys:
        if key not in allowed:
            near = difflib.get_close_matches(key, [*own, *allowed], n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            also = f"; the arm's own: {', '.join(own)}" if own else ""
            raise ConfigError(source, where, key, f"unknown key for {what}; allowed: {', '.join(allowed)}{also}{hint}")
    wrong = _wrong_type(cls, keys) if typed else None
    if wrong is not None:
        raise ConfigError(source, where, wrong[0], wrong[1])
    try:
        return cls(**keys)
    except BoundsError as exc:
        raise ConfigError(source, where, exc.key, str(exc)) from None
    except TypeError as exc:
        missing = re.findall(r"'(\w+)'", str(exc)) if "missing" in str(exc) else []
        if missing:
            raise ConfigError(source, where, missing[0], f"missing required key for {what}") from None
        raise _named(exc, keys, source, where) from None
    except ValueError as exc:
        raise _named(exc, keys, source, where) from None


def _named(exc: Exception, keys: dict[str, Any], source: str, where: str) -> ConfigError:
    """A validator's error as a ConfigError naming the key its message names."""
    # attrs' in_ validator puts the attribute's repr and the options after its message
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    bad = next((k for k in keys if re.search(rf"\b{re.escape(k)}\b", message)), None)
    return ConfigError(source, where, bad, message)


def _wrong_type(cls: type, keys: dict[str, Any]) -> tuple[str, str] | None:
    """The first key whose value is not of its field's annotated type, and the message; None if all are.

    attrs checks no annotation, so without this ``max_ngram = 2.5`` would be taken as is and
    ``device = 3`` would fail inside a validator with a message naming no key. A field whose
    annotation this does not model (a class, ``Any``) is left to its validators.
    """
    try:
        fields = {f.alias: f.type for f in attrs.fields(attrs.resolve_types(cls))}
    except (NameError, TypeError):  # an annotation only a type checker resolves
        return None
    for key, value in keys.items():
        kind = fields.get(key)
        if kind is not None and _fits(value, kind) is False:
            return key, f"{key} must be {_describe(kind)}, got {value!r}"
    return None


_SCALARS: dict[Any, tuple[str, Callable[[Any], bool]]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, int | float) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
    type(None): ("left out", lambda v: v is None),
}


def _fits(value: Any, kind: Any) -> bool | None:
    """Whether ``value`` (as TOML gives it) is a ``kind``; None where ``kind`` is not modelled."""
    if kind in _SCALARS:
        return _SCALARS[kind][1](value)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        fits = [_fits(value, a) for a in args]
        return None if None in fits and not any(fits) else any(fits)
    if origin is Literal:
        return value in args
    if origin in (tuple, list) and args:
        if not isinstance(value, list | tuple):
            return False
        item = args[0] if origin is list or (len(args) == 2 and args[1] is Ellipsis) else None
        if item is None:
            return len(value) == len(args) and all(_fits(v, a) is not False for v, a in zip(value, args, strict=True))
        return all(_fits(v, item) is not False for v in value)
    return None


def _describe(kind: Any) -> str:
    if kind in _SCALARS:
        return _SCALARS[kind][0]
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (tuple, list) and args:
        return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
    return str(kind)
