"""flashspec_hf plugin."""
