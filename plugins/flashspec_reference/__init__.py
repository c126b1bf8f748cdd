"""The plain-torch reference verifier."""
