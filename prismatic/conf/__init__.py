"""Configuration: the root `TrainConfig` and the VLA experiment registry (`VLAConfig`)."""
