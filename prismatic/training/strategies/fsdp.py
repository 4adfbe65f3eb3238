"""FSDP2 strategies (`fully_shard`): gloo on CPU, nccl on GPU, the same code.

`fsdp-full-shard` reshards parameters after forward (ZeRO-3); `fsdp-shard-grad-op` keeps them gathered until
backward (ZeRO-2: more memory, less communication). Mixed precision is FSDP's bf16 `MixedPrecisionPolicy` with
FP32 master weights; frozen parameters are stored in bf16 (they are computed in bf16 anyway).

Meshes: on one node a 1-D mesh over its ranks. On several nodes (`--sharding auto`/`hybrid`) a 2-D mesh
(replicate across nodes x shard within a node, the node size from torchrun's LOCAL_WORLD_SIZE): parameters are
all-gathered and gradients reduce-scattered over the fast in-node links only, and gradients are all-reduced across
nodes once per step (HSDP, OpenVLA's HYBRID_SHARD). `--sharding full` shards over every rank of every node.

`--vla.cpu_offload` (CUDA only) adds FSDP2's `CPUOffloadPolicy`: sharded parameters, gradients and AdamW state
live in (pinned) host memory, each unit's shards are copied to the GPU only while it computes, and the optimizer
steps on the CPU. Mixed precision applies as without it (bf16 all-gathers, FP32 shards); gradients are
reduce-scattered after every micro-batch (`--grad_sync auto`) so they accumulate on the host; gradient clipping
reduces one number per rank over the device's backend (`clip_host_grad_norm_`); checkpoints hold the same DTensor
shards, only their local values are on the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
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
    place_for_cpu_offload,
)
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.util.errors import ConfigError
from prismatic.util.topology import local_world_size

logger = logging.getLogger(__name__)

# Keep unsharded gradients between micro-batches only while they take at most this share of free memory.
UNSHARDED_GRAD_MEMORY_SHARE = 0.25


def check_cpu_offload(cpu_offload: bool, device: torch.device) -> None:
    """Refuse `--vla.cpu_offload` unless training runs on CUDA devices (`device`: where this rank computes)."""
    if cpu_offload and device.type != "cuda":
        raise ConfigError(
            f"--vla.cpu_offload true needs CUDA GPUs, but this run would train on '{device.type}' (no CUDA device "
            "is visible). CPU offload keeps FSDP's sharded parameters, gradients and optimizer state in host memory "
            "and copies each layer to the GPU only while it computes, so that a model too large for the GPUs' "
            "memory (a 7B VLA on 24 GB cards) still trains; without a GPU everything already lives in host memory. "
            "Run without it: drop --vla.cpu_offload (or pass --vla.cpu_offload false)."
        )


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
        check_cpu_offload(self.vla.cpu_offload, self.dist.device)
        self.mesh: DeviceMesh | None = None  # the mesh the model is sharded over (`wrap_model`)

    def device_mesh(self) -> DeviceMesh:
        world, device_type = self.dist.world_size, self.dist.device.type
        local = local_world_size(world)
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
            return hybrid_mesh(device_type, nodes, local, self.dist.timeout)
        logger.info("FSDP mesh: full sharding over %d ranks", world)
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))

    def wrap_model(self) -> torch.nn.Module:
        mesh = self.mesh = self.device_mesh()
        policy = mixed_precision_policy(self.mixed_precision, self.vla.reduce_in_full_precision)
        if self.mixed_precision:
            cast_frozen_params_to_bf16(self.vlm)
        full_state = full_state_on_rank0(self.vlm)  # rank 0's weights, before sharding splits them
        offload = self.vla.cpu_offload
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
        if not self.vla.cpu_offload:
            return super().clip_grad_norm()
        return clip_host_grad_norm_(self.trainable_params, self.vla.max_grad_norm, self.dist.device)

    def choose_grad_sync(self) -> bool:
        """`auto`: reduce-scatter after every micro-batch when the unsharded FP32 gradients kept between
        micro-batches would take more than a quarter of the free memory (GPU: free device memory; CPU: available
        host memory shared by the node's ranks), and always under CPU offload (gradients belong on the host)."""
        if self.vla.cpu_offload and self.grad_sync == "step":
            logger.warning(
                "--grad_sync step with --vla.cpu_offload: the unsharded gradients stay on the GPU between "
                "micro-batches; --grad_sync auto (or micro-batch) keeps them sharded in host memory instead."
            )
        if self.grad_sync != "auto":
            return self.grad_sync == "micro-batch"
        if self.vla.cpu_offload:
            logger.info(
                "--grad_sync auto with --vla.cpu_offload: reduce-scatter every micro-batch (gradients accumulate "
                "sharded in host memory)"
            )
            return True
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        need = trainable * 4
        if self.dist.device.type == "cuda":
            free = torch.cuda.mem_get_info(self.dist.device)[0]
        else:
            local = local_world_size(self.dist.world_size)
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

    @contextlib.contextmanager
    def defer_cross_node_reduce(self) -> Iterator[None]:
        """Hybrid sharding, gradients reduced every micro-batch: reduce-scatter within the node now, but all-reduce
        across nodes only on the last micro-batch (FSDP2 adds the deferred partial sums into it), one slow-link
        all-reduce per step instead of one per micro-batch. The partial sums wait on the device (a shard in the
        reduce dtype), so under `--vla.cpu_offload`, whose point is device memory, every micro-batch all-reduces."""
        if self.mesh is None or self.mesh.ndim != 2 or self.vla.cpu_offload:  # 2-D: replicate x shard
            yield
            return
        self.model.set_requires_all_reduce(False)
        try:
            yield
        finally:
            self.model.set_requires_all_reduce(True)


class FSDPShardGradOpStrategy(FSDPStrategy):
    reshard_after_forward = False
