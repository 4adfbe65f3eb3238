"""`ActionHead`, the interface every action representation implements, and what it exchanges with its callers.

A head is called with the (possibly FSDP- or DDP-wrapped) model and a batch already on the device: it must call the
model through its `forward` (wrappers hook it). At inference the policy prepares a `DecodeRequest` and the head
returns a `HeadPrediction` in normalised units; the policy un-normalises it, whatever the head.

A head with a module of its own (`build_module`: the VLM's `action_head`) gets, inside the VLM's forward, one
`HeadInputs`: the LLM's last hidden states with their masks, plus the head's own training inputs the caller passed
to the VLM (target actions, proprio, a generator for its noise). Its module's `forward(inputs)` turns them into a
`HeadModuleOutput`, so the module runs through `forward` (what FSDP and DDP hook) and decides alone which
positions it reads and how.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import ModelOutput

from prismatic.models.action_heads.registry import ActionSpec, is_chunked
from prismatic.models.backbones.vision.base_vision import PixelValues
from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE


@dataclass
class HeadOutput:
    loss: torch.Tensor  # scalar, the mean loss of this micro-batch (what backward sees)
    sums: torch.Tensor  # float64 [B, len(head.columns)], detached: the per-sample metric sums


@dataclass(frozen=True)
class HeadInputs:
    """What the VLM hands its head module after the LLM ran (`PrismaticVLM.forward` with an `action_mask`).

    Sequence positions S are the LLM's: BOS, the `num_prefix_tokens` prefix positions (patches, proprio), then the
    text; padding is on the right.
    """

    hidden_BSE: torch.Tensor  # the LLM's last (normed) hidden states [B, S, llm_dim]
    mask_BS: torch.Tensor  # bool [B, S]: True at real positions, False at padding
    action_mask_BS: torch.Tensor  # bool [B, S]: True at the head layout's action positions
    num_prefix_tokens: int  # positions 1 .. num_prefix_tokens hold the image patches (and the proprio token)
    actions: torch.Tensor | None = None  # [B, K, D] normalised targets (training)
    proprio: torch.Tensor | None = None  # [B, P] normalised proprio, for a model that reads it
    generator: torch.Generator | None = None  # the head's noise, on the device

    def action_hidden(self, count: int) -> torch.Tensor:
        """`[B, count, llm_dim]`: the hidden states at the first `count` action positions of every row, in order.

        Every row of a head's layout holds the same number of action positions, so `count` is the head's to know;
        they are gathered by a stable sort of the mask, not by boolean indexing, which would wait for the device.
        """
        order = torch.sort(self.action_mask_BS.to(torch.uint8), dim=1, descending=True, stable=True).indices
        order = order[:, :count]
        return self.hidden_BSE.gather(1, order[..., None].expand(-1, -1, self.hidden_BSE.shape[-1]))


@dataclass
class HeadModuleOutput(ModelOutput):
    """A head module's answer to `HeadInputs` (a `ModelOutput`, so that FSDP and DDP find its tensors).

    `actions`: the predicted chunk `[B, chunk_size, action_dim]` in normalised units, where the module predicts one
    in this forward (a regression head always; a sampling head at inference). `prediction` / `target`: what a head
    whose loss is not on `actions` compares (e.g. a flow head's velocity and its target), float32.
    """

    actions: torch.Tensor | None = None
    prediction: torch.Tensor | None = None
    target: torch.Tensor | None = None


class HeadModule(nn.Module, ABC):
    """A head's module (`ActionHead.build_module`, the VLM's `action_head`): `forward(HeadInputs)` ->
    `HeadModuleOutput`. It runs inside the VLM's forward, so under FSDP / DDP it is hooked like the rest.

    A module with a stack of repeated blocks (a transformer expert) declares them (`get_blocks`), and the training
    strategies treat each as they treat an LLM decoder layer, whatever the head; the rest of the module stays in
    the root FSDP unit.
    """

    # Methods of each block other than `forward` that compute with the block's weights (called by the module
    # outside the block's `forward`): under FSDP2 they gather and free the block's shards as `forward` does.
    block_methods: ClassVar[tuple[str, ...]] = ()

    def get_blocks(self) -> nn.ModuleList:
        """The module's repeated blocks, each trained as an LLM decoder layer is: its own FSDP2 unit (sharded before
        the root), checkpointed when activation checkpointing is on (`--vla.speed.checkpointing_policy` says which),
        compiled under `--vla.speed.compile` (`prismatic.training.strategies.head_units`). Return the container the
        module runs them from, not a copy: checkpointing replaces its entries with wrappers around them. Default:
        none (a small module is one piece of the root unit)."""
        return nn.ModuleList()

    @abstractmethod
    def forward(self, inputs: HeadInputs) -> HeadModuleOutput:
        """The module's output for one batch (see `HeadModuleOutput`)."""


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
    seed: int = (
        0  # heads that sample (flow): the seed of their noise, so the same request gets the same actions
    )


