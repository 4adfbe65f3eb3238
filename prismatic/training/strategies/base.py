"""`TrainingStrategy`: the unit you swap (FSDP2 full-shard, FSDP2 shard-grad-op, DDP).

A strategy wraps the model for its kind of data parallelism, builds the optimizer and LR schedule, and runs the
loop; subclasses only say how to wrap, how to skip gradient sync on accumulation micro-batches, and how to cast.
`run_training` reads top to bottom; the work of one optimiser step is `train_step`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
from tqdm import tqdm

from prismatic.conf.vla import VLAConfig
from prismatic.models.parallelize import (
    apply_llm_activation_checkpointing,
    bf16_supported,
    format_param_bytes,
    param_bytes_by_dtype,
)
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.checkpointing import Checkpointer
from prismatic.training.metrics import StepMetrics
from prismatic.training.optim import build_lr_scheduler, build_optimizer
from prismatic.training.trackers import Tracker
from prismatic.util.dist import DistInfo

logger = logging.getLogger(__name__)


class TrainingStrategy(ABC):
    def __init__(self, vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo) -> None:
        self.vlm, self.vla, self.dist = vlm, vla, dist_info
        self.grad_accumulation_steps = vla.grad_accumulation_steps(dist_info.world_size)
        self.mixed_precision = vla.enable_mixed_precision_training and bf16_supported(dist_info.device)
        if vla.enable_mixed_precision_training and not self.mixed_precision:
            logger.warning("bf16 is not supported on %s: training in FP32.", dist_info.device)
        self.model: torch.nn.Module = vlm
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None

    # --- what subclasses define ---------------------------------------------------------------------------
    @abstractmethod
    def wrap_model(self) -> torch.nn.Module:
        """Apply this strategy's data parallelism to `self.vlm` (already on its device) and return the model."""

    @abstractmethod
    def no_sync(self) -> contextlib.AbstractContextManager:
        """Context for accumulation micro-batches: gradients accumulate locally, no cross-rank reduction."""

    def autocast(self) -> contextlib.AbstractContextManager:
        """Context around forward passes (FSDP casts through its policy instead)."""
        return contextlib.nullcontext()

    # --- set-up ---------------------------------------------------------------------------------------------
    def run_setup(self, num_training_steps: int) -> None:
        """Activation checkpointing, parallel wrapping, optimizer and LR schedule."""
        if self.vla.enable_gradient_checkpointing:
            apply_llm_activation_checkpointing(self.vlm)
        self.vlm.to(self.dist.device)
        self.model = self.wrap_model()
        logger.info("Parameter memory: %s", format_param_bytes(param_bytes_by_dtype(self.model)))
        self.optimizer = build_optimizer(self.model, self.vla.learning_rate, self.vla.weight_decay)
        self.lr_scheduler = build_lr_scheduler(
            self.optimizer, self.vla.lr_scheduler_type, num_training_steps, self.vla.warmup_ratio
        )

    # --- one optimiser step ---------------------------------------------------------------------------------
    def train_step(self, micro_batches: list[dict[str, Any]], metrics: StepMetrics) -> dict[str, float]:
        """Forward/backward over the micro-batches, clip, step optimizer and schedule; return global metrics.

        Gradient accumulation: only the last micro-batch synchronises gradients across ranks, and each loss is
        divided by the number of micro-batches so the update equals one over the concatenated batch (up to the
        per-micro-batch token normalisation of the HF loss, as in OpenVLA).
        """
        if self.optimizer is None or self.lr_scheduler is None:
            raise RuntimeError("TrainingStrategy.run_setup() must run before train_step().")
        self.model.train()
        lr = self.lr_scheduler.get_last_lr()[0]
        for i, batch in enumerate(micro_batches):
            is_last = i == len(micro_batches) - 1
            sync = contextlib.nullcontext() if is_last else self.no_sync()
            with sync, self.autocast():
                output = self.model(
                    input_ids=batch["input_ids"].to(self.dist.device),
                    attention_mask=batch["attention_mask"].to(self.dist.device),
                    pixel_values=_to_device(batch["pixel_values"], self.dist.device),
                    labels=batch["labels"].to(self.dist.device),
                )
                (output.loss / len(micro_batches)).backward()
            metrics.update(
                output.loss.detach(),
                output.logits.detach(),
                batch["labels"],
                self.vlm.num_patches,
                batch["dataset_names"],
            )
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.grad is not None], max_norm=self.vla.max_grad_norm
        )
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        step_metrics = metrics.reduce()
        step_metrics["grad_norm"] = float(
            grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
        )
        step_metrics["learning_rate"] = lr
        return step_metrics

    # --- the loop -------------------------------------------------------------------------------------------
    def run_training(
        self,
        batches: Iterator[dict[str, Any]],
        metrics: StepMetrics,
        checkpointer: Checkpointer,
        trackers: list[Tracker],
        *,
        start_step: int,
        num_training_steps: int,
        steps_per_epoch: int,
        train_state: dict[str, Any],
    ) -> dict[str, float]:
        """Train from `start_step` to `num_training_steps`, logging every step and checkpointing on cadence."""
        samples_per_step = self.vla.global_batch_size
        last: dict[str, float] = {}
        with tqdm(
            total=num_training_steps,
            initial=start_step,
            desc="train",
            disable=not self.dist.is_main,
            dynamic_ncols=True,
        ) as bar:
            for step in range(start_step + 1, num_training_steps + 1):
                start = time.perf_counter()
                micro_batches = [next(batches) for _ in range(self.grad_accumulation_steps)]
                last = self.train_step(micro_batches, metrics)
                step_time = time.perf_counter() - start
                epoch = step // steps_per_epoch
                last.update(epoch=epoch, step_time_s=step_time, samples_per_s=samples_per_step / step_time)
                for tracker in trackers:
                    tracker.log(step, last)
                bar.set_postfix(
                    loss=f"{last['loss']:.4f}",
                    acc=f"{last['action_accuracy']:.3f}",
                    sps=f"{last['samples_per_s']:.1f}",
                )
                bar.update()
                if checkpointer.should_save(step, is_last_step=step == num_training_steps):
                    state = {
                        **train_state,
                        "step": step,
                        "epoch": epoch,
                        "samples_per_rank": step
                        * self.grad_accumulation_steps
                        * self.vla.per_device_batch_size,
                        "world_size": self.dist.world_size,
                    }
                    checkpointer.save(self.model, self.optimizer, self.lr_scheduler, state, last["loss"])
        return last


def _to_device(pixel_values: torch.Tensor | dict[str, torch.Tensor], device: torch.device):
    if isinstance(pixel_values, dict):
        return {k: v.to(device) for k, v in pixel_values.items()}
    return pixel_values.to(device)
