"""AdamW with decay only on matrices (not biases / norms / 1-D params) and the two LR schedules."""

from __future__ import annotations

import math

import torch
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from prismatic.util.errors import ConfigError


def build_optimizer(model: torch.nn.Module, learning_rate: float, weight_decay: float) -> AdamW:
    """AdamW over the trainable parameters; biases and norm weights (ndim <= 1) get no weight decay."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim <= 1 or name.endswith(".bias") else decay).append(param)
    if not decay and not no_decay:
        raise ConfigError("No trainable parameters: check the freeze flags of the chosen --vla.type.")
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return AdamW(groups, lr=learning_rate)


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, scheduler_type: str, num_training_steps: int, warmup_ratio: float
) -> LambdaLR:
    """`constant` (with linear warmup when `warmup_ratio` > 0) or `linear-warmup+cosine-decay` to 0.

    Stepped once per optimiser step; its state (`last_epoch`) is checkpointed, so a resumed run continues the
    curve exactly.
    """
    num_warmup = math.floor(warmup_ratio * num_training_steps)
    if scheduler_type == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=num_warmup)
    if scheduler_type == "linear-warmup+cosine-decay":
        return get_cosine_schedule_with_warmup(optimizer, num_warmup, num_training_steps)
    raise ConfigError(
        f"Unknown lr_scheduler_type '{scheduler_type}'. Valid choices: constant, linear-warmup+cosine-decay."
    )
