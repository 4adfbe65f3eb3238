"""conf package."""
