"""Vision backbone registry: id -> which timm ViT(s) to build, at what resolution, with which overrides.

Adding a backbone is one `register_vision_backbone(...)` call (here for the shipped ones, or from your own code;
see docs/adding_a_model.md). Single backbones are one `ViTSpec`; fused backbones (DINO + SigLIP) are a
`FusedViTSpec` whose parts are concatenated on the channel dim. Tiny ids build from random init in milliseconds
through the same timm code paths as the real ones; real ids load pretrained timm weights from the Hub. A
checkpoint that describes its own ViTs (HF OpenVLA's `timm_model_ids`) builds without a registry entry:
`vision_spec_from_vits` makes the spec and `build_vision_backbone(..., spec=...)` builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from prismatic.models.registry import SpecRegistry
from prismatic.util.errors import ConfigError, did_you_mean

if TYPE_CHECKING:  # annotations only: this registry is plain data, read before torch loads
    from prismatic.models.backbones.vision.base_vision import VisionBackbone


# Prismatic's image preprocessing choices; `transforms.build_image_transform` implements them.
RESIZE_STRATEGIES = ("resize-naive", "letterbox", "resize-crop")


def check_resize_strategy(image_resize_strategy: str) -> None:
    """Raise a `ConfigError` naming the strategy when it is not one of `RESIZE_STRATEGIES`."""
    if image_resize_strategy not in RESIZE_STRATEGIES:
        raise ConfigError(
            f"Unknown image resize strategy '{image_resize_strategy}'."
            f"{did_you_mean(image_resize_strategy, RESIZE_STRATEGIES)} "
            f"Valid choices: {', '.join(RESIZE_STRATEGIES)}."
        )


@dataclass(frozen=True)
class ViTSpec:
    """One timm VisionTransformer.

    Attributes:
        timm_id: timm model name, with the pretrained tag pinned where timm's default tag has moved on
            (e.g. SigLIP "webli", which Prismatic trained with, not the newer "v2_webli").
        image_size: input resolution (square), passed to timm as `img_size`.
        arch_overrides: extra `timm.create_model` kwargs (shrunk widths for tiny ids, QuickGELU for OpenAI CLIP).
    """

    timm_id: str
    image_size: int
    arch_overrides: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SingleViTSpec:
    """A backbone made of one ViT."""

    vit: ViTSpec
    has_pretrained_weights: bool = True
    kind: ClassVar[str] = "single"


@dataclass(frozen=True)
class FusedViTSpec:
    """A backbone made of several ViTs (same patch grid) whose patch features are concatenated, in this order."""

    parts: Mapping[str, ViTSpec]
    has_pretrained_weights: bool = True
    kind: ClassVar[str] = "fused"


VisionBackboneSpec = SingleViTSpec | FusedViTSpec

_DINOV2_L = ViTSpec("vit_large_patch14_reg4_dinov2.lvd142m", 224)  # DINOv2 with 4 registers, as Prismatic
_DINOV2_L_336 = ViTSpec(_DINOV2_L.timm_id, 336)
_SIGLIP_SO_224 = ViTSpec("vit_so400m_patch14_siglip_224.webli", 224)
_SIGLIP_SO_384 = ViTSpec("vit_so400m_patch14_siglip_384.webli", 384)
# OpenAI CLIP was trained with QuickGELU; timm defaults to exact GELU, which gives worse features.
_QUICK_GELU = {"act_layer": "quick_gelu"}

# fmt: off
VISION_BACKBONES: SpecRegistry[VisionBackboneSpec] = SpecRegistry("vision backbone", {
    # === Tiny (random init, CPU tests and smoke runs): 16 patches each ===
    "tiny-vit-64px": SingleViTSpec(
        ViTSpec("vit_base_patch16_224", 64, {"embed_dim": 48, "depth": 3, "num_heads": 3}),
        has_pretrained_weights=False,
    ),
    "tiny-dinosiglip-64px": FusedViTSpec(
        {
            # DINOv2 code path (cls + 4 register tokens, LayerScale), patch 14 at 56px -> 4 x 4 patches.
            "dino": ViTSpec("vit_small_patch14_reg4_dinov2", 56, {"embed_dim": 48, "depth": 3, "num_heads": 3}),
            # SigLIP code path (no cls token, MAP head), patch 16 at 64px -> 4 x 4 patches.
            "siglip": ViTSpec("vit_base_patch16_siglip_224", 64, {"embed_dim": 64, "depth": 3, "num_heads": 4}),
        },
        has_pretrained_weights=False,
    ),

    # === Prismatic's 224px backbones ===
    "clip-vit-l": SingleViTSpec(ViTSpec("vit_large_patch14_clip_224.openai", 224, _QUICK_GELU)),
    "siglip-vit-so400m": SingleViTSpec(_SIGLIP_SO_224),
    "dinov2-vit-l": SingleViTSpec(_DINOV2_L),
    "in1k-vit-l": SingleViTSpec(ViTSpec("vit_large_patch16_224.augreg_in21k_ft_in1k", 224)),
    "dinosiglip-vit-so-224px": FusedViTSpec({"dino": _DINOV2_L, "siglip": _SIGLIP_SO_224}),

    # === Prismatic's higher-resolution backbones ===
    "clip-vit-l-336px": SingleViTSpec(ViTSpec("vit_large_patch14_clip_336.openai", 336, _QUICK_GELU)),
    "siglip-vit-so400m-384px": SingleViTSpec(_SIGLIP_SO_384),
    "dinosiglip-vit-so-384px": FusedViTSpec({"dino": ViTSpec(_DINOV2_L.timm_id, 384), "siglip": _SIGLIP_SO_384}),
    "dinoclip-vit-l-336px": FusedViTSpec(
        {"dino": _DINOV2_L_336, "clip": ViTSpec("vit_large_patch14_clip_336.openai", 336, _QUICK_GELU)}
    ),
})
# fmt: on


# The public paths for new vision backbones (docs/adding_a_model.md); an unknown id gets a did-you-mean ConfigError.
register_vision_backbone = VISION_BACKBONES.register
get_vision_backbone_spec = VISION_BACKBONES.get_spec


def build_vision_backbone(
    vision_backbone_id: str,
    image_resize_strategy: str,
    *,
    pretrained: bool | None = None,
    spec: VisionBackboneSpec | None = None,
) -> VisionBackbone:
    """Build a vision backbone in FP32.

    Args:
        vision_backbone_id: a key of `VISION_BACKBONES`, or any name when `spec` is given.
        image_resize_strategy: one of "resize-naive", "letterbox", "resize-crop".
        pretrained: load timm's pretrained weights; None means "if the id has any" (real ids yes, tiny ids no).
        spec: build this spec instead of the registry's entry (a checkpoint that describes its own ViTs, see
            `vision_spec_from_vits`).

    Raises:
        ConfigError: unknown id or strategy; pretrained weights asked of a tiny id, or not obtainable (offline).
    """
    if spec is None:
        spec = get_vision_backbone_spec(vision_backbone_id)
    check_resize_strategy(image_resize_strategy)
    if pretrained is None:
        pretrained = spec.has_pretrained_weights
    elif pretrained and not spec.has_pretrained_weights:
        raise ConfigError(
            f"Vision backbone '{vision_backbone_id}' is a random-init preset with no pretrained weights."
        )

    # lazy: timm and torch load on the first build, not with this plain-data registry
    if isinstance(spec, FusedViTSpec):
        from prismatic.models.backbones.vision.fused_vit import FusedViTBackbone

        return FusedViTBackbone(vision_backbone_id, spec, image_resize_strategy, pretrained=pretrained)
    from prismatic.models.backbones.vision.timm_vit import TimmViTBackbone

    return TimmViTBackbone(vision_backbone_id, spec, image_resize_strategy, pretrained=pretrained)


def vits_of(spec: VisionBackboneSpec) -> list[ViTSpec]:
    """The ViTs of a backbone, in feature-concatenation order."""
    return list(spec.parts.values()) if isinstance(spec, FusedViTSpec) else [spec.vit]


def timm_architecture(timm_id: str) -> str:
    """A timm model name without its pretrained tag ("vit_so400m_patch14_siglip_224.webli" -> "..._224")."""
    return timm_id.split(".", 1)[0]


def describe_vits(vits: list[ViTSpec]) -> str:
    """One line naming each ViT's timm architecture, resolution and overrides (for error messages)."""
    return " + ".join(
        f"{timm_architecture(v.timm_id)} at {v.image_size}px"
        + (f" {dict(sorted(v.arch_overrides.items()))}" if v.arch_overrides else "")
        for v in vits
    )


