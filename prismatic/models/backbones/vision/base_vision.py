"""Vision backbone interface: what the VLM, the data pipeline and FSDP need from an image featurizer.

A backbone maps pixel values to patch features `[B, num_patches, embed_dim]` and owns the image transform that
turns a PIL image into those pixel values, so the data pipeline and the model can never disagree about resolution
or normalisation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import torch
from PIL.Image import Image
from torch import nn

# A single ViT takes a [B, 3, H, W] tensor; a fused backbone takes one such tensor per ViT, keyed by part name.
PixelValues = torch.Tensor | dict[str, torch.Tensor]


class ImageTransform(Protocol):
    """PIL image -> pixel values for one image (`Tensor[3, H, W]`, or a dict of them for fused backbones)."""

    def __call__(self, img: Image) -> torch.Tensor | dict[str, torch.Tensor]: ...


class VisionBackbone(nn.Module, ABC):
    """An image featurizer returning patch tokens; subclasses wrap one or more timm ViTs."""

    def __init__(self, identifier: str, image_resize_strategy: str) -> None:
        super().__init__()
        self.identifier = identifier
        self.image_resize_strategy = image_resize_strategy

    @abstractmethod
    def forward(self, pixel_values: PixelValues) -> torch.Tensor:
        """Patch features `[B, num_patches, embed_dim]` (prefix / register tokens excluded)."""

    @abstractmethod
    def get_image_transform(self) -> ImageTransform:
        """The transform the data pipeline applies to every image fed to this backbone."""

    @abstractmethod
    def get_blocks(self) -> list[nn.Module]:
        """Every transformer block of every ViT, in order: the units FSDP shards one by one."""

    @abstractmethod
    def unused_modules(self) -> list[nn.Module]:
        """Sub-modules whose output never reaches the patch features (blocks after the feature layer, heads)."""

    @property
    @abstractmethod
    def embed_dim(self) -> int:
        """Channel width of the patch features."""

    @property
    @abstractmethod
    def num_patches(self) -> int:
        """Number of patch tokens per image."""

    @property
    @abstractmethod
    def default_image_resolution(self) -> tuple[int, int, int]:
        """`(3, H, W)`: the resolution images should be stored / resized to before the transform."""

    @property
    def half_precision_dtype(self) -> torch.dtype:
        """Dtype for mixed-precision compute (all Prismatic ViTs were trained in BF16)."""
        return torch.bfloat16

    def freeze_unused(self) -> None:
        """Mark never-used parameters frozen, so DDP does not wait for their gradients and optimisers skip them.

        They stay in the module (and in checkpoints) so that state-dict keys match timm and Prismatic.
        """
        for module in self.unused_modules():
            module.requires_grad_(False)
