"""Registers the bundled arm selectors."""
