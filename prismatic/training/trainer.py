"""The training loop, top to bottom: batch -> forward/loss -> backward (accumulating) -> clip -> step -> metrics ->
eval -> checkpoint.

Everything it calls is swappable without touching it: the strategy (FSDP2 / DDP) says how gradients are synced
and clipped, the action head computes the loss, the checkpoint manager decides when and how to save. Counters
(step, epoch, frames consumed over all ranks) live in one dict that the checkpoint reads, so a checkpoint always
holds the position the loop is at. Host syncs: one per step by design (the metrics' all-reduce, which also carries
the ranks' preemption votes), plus transformers' packed-sequence check in each unmasked LLM forward
(`train_step`); nothing else in a step waits for the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from prismatic.models.action_heads import ActionHead
from prismatic.training.metrics import StepMetrics
from prismatic.training.preemption import Preempted, PreemptionHandler
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.training.trackers import Tracker


class Checkpoints(Protocol):
    """What the loop asks of the checkpointer (`checkpointing.Checkpointer`): it decides when, and saves."""

    def should_save(self, step: int, is_last_step: bool) -> bool: ...

    def save(self, blocking: bool) -> Path: ...

    def poll(self) -> None: ...

    def wait(self) -> None: ...


@dataclass
class LoopHooks:
    """What the loop calls out to besides the model: trackers, evaluation, checkpoints and the signal handler."""

    trackers: list[Tracker]
    checkpoints: Checkpoints
    preemption: PreemptionHandler
    validate: Callable[[], dict[str, float]] | None = None


@dataclass
class LoopPlan:
    start_step: int  # the step the run is at (0, or the resumed checkpoint's)
    num_training_steps: int
    steps_per_epoch: int
    global_batch_size: int  # frames consumed per step over all ranks
    eval_interval: int | None
    show_progress: bool = True


def train_step(
    strategy: TrainingStrategy,
    head: ActionHead,
    batches: Iterator[dict[str, Any]],
    metrics: StepMetrics,
) -> torch.Tensor:
    """One optimizer step's device work: forward and backward over the step's micro-batches (their loss and sums
    added to `metrics` on the device), clipping, the update. Returns the gradient norm, not waited for.

    Nothing here waits for the device (tests/training/test_host_syncs.py pins it) but transformers' own mask checks
    at the start of each LLM forward (one, its packed-sequence check, where `causal_mask_only` dropped the mask), so
    the host queues the step's work ahead of the GPU.
    """
    model, n_micro = strategy.model, strategy.grad_accumulation_steps
    model.train()
    for i in range(n_micro):
        batch = strategy.to_device(next(batches))
        with strategy.accumulate(is_last_micro_batch=i == n_micro - 1), strategy.autocast():
            out = head(model, batch)
            (out.loss / n_micro).backward()
        metrics.update(out.loss, out.sums, batch["dataset_names"])
    grad_norm = strategy.clip_grad_norm()
    strategy.optimizer.step()
    strategy.lr_scheduler.step()
    strategy.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def train_loop(
    strategy: TrainingStrategy,
    head: ActionHead,
    batches: Iterator[dict[str, Any]],
    metrics: StepMetrics,
    plan: LoopPlan,
    counters: dict[str, int],
    hooks: LoopHooks,
) -> dict[str, float]:
    """Train from `plan.start_step` to `plan.num_training_steps`; returns the last step's metrics.

    `hooks.checkpoints.save(blocking)` writes a checkpoint of the current `counters`. Raises `Preempted` after
    saving when a rank received SIGTERM / SIGINT.
    """
    checkpoints, validate, preemption = hooks.checkpoints, hooks.validate, hooks.preemption
    last: dict[str, float] = {}
    bar = tqdm(
        total=plan.num_training_steps,
        initial=plan.start_step,
        desc="train",
        disable=not plan.show_progress,
        dynamic_ncols=True,
    )
    for step in range(plan.start_step + 1, plan.num_training_steps + 1):
        started = time.perf_counter()
        learning_rate = strategy.lr_scheduler.get_last_lr()[0]
        grad_norm = train_step(strategy, head, batches, metrics)

        counters.update(
            step=step,
            epoch=step // plan.steps_per_epoch,
            frames=counters["frames"] + plan.global_batch_size,
        )
        votes = preemption.votes()  # summed over the ranks by the metrics' all-reduce: no collective
        last = metrics.reduce(grad_norm, also_sum=votes)
        step_time = time.perf_counter() - started
        last.update(
            learning_rate=learning_rate,
            epoch=counters["epoch"],
            frames=counters["frames"],
            step_time_s=step_time,
            samples_per_s=plan.global_batch_size / step_time,
        )
        is_last = step == plan.num_training_steps
        if validate is not None and (step % plan.eval_interval == 0 or is_last):
            last.update(validate())
        for tracker in hooks.trackers:
            tracker.log(step, last)
        bar.set_postfix(
            loss=f"{last['loss']:.4f}",
            **{k: f"{last[k]:.3f}" for k in ("action_accuracy", "l1_loss") if k in last and k != "loss"},
        )
        bar.update()

        signum = preemption.agreed(votes)  # the same on every rank
        if signum or checkpoints.should_save(step, is_last):
            checkpoints.save(bool(signum) or is_last)
        checkpoints.poll()
        if signum:
            bar.close()
            raise Preempted(signum, step)
    bar.close()
    checkpoints.wait()
    return last
