"""FSDP2 strategies (`fully_shard`): gloo on CPU, nccl on GPU, the same code.

`fsdp-full-shard` reshards parameters after forward (ZeRO-3); `fsdp-shard-grad-op` keeps them gathered until
backward (ZeRO-2: more memory, less communication). Mixed precision is FSDP's bf16 `MixedPrecisionPolicy` with
FP32 master weights; frozen parameters are stored in bf16 (they are computed in bf16 anyway).

Meshes: on one node a 1-D mesh over its ranks. On several nodes (`--sharding auto`/`hybrid`) a 2-D mesh
(replicate across nodes x shard within a node, the node size from torchrun's LOCAL_WORLD_SIZE): parameters are
all-gathered and gradients reduce-scattered over the fast in-node links only, and gradients are all-reduced across
nodes once per step (HSDP, OpenVLA's HYBRID_SHARD). `--sharding full` shards over every rank of every node.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from prismatic.models.distributed_init import full_state_on_rank0, materialize_from_rank0
from prismatic.models.parallelize import apply_fsdp, cast_frozen_params_to_bf16, mixed_precision_policy
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

# Keep unsharded gradients between micro-batches only while they take at most this share of free memory.
UNSHARDED_GRAD_MEMORY_SHARE = 0.25


class FSDPStrategy(TrainingStrategy):
    reshard_after_forward = True

    def device_mesh(self) -> DeviceMesh:
        world, device_type = self.dist.world_size, self.dist.device.type
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        nodes = world // local if local and world % local == 0 else 1
        hybrid = self.sharding == "hybrid" or (self.sharding == "auto" and nodes > 1)
        if self.sharding == "hybrid" and nodes == 1:
            logger.info("--sharding hybrid on one node: that is full sharding over its %d ranks.", world)
            hybrid = False
        if hybrid:
            if world % local:
                raise ConfigError(
                    f"--sharding hybrid needs the same number of ranks on every node: world size {world} is not a "
                    f"multiple of LOCAL_WORLD_SIZE={local}. Use --sharding full."
                )
            logger.info("FSDP mesh: hybrid, %d nodes (replicate) x %d ranks (shard)", nodes, local)
            return init_device_mesh(device_type, (nodes, local), mesh_dim_names=("replicate", "shard"))
        logger.info("FSDP mesh: full sharding over %d ranks", world)
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))

    def wrap_model(self) -> torch.nn.Module:
        mesh = self.device_mesh()
        policy = mixed_precision_policy(self.mixed_precision, self.vla.reduce_in_full_precision)
        if self.mixed_precision:
            cast_frozen_params_to_bf16(self.vlm)
        full_state = full_state_on_rank0(self.vlm)  # rank 0's weights, before sharding splits them
        model = apply_fsdp(self.vlm, mesh, policy, reshard_after_forward=self.reshard_after_forward)
        materialize_from_rank0(model, full_state, self.dist.device)
        return model

    def choose_grad_sync(self) -> bool:
        """`auto`: reduce-scatter after every micro-batch when the unsharded FP32 gradients kept between
        micro-batches would take more than a quarter of the free memory (GPU: free device memory; CPU: available
        host memory shared by the node's ranks)."""
        if self.grad_sync != "auto":
            return self.grad_sync == "micro-batch"
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        need = trainable * 4
        if self.dist.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.dist.device)[0]
        else:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.dist.world_size))
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // max(1, local)
        every = need > UNSHARDED_GRAD_MEMORY_SHARE * free
        logger.info(
            "--grad_sync auto: unsharded gradients would need %.2f GB of %.2f GB free -> %s",
            need / 1e9,
            free / 1e9,
            "reduce-scatter every micro-batch" if every else "reduce once per step",
        )
        return every

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)


class FSDPShardGradOpStrategy(FSDPStrategy):
    reshard_after_forward = False
