"""flashspec_selectors plugin."""
