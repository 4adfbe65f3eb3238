"""`ActionHead`, the interface every action representation implements, and what it exchanges with its callers.

A head is called with the (possibly FSDP- or DDP-wrapped) model and a batch already on the device: it must call the
model through its `forward` (wrappers hook it). At inference the policy prepares a `DecodeRequest` and the head
returns a `HeadPrediction` in normalised units; the policy un-normalises it, whatever the head.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prismatic.models.action_heads.registry import ActionSpec, is_chunked
from prismatic.models.backbones.vision.base_vision import PixelValues
from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE


@dataclass
class HeadOutput:
    loss: torch.Tensor  # scalar, the mean loss of this micro-batch (what backward sees)
    sums: torch.Tensor  # float64 [B, len(head.columns)], detached: the per-sample metric sums


@dataclass(frozen=True)
class DecodeRequest:
    """A batch of inference requests as the policy prepared them: what a head needs to predict their actions."""

    prompt_ids: Sequence[list[int]]  # B prompts (BOS first), any lengths
    pixel_values: PixelValues  # [B, 3N, H, W] (a dict per part for fused backbones), on the model's device
    proprio: torch.Tensor | None  # [B, P] normalised, for a model that reads proprio
    action_dim: int  # the width of one action, from the statistics of the requests' datasets
    pad_id: int
    eos_id: int
    device: torch.device
    constrained: bool = True  # token heads: decode only action-token ids
    use_cache: bool = True  # token heads: KV-cached decoding (False re-runs the sequence; same result)
    static_cache: bool | None = None  # token heads: CUDA-graph replay over a static cache (None: on CUDA)
    compile_steps: bool = False  # token heads, static cache: torch.compile its prefill and step first
    # What compile_steps compiles: each ViT block and decoder layer ("layers") or each function ("whole").
    compile_scope: str = DEFAULT_COMPILE_SCOPE


@dataclass(frozen=True)
class HeadPrediction:
    """A head's answer to a `DecodeRequest`, in normalised units."""

    token_ids: np.ndarray  # int64 [B, A] ([B, 0] for a continuous head)
    normalized: np.ndarray  # float64 [B, A] ([B, K, A] for a chunk head)
    logprobs: np.ndarray  # float32, one per decoded token (NaN for a continuous head: no token distribution)


class ActionHead(ABC):
    """One action representation (see the package docstring). Subclasses set `uses_lm_head`, `columns` and
    `ratios`, and implement `layout`, `__call__` and `predict`; `build_module` when they read out with one."""

    uses_lm_head: ClassVar[bool]  # False: the LM head gets no gradient and is frozen
    columns: tuple[str, ...]  # per-sample sums returned by `__call__`
    ratios: dict[str, tuple[str, str]]  # reported metric -> (numerator column, denominator column)

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        self.spec, self.action_tokenizer, self.num_prefix_tokens = spec, action_tokenizer, num_prefix_tokens
        # `--vla.speed.logits_at_labels`: heads whose loss reads the LM head compute it at the labelled positions only.
        self.logits_at_labels = False

    @property
    def chunked(self) -> bool:
        """Whether actions come out as chunks `[chunk_size, action_dim]` (the registry entry's `chunked`)."""
        return is_chunked(self.spec.head)

    @property
    def future_action_window_size(self) -> int:
        """Future actions the pipeline attaches to each frame (its `future_action_window_size`)."""
        return self.spec.chunk_size - 1

    @classmethod
    def build_module(cls, spec: ActionSpec, llm_dim: int) -> nn.Module | None:
        """The read-out module the VLM gets as `action_head` (`PrismaticVLM.attach_action_modules`); None: none."""
        return None

    @abstractmethod
    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """A frame's text after its prompt: {"input_ids", "labels"} (and head-specific masks), int64 / bool [L]."""

    @abstractmethod
    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        """Forward `batch` through `model`; the loss (0 when `with_loss` is False) and the metric sums."""

    @abstractmethod
    def predict(self, vlm: nn.Module, request: DecodeRequest) -> HeadPrediction:
        """Decode the actions of a batch of requests with `vlm` (in eval mode, under inference mode)."""

    @staticmethod
    def model_inputs(batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch entries every head passes to the VLM's forward."""
        inputs = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "pixel_values": batch["pixel_values"],
        }
        if batch.get("proprio") is not None:
            inputs["proprio"] = batch["proprio"]
        return inputs


class ProprioProjector(nn.Module):
    """Normalised proprio `[B, P]` -> one LLM token `[B, 1, llm_dim]`: Linear -> GELU -> Linear (OpenVLA-OFT's)."""

    def __init__(self, proprio_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))[:, None, :]
