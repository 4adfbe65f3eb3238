"""Vision backbones: tiny featurizer outputs, image transforms per resize strategy, real registry entries."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from prismatic.models.backbones.vision import (
    RESIZE_STRATEGIES,
    VISION_BACKBONES,
    FusedViTSpec,
    build_vision_backbone,
)
from prismatic.util.errors import ConfigError


def _quarter_red_image(width: int = 128, height: int = 64) -> Image.Image:
    """Left quarter red, rest blue: tells naive resize (keeps the red) from centre crop (loses it)."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[:, : width // 4, 0] = 255
    pixels[:, width // 4 :, 2] = 255
    return Image.fromarray(pixels)


def test_tiny_vit_features_skip_prefix_tokens_and_last_block() -> None:
    torch.manual_seed(0)
    backbone = build_vision_backbone("tiny-vit-64px", "resize-naive")
    assert (backbone.embed_dim, backbone.num_patches, backbone.default_image_resolution) == (
        48,
        16,
        (3, 64, 64),
    )
    assert len(backbone.get_blocks()) == 3
    pixel_values = torch.randn(2, 3, 64, 64)
    features = backbone(pixel_values)
    assert features.shape == (2, 16, 48)
    # Same as timm's own "second-to-last block, no norm, prefix tokens dropped" (Prismatic's features).
    (expected,) = backbone.featurizer.get_intermediate_layers(pixel_values, n=[1])
    assert torch.equal(features, expected)


def test_copies_run_their_own_weights() -> None:
    """`featurizer.forward` is re-pointed at the featurizer; a deep copy must point at the copy, not the original."""
    backbone = build_vision_backbone("tiny-vit-64px", "resize-naive")
    clone = copy.deepcopy(backbone)
    with torch.no_grad():
        for param in clone.parameters():
            param.add_(1.0)
        pixel_values = torch.randn(1, 3, 64, 64)
        assert not torch.allclose(clone(pixel_values), backbone(pixel_values))


def test_tiny_dinosiglip_concatenates_parts() -> None:
    torch.manual_seed(0)
    backbone = build_vision_backbone("tiny-dinosiglip-64px", "resize-naive")
    assert backbone.featurizers["dino"].num_prefix_tokens == 5  # cls + 4 registers, excluded from features
    assert backbone.featurizers["siglip"].num_prefix_tokens == 0
    assert (backbone.embed_dim, backbone.num_patches, backbone.default_image_resolution) == (
        112,
        16,
        (3, 64, 64),
    )
    assert len(backbone.get_blocks()) == 6
    features = backbone({"dino": torch.randn(2, 3, 56, 56), "siglip": torch.randn(2, 3, 64, 64)})
    assert features.shape == (2, 16, 48 + 64)
    with pytest.raises(ValueError, match="keyed by"):
        backbone(torch.randn(2, 3, 64, 64))


@pytest.mark.parametrize("strategy", RESIZE_STRATEGIES)
def test_transform_shapes(strategy: str) -> None:
    image = _quarter_red_image()
    single = build_vision_backbone("tiny-vit-64px", strategy).get_image_transform()(image)
    assert single.shape == (3, 64, 64) and single.dtype == torch.float32
    fused = build_vision_backbone("tiny-dinosiglip-64px", strategy).get_image_transform()(image)
    assert {key: tuple(value.shape) for key, value in fused.items()} == {
        "dino": (3, 56, 56),
        "siglip": (3, 64, 64),
    }


def test_resize_strategies_differ_as_prismatics() -> None:
    image = _quarter_red_image()  # 128 x 64, normalised with mean = std = 0.5: red -> +1 / -1 / -1
    naive = build_vision_backbone("tiny-vit-64px", "resize-naive").get_image_transform()(image)
    crop = build_vision_backbone("tiny-vit-64px", "resize-crop").get_image_transform()(image)
    letterbox = build_vision_backbone("tiny-vit-64px", "letterbox").get_image_transform()(image)

    assert naive[0, :, :12].min() > 0.9  # the squashed red quarter is still there ...
    assert crop[0].max() < -0.9  # ... the centre crop cut it off
    # Letterbox pads 32 rows above and below with the mean colour (-> ~0 after normalisation), then resizes.
    assert letterbox[:, :14].abs().max() < 0.01 and letterbox[:, -14:].abs().max() < 0.01
    assert letterbox[0, 20:44, :12].min() > 0.9


def test_unknown_ids_and_strategies() -> None:
    with pytest.raises(ConfigError, match="'tiny-vit-46px'.*Did you mean 'tiny-vit-64px'"):
        build_vision_backbone("tiny-vit-46px", "resize-naive")
    with pytest.raises(ConfigError, match="'resize-navie'.*Did you mean 'resize-naive'"):
        build_vision_backbone("tiny-vit-64px", "resize-navie")
    with pytest.raises(ConfigError, match="no pretrained weights"):
        build_vision_backbone("tiny-vit-64px", "resize-naive", pretrained=True)


# Prismatic's / OpenVLA's timm ids; SigLIP is pinned to the "webli" weights they trained with.
REAL_TIMM_IDS = {
    "clip-vit-l": ["vit_large_patch14_clip_224.openai"],
    "clip-vit-l-336px": ["vit_large_patch14_clip_336.openai"],
    "siglip-vit-so400m": ["vit_so400m_patch14_siglip_224.webli"],
    "siglip-vit-so400m-384px": ["vit_so400m_patch14_siglip_384.webli"],
    "dinov2-vit-l": ["vit_large_patch14_reg4_dinov2.lvd142m"],
    "in1k-vit-l": ["vit_large_patch16_224.augreg_in21k_ft_in1k"],
    "dinosiglip-vit-so-224px": [
        "vit_large_patch14_reg4_dinov2.lvd142m",
        "vit_so400m_patch14_siglip_224.webli",
    ],
    "dinosiglip-vit-so-384px": [
        "vit_large_patch14_reg4_dinov2.lvd142m",
        "vit_so400m_patch14_siglip_384.webli",
    ],
}


@pytest.mark.parametrize("backbone_id", sorted(REAL_TIMM_IDS))
def test_real_entries_name_existing_timm_weights(backbone_id: str) -> None:
    spec = VISION_BACKBONES[backbone_id]
    vits = list(spec.parts.values()) if isinstance(spec, FusedViTSpec) else [spec.vit]
    assert [vit.timm_id for vit in vits] == REAL_TIMM_IDS[backbone_id]
    assert spec.has_pretrained_weights
    for vit in vits:
        assert timm.models.get_pretrained_cfg(vit.timm_id).hf_hub_id == f"timm/{vit.timm_id}"
        assert vit.image_size == (384 if "384" in backbone_id else 336 if "336" in backbone_id else 224)
    if backbone_id.startswith("clip"):
        assert all(vit.arch_overrides == {"act_layer": "quick_gelu"} for vit in vits)


def test_openvla_backbone_structure_on_meta() -> None:
    """OpenVLA's DINO-SigLIP 224px: 256 patches of 1024 + 1152 channels (built on meta: no weights, no RAM)."""
    with torch.device("meta"):
        backbone = build_vision_backbone("dinosiglip-vit-so-224px", "resize-naive", pretrained=False)
    assert (backbone.num_patches, backbone.embed_dim, backbone.default_image_resolution) == (
        256,
        2176,
        (3, 224, 224),
    )
    assert len(backbone.get_blocks()) == 24 + 27
