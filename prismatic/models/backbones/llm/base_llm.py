"""LLM backbone interface: what the VLM, the data pipeline, freezing and FSDP need from a causal language model."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import CausalLMOutputWithPast

from prismatic.models.backbones.llm.prompting import PromptBuilder

# transformers' own SDPA attention under a name transformers builds no masks for (it prepares masks only for the
# names it knows): a forward given no padding mask then skips mask preparation, whose check of the position ids for
# packed sequences reads a device value (a host sync) at the start of every forward. See `causal_attention`.
CAUSAL_SDPA = "prismatic_causal_sdpa"
AttentionInterface.register(CAUSAL_SDPA, sdpa_attention_forward)


def full_attention_only(config: PretrainedConfig) -> bool:
    """Whether every layer attends to all earlier positions (no sliding window, whose limit lives in the mask)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(config, "sliding_window", None) is None


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
        self._check_mask(attention_mask)
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
        self._check_mask(attention_mask)
        hidden = self.llm.get_decoder()(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, use_cache=False
        ).last_hidden_state
        picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
        return self.llm.get_output_embeddings()(picked)

    @contextlib.contextmanager
    def causal_attention(self) -> Iterator[None]:
        """Inside, the LLM attends causally without transformers' mask preparation (`CAUSAL_SDPA`): for forwards
        (and their backward, whose recomputation reads the same setting) given no padding mask, where that
        preparation only checks for packed sequences, waiting for the device to do so. The same SDPA call runs
        either way (no mask, `is_causal`). A 4D mask (parallel decoding) is still used as given; a 2D mask would
        be ignored, so `forward` and `logits_at` refuse one inside. A no-op for models not on SDPA or with
        sliding-window layers."""
        config = self.llm.config
        if config._attn_implementation != "sdpa" or not full_attention_only(config):
            yield
            return
        config._attn_implementation = CAUSAL_SDPA
        try:
            yield
        finally:
            config._attn_implementation = "sdpa"

    def _check_mask(self, attention_mask: torch.Tensor | None) -> None:
        if (
            attention_mask is not None
            and attention_mask.ndim == 2
            and self.llm.config._attn_implementation == CAUSAL_SDPA
        ):
            raise ValueError(
                "A 2D attention mask reached the LLM inside `causal_attention()`, where it would be ignored: call "
                "without the context for masked batches."
            )

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
