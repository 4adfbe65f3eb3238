"""LLM backbone interface: what the VLM, the data pipeline, freezing and FSDP need from a causal language model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.modeling_outputs import CausalLMOutputWithPast

from prismatic.models.backbones.llm.prompting import PromptBuilder


class LLMBackbone(nn.Module, ABC):
    """A decoder-only LM (`llm`) plus its tokenizer and prompt format; the VLM feeds it input embeddings."""

    llm: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase

    def __init__(self, identifier: str) -> None:
        super().__init__()
        self.identifier = identifier

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        """Run the LM; with `labels`, the output carries the (shifted, IGNORE_INDEX-masked) cross-entropy loss."""
        return self.llm(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            labels=labels,
            **kwargs,
        )

    def logits_at(
        self, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None, positions: torch.Tensor
    ) -> torch.Tensor:
        """Logits `[B, K, vocab]` at `positions` (int64 `[B, K]`) only: the decoder, a gather, then the LM head.

        The LM head is the largest matmul of a short-answer sequence (~290 positions x 32k vocabulary at 7B); a
        loss that reads K positions needs only those rows, as the model's own `logits_to_keep` slice does.
        """
        hidden = self.llm.get_decoder()(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.llm.get_output_embeddings()(picked)

    @abstractmethod
    def last_hidden_state(self, inputs_embeds: torch.Tensor, attention_mask_4d: torch.Tensor) -> torch.Tensor:
        """The decoder's final (normed) hidden states `[B, S, D]` under a custom mask (bool `[B, 1, S, S]`, True =
        may attend), without the LM head: what parallel-decoding action heads read."""

    @abstractmethod
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids `[B, L]` -> input embeddings `[B, L, embed_dim]`."""

    @abstractmethod
    def get_layers(self) -> nn.ModuleList:
        """The decoder layers, in order: the units FSDP shards and activation checkpointing wraps."""

    @abstractmethod
    def last_layer_finetune_modules(self) -> tuple[nn.Module, ...]:
        """Modules that train in the "last layer" stages: input embeddings, last decoder layer, LM head."""

    @property
    @abstractmethod
    def prompt_builder_fn(self) -> type[PromptBuilder]:
        """The prompt format this LLM was trained with."""

    @property
    def transformer_layer_cls(self) -> type[nn.Module]:
        """Class of the decoder layers (for wrapping policies that match by type)."""
        return type(self.get_layers()[0])

    @property
    def embed_dim(self) -> int:
        return self.llm.config.hidden_size

    @property
    def pad_token_id(self) -> int:
        return self.tokenizer.pad_token_id

    @property
    def half_precision_dtype(self) -> torch.dtype:
        """Dtype for mixed-precision compute (Llama-2 was trained in BF16)."""
        return torch.bfloat16
