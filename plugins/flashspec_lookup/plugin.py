"""Registers the prompt-lookup (n-gram) draft provider."""
