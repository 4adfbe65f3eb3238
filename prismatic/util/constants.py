"""Constants shared by data, models and training."""

# Label value ignored by the LLM's cross-entropy (HF convention).
IGNORE_INDEX = -100
