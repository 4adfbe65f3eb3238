"""Base-VLM registry: Prismatic model id -> vision backbone, LLM backbone, projector and image preprocessing.

A VLA fine-tunes one of these. The published ids are Prismatic's (`prismatic/conf/models.py` in
TRI-ML/prismatic-vlms); OpenVLA starts from `prism-dinosiglip-224px+7b` (OpenVLA 7B) and `siglip-224px+7b`
(OpenVLA v0.1). This module is plain data: importing it loads neither torch nor any model code.
"""

from __future__ import annotations

from dataclasses import dataclass

from prismatic.util.errors import lookup


@dataclass(frozen=True)
class BaseVLMSpec:
    """What a base VLM is made of; every id must exist in its own registry."""

    vision_backbone_id: str
    llm_backbone_id: str
    arch_specifier: str
    image_resize_strategy: str


# fmt: off
BASE_VLMS: dict[str, BaseVLMSpec] = {
    # === Tiny (random init, CPU tests and smoke runs) ===
    "tiny-vit+tiny-llama": BaseVLMSpec("tiny-vit-64px", "tiny-llama", "gelu-mlp", "resize-naive"),
    "tiny-dinosiglip+tiny-llama": BaseVLMSpec("tiny-dinosiglip-64px", "tiny-llama", "fused-gelu-mlp", "resize-naive"),

    # === Section 4.2: single 224px representations (Vicuna v1.5, letterbox) ===
    "siglip-224px+7b": BaseVLMSpec("siglip-vit-so400m", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "clip-224px+7b": BaseVLMSpec("clip-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "dinov2-224px+7b": BaseVLMSpec("dinov2-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "in1k-224px+7b": BaseVLMSpec("in1k-vit-l", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),

    # === Section 4.3: Llama-2 base LLM (CLIP 336px, letterbox) ===
    "llama2+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "letterbox"),

    # === Section 5: Prisms (Llama-2 base LLM, naive resize) ===
    "prism-clip-controlled+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-clip+7b": BaseVLMSpec("clip-vit-l-336px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-siglip-controlled+7b": BaseVLMSpec(
        "siglip-vit-so400m-384px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"
    ),
    "prism-siglip+7b": BaseVLMSpec("siglip-vit-so400m-384px", "llama2-7b-pure", "no-align+gelu-mlp", "resize-naive"),
    "prism-dinosiglip-controlled+7b": BaseVLMSpec(
        "dinosiglip-vit-so-384px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip+7b": BaseVLMSpec(
        "dinosiglip-vit-so-384px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),

    # === Inference-optimised 224px Prisms (OpenVLA's base VLMs) ===
    "dinosiglip-224px-resize-naive+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "vicuna-v15-7b", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip-224px-controlled+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
    "prism-dinosiglip-224px+7b": BaseVLMSpec(
        "dinosiglip-vit-so-224px", "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive"
    ),
}
# fmt: on


def get_base_vlm_spec(base_vlm_id: str) -> BaseVLMSpec:
    """Look up a base-VLM id, raising a did-you-mean `ConfigError` when unknown."""
    return lookup(BASE_VLMS, base_vlm_id, "base VLM")
