"""LLM backbone registry: id -> Hub id (or tiny config), model family, prompt format and tokenizer source.

Adding an LLM is one `register_llm_backbone(...)` call (here for the shipped ones, or from your own code; see
docs/adding_a_model.md). Real ids load weights and tokenizer from the Hugging Face Hub (Llama-2 is gated:
pass `hf_token`); tiny ids build a random-init model of the same architecture from a small config and use the
in-repo tiny tokenizer, so tests and CPU smoke runs exercise the real transformers code path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prismatic.models.backbones.llm.prompting import (
    Llama2ChatPromptBuilder,
    MistralInstructPromptBuilder,
    PhiPromptBuilder,
    PromptBuilder,
    PurePromptBuilder,
    Qwen25ChatPromptBuilder,
    VicunaV15ChatPromptBuilder,
)
from prismatic.models.registry import SpecRegistry
from prismatic.util.errors import ConfigError

if TYPE_CHECKING:  # annotations only: this registry is plain data, read before torch loads
    from transformers import PretrainedConfig

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
        bos_token: for tokenizers that prepend no BOS (Phi-2, Qwen2.5), the token to prepend: the VLM inserts
            image patches right after the first token, so every prompt must start with the same one.
        arch: the published architecture (`config.json` fields) of a Hub model, used to build it without
            network access on the meta device (tests, memory planning) and as its random-init shape offline.
    """

    llm_family: str
    prompt_builder: type[PromptBuilder]
    hf_hub_id: str | None = None
    model_type: str = "llama"
    config: Mapping[str, Any] = field(default_factory=dict)
    tokenizer_source: Literal["hub", "tiny"] = "hub"
    max_length: int = 2048
    attn_implementation: str = "sdpa"
    bos_token: str | None = None
    arch: Mapping[str, Any] = field(default_factory=dict)

    @property
    def has_pretrained_weights(self) -> bool:
        return self.hf_hub_id is not None


# Published architectures (each Hub repo's config.json), for meta-device builds without network access.
_LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_LLAMA2_13B = {
    **_LLAMA2_7B,
    "hidden_size": 5120,
    "intermediate_size": 13824,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 40,
}
_MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "sliding_window": 4096,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_PHI2 = {
    "model_type": "phi",
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "vocab_size": 51200,
    "max_position_embeddings": 2048,
    "partial_rotary_factor": 0.4,
    "layer_norm_eps": 1e-5,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
}
_QWEN25_05B = {
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
}

# fmt: off
LLM_BACKBONES: SpecRegistry[LLMBackboneSpec] = SpecRegistry("LLM backbone", {
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
    "llama2-7b-pure": LLMBackboneSpec("llama2", PurePromptBuilder, "meta-llama/Llama-2-7b-hf", arch=_LLAMA2_7B),
    "llama2-13b-pure": LLMBackboneSpec("llama2", PurePromptBuilder, "meta-llama/Llama-2-13b-hf", arch=_LLAMA2_13B),

    # === Llama-2 chat ===
    "llama2-7b-chat": LLMBackboneSpec(
        "llama2", Llama2ChatPromptBuilder, "meta-llama/Llama-2-7b-chat-hf", arch=_LLAMA2_7B
    ),
    "llama2-13b-chat": LLMBackboneSpec(
        "llama2", Llama2ChatPromptBuilder, "meta-llama/Llama-2-13b-chat-hf", arch=_LLAMA2_13B
    ),

    # === Vicuna v1.5 (Llama-2 fine-tuned for chat): Prismatic's default LLM, OpenVLA v0.1's LLM ===
    "vicuna-v15-7b": LLMBackboneSpec("llama2", VicunaV15ChatPromptBuilder, "lmsys/vicuna-7b-v1.5", arch=_LLAMA2_7B),
    "vicuna-v15-13b": LLMBackboneSpec(
        "llama2", VicunaV15ChatPromptBuilder, "lmsys/vicuna-13b-v1.5", arch=_LLAMA2_13B
    ),

    # === Mistral v0.1 ===
    "mistral-v0.1-7b-pure": LLMBackboneSpec(
        "mistral", PurePromptBuilder, "mistralai/Mistral-7B-v0.1", model_type="mistral", arch=_MISTRAL_7B
    ),
    "mistral-v0.1-7b-instruct": LLMBackboneSpec(
        "mistral", MistralInstructPromptBuilder, "mistralai/Mistral-7B-Instruct-v0.1", model_type="mistral",
        arch=_MISTRAL_7B,
    ),

    # === Phi-2 (its tokenizer adds no BOS: "<|endoftext|>" is prepended, as Prismatic's Phi prompts start) ===
    "phi-2-3b": LLMBackboneSpec(
        "phi", PhiPromptBuilder, "microsoft/phi-2", model_type="phi", bos_token="<|endoftext|>", arch=_PHI2
    ),

    # === Qwen2.5 0.5B: MiniVLA's small LLM (no BOS in its tokenizer: "<|endoftext|>" is prepended) ===
    "qwen25-0_5b-pure": LLMBackboneSpec(
        "qwen2", PurePromptBuilder, "Qwen/Qwen2.5-0.5B", model_type="qwen2", bos_token="<|endoftext|>",
        arch=_QWEN25_05B,
    ),
    "qwen25-0_5b-instruct": LLMBackboneSpec(
        "qwen2", Qwen25ChatPromptBuilder, "Qwen/Qwen2.5-0.5B-Instruct", model_type="qwen2",
        bos_token="<|endoftext|>", arch=_QWEN25_05B,
    ),
})
# fmt: on


# The public paths for new LLM backbones (docs/adding_a_model.md); an unknown id gets a did-you-mean ConfigError.
register_llm_backbone = LLM_BACKBONES.register
get_llm_backbone_spec = LLM_BACKBONES.get_spec


def build_llm_backbone(
    llm_backbone_id: str,
    *,
    hf_token: str | None = None,
    pretrained: bool | None = None,
    config: PretrainedConfig | None = None,
    tokenizer_dir: Path | None = None,
) -> HFCausalLLMBackbone:
    """Build an LLM backbone in FP32, with a pad token and embeddings resized to a multiple of 64.

    Args:
        llm_backbone_id: a key of `LLM_BACKBONES`.
        hf_token: Hugging Face token for gated repos (Llama-2).
        pretrained: load Hub weights; None means "if the id has any". False on a real id builds a random-init
            model from the Hub config (the shape a checkpoint is loaded into).
        config: a transformers config to build from (random init) instead of the Hub's or the preset's.
        tokenizer_dir: a folder holding the tokenizer to use instead of the Hub's or the tiny one.

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
    if config is not None:
        pretrained = False

    # lazy: transformers and torch load on the first build, not with this plain-data registry
    from prismatic.models.backbones.llm.hf_causal import HFCausalLLMBackbone

    return HFCausalLLMBackbone(
        llm_backbone_id,
        spec,
        hf_token=hf_token,
        pretrained=pretrained,
        config=config,
        tokenizer_dir=tokenizer_dir,
    )
