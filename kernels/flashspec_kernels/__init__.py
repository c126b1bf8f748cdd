"""Triton kernels for on-device verification, each beside its plain-torch reference."""
