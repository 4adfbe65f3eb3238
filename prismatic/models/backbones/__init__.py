"""backbones package."""
