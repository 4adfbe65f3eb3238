"""FSDP2 strategies (`fully_shard` over a 1-D device mesh): gloo on CPU, nccl on GPU, the same code.

`fsdp-full-shard` reshards parameters after forward (ZeRO-3); `fsdp-shard-grad-op` keeps them gathered until
backward (ZeRO-2: more memory, less communication). Mixed precision is FSDP's bf16 `MixedPrecisionPolicy` with
FP32 master weights; frozen parameters are stored in bf16 (they are computed in bf16 anyway).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh

from prismatic.models.parallelize import apply_fsdp, cast_frozen_params_to_bf16, mixed_precision_policy
from prismatic.training.strategies.base import TrainingStrategy


class FSDPStrategy(TrainingStrategy):
    reshard_after_forward = True

    def wrap_model(self) -> torch.nn.Module:
        mesh = init_device_mesh(self.dist.device.type, (self.dist.world_size,))
        policy = mixed_precision_policy(self.mixed_precision, self.vla.reduce_in_full_precision)
        if self.mixed_precision:
            cast_frozen_params_to_bf16(self.vlm)
        return apply_fsdp(self.vlm, mesh, policy, reshard_after_forward=self.reshard_after_forward)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)


class FSDPShardGradOpStrategy(FSDPStrategy):
    reshard_after_forward = False
