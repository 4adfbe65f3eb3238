"""Build a base VLM from its registry id (or from its parts): vision backbone (timm) + LLM (transformers) +
projector.

Everything is built in FP32 (mixed precision is the training strategy's business) and from the torch RNG only:
seed torch before calling `build_vlm` and two builds are identical. Loaders build the parts a checkpoint fills
with their parameters on the meta device (`on_meta`): no memory and no random init, so loading a checkpoint
never holds a second copy of the model (see `prismatic.models.loading`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig

from prismatic.models.backbones.llm.registry import build_llm_backbone, get_llm_backbone_spec
from prismatic.models.backbones.vision.registry import (
    VisionBackboneSpec,
    build_vision_backbone,
    check_resize_strategy,
    get_vision_backbone_spec,
)
from prismatic.models.projectors import resolve_projector_arch
from prismatic.models.registry import BaseVLMSpec, get_base_vlm_spec
from prismatic.models.vlms.prismatic import PrismaticVLM

logger = logging.getLogger(__name__)

VLM_PARTS = ("vision_backbone", "projector", "llm_backbone")


@dataclass(frozen=True)
class VLMArchitecture:
    """Everything that fixes a VLM's modules, without its weights: what a checkpoint's config describes.

    Attributes:
        model_id: the name the VLM carries.
        spec: vision backbone / LLM / projector / resize ids.
        vision_spec: the ViTs to build when the checkpoint describes them itself (HF `timm_model_ids`); None
            means the registry entry of `spec.vision_backbone_id`.
        llm_config: the checkpoint's own transformers config of the LLM (HF `text_config`); None means the
            registry's (tiny presets) or the Hub's.
        tokenizer_dir: a folder holding the checkpoint's tokenizer; None means the registry's / the Hub's.
        base: where the weights of parts a checkpoint lacks come from: a local folder or Hub id (the model a run
            started from); None means the registry's pretrained weights.
    """

    model_id: str
    spec: BaseVLMSpec
    vision_spec: VisionBackboneSpec | None = None
    llm_config: PretrainedConfig | None = None
    tokenizer_dir: Path | None = None
    base: str | None = None


def build_vlm(base_vlm_id: str, hf_token: str | None = None) -> PrismaticVLM:
    """Build the base VLM `base_vlm_id` in FP32: random init for tiny ids, pretrained backbones for real ones.

    Args:
        base_vlm_id: a key of `prismatic.models.registry.BASE_VLMS`.
        hf_token: Hugging Face token for gated LLM weights (Llama-2).

    Raises:
        ConfigError: unknown id (or a registry entry naming unknown parts); pretrained weights unavailable.
        ValueError: a parameter came out in a dtype other than float32.
    """
    return build_vlm_from_spec(
        VLMArchitecture(base_vlm_id, get_base_vlm_spec(base_vlm_id)), hf_token=hf_token
    )


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Create every `nn.Parameter` registered inside this block on the meta device (no memory, no init cost).

    Buffers stay real: modules compute non-persistent ones (the LLM's rotary `inv_freq`) in `__init__`, and no
    checkpoint holds them. A loader then assigns each parameter from the checkpoint (`load_state_dict(assign=True)`).
    """
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _maybe_on_meta(on_meta: bool) -> contextlib.AbstractContextManager[None]:
    return parameters_on_meta() if on_meta else contextlib.nullcontext()


def build_vlm_from_spec(
    arch: VLMArchitecture,
    *,
    hf_token: str | None = None,
    pretrained_vision: bool | None = None,
    pretrained_llm: bool | None = None,
    on_meta: Collection[str] = (),
) -> PrismaticVLM:
    """Build the VLM `arch` describes in FP32; the loaders use it to get the shape a checkpoint fills.

    Args:
        arch: the name, the `BaseVLMSpec` (vision backbone, LLM, projector, resize strategy) and the checkpoint's own
            descriptions of its parts (LLM config, tokenizer folder, ViTs), built instead of the registry's.
        hf_token: Hugging Face token for gated repos.
        pretrained_vision / pretrained_llm: load pretrained weights (None: "if the part has any"); loaders pass
            False for parts whose weights come from the checkpoint.
        on_meta: parts (of `VLM_PARTS`) whose parameters stay on the meta device, for a loader to assign; such a
            part loads no pretrained weights.

    Raises:
        ConfigError: a part is not registered; pretrained weights unavailable.
        ValueError: a parameter came out in a dtype other than float32; an unknown part in `on_meta`.
    """
    spec = arch.spec
    unknown = set(on_meta) - set(VLM_PARTS)
    if unknown:
        raise ValueError(f"on_meta names unknown parts {sorted(unknown)}; valid: {', '.join(VLM_PARTS)}.")
    # Validate every part before building anything: a typo should not cost a 7B model load.
    if arch.vision_spec is None:
        get_vision_backbone_spec(spec.vision_backbone_id)
    get_llm_backbone_spec(spec.llm_backbone_id)
    resolve_projector_arch(spec.arch_specifier)
    check_resize_strategy(spec.image_resize_strategy)

    logger.info("Building base VLM '%s' (%s)", arch.model_id, spec)
    with _maybe_on_meta("vision_backbone" in on_meta):
        vision_backbone = build_vision_backbone(
            spec.vision_backbone_id,
            spec.image_resize_strategy,
            pretrained=False if "vision_backbone" in on_meta else pretrained_vision,
            spec=arch.vision_spec,
        )
    with _maybe_on_meta("llm_backbone" in on_meta):
        llm_backbone = build_llm_backbone(
            spec.llm_backbone_id,
            hf_token=hf_token,
            pretrained=False if "llm_backbone" in on_meta else pretrained_llm,
            config=arch.llm_config,
            tokenizer_dir=arch.tokenizer_dir,
        )
    with _maybe_on_meta("projector" in on_meta):
        vlm = PrismaticVLM(arch.model_id, vision_backbone, llm_backbone, arch_specifier=spec.arch_specifier)

    not_fp32 = [f"{name} ({p.dtype})" for name, p in vlm.named_parameters() if p.dtype != torch.float32]
    if not_fp32:
        raise ValueError(f"Base VLM '{arch.model_id}' has non-FP32 parameters: {', '.join(not_fp32[:5])}.")
    return vlm


def build_vlm_from_architecture(
    arch: VLMArchitecture,
    *,
    hf_token: str | None = None,
    pretrained_vision: bool | None = None,
    on_meta: Collection[str] = VLM_PARTS,
) -> PrismaticVLM:
    """`build_vlm_from_spec` with the loaders' defaults: the LLM never loads Hub weights (the checkpoint holds
    them), and every part is left on the meta device for the loader unless `on_meta` says otherwise."""
    return build_vlm_from_spec(
        arch, hf_token=hf_token, pretrained_vision=pretrained_vision, pretrained_llm=False, on_meta=on_meta
    )


def cast_floating_parameters(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating-point parameters to `dtype` in place; buffers keep theirs (rotary `inv_freq` stays FP32)."""
    for param in module.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
