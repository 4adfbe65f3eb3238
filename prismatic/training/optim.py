"""AdamW with decay only on matrices (not biases / norms / 1-D params) and the two LR schedules.

AdamW's implementation (`--vla.speed.optimizer_impl`): torch picks its foreach kernels only for plain tensors, so with
FSDP2's DTensor parameters it falls back to a Python loop over every trainable tensor (two host syncs each per
step on CUDA). `auto` asks for the fused kernel on CUDA and keeps torch's own choice on CPU, where earlier runs'
numbers stay as they were (`prismatic.training.speed_plan.adamw_implementation` decides).
"""

from __future__ import annotations

import functools
import math

import torch
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from prismatic.util.errors import ConfigError


def build_optimizer(
    model: torch.nn.Module, learning_rate: float, weight_decay: float, implementation: str = "default"
) -> AdamW:
    """AdamW over the trainable parameters; biases and norm weights (ndim <= 1) get no weight decay.

    `implementation`: "fused", "foreach", "for-loop" or "default" (torch's choice): the speed plan's `optimizer_impl`.
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name.endswith(".bias") else decay).append(param)
    if not decay and not no_decay:
        raise ConfigError("No trainable parameters: check the freeze flags of the chosen --vla.type.")
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    return AdamW(groups, lr=learning_rate, **kwargs.get(implementation, {}))


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    scheduler_type: str,
    num_training_steps: int,
    warmup_ratio: float,
    num_steps_before_decay: int | None = None,
) -> LambdaLR:
    """`constant` (with linear warmup when `warmup_ratio` > 0), `linear-warmup+cosine-decay` to 0, or
    `step-decay`: `constant` for `num_steps_before_decay` optimiser steps, then a tenth of the peak (OpenVLA-OFT's
    `MultiStepLR(milestones=[num_steps_before_decay], gamma=0.1)`).

    Stepped once per optimiser step; its state (`last_epoch`) is checkpointed, so a resumed run continues the
    curve exactly.
    """
    num_warmup = math.floor(warmup_ratio * num_training_steps)
    if scheduler_type == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=num_warmup)
    if scheduler_type == "linear-warmup+cosine-decay":
        return get_cosine_schedule_with_warmup(optimizer, num_warmup, num_training_steps)
    if scheduler_type == "step-decay":
        if num_steps_before_decay is None or num_steps_before_decay < 1:
            raise ConfigError("lr_scheduler_type 'step-decay' needs --vla.num_steps_before_decay (>= 1).")
        return LambdaLR(optimizer, functools.partial(step_decay_factor, num_warmup, num_steps_before_decay))
    raise ConfigError(
        f"Unknown lr_scheduler_type '{scheduler_type}'. Valid choices: constant, linear-warmup+cosine-decay, "
        "step-decay."
    )


def step_decay_factor(num_warmup: int, num_steps_before_decay: int, step: int) -> float:
    """The LR multiplier of `step-decay` after `step` optimiser steps: linear warmup, 1, then 0.1 from
    `num_steps_before_decay` on (the (N+1)-th optimiser step is the first at a tenth, as with MultiStepLR)."""
    warmup = step / max(1, num_warmup) if step < num_warmup else 1.0
    return warmup * (0.1 if step >= num_steps_before_decay else 1.0)
