"""LLM backbones: Hugging Face causal LMs with their tokenizer and prompt format, and their registry.

The registry and `build_llm_backbone` import without torch or transformers. The backbone classes live in their
modules (`base_llm.LLMBackbone`, `hf_causal.HFCausalLLMBackbone`): importing one loads transformers.
"""

from __future__ import annotations

from prismatic.models.backbones.llm.registry import (
    LLM_BACKBONES,
    LLMBackboneSpec,
    build_llm_backbone,
    get_llm_backbone_spec,
)

__all__ = ["LLM_BACKBONES", "LLMBackboneSpec", "build_llm_backbone", "get_llm_backbone_spec"]
