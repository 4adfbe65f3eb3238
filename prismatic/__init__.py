"""prismatic: fine-tune Vision-Language-Action policies (vision backbone + projector + LLM) on RLDS data."""
