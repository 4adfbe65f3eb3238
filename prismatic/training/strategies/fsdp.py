"""FSDP2 strategies (`fully_shard`): gloo on CPU, nccl on GPU, the same code.

`fsdp-full-shard` reshards parameters after forward (ZeRO-3); `fsdp-shard-grad-op` keeps them gathered until
backward (ZeRO-2: more memory, less communication). Mixed precision is FSDP's bf16 `MixedPrecisionPolicy` with
FP32 master weights; frozen parameters are stored in bf16 (they are computed in bf16 anyway).

Meshes: on one node a 1-D mesh over its ranks. On several nodes (`--sharding auto`/`hybrid`) a 2-D mesh
(replicate across nodes x shard within a node, the node size from torchrun's LOCAL_WORLD_SIZE): parameters are
all-gathered and gradients reduce-scattered over the fast in-node links only, and gradients are all-reduced across
nodes once per step (HSDP, OpenVLA's HYBRID_SHARD). `--sharding full` shards over every rank of every node.

`--vla.speed.cpu_offload` (CUDA only) adds FSDP2's `CPUOffloadPolicy`: sharded parameters, gradients and AdamW state
live in (pinned) host memory, each unit's shards are copied to the GPU only while it computes, and the optimizer
steps on the CPU. Mixed precision applies as without it (bf16 all-gathers, FP32 shards); gradients are
reduce-scattered after every micro-batch (`--grad_sync auto`: `speed_plan.choose_grad_sync`) so they accumulate on the host; gradient clipping
reduces one number per rank over the device's backend (`clip_host_grad_norm_`); checkpoints hold the same DTensor
shards, only their local values are on the host.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from prismatic.models.distributed_init import full_state_on_rank0, materialize_from_rank0
from prismatic.models.parallelize import (
    apply_fsdp,
    cast_frozen_params_to_bf16,
    mixed_precision_policy,
    offload_policy,
    place_for_cpu_offload,
)
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.training.strategies.head_units import head_module, shard_head_blocks
from prismatic.util.topology import local_world_size

logger = logging.getLogger(__name__)


def _sum_of_squares(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([torch.linalg.vector_norm(t, dtype=torch.float32) for t in tensors]).square().sum()


def clip_host_grad_norm_(
    parameters: Iterable[torch.nn.Parameter], max_norm: float, comm_device: torch.device
) -> torch.Tensor:
    """Clip gradients kept in host memory (FSDP2 CPU offload) to a global L2 norm of at most `max_norm`; return
    the norm before clipping, on `comm_device`. Collective: call on every rank.

    `torch.nn.utils.clip_grad_norm_` all-reduces a DTensor norm whose local value is then on the host, which NCCL
    cannot take ("No backend type associated with device type cpu"). Here each rank sums the squares of its own
    shards on the host; only that number goes to `comm_device` for an all-reduce over the mesh dimensions that
    shard (replicated dimensions hold equal values), and the clip factor comes back to the gradients' device.
    Gradients that are not DTensors are whole on every rank and counted once.
    """
    sharded: dict[tuple[Any, tuple[int, ...]], list[torch.Tensor]] = {}
    whole: list[torch.Tensor] = []
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            dims = tuple(i for i, placement in enumerate(grad.placements) if placement.is_shard())
            sharded.setdefault((grad.device_mesh, dims), []).append(grad.to_local())
        else:
            whole.append(grad)
    total = torch.zeros((), dtype=torch.float32, device=comm_device)
    for (mesh, dims), tensors in sharded.items():  # the same order on every rank: the parameters' order
        squares = _sum_of_squares(tensors).to(comm_device)
        for dim in dims:
            dist.all_reduce(squares, group=mesh.get_group(dim))
        total = total + squares
    if whole:
        total = total + _sum_of_squares(whole).to(comm_device)
    norm = total.sqrt()
    factor = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    on_device: dict[torch.device, torch.Tensor] = {}
    for tensors in [*sharded.values(), whole]:
        for tensor in tensors:  # a DTensor's local tensor shares its storage: scaling it scales the gradient
            if tensor.device not in on_device:
                on_device[tensor.device] = factor.to(tensor.device)
            tensor.mul_(on_device[tensor.device])
    return norm


def hybrid_mesh(device_type: str, nodes: int, local: int, timeout: timedelta | None) -> DeviceMesh:
    """The 2-D mesh (replicate across `nodes`) x (shard over the `local` ranks of a node), its process groups made
    with `timeout` (the run's `--dist_timeout_s`). `init_device_mesh` would give them torch's default instead (10
    minutes for NCCL), shorter than the run's everywhere else. Collective: call on every rank."""
    ranks = torch.arange(nodes * local).view(nodes, local)
    shard, _ = dist.new_subgroups_by_enumeration([row.tolist() for row in ranks], timeout=timeout)
    replicate, _ = dist.new_subgroups_by_enumeration([col.tolist() for col in ranks.T], timeout=timeout)
    return DeviceMesh.from_group(
        [replicate, shard], device_type, mesh=ranks, mesh_dim_names=("replicate", "shard")
    )


class FSDPStrategy(TrainingStrategy):
    reshard_after_forward = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mesh: DeviceMesh | None = None  # the mesh the model is sharded over (`wrap_model`)

    def device_mesh(self) -> DeviceMesh:
        """The mesh the plan's `sharding` names: "hybrid" (nodes x the LOCAL_WORLD_SIZE ranks of each) or "full"."""
        world, device_type = self.dist.world_size, self.dist.device.type
        if self.plan.sharding == "hybrid":
            local = local_world_size(world)
            nodes = world // local
            logger.info("FSDP mesh: hybrid, %d nodes (replicate) x %d ranks (shard)", nodes, local)
            return hybrid_mesh(device_type, nodes, local, self.dist.timeout)
        logger.info("FSDP mesh: full sharding over %d ranks", world)
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))

    def wrap_model(self) -> torch.nn.Module:
        mesh = self.mesh = self.device_mesh()
        policy = mixed_precision_policy(self.mixed_precision, self.vla.reduce_in_full_precision)
        if self.mixed_precision:
            cast_frozen_params_to_bf16(self.vlm)
        full_state = full_state_on_rank0(self.vlm)  # rank 0's weights, before sharding splits them
        offload = self.vla.speed.cpu_offload
        # The action head's blocks first, as the LLM's layers: the root (`apply_fsdp`) must be sharded last.
        units = shard_head_blocks(
            head_module(self.vlm),
            mesh=mesh,
            mp_policy=policy,
            reshard_after_forward=self.reshard_after_forward,
            offload_policy=offload_policy(offload, mesh.device_type),
        )
        if units:
            logger.info("FSDP2: %d action-head blocks as units of their own", units)
        model = apply_fsdp(
            self.vlm, mesh, policy, reshard_after_forward=self.reshard_after_forward, cpu_offload=offload
        )
        if not offload:
            materialize_from_rank0(model, full_state, self.dist.device)
            return model
        # Several ranks receive rank 0's values over the device's backend (NCCL takes no host tensors), so their
        # shards (1/world of the model each) pass through the GPU once; a single process keeps them on the host.
        materialize_from_rank0(
            model, full_state, self.dist.device if self.dist.world_size > 1 else torch.device("cpu")
        )
        place_for_cpu_offload(model, self.dist.device)
        logger.info("CPU offload: sharded parameters, gradients and optimizer state in host memory")
        return model

    def clip_grad_norm(self) -> torch.Tensor:
        """As the base class; under CPU offload the gradients are on the host (`clip_host_grad_norm_`)."""
        if not self.vla.speed.cpu_offload:
            return super().clip_grad_norm()
        return clip_host_grad_norm_(self.trainable_params, self.vla.max_grad_norm, self.dist.device)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def defer_cross_node_reduce(self) -> Iterator[None]:
        """Hybrid sharding, gradients reduced every micro-batch: reduce-scatter within the node now, but all-reduce
        across nodes only on the last micro-batch (FSDP2 adds the deferred partial sums into it), one slow-link
        all-reduce per step instead of one per micro-batch. The partial sums wait on the device (a shard in the
        reduce dtype), so under `--vla.speed.cpu_offload`, whose point is device memory, every micro-batch
        all-reduces."""
        if self.mesh is None or self.mesh.ndim != 2 or self.vla.speed.cpu_offload:  # 2-D: replicate x shard
            yield
            return
        self.model.set_requires_all_reduce(False)
        try:
            yield
        finally:
            self.model.set_requires_all_reduce(True)


class FSDPShardGradOpStrategy(FSDPStrategy):
    reshard_after_forward = False
