"""Vision backbones: timm ViT featurizers (single and fused) and their registry.

The registry and `build_vision_backbone` import without torch or timm; the backbone classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.backbones.vision.base_vision import ImageTransform, VisionBackbone
    from prismatic.models.backbones.vision.fused_vit import FusedViTBackbone
    from prismatic.models.backbones.vision.timm_vit import TimmViTBackbone

_LAZY = {
    "ImageTransform": "prismatic.models.backbones.vision.base_vision",
    "VisionBackbone": "prismatic.models.backbones.vision.base_vision",
    "TimmViTBackbone": "prismatic.models.backbones.vision.timm_vit",
    "FusedViTBackbone": "prismatic.models.backbones.vision.fused_vit",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "RESIZE_STRATEGIES",
    "VISION_BACKBONES",
    "FusedViTBackbone",
    "FusedViTSpec",
    "ImageTransform",
    "SingleViTSpec",
    "TimmViTBackbone",
    "ViTSpec",
    "VisionBackbone",
    "VisionBackboneSpec",
    "build_vision_backbone",
    "get_vision_backbone_spec",
]
