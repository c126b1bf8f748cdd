"""Registers the ``triton`` verifier (imports triton lazily)."""
