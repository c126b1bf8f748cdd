"""The ``reference`` verifier's name, without torch (:class:`~flashspec_core.config.ComponentKeys`)."""

from __future__ import annotations

from flashspec_core.config import ComponentKeys

COMPONENTS = (ComponentKeys("verifier", "reference", None, "plain-torch rejection sampler"),)
