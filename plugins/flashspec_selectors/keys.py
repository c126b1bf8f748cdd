"""The bundled selectors' names and config keys, without torch (:class:`~flashspec_core.config.ComponentKeys`)."""

from __future__ import annotations

from flashspec_core.config import ComponentKeys
from flashspec_selectors.selectors import (
    DiscountedThompsonConfig,
    FactoredConfig,
    FixedConfig,
    GLRThompsonConfig,
    RequestThompsonConfig,
    SlidingWindowUCBConfig,
    ThompsonConfig,
    UCB1Config,
)

COMPONENTS = (
    ComponentKeys("selector", "fixed", FixedConfig, "always the configured arm"),
    ComponentKeys("selector", "ucb1", UCB1Config, "UCB1 (Auer et al. 2002)"),
    ComponentKeys("selector", "thompson", ThompsonConfig, "Beta Thompson sampling, fractional rewards"),
    ComponentKeys("selector", "sliding_window_ucb", SlidingWindowUCBConfig, "SW-UCB (Garivier & Moulines 2011)"),
    ComponentKeys("selector", "discounted_thompson", DiscountedThompsonConfig,
                  "discounted Thompson sampling (Raj & Kalyani 2017)"),
    ComponentKeys("selector", "glr_thompson", GLRThompsonConfig,
                  "Thompson sampling with GLR change detection and restarts (Besson et al. 2022)"),
    ComponentKeys("selector", "request_thompson", RequestThompsonConfig,
                  "latent-state Thompson sampling over past requests (Hong et al. 2020); uses begin_request"),
    ComponentKeys("selector", "factored", FactoredConfig,
                  "Thompson sampling on predicted tokens/s: pooled acceptance, step cost linear in rows and width; "
                  "uses see_rows, observe and see_widths"),
)
