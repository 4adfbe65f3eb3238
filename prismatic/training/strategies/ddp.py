"""DDP strategy: every rank holds the whole model; gradients are all-reduced; bf16 through autocast.

Under bf16 mixed precision the frozen parameters are stored in bf16, as OpenVLA's LoRA fine-tuning loads its
whole model and as the FSDP strategies store them: autocast computes matmuls with bf16 copies of them anyway,
and FP32 frozen weights would be cast again at every use (a 7B LoRA step: the 13.5 GB of bf16 weights made
twice, forward and recompute) and take twice the memory. Trainable parameters stay FP32 (AdamW's master
weights); LoRA layers keep their bf16 input instead of casting it to FP32 for autocast to cast it back
(`keep_lora_input_dtype`).

Every GPU keeps a full replica: the weights, plus FP32 gradients and AdamW's two FP32 moments of every trainable
parameter (a 7B full fine-tune: about 28 + 28 + 56 GB before activations). `check_replica_fits` refuses that on a
GPU with less free memory, before anything is copied to it, and names the strategy that shards it instead.
"""

from __future__ import annotations

import contextlib
import inspect
import logging

import torch
from torch.nn.parallel import DistributedDataParallel

from prismatic.models.distributed_init import materialize_from_rank0
from prismatic.models.lora import keep_lora_input_dtype
from prismatic.models.parallelize import bf16_supported, cast_frozen_params_to_bf16
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.util.dist import first_over_ranks
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

FP32_BYTES = 4
# The buffers (rotary tables) are rank 0's after `materialize_from_rank0` and training never changes them, so DDP's
# broadcast of every buffer before each forward (a walk over all modules and a collective, host time every forward)
# buys nothing; FSDP2 does not sync buffers either. torch >= 2.13 names the flag
# `forward_sync_buffers`; older releases `broadcast_buffers` (which also skips the init sync
# `materialize_from_rank0` already did).
NO_FORWARD_BUFFER_SYNC = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)
# torch >= 2.12: DDP can copy a bucket's gradients into it with one `_foreach_copy_` and one `div_` when the
# bucket is ready, instead of one kernel per parameter as each gradient arrives (`zero_grad(set_to_none=True)`
# gives every step fresh gradients, so without it each one is copied): one launch per bucket instead of per parameter.
HAS_BATCHED_GRAD_COPY = "batched_grad_copy" in inspect.signature(DistributedDataParallel).parameters


def replica_bytes(model: torch.nn.Module, frozen_dtype: torch.dtype | None = None) -> int:
    """Bytes DDP keeps on every device: all parameters in their dtype (frozen floating-point ones in `frozen_dtype`
    where given: DDP stores them in bf16 under mixed precision, `cast_frozen_params_to_bf16`), and for the trainable
    ones an FP32 gradient and AdamW's two FP32 moments (activations not included). Works on the meta device."""
    weights = trainable = 0
    for p in model.parameters():
        frozen_cast = frozen_dtype is not None and not p.requires_grad and p.is_floating_point()
        weights += p.numel() * (frozen_dtype.itemsize if frozen_cast else p.element_size())
        trainable += p.numel() if p.requires_grad else 0
    return weights + 3 * FP32_BYTES * trainable


# DDP's expected peak memory, in replicas (`replica_bytes`, frozen weights as DDP stores them), with activation
# checkpointing: measured peaks stayed below two replicas for both a full fine-tune and a LoRA run
# (docs/performance.md).
DDP_PEAK_REPLICAS = 2


def ddp_fits(model: torch.nn.Module, mixed_precision: bool, device: torch.device) -> bool:
    """Whether DDP's expected peak (`DDP_PEAK_REPLICAS` replicas, frozen weights in bf16 under `mixed_precision`)
    fits the free memory of `device` on every rank: where `--vla.train_strategy auto` may pick DDP. A ~1B full
    fine-tune or a 7B LoRA run fits an 80 GB card; a 7B full fine-tune (a 120 GB replica) fits none. False off
    CUDA (every rank alike). Collective on CUDA (the ranks must agree on the strategy): call it on every rank."""
    if device.type != "cuda":
        return False
    frozen = torch.bfloat16 if mixed_precision and bf16_supported(device) else None
    need, free = DDP_PEAK_REPLICAS * replica_bytes(model, frozen), torch.cuda.mem_get_info(device)[0]
    short = None
    if need > free:
        short = f"DDP's expected peak, {need / 1e9:.1f} GB, exceeds the {free / 1e9:.1f} GB free on {device}"
    found = first_over_ranks(short)
    if found is not None:
        rank, reason = found
        logger.info("--vla.train_strategy auto: not DDP: on rank %d, %s.", rank, reason)
    return found is None


def check_replica_fits(model: torch.nn.Module, device: torch.device) -> None:
    """Refuse DDP on a GPU whose free memory cannot hold the replica (`replica_bytes`); CPUs are not checked.

    Raises:
        ConfigError: with both figures and the strategies that fit.
    """
    if device.type != "cuda":
        return
    need, free = replica_bytes(model), torch.cuda.mem_get_info(device)[0]
    if need > free:
        raise ConfigError(
            "DDP (--vla.train_strategy ddp, or auto for LoRA on GPUs) keeps a full replica of the model "
            f"on every GPU: {need / 1e9:.1f} GB of weights, FP32 gradients and AdamW moments, but {device} has "
            f"{free / 1e9:.1f} GB free. Use "
            "--vla.train_strategy fsdp-full-shard (shards all of it over the GPUs), or train LoRA adapters "
            "(--vla.use_lora true)."
        )


class DDPStrategy(TrainingStrategy):
    @property
    def batched_grad_copy(self) -> bool:
        """Whether DDP copies gradients into its buckets a bucket at a time (the plan's `batched_grad_copy`)."""
        return self.plan.batched_grad_copy

    def wrap_model(self) -> torch.nn.Module:
        if self.mixed_precision:
            cast_frozen_params_to_bf16(self.vlm)
            keep_lora_input_dtype(self.vlm)  # every DDP forward (training, validation) runs under autocast
        check_replica_fits(self.vlm, self.dist.device)
        materialize_from_rank0(self.vlm, None, self.dist.device)
        device_ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        copies = {"batched_grad_copy": True} if self.batched_grad_copy else {}
        # Frozen backbones produce no gradients; DDP must not wait for them.
        return DistributedDataParallel(
            self.vlm, device_ids=device_ids, gradient_as_bucket_view=True, **NO_FORWARD_BUFFER_SYNC, **copies
        )

    def no_sync(self) -> contextlib.AbstractContextManager:
        return self.model.no_sync()

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.mixed_precision:
            return contextlib.nullcontext()
        return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
