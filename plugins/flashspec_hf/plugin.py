"""Registers the Hugging Face causal-LM draft provider."""
