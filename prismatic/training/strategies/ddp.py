"""DDP strategy: every rank holds the whole model; gradients are all-reduced; bf16 through autocast."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from prismatic.models.distributed_init import materialize_from_rank0
from prismatic.training.strategies.base import TrainingStrategy


class DDPStrategy(TrainingStrategy):
    def wrap_model(self) -> torch.nn.Module:
        materialize_from_rank0(self.vlm, None, self.dist.device)
        device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        # Frozen backbones produce no gradients; DDP must not wait for them.
        return DistributedDataParallel(self.vlm, device_ids=device_ids, gradient_as_bucket_view=True)

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.model.no_sync()

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.mixed_precision:
            return contextlib.nullcontext()
        return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
