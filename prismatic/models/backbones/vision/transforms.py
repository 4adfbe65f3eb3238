"""Image transforms for timm ViTs under Prismatic's three resize strategies.

- "resize-naive": resize to H x W, ignoring the aspect ratio (what OpenVLA's base VLMs use);
- "letterbox": pad to a square with the normalisation mean colour, then resize;
- "resize-crop": timm's default, resize the short side then centre-crop.
Every strategy then converts to a tensor and normalises with the backbone's own mean / std.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torchvision.transforms.functional as TVF
from PIL.Image import Image
from timm.data import create_transform, resolve_model_data_config
from torchvision.transforms import Compose

from prismatic.models.backbones.vision.registry import check_resize_strategy


@dataclass
class LetterboxPad:
    """Pad a PIL image to a square with a symmetric constant border (Prismatic's `LetterboxPad`)."""

    fill: tuple[int, int, int]

    def __call__(self, image: Image) -> Image:
        (width, height), side = image.size, max(image.size)
        pad_w, pad_h = (side - width) // 2, (side - height) // 2
        return TVF.pad(image, [pad_w, pad_h, pad_w, pad_h], fill=tuple(self.fill), padding_mode="constant")


@dataclass
class FusedImageTransform:
    """Apply each part's transform to the same image: `{"dino": Tensor, "siglip": Tensor}` for DINO-SigLIP."""

    transforms: Mapping[str, Callable[[Image], torch.Tensor]]

    def __call__(self, img: Image) -> dict[str, torch.Tensor]:
        return {name: transform(img) for name, transform in self.transforms.items()}


def timm_data_config(vit: torch.nn.Module, image_size: int) -> dict[str, Any]:
    """timm's preprocessing config for `vit` (mean, std, interpolation) at `image_size` x `image_size`.

    `crop_pct` is forced to 1.0: SigLIP / IN1K configs resize to size / 0.9 and then crop, which loses the border;
    Prismatic patched their transforms to resize to the target size instead, and 1.0 is exactly that.
    """
    data_cfg = resolve_model_data_config(vit)
    data_cfg["input_size"] = (3, image_size, image_size)
    data_cfg["crop_pct"] = 1.0
    return data_cfg


def build_image_transform(data_cfg: Mapping[str, Any], image_resize_strategy: str) -> Compose:
    """PIL image -> normalised `Tensor[3, H, W]` following `image_resize_strategy`.

    Raises:
        ConfigError: unknown strategy.
    """
    check_resize_strategy(image_resize_strategy)
    if image_resize_strategy == "resize-naive":
        # "squash" resizes both edges to the target, which with crop_pct 1.0 makes the centre crop a no-op.
        return create_transform(**{**data_cfg, "crop_mode": "squash"}, is_training=False)
    resize_crop = create_transform(**{**data_cfg, "crop_mode": "center"}, is_training=False)
    if image_resize_strategy == "resize-crop":
        return resize_crop
    fill = tuple(int(x * 255) for x in data_cfg["mean"])
    return Compose([LetterboxPad(fill), *resize_crop.transforms])
