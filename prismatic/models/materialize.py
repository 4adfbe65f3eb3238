"""Build a base VLM from its registry id (or from its parts): vision backbone (timm) + LLM (transformers) +
projector.

Everything is built in FP32 (mixed precision is the training strategy's business) and from the torch RNG only:
seed torch before calling `build_vlm` and two builds are identical.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from prismatic.models.backbones.llm.registry import build_llm_backbone, get_llm_backbone_spec
from prismatic.models.backbones.vision.registry import (
    build_vision_backbone,
    check_resize_strategy,
    get_vision_backbone_spec,
)
from prismatic.models.projectors import resolve_projector_arch
from prismatic.models.registry import BaseVLMSpec, get_base_vlm_spec
from prismatic.models.vlms.prismatic import PrismaticVLM

if TYPE_CHECKING:
    from transformers import PretrainedConfig

logger = logging.getLogger(__name__)


def build_vlm(base_vlm_id: str, hf_token: str | None = None) -> PrismaticVLM:
    """Build the base VLM `base_vlm_id` in FP32: random init for tiny ids, pretrained backbones for real ones.

    Args:
        base_vlm_id: a key of `prismatic.models.registry.BASE_VLMS`.
        hf_token: Hugging Face token for gated LLM weights (Llama-2).

    Raises:
        ConfigError: unknown id (or a registry entry naming unknown parts); pretrained weights unavailable.
        ValueError: a parameter came out in a dtype other than float32.
    """
    return build_vlm_from_spec(base_vlm_id, get_base_vlm_spec(base_vlm_id), hf_token=hf_token)


def build_vlm_from_spec(
    model_id: str,
    spec: BaseVLMSpec,
    *,
    hf_token: str | None = None,
    pretrained_vision: bool | None = None,
    pretrained_llm: bool | None = None,
    llm_config: PretrainedConfig | None = None,
    tokenizer_dir: Path | None = None,
) -> PrismaticVLM:
    """Build a VLM from a `BaseVLMSpec` in FP32; the loaders use it to get the shape a checkpoint fills.

    Args:
        model_id: the name the VLM carries (a registry id, or a checkpoint's own id).
        spec: vision backbone, LLM, projector and resize strategy.
        hf_token: Hugging Face token for gated repos.
        pretrained_vision / pretrained_llm: load pretrained weights (None: "if the part has any"); loaders pass
            False for parts whose weights come from the checkpoint.
        llm_config / tokenizer_dir: the checkpoint's own LLM config and tokenizer (HF OpenVLA folders).

    Raises:
        ConfigError: a part is not registered; pretrained weights unavailable.
        ValueError: a parameter came out in a dtype other than float32.
    """
    # Validate every part before building anything: a typo should not cost a 7B model load.
    get_vision_backbone_spec(spec.vision_backbone_id)
    get_llm_backbone_spec(spec.llm_backbone_id)
    resolve_projector_arch(spec.arch_specifier)
    check_resize_strategy(spec.image_resize_strategy)

    logger.info("Building base VLM '%s' (%s)", model_id, spec)
    vision_backbone = build_vision_backbone(
        spec.vision_backbone_id, spec.image_resize_strategy, pretrained=pretrained_vision
    )
    llm_backbone = build_llm_backbone(
        spec.llm_backbone_id,
        hf_token=hf_token,
        pretrained=pretrained_llm,
        config=llm_config,
        tokenizer_dir=tokenizer_dir,
    )
    vlm = PrismaticVLM(model_id, vision_backbone, llm_backbone, arch_specifier=spec.arch_specifier)

    not_fp32 = [f"{name} ({p.dtype})" for name, p in vlm.named_parameters() if p.dtype != torch.float32]
    if not_fp32:
        raise ValueError(f"Base VLM '{model_id}' has non-FP32 parameters: {', '.join(not_fp32[:5])}.")
    return vlm
