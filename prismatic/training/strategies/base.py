"""`TrainingStrategy`: the unit you swap (FSDP2 full-shard, FSDP2 shard-grad-op, DDP).

A strategy wraps the model for its kind of data parallelism and provides the hooks the loop
(`prismatic/training/trainer.py`) calls: the context for accumulation micro-batches, autocast, gradient clipping,
moving a batch to the device. It builds the optimizer and LR schedule. It never computes a loss.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from typing import Any

import torch

from prismatic.conf.vla import VLAConfig
from prismatic.models.parallelize import (
    apply_llm_activation_checkpointing,
    bf16_supported,
    format_param_bytes,
    param_bytes_by_dtype,
)
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.optim import build_lr_scheduler, build_optimizer
from prismatic.util.dist import DistInfo

logger = logging.getLogger(__name__)


class TrainingStrategy(ABC):
    def __init__(
        self,
        vlm: PrismaticVLM,
        vla: VLAConfig,
        dist_info: DistInfo,
        *,
        grad_sync: str = "auto",
        sharding: str = "auto",
    ) -> None:
        self.vlm, self.vla, self.dist = vlm, vla, dist_info
        self.grad_sync, self.sharding = grad_sync, sharding
        self.grad_accumulation_steps = vla.grad_accumulation_steps(dist_info.world_size)
        self.mixed_precision = vla.enable_mixed_precision_training and bf16_supported(dist_info.device)
        if vla.enable_mixed_precision_training and not self.mixed_precision:
            logger.warning("bf16 is not supported on %s: training in FP32.", dist_info.device)
        self.model: torch.nn.Module = vlm
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.sync_every_micro_batch = False

    # --- what subclasses define ---------------------------------------------------------------------------
    @abstractmethod
    def wrap_model(self) -> torch.nn.Module:
        """Apply this strategy's data parallelism to `self.vlm` (real on rank 0, possibly on the meta device on the
        others), put every rank's values on its device (`materialize_from_rank0`) and return the model."""

    @abstractmethod
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context for accumulation micro-batches: gradients accumulate locally, no cross-rank reduction."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context around forward passes (FSDP casts through its policy instead)."""
        return contextlib.nullcontext()

    def choose_grad_sync(self) -> bool:
        """Whether to reduce gradients after every micro-batch (True) or once per step (False)."""
        return self.grad_sync == "micro-batch"

    # --- set-up ---------------------------------------------------------------------------------------------
    def setup(self, num_training_steps: int) -> None:
        """Activation checkpointing, parallel wrapping (which also fills ranks that built the model on the meta
        device from rank 0, `prismatic.models.distributed_init`), optimizer and LR schedule."""
        if self.vla.enable_gradient_checkpointing:
            apply_llm_activation_checkpointing(self.vlm)
        self.model = self.wrap_model()
        logger.info("Parameter memory: %s", format_param_bytes(param_bytes_by_dtype(self.model)))
        if self.grad_accumulation_steps > 1:
            self.sync_every_micro_batch = self.choose_grad_sync()
            logger.info(
                "Gradient accumulation over %d micro-batches: gradients reduced %s.",
                self.grad_accumulation_steps,
                "after every micro-batch (sharded gradients only)"
                if self.sync_every_micro_batch
                else "once per step (unsharded gradients kept between micro-batches)",
            )
        self.optimizer = build_optimizer(self.model, self.vla.learning_rate, self.vla.weight_decay)
        self.lr_scheduler = build_lr_scheduler(
            self.optimizer, self.vla.lr_scheduler_type, num_training_steps, self.vla.warmup_ratio
        )

    # --- hooks the loop calls -------------------------------------------------------------------------------
    def accumulate(self, is_last_micro_batch: bool) -> contextlib.AbstractContextManager:
        """Gradient sync on the step's last micro-batch (or on every one, when chosen); local accumulation else."""
        if is_last_micro_batch or self.sync_every_micro_batch:
            return contextlib.nullcontext()
        return self.no_sync()

    def clip_grad_norm(self) -> torch.Tensor:
        """Clip to `max_grad_norm`; return the global norm as a (local, device) tensor without waiting for it."""
        norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.grad is not None], max_norm=self.vla.max_grad_norm
        )
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The model's inputs on the device; host copies are non-blocking (the loader pins memory on GPU)."""
        device = self.dist.device
        out = dict(batch)
        for key in ("input_ids", "attention_mask", "labels"):
            out[key] = batch[key].to(device, non_blocking=True)
        pixels = batch["pixel_values"]
        if isinstance(pixels, dict):
            out["pixel_values"] = {k: v.to(device, non_blocking=True) for k, v in pixels.items()}
        else:
            out["pixel_values"] = pixels.to(device, non_blocking=True)
        return out
