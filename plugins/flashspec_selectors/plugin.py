"""Registers the bundled arm selectors."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flashspec_core import ArmSelector, ComponentSpec, hookimpl
from flashspec_selectors.keys import COMPONENTS
from flashspec_selectors.selectors import (
    UCB1,
    DiscountedThompson,
    DiscountedThompsonConfig,
    Factored,
    FactoredConfig,
    FixedConfig,
    FixedSelector,
    GLRThompson,
    GLRThompsonConfig,
    RequestThompson,
    RequestThompsonConfig,
    SlidingWindowUCB,
    SlidingWindowUCBConfig,
    Thompson,
    ThompsonConfig,
    UCB1Config,
)


def _fixed(config: FixedConfig | None, num_arms: int) -> ArmSelector:
    return FixedSelector(config or FixedConfig(), num_arms)


def _ucb1(config: UCB1Config | None, num_arms: int) -> ArmSelector:
    return UCB1(config or UCB1Config(), num_arms)


def _thompson(config: ThompsonConfig | None, num_arms: int) -> ArmSelector:
    return Thompson(config or ThompsonConfig(), num_arms)


def _sw_ucb(config: SlidingWindowUCBConfig | None, num_arms: int) -> ArmSelector:
    return SlidingWindowUCB(config or SlidingWindowUCBConfig(), num_arms)


def _discounted_thompson(config: DiscountedThompsonConfig | None, num_arms: int) -> ArmSelector:
    return DiscountedThompson(config or DiscountedThompsonConfig(), num_arms)


def _glr_thompson(config: GLRThompsonConfig | None, num_arms: int) -> ArmSelector:
    return GLRThompson(config or GLRThompsonConfig(), num_arms)


def _request_thompson(config: RequestThompsonConfig | None, num_arms: int) -> ArmSelector:
    return RequestThompson(config or RequestThompsonConfig(), num_arms)


def _factored(config: FactoredConfig | None, num_arms: int) -> ArmSelector:
    return Factored(config or FactoredConfig(), num_arms)


_FACTORIES: dict[str, Callable[..., ArmSelector]] = {
    "fixed": _fixed,
    "ucb1": _ucb1,
    "thompson": _thompson,
    "sliding_window_ucb": _sw_ucb,
    "discounted_thompson": _discounted_thompson,
    "glr_thompson": _glr_thompson,
    "request_thompson": _request_thompson,
    "factored": _factored,
}


def selector_specs() -> list[ComponentSpec[ArmSelector]]:
    """The selectors this plugin provides (also used directly by the simulator)."""
    return [ComponentSpec(k.name, "selector", _FACTORIES[k.name], k.config_cls, k.description) for k in COMPONENTS]


@hookimpl
def flashspec_arm_selectors() -> Iterable[ComponentSpec[ArmSelector]]:
    return selector_specs()
