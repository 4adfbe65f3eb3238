"""rlds package."""
