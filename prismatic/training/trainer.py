"""The training loop, top to bottom: batch -> forward/loss -> backward (accumulating) -> clip -> step -> metrics ->
eval -> checkpoint.

Everything it calls is swappable without touching it: the strategy (FSDP2 / DDP) says how gradients are synced
and clipped, the action head computes the loss, the checkpoint manager decides when and how to save. Counters
(step, epoch, frames consumed over all ranks) live in one dict that the checkpoint reads, so a checkpoint always
holds the position the loop is at. Host syncs: one per step by design (reading the metrics' all-reduce, which also
carries the ranks' preemption votes; with `--vla.speed.overlap_steps` after the next step is queued); nothing in a step
(`train_step`) waits for the device.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from prismatic.models.action_heads import ActionHead
from prismatic.training.metrics import PendingMetrics, StepMetrics
from prismatic.training.preemption import Preempted, PreemptionHandler
from prismatic.training.profiling import StepProfiler
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.training.trackers import Tracker

logger = logging.getLogger(__name__)


class Checkpoints(Protocol):
    """What the loop asks of the checkpointer (`checkpointing.Checkpointer`): it decides when, and saves."""

    def should_save(self, step: int, is_last_step: bool) -> bool: ...

    def save(self, blocking: bool) -> Path: ...

    def poll(self) -> None: ...

    def wait(self) -> None: ...


@dataclass
class LoopHooks:
    """What the loop calls out to besides the model: trackers, evaluation, checkpoints, the signal handler and the
    profiler of a window of steps (`--profile.*`)."""

    trackers: list[Tracker]
    checkpoints: Checkpoints
    preemption: PreemptionHandler
    validate: Callable[[], dict[str, float]] | None = None
    profiler: StepProfiler | None = None


@dataclass
class LoopPlan:
    start_step: int  # the step the run is at (0, or the resumed checkpoint's)
    num_training_steps: int
    steps_per_epoch: int
    global_batch_size: int  # frames consumed per step over all ranks
    eval_interval: int | None
    show_progress: bool = True
    overlap_steps: bool = False  # read a step's metrics after queuing the next (`--vla.speed.overlap_steps`)


def train_step(
    strategy: TrainingStrategy,
    head: ActionHead,
    batches: Iterator[dict[str, Any]],
    metrics: StepMetrics,
) -> torch.Tensor:
    """One optimizer step's device work: forward and backward over the step's micro-batches (their loss and sums
    added to `metrics` on the device), clipping, the update. Returns the gradient norm, not waited for.

    Nothing here waits for the device (tests/training/test_host_syncs.py pins it), so the host queues the step's
    work ahead of the GPU. With a masked batch (`causal_mask_only` off, or left padding) transformers' padding-mask
    checks would; a batch without a mask skips transformers' mask preparation (`strategy.causal_attention`).
    """
    model, n_micro = strategy.model, strategy.grad_accumulation_steps
    # `setup` put every module in train mode and evaluation restores it: walking a 7B LoRA model's thousands of
    # modules every step costs the host time the GPU then waits for.
    if not model.training:
        model.train()
    strategy.begin_step()
    for i in range(n_micro):
        batch = strategy.to_device(next(batches))
        with (
            strategy.accumulate(is_last_micro_batch=i == n_micro - 1),
            strategy.autocast(),
            strategy.causal_attention(batch),
        ):
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

    With `plan.overlap_steps` a step's metrics are read after the next step is queued, so the device goes from
    one step to the next without waiting for the host (its logging, checks and next batch). Steps that evaluate,
    save or end the run are read at once, before anything else runs: evaluation and checkpoints see that step's
    state, and every step is logged, in order. The ranks' agreement on a signal then comes one step later, and
    the run stops (and saves) at the step after the one it would stop at otherwise.
    """
    checkpoints, validate = hooks.checkpoints, hooks.validate
    log = _StepLog(plan, hooks)
    pending: _Reading | None = None
    try:
        for step in range(plan.start_step + 1, plan.num_training_steps + 1):
            if hooks.profiler is not None:
                hooks.profiler.before_step(step)
            started = time.perf_counter()
            learning_rate = strategy.lr_scheduler.get_last_lr()[0]
            grad_norm = train_step(strategy, head, batches, metrics)
            counters.update(
                step=step,
                epoch=step // plan.steps_per_epoch,
                frames=counters["frames"] + plan.global_batch_size,
            )
            # This rank's signal votes ride on the metrics' all-reduce, which sums them over the ranks: no collective.
            reading = _Reading(
                step,
                metrics.start(grad_norm, also_sum=hooks.preemption.votes()),
                started,
                {"learning_rate": learning_rate, "epoch": counters["epoch"], "frames": counters["frames"]},
            )
            # The step before, if left pending: its work is done, or is the last before this step's.
            signum = log.write(pending) if pending is not None else 0
            pending = None
            is_last = step == plan.num_training_steps
            evaluates = validate is not None and (step % plan.eval_interval == 0 or is_last)
            saves = checkpoints.should_save(step, is_last)
            if plan.overlap_steps and not (evaluates or saves or is_last or signum):
                pending = reading
            else:  # the signal agreed on (the same on every rank), in this step's votes or the step before's
                signum = log.write(reading, validate if evaluates else None) or signum
            if signum or saves:
                checkpoints.save(bool(signum) or is_last)
            checkpoints.poll()
            if signum:
                raise Preempted(signum, step)
    except BaseException:
        if pending is not None:  # the step before the failure: its record still reaches the trackers
            log.write_quietly(pending)
        raise
    finally:
        log.close()
        if hooks.profiler is not None:
            hooks.profiler.close()
    checkpoints.wait()
    return log.last


