"""The flow head (`--vla.action_head flow`, π0's recipe): a flow-matching expert that reads the VLM's hidden states.

The frame's text is the prompt alone (no action positions: the LLM never sees the actions); the VLM hands the head
module (`FlowHeadModule`, the VLM's `action_head`) its last hidden states over BOS, patches, proprio and prompt with
their padding mask, and, in training, the target chunk. The module encodes that prefix once for its expert, then:
    training: draws a flow time and noise per sample (π0's rule, `matching.py`), noises the chunk, and returns the
        expert's velocity and its target; the head's loss is their mean squared error;
    inference: integrates the velocity from noise with `--vla.head.flow.num_steps` Euler steps, the noise drawn
        from a generator seeded by the request (`DecodeRequest.seed`): the same request gives the same actions.
Training noise comes from torch's global generator on the device, which checkpoints save and restore. Validation
(`FlowActionHead.evaluate`) reports the same loss and the L1 error of sampled chunks, all its noise drawn from a
generator the validator seeds per batch: the same weights give the same numbers, and the global RNG is untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
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
from prismatic.models.action_heads.flow.expert import FlowExpert
from prismatic.models.action_heads.flow.matching import (
    noisy_actions_and_target,
    sample,
    sample_noise,
    sample_time,
)
from prismatic.models.action_heads.flow.options import FlowOptions
from prismatic.models.action_heads.registry import ActionSpec
from prismatic.models.decoding import PolicyInputError
from prismatic.util.constants import IGNORE_INDEX


class FlowHeadModule(HeadModule):
    """The VLM's `action_head` for the flow head: its `expert` (a `FlowExpert`) and the sampler's step count.

    The expert's blocks are its units (`get_blocks`): each its own FSDP2 unit, checkpointed and compiled as the
    LLM's layers are. Sampling runs a block's `project_prefix` outside its `forward` (once per observation, before
    the Euler steps), so FSDP2 gathers the block's weights for it too (`block_methods`); a training step, which
    wants one velocity, leaves the projection to the blocks' `forward`. Under mixed precision the expert computes in the
    dtype its weights come in (FSDP2's bf16 copies) or autocast's (DDP): it casts the noisy chunk, time embedding,
    prefix and proprio it is given to that dtype and returns a float32 velocity; times, noise and targets are
    drawn and formed in float32 (under FSDP2 the root unit hands the module the actions already in bf16, as it
    casts every floating input of the VLM's forward), and the loss is taken in float32.
    """

    block_methods = ("project_prefix",)

    def __init__(self, options: FlowOptions, llm_dim: int, spec: ActionSpec) -> None:
        super().__init__()
        self.num_steps = options.num_steps
        self.expert = FlowExpert(
            options.expert_options(), llm_dim, spec.action_dim, spec.chunk_size, spec.proprio_dim
        )

    def get_blocks(self) -> nn.ModuleList:
        return self.expert.blocks

    def forward(self, inputs: HeadInputs) -> HeadModuleOutput:
        """With `inputs.actions`: the velocity at a noised chunk and its target, plus, in eval mode (validation),
        a chunk sampled after them. Without (inference): the sampled chunk."""
        expert = self.expert
        # A training step wants one velocity per observation: each block projects the prefix in its own forward.
        once = self.training and inputs.actions is not None
        cache = expert.encode_prefix(inputs.hidden_BSE, inputs.mask_BS, per_block=not once)
        proprio = inputs.proprio if expert.proprio_dim else None
        batch, device = inputs.hidden_BSE.shape[0], inputs.hidden_BSE.device
        shape = (batch, expert.chunk_size, expert.action_dim)
        generator = inputs.generator  # on its own device; torch's global one on `device` when None
        draw_on = None if generator is not None else device
        noise = sample_noise(shape, generator=generator, device=draw_on).to(device)
        if inputs.actions is None:
            actions = sample(lambda x_t, time: expert(cache, x_t, time, proprio), noise, self.num_steps)
            return HeadModuleOutput(actions=actions)
        time = sample_time(batch, generator=generator, device=draw_on).to(device)
        x_t, target = noisy_actions_and_target(inputs.actions.to(device, torch.float32), noise, time)
        velocity = expert(cache, x_t, time, proprio)
        if self.training:
            return HeadModuleOutput(prediction=velocity, target=target)
        # Validation (eval mode with targets): also sample a chunk from the same prefix, from noise drawn after
        # the loss's, so held-out L1 costs no second LLM pass and the loss is the one training would report.
        start = sample_noise(shape, generator=generator, device=draw_on).to(device)
        actions = sample(lambda x, t: expert(cache, x, t, proprio), start, self.num_steps)
        return HeadModuleOutput(actions=actions, prediction=velocity, target=target)


class FlowActionHead(ActionHead):
    """π0's flow matching on the VLM's hidden states (module docstring). Targets are the pipeline's normalised
    chunks `[chunk_size, action_dim]`; the loss is the velocity MSE over every element (openpi's)."""

    uses_lm_head = False
    columns = ("sq_sum", "values")
    ratios = {"loss": ("sq_sum", "values"), "flow_mse": ("sq_sum", "values")}
    # Validation also samples (`evaluate`): l1_loss is |sampled chunk - target| per value, in normalised units.
    eval_columns = ("sq_sum", "values", "abs_sum")
    eval_ratios = {**ratios, "l1_loss": ("abs_sum", "values")}

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        self.options = FlowOptions(**spec.head_options)

    @classmethod
    def build_module(cls, spec: ActionSpec, llm_dim: int) -> FlowHeadModule:
        return FlowHeadModule(FlowOptions(**spec.head_options), llm_dim, spec)

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        """The prompt alone, no labels, no action positions (`action_mask` all False: the VLM still hands its
        hidden states to the head module); `actions` must be `[chunk_size, action_dim]`."""
        expected = (self.spec.chunk_size, self.spec.action_dim)
        if tuple(np.shape(actions)) != expected:
            raise ValueError(
                f"The flow head needs actions of shape {expected} (chunk_size, action_dim) per frame, got "
                f"{tuple(np.shape(actions))}: build the pipeline with future_action_window_size = chunk_size - 1."
            )
        input_ids = torch.tensor(prefix_ids, dtype=torch.long)
        return {
            "input_ids": input_ids,
            "labels": torch.full_like(input_ids, IGNORE_INDEX),
            "action_mask": torch.zeros(len(input_ids), dtype=torch.bool),
        }

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        actions = batch["actions"].to(device=batch["input_ids"].device, dtype=torch.float32)
        output = model(**self.model_inputs(batch), action_mask=batch["action_mask"], actions=actions)
        error = (output.prediction.float() - output.target.float()).square()  # [B, H, D]
        loss = error.mean() if with_loss else error.new_zeros(())
        with torch.no_grad():
            e = error.detach().double()
            sums = torch.stack([e.sum((1, 2)), e.new_full((e.shape[0],), float(e[0].numel()))], dim=1)
        return HeadOutput(loss=loss, sums=sums)

    def evaluate(
        self, model: nn.Module, batch: dict[str, Any], *, generator: torch.Generator
    ) -> torch.Tensor:
        """Held-out sums: the velocity MSE's (`sq_sum`, `values`) under π0's training rule and `abs_sum`, the L1
        error of a chunk sampled with `num_steps` Euler steps against the target, all noise from `generator`
        (the loss's noise and time first, then the sampler's start). The model must be in eval mode."""
        actions = batch["actions"].to(device=batch["input_ids"].device, dtype=torch.float32)
        inputs = self.model_inputs(batch)
        output = model(**inputs, action_mask=batch["action_mask"], actions=actions, generator=generator)
        if output.actions is None:
            raise RuntimeError(
                "The flow head module sampled no chunk: evaluate needs the model in eval mode."
            )
        sq = (output.prediction.float() - output.target.float()).square().double()
        l1 = (output.actions.float() - actions).abs().double()
        values = sq.new_full((sq.shape[0],), float(sq[0].numel()))
        return torch.stack([sq.sum((1, 2)), values, l1.sum((1, 2))], dim=1)

    @torch.inference_mode()
    def predict(self, vlm: nn.Module, request: DecodeRequest) -> HeadPrediction:
        """Sample a chunk per request: `num_steps` Euler steps from noise seeded by `request.seed`."""
        action_dim, chunk = request.action_dim, self.spec.chunk_size
        if action_dim != self.spec.action_dim:
            raise PolicyInputError(
                f"This policy predicts {self.spec.action_dim}-dim actions; the unnorm key asks for {action_dim}."
            )
        generator = torch.Generator(device=request.device).manual_seed(request.seed)
        output = module_forward(self, vlm, request, generator=generator)
        batch = len(request.prompt_ids)
        return HeadPrediction(
            np.zeros((batch, 0), np.int64),
            output.actions.float().cpu().numpy().astype(np.float64),
            np.full((batch, chunk, action_dim), np.nan, np.float32),
        )
