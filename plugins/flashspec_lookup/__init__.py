"""flashspec_lookup plugin."""
