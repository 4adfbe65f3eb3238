"""vla package."""
