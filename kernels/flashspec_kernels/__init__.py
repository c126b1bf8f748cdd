"""Triton kernels, each beside its plain-torch reference: pure ops, no plugin code.

The ``triton`` verifier that wraps :mod:`flashspec_kernels.verify` is the plugin
:mod:`flashspec_triton`; the fast back-end calls :mod:`flashspec_kernels.attention` and
:mod:`flashspec_kernels.rope` itself.
"""
