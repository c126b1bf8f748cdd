"""Placeholder: filled in by the restructuring."""
