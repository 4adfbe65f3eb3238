"""A timm VisionTransformer as a patch featurizer (Prismatic's `TimmViTBackbone`).

Features are the patch tokens of the SECOND-TO-LAST block, without the final norm and without prefix (class /
register) tokens, exactly what Prismatic's `get_intermediate_layers(n={len(blocks) - 2})` returned; the VLMs we
fine-tune were trained on those features.
"""

from __future__ import annotations

import functools
from typing import Any

import timm
import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from prismatic.models.backbones.vision.base_vision import ImageTransform, VisionBackbone
from prismatic.models.backbones.vision.registry import SingleViTSpec, ViTSpec
from prismatic.models.backbones.vision.transforms import build_image_transform, timm_data_config
from prismatic.util.errors import ConfigError


def _patch_features(vit: VisionTransformer, feature_layer: int, pixel_values: torch.Tensor) -> torch.Tensor:
    """`[B, 3, H, W]` -> `[B, num_patches, embed_dim]` from block `feature_layer`; later blocks are not run."""
    (features,) = vit.forward_intermediates(
        pixel_values, indices=[feature_layer], stop_early=True, output_fmt="NLC", intermediates_only=True
    )
    # Dropping prefix tokens leaves a view; FSDP2 warns on view outputs (in-place ops on them skip its hooks).
    return features.clone() if features._base is not None else features


def create_featurizer(backbone_id: str, spec: ViTSpec, *, pretrained: bool) -> tuple[VisionTransformer, int]:
    """Create the timm ViT whose `forward` returns patch features; returns it and its feature-layer index.

    `forward` is re-pointed (as Prismatic does) rather than calling `forward_intermediates` from outside, because
    FSDP / DDP hooks only fire through `module(...)`: a featurizer sharded as one unit must be *called*.

    Raises:
        ConfigError: pretrained weights could not be fetched (offline, not cached) or the model is not a ViT.
    """
    try:
        vit = timm.create_model(
            spec.timm_id,
            pretrained=pretrained,
            num_classes=0,
            img_size=spec.image_size,
            **spec.arch_overrides,
        )
    except OSError as err:  # huggingface_hub raises OSError subclasses for offline / missing / HTTP errors
        raise ConfigError(
            f"Pretrained weights for vision backbone '{backbone_id}' (timm '{spec.timm_id}') are unavailable: "
            f"they could not be fetched from the Hugging Face Hub or found in the local cache (offline?). "
            f"Cause: {err}"
        ) from err
    if not isinstance(vit, VisionTransformer):
        raise ConfigError(
            f"Vision backbone '{backbone_id}': timm '{spec.timm_id}' is not a VisionTransformer."
        )
    feature_layer = len(vit.blocks) - 2
    vit.forward = functools.partial(_patch_features, vit, feature_layer)
    return vit, feature_layer


def unused_featurizer_modules(vit: VisionTransformer, feature_layer: int) -> list[nn.Module]:
    """Blocks after `feature_layer` plus the final norm and pooling / classifier heads of `vit`."""
    tail = [vit.norm, vit.fc_norm, getattr(vit, "attn_pool", None), vit.head]
    return [*vit.blocks[feature_layer + 1 :], *(m for m in tail if m is not None)]


class TimmViTBackbone(VisionBackbone):
    """One timm ViT; `featurizer` is the timm model (state-dict keys `featurizer.*`, as in Prismatic)."""

    def __init__(
        self, identifier: str, spec: SingleViTSpec, image_resize_strategy: str, *, pretrained: bool
    ) -> None:
        super().__init__(identifier, image_resize_strategy)
        self.spec = spec
        self.featurizer, self.feature_layer = create_featurizer(identifier, spec.vit, pretrained=pretrained)
        self.data_cfg: dict[str, Any] = timm_data_config(self.featurizer, spec.vit.image_size)
        self.image_transform = build_image_transform(self.data_cfg, image_resize_strategy)
        self.freeze_unused()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.featurizer(pixel_values)

    def get_image_transform(self) -> ImageTransform:
        return self.image_transform

    def get_blocks(self) -> list[nn.Module]:
        return list(self.featurizer.blocks)

    def unused_modules(self) -> list[nn.Module]:
        return unused_featurizer_modules(self.featurizer, self.feature_layer)

    @property
    def embed_dim(self) -> int:
        return self.featurizer.embed_dim

    @property
    def num_patches(self) -> int:
        return self.featurizer.patch_embed.num_patches

    @property
    def default_image_resolution(self) -> tuple[int, int, int]:
        return tuple(self.data_cfg["input_size"])
