"""The tiny models of :mod:`flashspec_core.testing.tiny`, under the name the tests import."""

from flashspec_core.testing.tiny import one_arm_dict, perturbed_lm, pipeline_dict, tiny_family, tiny_lm, tiny_tokenizer

__all__ = ["one_arm_dict", "perturbed_lm", "pipeline_dict", "tiny_family", "tiny_lm", "tiny_tokenizer"]
