"""LLM backbone registry: id -> Hub id (or tiny config), model family, prompt format and tokenizer source.

Adding an LLM is one entry here. Real ids load weights and tokenizer from the Hugging Face Hub (Llama-2 is gated:
pass `hf_token`); tiny ids build a random-init model of the same architecture from a small config and use the
in-repo tiny tokenizer, so tests and CPU smoke runs exercise the real transformers code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from prismatic.models.backbones.llm.prompting import (
    PromptBuilder,
    PurePromptBuilder,
    VicunaV15ChatPromptBuilder,
)
from prismatic.util.errors import ConfigError, lookup

if TYPE_CHECKING:
    from prismatic.models.backbones.llm.hf_causal import HFCausalLLMBackbone


@dataclass(frozen=True)
class LLMBackboneSpec:
    """How to build one LLM backbone.

    Attributes:
        llm_family: e.g. "llama2"; informational (logs, checkpoints).
        prompt_builder: the `PromptBuilder` class for the format the model was trained with.
        hf_hub_id: Hub repo with config, weights and tokenizer; None for tiny presets (built from `config`).
        model_type: transformers `model_type` used to build tiny presets from `config`.
        config: config kwargs for tiny presets (`vocab_size` comes from the tokenizer).
        tokenizer_source: "hub" (AutoTokenizer from `hf_hub_id`) or "tiny" (`load_tiny_tokenizer()`).
        max_length: tokenizer `model_max_length`: the longest sequence the collator keeps.
        attn_implementation: transformers attention kernel; "sdpa" runs everywhere in FP32.
    """

    llm_family: str
    prompt_builder: type[PromptBuilder]
    hf_hub_id: str | None = None
    model_type: str = "llama"
    config: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_source: Literal["hub", "tiny"] = "hub"
    max_length: int = 2048
    attn_implementation: str = "sdpa"

    @property
    def has_pretrained_weights(self) -> bool:
        return self.hf_hub_id is not None


# fmt: off
LLM_BACKBONES: dict[str, LLMBackboneSpec] = {
    # === Tiny (random init): Llama architecture, 2 layers, width 64 ===
    "tiny-llama": LLMBackboneSpec(
        "llama2", PurePromptBuilder,
        config={
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2,
        },
        tokenizer_source="tiny", max_length=256,
    ),

    # === Llama-2 base ("pure") models: OpenVLA's LLM ===
    "llama2-7b-pure": LLMBackboneSpec("llama2", PurePromptBuilder, "meta-llama/Llama-2-7b-hf"),
    "llama2-13b-pure": LLMBackboneSpec("llama2", PurePromptBuilder, "meta-llama/Llama-2-13b-hf"),

    # === Vicuna v1.5 (Llama-2 fine-tuned for chat): Prismatic's default LLM, OpenVLA v0.1's LLM ===
    "vicuna-v15-7b": LLMBackboneSpec("llama2", VicunaV15ChatPromptBuilder, "lmsys/vicuna-7b-v1.5"),
    "vicuna-v15-13b": LLMBackboneSpec("llama2", VicunaV15ChatPromptBuilder, "lmsys/vicuna-13b-v1.5"),
}
# fmt: on


def get_llm_backbone_spec(llm_backbone_id: str) -> LLMBackboneSpec:
    """Look up an LLM backbone id, raising a did-you-mean `ConfigError` when unknown."""
    return lookup(LLM_BACKBONES, llm_backbone_id, "LLM backbone")


def build_llm_backbone(
    llm_backbone_id: str, *, hf_token: str | None = None, pretrained: bool | None = None
) -> HFCausalLLMBackbone:
    """Build an LLM backbone in FP32, with a pad token and embeddings resized to a multiple of 64.

    Args:
        llm_backbone_id: a key of `LLM_BACKBONES`.
        hf_token: Hugging Face token for gated repos (Llama-2).
        pretrained: load Hub weights; None means "if the id has any". False on a real id builds a random-init
            model from the Hub config (the shape a checkpoint is loaded into).

    Raises:
        ConfigError: unknown id; weights asked of a tiny id; Hub files not obtainable (offline, gated).
    """
    spec = get_llm_backbone_spec(llm_backbone_id)
    if pretrained is None:
        pretrained = spec.has_pretrained_weights
    elif pretrained and not spec.has_pretrained_weights:
        raise ConfigError(
            f"LLM backbone '{llm_backbone_id}' is a random-init preset with no pretrained weights."
        )

    from prismatic.models.backbones.llm.hf_causal import HFCausalLLMBackbone

    return HFCausalLLMBackbone(llm_backbone_id, spec, hf_token=hf_token, pretrained=pretrained)
