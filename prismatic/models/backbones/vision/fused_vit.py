"""Several timm ViTs over the same image, patch features concatenated on the channel dim (DINO + SigLIP).

Each part keeps its own resolution, mean / std and transform; the only requirement is that all parts produce the
same number of patches, so their tokens line up. Sub-modules are named `{part}_featurizer` (e.g.
`dino_featurizer`, `siglip_featurizer`) so state-dict keys match Prismatic's `DinoSigLIPViTBackbone`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from prismatic.models.backbones.vision.base_vision import VisionBackbone
from prismatic.models.backbones.vision.registry import FusedViTSpec
from prismatic.models.backbones.vision.timm_vit import create_featurizer, unused_featurizer_modules
from prismatic.models.backbones.vision.transforms import (
    FusedImageTransform,
    build_image_transform,
    timm_data_config,
)


class FusedViTBackbone(VisionBackbone):
    """`forward({"dino": [B,3,H1,W1], "siglip": [B,3,H2,W2]}) -> [B, num_patches, sum of embed dims]`."""

    def __init__(
        self, identifier: str, spec: FusedViTSpec, image_resize_strategy: str, *, pretrained: bool
    ) -> None:
        super().__init__(identifier, image_resize_strategy)
        self.spec = spec
        self.part_names: tuple[str, ...] = tuple(spec.parts)
        self.feature_layers: dict[str, int] = {}
        self.data_cfgs: dict[str, dict[str, Any]] = {}
        transforms = {}
        for name, vit_spec in spec.parts.items():
            featurizer, self.feature_layers[name] = create_featurizer(
                identifier, vit_spec, pretrained=pretrained
            )
            setattr(self, f"{name}_featurizer", featurizer)
            self.data_cfgs[name] = timm_data_config(featurizer, vit_spec.image_size)
            transforms[name] = build_image_transform(self.data_cfgs[name], image_resize_strategy)
        self.image_transform = FusedImageTransform(transforms)

        patch_counts = {name: f.patch_embed.num_patches for name, f in self.featurizers.items()}
        if len(set(patch_counts.values())) != 1:
            raise ValueError(
                f"Fused vision backbone '{identifier}' parts disagree on patch count: {patch_counts}."
            )
        self.freeze_unused()

    @property
    def featurizers(self) -> dict[str, nn.Module]:
        """Part name -> timm ViT, in concatenation order."""
        return {name: getattr(self, f"{name}_featurizer") for name in self.part_names}

    def forward(self, pixel_values: Mapping[str, torch.Tensor]) -> torch.Tensor:
        if not isinstance(pixel_values, Mapping) or set(pixel_values) != set(self.part_names):
            got = sorted(pixel_values) if isinstance(pixel_values, Mapping) else type(pixel_values).__name__
            raise ValueError(
                f"'{self.identifier}' expects pixel_values keyed by {list(self.part_names)}, got {got}."
            )
        patches = [featurizer(pixel_values[name]) for name, featurizer in self.featurizers.items()]
        return torch.cat(patches, dim=2)

    def get_image_transform(self) -> FusedImageTransform:
        return self.image_transform

    def get_blocks(self) -> list[nn.Module]:
        return [block for featurizer in self.featurizers.values() for block in featurizer.blocks]

    def unused_modules(self) -> list[nn.Module]:
        return [
            module
            for name, featurizer in self.featurizers.items()
            for module in unused_featurizer_modules(featurizer, self.feature_layers[name])
        ]

    @property
    def embed_dim(self) -> int:
        return sum(featurizer.embed_dim for featurizer in self.featurizers.values())

    @property
    def num_patches(self) -> int:
        return next(iter(self.featurizers.values())).patch_embed.num_patches

    @property
    def default_image_resolution(self) -> tuple[int, int, int]:
        """The largest part resolution, so that no part has to upsample a smaller stored image."""
        sizes = [cfg["input_size"] for cfg in self.data_cfgs.values()]
        return (3, max(size[1] for size in sizes), max(size[2] for size in sizes))
