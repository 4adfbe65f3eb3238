"""LLM backbone: the tiny Llama, its tokenizer / pad / resize handling, real registry entries, prompt builders."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaForCausalLM

from prismatic.models.backbones.llm import LLM_BACKBONES, build_llm_backbone
from prismatic.models.backbones.llm.prompting import PurePromptBuilder, VicunaV15ChatPromptBuilder
from prismatic.util.errors import ConfigError


@pytest.fixture(scope="module")
def tiny_llm():
    torch.manual_seed(0)
    return build_llm_backbone("tiny-llama")


def test_tiny_llama(tiny_llm) -> None:
    llm = tiny_llm.llm
    assert isinstance(llm, LlamaForCausalLM)
    assert (llm.config.hidden_size, llm.config.num_hidden_layers, llm.config.num_key_value_heads) == (
        64,
        2,
        2,
    )
    assert tiny_llm.embed_dim == 64
    # 1024 base tokens + <PAD> = 1025, padded to a multiple of 64.
    assert len(tiny_llm.tokenizer) == 1025 and tiny_llm.pad_token_id == 1024
    assert llm.get_input_embeddings().weight.shape == (1088, 64) and llm.lm_head.weight.shape == (1088, 64)
    assert llm.config.pad_token_id == 1024 and llm.config.use_cache is False
    assert tiny_llm.tokenizer.padding_side == "right" and tiny_llm.tokenizer.model_max_length == 256
    assert tiny_llm.prompt_builder_fn is PurePromptBuilder
    assert all(p.dtype == torch.float32 for p in tiny_llm.parameters())


def test_layers_and_embeddings(tiny_llm) -> None:
    assert len(tiny_llm.get_layers()) == 2 and tiny_llm.transformer_layer_cls is LlamaDecoderLayer
    ids = torch.tensor([[1, 5, 9]])
    assert tiny_llm.embed_input_ids(ids).shape == (1, 3, 64)
    out = tiny_llm(input_ids=ids, labels=ids)
    assert out.logits.shape == (1, 3, 1088) and torch.isfinite(out.loss)


REAL_HUB_IDS = {
    "llama2-7b-pure": ("meta-llama/Llama-2-7b-hf", PurePromptBuilder),
    "llama2-13b-pure": ("meta-llama/Llama-2-13b-hf", PurePromptBuilder),
    "vicuna-v15-7b": ("lmsys/vicuna-7b-v1.5", VicunaV15ChatPromptBuilder),
    "vicuna-v15-13b": ("lmsys/vicuna-13b-v1.5", VicunaV15ChatPromptBuilder),
}


@pytest.mark.parametrize("llm_id", sorted(REAL_HUB_IDS))
def test_real_entries(llm_id: str) -> None:
    spec = LLM_BACKBONES[llm_id]
    assert (spec.hf_hub_id, spec.prompt_builder) == REAL_HUB_IDS[llm_id]
    assert spec.has_pretrained_weights and spec.tokenizer_source == "hub" and spec.max_length == 2048


def test_real_llm_offline_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'llama2-7b-pure'.*'meta-llama/Llama-2-7b-hf'.*unavailable"):
        build_llm_backbone("llama2-7b-pure")


def test_unknown_llm_id() -> None:
    with pytest.raises(ConfigError, match="'tiny-lama'.*Did you mean 'tiny-llama'"):
        build_llm_backbone("tiny-lama")


def test_vicuna_prompt_builder() -> None:
    builder = VicunaV15ChatPromptBuilder("openvla")
    builder.add_turn("human", "What action should the robot take to open the drawer?")
    prefix = builder.get_response_prefix()
    assert prefix.startswith("A chat between a curious user and an artificial intelligence assistant.")
    assert prefix.endswith(" USER: What action should the robot take to open the drawer? ASSISTANT: ")
    builder.add_turn("gpt", "done")
    assert builder.get_prompt().endswith("ASSISTANT: done</s>")
    with pytest.raises(ValueError, match="must come from 'human'"):
        builder.add_turn("gpt", "again")