def vits_match(registered: list[ViTSpec], described: list[ViTSpec], *, compare_overrides: bool) -> bool:
    """Whether two ViT lists build the same modules: timm architecture (any pretrained tag), resolution, and
    `act_layer` (all overrides when `compare_overrides`, i.e. when the description records them)."""
    if len(registered) != len(described):
        return False
    for reg, desc in zip(registered, described, strict=True):
        if (
            timm_architecture(reg.timm_id) != timm_architecture(desc.timm_id)
            or reg.image_size != desc.image_size
        ):
            return False
        if compare_overrides:
            if dict(reg.arch_overrides) != dict(desc.arch_overrides):
                return False
        elif reg.arch_overrides.get("act_layer") != desc.arch_overrides.get("act_layer"):
            return False
    return True


def _part_name(timm_id: str, taken: set[str], index: int) -> str:
    """Prismatic's part names for the families it fuses ("dino", "siglip", "clip"), else "vit{index}"."""
    arch = timm_architecture(timm_id)
    family = next((f for f in ("dino", "siglip", "clip") if f in arch), f"vit{index}")
    return family if family not in taken else f"{family}{index}"


def vision_spec_from_vits(vits: list[ViTSpec]) -> VisionBackboneSpec:
    """A registry-less backbone spec for ViTs described by a checkpoint (HF OpenVLA's `timm_model_ids`).

    One ViT is a `SingleViTSpec`; two or more are fused, with parts named after their family as Prismatic names
    them (`dino_featurizer`, `siglip_featurizer`). No pretrained weights: the checkpoint holds them.
    """
    if len(vits) == 1:
        return SingleViTSpec(vits[0], has_pretrained_weights=False)
    parts: dict[str, ViTSpec] = {}
    for index, vit in enumerate(vits):
        parts[_part_name(vit.timm_id, set(parts), index)] = vit
    return FusedViTSpec(parts, has_pretrained_weights=False)
