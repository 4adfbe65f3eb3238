"""OpenVLA-OFT's action head (Kim, Finn, Liang 2025): parallel decoding of a chunk with an MLP and an L1 loss.

`chunk_size * action_dim` empty action positions follow the prompt (their embeddings are zero), attend to each
other and to the prompt (which does not see them), and an MLP on their last hidden states (`L1ChunkMLP`, the VLM's
`action_head` module, which picks those positions out of the `HeadInputs` the VLM hands it) predicts the whole
chunk of normalised actions in one forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prismatic.models.action_heads.base import (
    ActionHead,
    DecodeRequest,
    HeadInputs,
    HeadModule,
    HeadModuleOutput,
    HeadOutput,
    HeadPrediction,
    module_forward,
)
from prismatic.models.action_heads.options import L1ChunkOptions
from prismatic.models.action_heads.registry import ActionSpec
from prismatic.models.decoding import PolicyInputError
from prismatic.util.constants import IGNORE_INDEX


class ResidualMLPBlock(nn.Module):
    """LayerNorm -> Linear -> ReLU, added to its input (OpenVLA-OFT's MLPResNet block)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.linear(self.norm(x)))


class L1ChunkMLP(HeadModule):
    """Hidden states of one chunk step's `action_dim` positions, concatenated -> that step's action.

    `[B, K, action_dim * llm_dim]` -> LayerNorm -> Linear(-> llm_dim) -> ReLU -> 2 residual blocks -> LayerNorm ->
    Linear(-> action_dim): `[B, K, action_dim]` (OpenVLA-OFT's L1 regression head, MLPResNet with 2 blocks;
    `--vla.head.l1_chunk.mlp_blocks` changes the count).
    `forward` reads the K * action_dim action positions of the VLM's `HeadInputs`; `read_out` is the MLP alone.
    """

    def __init__(self, llm_dim: int, action_dim: int, chunk_size: int = 1, num_blocks: int = 2) -> None:
        super().__init__()
        self.action_dim, self.chunk_size = action_dim, chunk_size
        self.input_norm = nn.LayerNorm(action_dim * llm_dim)
        self.input = nn.Linear(action_dim * llm_dim, llm_dim)
        self.blocks = nn.ModuleList(ResidualMLPBlock(llm_dim) for _ in range(num_blocks))
        self.output_norm = nn.LayerNorm(llm_dim)
        self.output = nn.Linear(llm_dim, action_dim)

    def read_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[B, K, action_dim * llm_dim]` -> `[B, K, action_dim]`."""
        x = F.relu(self.input(self.input_norm(hidden)))
        for block in self.blocks:
            x = block(x)
        return self.output(self.output_norm(x))

    def forward(self, inputs: HeadInputs) -> HeadModuleOutput:
        """The chunk `[B, chunk_size, action_dim]` from the hidden states at the layout's action positions."""
        slots = inputs.action_hidden(self.chunk_size * self.action_dim)
        slots = slots.reshape(slots.shape[0], self.chunk_size, self.action_dim * slots.shape[-1])
        actions = self.read_out(slots)
        # FSDP2 hooks the output for backward; a view (Linear's 3D output is one) would warn that an in-place op on
        # it could skip that hook.
        return HeadModuleOutput(actions=actions.clone() if actions._is_view() else actions)


class L1ChunkActionHead(ActionHead):
    """OpenVLA-OFT's parallel decoding with a continuous head (module docstring). Targets are the pipeline's
    normalised actions `[K, action_dim]` (the current one and K - 1 future ones)."""

    uses_lm_head = False

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        dims = [f"abs_dim{d}" for d in range(spec.action_dim)]
        self.columns = ("abs_sum", "values", "steps", *dims)
        self.ratios = {
            "loss": ("abs_sum", "values"),
            "l1_loss": ("abs_sum", "values"),
            **{f"l1_dim{d}": (f"abs_dim{d}", "steps") for d in range(spec.action_dim)},
        }

    @classmethod
    def build_module(cls, spec: ActionSpec, llm_dim: int) -> L1ChunkMLP:
        # A subclass registered without options (the docs' l2-chunk) gets the defaults.
        options = L1ChunkOptions(**spec.head_options) if spec.head_options else L1ChunkOptions()
        return L1ChunkMLP(llm_dim, spec.action_dim, spec.chunk_size, options.mlp_blocks)

    @property
    def num_slots(self) -> int:
        return self.spec.chunk_size * self.spec.action_dim

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """prompt + `chunk_size * action_dim` action positions (their ids never reach the LLM: the VLM zeroes their
        embeddings), no labels; `action_mask` marks them; `actions` must be `[chunk_size, action_dim]`."""
        shape = np.shape(actions)
        expected = (self.spec.chunk_size, self.spec.action_dim)
        if tuple(shape) != expected:
            raise ValueError(
                f"The l1-chunk head needs actions of shape {expected} (chunk_size, action_dim) per frame, got "
                f"{tuple(shape)}: build the pipeline with future_action_window_size = chunk_size - 1."
            )
        n = len(prefix_ids)
        input_ids = torch.tensor([*prefix_ids, *([eos_id] * self.num_slots)], dtype=torch.long)
        action_mask = torch.zeros(len(input_ids), dtype=torch.bool)
        action_mask[n:] = True
        return {
            "input_ids": input_ids,
            "labels": torch.full_like(input_ids, IGNORE_INDEX),
            "action_mask": action_mask,
        }

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        output = model(**self.model_inputs(batch), action_mask=batch["action_mask"])
        predicted = output.actions  # [B, K, D], normalised units
        target = batch["actions"].to(device=predicted.device, dtype=torch.float32)
        error = (predicted.float() - target).abs()
        loss = error.mean() if with_loss else error.new_zeros(())
        with torch.no_grad():
            e = error.detach().double()
            batch_size, chunk, dim = e.shape
            sums = torch.cat(
                [
                    e.sum((1, 2))[:, None],
                    e.new_full((batch_size, 1), float(chunk * dim)),
                    e.new_full((batch_size, 1), float(chunk)),
                    e.sum(1),
                ],
                dim=1,
            )
        return HeadOutput(loss=loss, sums=sums)

    @torch.inference_mode()
    def predict(self, vlm: nn.Module, request: DecodeRequest) -> HeadPrediction:
        """Parallel decoding: every action position of every row in one forward (the layout training used)."""
        action_dim, chunk = request.action_dim, self.spec.chunk_size
        if action_dim != self.spec.action_dim:
            raise PolicyInputError(
                f"This policy predicts {self.spec.action_dim}-dim actions; the unnorm key asks for {action_dim}."
            )
        output = module_forward(self, vlm, request)
        normalized = output.actions.float().cpu().numpy().astype(np.float64)
        batch = len(request.prompt_ids)
        return HeadPrediction(
            np.zeros((batch, 0), np.int64),
            normalized,
            np.full((batch, chunk, action_dim), np.nan, np.float32),
        )
