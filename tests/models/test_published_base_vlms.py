"""Base-VLM ids resolve to the combinations TRI-ML's Prismatic registry publishes (prismatic/conf/models.py)."""

from __future__ import annotations

import pytest

from prismatic.models import get_base_vlm_spec

# (vision backbone, LLM backbone, projector arch, image resize strategy), as published.
PUBLISHED = {
    "siglip-224px+7b": ("siglip-vit-so400m", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "prism-dinosiglip-224px+7b": (
        "dinosiglip-vit-so-224px",
        "llama2-7b-pure",
        "no-align+fused-gelu-mlp",
        "resize-naive",
    ),
    "prism-dinosiglip+7b": (
        "dinosiglip-vit-so-384px",
        "llama2-7b-pure",
        "no-align+fused-gelu-mlp",
        "resize-naive",
    ),
    "dinosiglip-224px-resize-naive+7b": (
        "dinosiglip-vit-so-224px",
        "vicuna-v15-7b",
        "no-align+fused-gelu-mlp",
        "resize-naive",
    ),
    "llama2+7b": ("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "letterbox"),
    "mistral-v0.1+7b": ("clip-vit-l-336px", "mistral-v0.1-7b-pure", "no-align+gelu-mlp", "letterbox"),
    "phi-2+3b": ("clip-vit-l-336px", "phi-2-3b", "no-align+gelu-mlp", "letterbox"),
    "dinoclip-336px-letterbox+7b": (
        "dinoclip-vit-l-336px",
        "vicuna-v15-7b",
        "no-align+fused-gelu-mlp",
        "letterbox",
    ),
    "prism-siglip+7b": ("siglip-vit-so400m-384px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
}


@pytest.mark.parametrize("base_vlm_id", sorted(PUBLISHED))
def test_published_combination(base_vlm_id: str):
    spec = get_base_vlm_spec(base_vlm_id)
    got = (spec.vision_backbone_id, spec.llm_backbone_id, spec.arch_specifier, spec.image_resize_strategy)
    assert got == PUBLISHED[base_vlm_id]
