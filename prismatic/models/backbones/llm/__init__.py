"""LLM backbones: Hugging Face causal LMs with their tokenizer and prompt format, and their registry.

The registry and `build_llm_backbone` import without torch or transformers; the backbone classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.models.backbones.llm.registry import (
    LLM_BACKBONES,
    LLMBackboneSpec,
    build_llm_backbone,
    get_llm_backbone_spec,
)
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.backbones.llm.base_llm import LLMBackbone
    from prismatic.models.backbones.llm.hf_causal import HFCausalLLMBackbone

_LAZY = {
    "LLMBackbone": "prismatic.models.backbones.llm.base_llm",
    "HFCausalLLMBackbone": "prismatic.models.backbones.llm.hf_causal",
}

__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "LLM_BACKBONES",
    "HFCausalLLMBackbone",
    "LLMBackbone",
    "LLMBackboneSpec",
    "build_llm_backbone",
    "get_llm_backbone_spec",
]
