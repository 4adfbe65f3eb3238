"""Models: the base-VLM registry and `build_vlm`, which composes vision backbone + projector + LLM.

    build_vlm(base_vlm_id: str, hf_token: str | None = None) -> PrismaticVLM
    load(id_or_path, hf_token=None, dtype=None, device=None) -> PrismaticVLM   # registry id, run folder or checkpoint,
                                                          # HF OpenVLA folder, Hub; device="meta": no weights read
    load_vla(id_or_path, hf_token=None, dtype=None) -> LoadedVLA  # ... plus the action statistics (norm_stats)
    PrismaticVLM.forward(input_ids, attention_mask, pixel_values, labels=None) -> CausalLMOutputWithPast
    PrismaticVLM.freeze_backbones(stage)  # one of VLA_STAGES

Registries (plain data): BASE_VLMS, VISION_BACKBONES, LLM_BACKBONES, PROJECTORS. Importing this package loads
neither torch, timm nor transformers; they load on first use of a builder or model class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.models.backbones.llm.registry import LLM_BACKBONES, LLMBackboneSpec, get_llm_backbone_spec
from prismatic.models.backbones.vision.registry import (
    RESIZE_STRATEGIES,
    VISION_BACKBONES,
    VisionBackboneSpec,
    get_vision_backbone_spec,
)
from prismatic.models.registry import BASE_VLMS, BaseVLMSpec, get_base_vlm_spec
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.loading import LoadedVLA, load, load_vla
    from prismatic.models.materialize import build_vlm
    from prismatic.models.projectors import PROJECTORS
    from prismatic.models.vlms.prismatic import VLA_STAGES, PrismaticVLM

_LAZY = {
    "build_vlm": "prismatic.models.materialize",
    "load": "prismatic.models.loading",
    "load_vla": "prismatic.models.loading",
    "LoadedVLA": "prismatic.models.loading",
    "PrismaticVLM": "prismatic.models.vlms.prismatic",
    "VLA_STAGES": "prismatic.models.vlms.prismatic",
    "PROJECTORS": "prismatic.models.projectors",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "BASE_VLMS",
    "LLM_BACKBONES",
    "PROJECTORS",
    "RESIZE_STRATEGIES",
    "VISION_BACKBONES",
    "VLA_STAGES",
    "BaseVLMSpec",
    "LLMBackboneSpec",
    "LoadedVLA",
    "PrismaticVLM",
    "VisionBackboneSpec",
    "build_vlm",
    "get_base_vlm_spec",
    "get_llm_backbone_spec",
    "get_vision_backbone_spec",
    "load",
    "load_vla",
]
