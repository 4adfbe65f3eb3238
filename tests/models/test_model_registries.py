"""Base-VLM registry and projectors: every entry resolves, published ids have Prismatic's combinations."""

from __future__ import annotations

import re

import pytest
import torch

from prismatic.models import BASE_VLMS, LLM_BACKBONES, RESIZE_STRATEGIES, VISION_BACKBONES, get_base_vlm_spec
from prismatic.models.projectors import (
    FusedMLPProjector,
    LinearProjector,
    MLPProjector,
    build_projector,
    resolve_projector_arch,
)
from prismatic.util.errors import ConfigError


@pytest.mark.parametrize("base_vlm_id", sorted(BASE_VLMS))
def test_every_entry_resolves(base_vlm_id: str) -> None:
    spec = BASE_VLMS[base_vlm_id]
    assert spec.vision_backbone_id in VISION_BACKBONES
    assert spec.llm_backbone_id in LLM_BACKBONES
    assert spec.image_resize_strategy in RESIZE_STRATEGIES
    resolve_projector_arch(spec.arch_specifier)


# (vision backbone, LLM, arch specifier, resize strategy) from Prismatic's prismatic/conf/models.py.
PUBLISHED = {
    "prism-dinosiglip-224px+7b": (
        "dinosiglip-vit-so-224px",
        "llama2-7b-pure",
        "no-align+fused-gelu-mlp",
        "resize-naive",
    ),
    "prism-dinosiglip-224px-controlled+7b": (
        "dinosiglip-vit-so-224px",
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
    "siglip-224px+7b": ("siglip-vit-so400m", "vicuna-v15-7b", "no-align+gelu-mlp", "letterbox"),
    "prism-dinosiglip+7b": (
        "dinosiglip-vit-so-384px",
        "llama2-7b-pure",
        "no-align+fused-gelu-mlp",
        "resize-naive",
    ),
}


@pytest.mark.parametrize("base_vlm_id", sorted(PUBLISHED))
def test_published_combinations(base_vlm_id: str) -> None:
    spec = get_base_vlm_spec(base_vlm_id)
    assert (
        spec.vision_backbone_id,
        spec.llm_backbone_id,
        spec.arch_specifier,
        spec.image_resize_strategy,
    ) == (PUBLISHED[base_vlm_id])


def test_unknown_base_vlm_lookup() -> None:
    with pytest.raises(
        ConfigError, match=re.escape("'prism-dinosiglip-224+7b'. Did you mean 'prism-dinosiglip-224px+7b'?")
    ):
        get_base_vlm_spec("prism-dinosiglip-224+7b")


def test_projector_designs() -> None:
    linear, mlp, fused = (
        build_projector(arch, 12, 8) for arch in ("linear", "no-align+gelu-mlp", "fused-gelu-mlp")
    )
    assert isinstance(linear, LinearProjector) and isinstance(mlp, MLPProjector)
    assert isinstance(fused, FusedMLPProjector)
    layer_shapes = {name: tuple(p.shape) for name, p in fused.named_parameters() if name.endswith("weight")}
    assert layer_shapes == {
        "projector.0.weight": (48, 12),
        "projector.2.weight": (8, 48),
        "projector.4.weight": (8, 8),
    }
    assert [type(m).__name__ for m in mlp.projector] == ["Linear", "GELU", "Linear"]
    assert mlp(torch.randn(2, 5, 12)).shape == (2, 5, 8)


def test_unknown_projector() -> None:
    with pytest.raises(ConfigError, match="'no-align\\+gelu-mpl'.*Did you mean 'gelu-mlp'"):
        resolve_projector_arch("no-align+gelu-mpl")
