"""flashspec_selectors plugin: bandit arm selectors, step rewards and a bandit simulator."""

from flashspec_core.rewards import ThroughputReward, acceptance_reward
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
    check_reward,
)

__all__ = [
    "DiscountedThompson",
    "DiscountedThompsonConfig",
    "Factored",
    "FactoredConfig",
    "FixedConfig",
    "FixedSelector",
    "GLRThompson",
    "GLRThompsonConfig",
    "RequestThompson",
    "RequestThompsonConfig",
    "SlidingWindowUCB",
    "SlidingWindowUCBConfig",
    "Thompson",
    "ThompsonConfig",
    "ThroughputReward",
    "UCB1",
    "UCB1Config",
    "acceptance_reward",
    "check_reward",
]
