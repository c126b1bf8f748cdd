"""The pipeline law gate of :mod:`flashspec_core.testing.tiny`, under the name the stats tests import."""

from flashspec_core.testing.tiny import ALPHA, Adversaries, gate, law_of

__all__ = ["ALPHA", "Adversaries", "gate", "law_of"]