@dataclass(frozen=True)
class HeadPrediction:
    """A head's answer to a `DecodeRequest`, in normalised units."""

    token_ids: np.ndarray  # int64 [B, A] ([B, 0] for a continuous head)
    normalized: np.ndarray  # float64 [B, A] ([B, K, A] for a chunk head)
    logprobs: np.ndarray  # float32, one per decoded token (NaN for a continuous head: no token distribution)
    # bool [B]: whether each row's ids decoded to actions (False: a stand-in, e.g. FAST's zeros); None: the head's
    # answers always decode. Evaluations count the False rows.
    valid: np.ndarray | None = None


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
    def eval_columns(self) -> tuple[str, ...]:
        """Per-sample sums returned by `evaluate` (validation's): the training ones unless the head measures more."""
        return self.columns

    @property
    def eval_ratios(self) -> dict[str, tuple[str, str]]:
        """Validation's reported metric -> (numerator, denominator) of `eval_columns`."""
        return self.ratios

    def evaluate(
        self, model: nn.Module, batch: dict[str, Any], *, generator: torch.Generator
    ) -> torch.Tensor:
        """Held-out per-sample sums `[B, len(eval_columns)]` of `batch` (no loss). `generator`, seeded by the
        validator per batch on the device, is the only randomness a head may use here, so that two validations
        of the same weights agree and training's global RNG is left as it was. Default: the training sums."""
        return self(model, batch, with_loss=False).sums

    @property
    def chunked(self) -> bool:
        """Whether actions come out as chunks `[chunk_size, action_dim]` (the registry entry's `chunked`)."""
        return is_chunked(self.spec.head)

    @property
    def future_action_window_size(self) -> int:
        """Future actions the pipeline attaches to each frame (its `future_action_window_size`)."""
        return self.spec.chunk_size - 1

    @classmethod
    def build_module(cls, spec: ActionSpec, llm_dim: int) -> HeadModule | None:
        """The module the VLM gets as `action_head` (`PrismaticVLM.attach_action_modules`), which the VLM's forward
        with an `action_mask` calls with `HeadInputs`; None: the head has none (it reads the LM head's logits)."""
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

    def prepare_files(
        self,
        folder: Path,
        sample_chunks: Callable[[int], np.ndarray],
        dist_info: Any,
        *,
        resumed: bool,
        timeout: timedelta,
        base: Path | None = None,
    ) -> None:
        """Training, before any frame is laid out: set up what the head keeps in the run folder `folder` beside the
        statistics (FAST's vocabulary: fitted on a new run from `sample_chunks(n)`, n normalised training chunks
        `[n, chunk_size, action_dim]`, or taken from `base`, the folder the starting model was loaded from, when it
        has them; read on a resume). Collective (`timeout`: how long ranks wait for rank 0). Default: nothing."""
        return None

    def load_files(self, folder: Path | None) -> None:
        """Inference: read what `prepare_files` kept in the run (or export) folder `folder` (None: not loaded from
        a folder). Default: nothing."""
        return None

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


def module_forward(
    head: ActionHead, vlm: nn.Module, request: DecodeRequest, **head_inputs: Any
) -> HeadModuleOutput:
    """One forward of `vlm` over the requests laid out by `head.layout` (with an empty chunk: a head with a module
    reads no action values at inference), right-padded as the training collator pads; `head_inputs` go to the
    head module (`generator`). What `predict` of a head with a module runs."""
    empty = np.zeros((head.spec.chunk_size, request.action_dim), np.float32)
    rows = [head.layout(list(ids), empty, request.eos_id) for ids in request.prompt_ids]
    length = max(len(row["input_ids"]) for row in rows)
    input_ids = torch.full((len(rows), length), request.pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    action_mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n], attention_mask[i, :n], action_mask[i, :n] = (
            row["input_ids"],
            True,
            row["action_mask"],
        )
    return vlm(
        input_ids=input_ids.to(request.device),
        attention_mask=attention_mask.to(request.device),
        pixel_values=request.pixel_values,
        proprio=request.proprio,
        action_mask=action_mask.to(request.device),
        **head_inputs,
    )


class ProprioProjector(nn.Module):
    """Normalised proprio `[B, P]` -> one LLM token `[B, 1, llm_dim]`: Linear -> GELU -> Linear (OpenVLA-OFT's)."""

    def __init__(self, proprio_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))[:, None, :]