@dataclass
class _Reading:
    """A step whose metrics are on their way to the host, with what its log record needs besides them."""

    step: int
    metrics: PendingMetrics  # its `also_sum`: the preemption votes, summed over the ranks once read
    started: float  # when the loop began queuing the step
    figures: dict[str, float]  # learning rate, epoch, frames


class _StepLog:
    """Reads a step's metrics, adds evaluation and timing, hands the record to the trackers and the progress bar."""

    def __init__(self, plan: LoopPlan, hooks: LoopHooks) -> None:
        self.plan, self.hooks = plan, hooks
        self.last: dict[str, float] = {}
        self.last_read = float("-inf")
        self.bar = tqdm(
            total=plan.num_training_steps,
            initial=plan.start_step,
            desc="train",
            disable=not plan.show_progress,
            dynamic_ncols=True,
        )

    def write(self, reading: _Reading, validate: Callable[[], dict[str, float]] | None = None) -> int:
        """Log `reading`'s step; returns the signal the ranks agreed on in its votes (0: none)."""
        last = reading.metrics.result()
        now = time.perf_counter()
        # From when the step was queued, or when the step before it was read if that came later: with overlap,
        # the interval between two steps' ends, which is the device's step time once the host runs ahead.
        step_time = now - max(self.last_read, reading.started)
        self.last_read = now
        last.update(
            reading.figures,
            step_time_s=step_time,
            samples_per_s=self.plan.global_batch_size / step_time,
        )
        if validate is not None:
            last.update(validate())
        for tracker in self.hooks.trackers:
            tracker.log(reading.step, last)
        self.bar.set_postfix(
            loss=f"{last['loss']:.4f}",
            **{k: f"{last[k]:.3f}" for k in ("action_accuracy", "l1_loss") if k in last and k != "loss"},
        )
        self.bar.update()
        self.last = last
        return self.hooks.preemption.agreed(reading.metrics.also_sum)

    def write_quietly(self, reading: _Reading) -> None:
        """`write` while another error is on its way up, if the step's work is done: a failure here must not hide
        that error, and a device that no longer finishes its work (a failed collective) must not hang the exit."""
        if not reading.metrics.ready():
            logger.warning("Step %d's metrics are not back from the device; not logged.", reading.step)
            return
        try:
            self.write(reading)
        except Exception:  # noqa: BLE001 (the error on its way up is the one to report)
            logger.warning("Could not log step %d's metrics after the failure below.", reading.step)

    def close(self) -> None:
        self.bar.close()
