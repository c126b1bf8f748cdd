"""Registers the bundled arm selectors."""

from __future__ import annotations

from collections.abc import Iterable

from flashspec_core import ArmSelector, ComponentSpec, hookimpl
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


def selector_specs() -> list[ComponentSpec[ArmSelector]]:
    """The selectors this plugin provides (also used directly by the simulator)."""
    return [
        ComponentSpec("fixed", "selector", _fixed, FixedConfig, "always the configured arm"),
        ComponentSpec("ucb1", "selector", _ucb1, UCB1Config, "UCB1 (Auer et al. 2002)"),
        ComponentSpec("thompson", "selector", _thompson, ThompsonConfig, "Beta Thompson sampling, fractional rewards"),
        ComponentSpec(
            "sliding_window_ucb", "selector", _sw_ucb, SlidingWindowUCBConfig, "SW-UCB (Garivier & Moulines 2011)"
        ),
        ComponentSpec(
            "discounted_thompson",
            "selector",
            _discounted_thompson,
            DiscountedThompsonConfig,
            "discounted Thompson sampling (Raj & Kalyani 2017)",
        ),
        ComponentSpec(
            "glr_thompson",
            "selector",
            _glr_thompson,
            GLRThompsonConfig,
            "Thompson sampling with GLR change detection and restarts (Besson et al. 2022)",
        ),
        ComponentSpec(
            "request_thompson",
            "selector",
            _request_thompson,
            RequestThompsonConfig,
            "latent-state Thompson sampling over past requests (Hong et al. 2020); uses begin_request",
        ),
        ComponentSpec(
            "factored",
            "selector",
            _factored,
            FactoredConfig,
            "Thompson sampling on predicted tokens/s: pooled acceptance, step cost linear in rows and width; "
            "uses see_rows and observe",
        ),
    ]


@hookimpl
def flashspec_arm_selectors() -> Iterable[ComponentSpec[ArmSelector]]:
    return selector_specs()
