"""Vision backbones: timm ViT featurizers (single and fused) and their registry.

The registry and `build_vision_backbone` import without torch or timm. The backbone classes live in their modules
(`base_vision.VisionBackbone`, `timm_vit.TimmViTBackbone`, `fused_vit.FusedViTBackbone`): importing one loads them.
"""

from __future__ import annotations

from prismatic.models.backbones.vision.registry import (
    RESIZE_STRATEGIES,
    VISION_BACKBONES,
    FusedViTSpec,
    SingleViTSpec,
    VisionBackboneSpec,
    ViTSpec,
    build_vision_backbone,
    get_vision_backbone_spec,
)

__all__ = [
    "RESIZE_STRATEGIES",
    "VISION_BACKBONES",
    "FusedViTSpec",
    "SingleViTSpec",
    "ViTSpec",
    "VisionBackboneSpec",
    "build_vision_backbone",
    "get_vision_backbone_spec",
]
