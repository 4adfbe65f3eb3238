"""Training set-up shared by the GPU tests: the tiny VLA as `vla_scripts/train.py` builds it, synthetic frames, the
real `train_loop`, and an independent FP32 CPU reference of the same steps.

The model comes from the tiny preset (`tiny+mx-toy`: a tiny ViT and a tiny Llama) through training's builders
(`build_vlm` -> `attach_action_head` -> `get_train_strategy(...).setup()`); frames from the project's own batch
transform and collator on random images and actions (`prismatic.vla.datasets.synthetic`), never from tf.data. The
reference is a deep copy of the same initial model, trained on the CPU in FP32 without any wrapper by a loop written
here, so each strategy's loss and gradient norm are checked against numbers its own code did not compute.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.models.action_heads import ActionHead
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head, build_vlm
from prismatic.training.optim import build_optimizer
from prismatic.training.preemption import PreemptionHandler
from prismatic.training.speed_plan import plan_flags
from prismatic.training.strategies import TrainingStrategy, get_train_strategy
from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop
from prismatic.util.dist import DistInfo
from prismatic.vla.datasets.synthetic import synthetic_batch

VLA = "tiny+mx-toy"
DATASET = "synthetic"  # the dataset name `synthetic_batch` gives every frame
ACTION_DIM, PROPRIO_DIM = 7, 8
MICRO_BATCH = 4  # frames per micro-batch; 2 micro-batches per step on one rank
# bf16 (8 bits of mantissa) against FP32. Measured on an H200 over 2 steps: losses within 1.5e-4 and gradient norms
# within 0.4% of the reference (FSDP2 and DDP); on CPU bf16 similar.
LOSS_RTOL, GRAD_NORM_RTOL = 1e-2, 2e-2


def action_statistics(action_dim: int = ACTION_DIM) -> dict[str, Any]:
    """Action statistics in OpenVLA's layout (q01 / q99 per dimension, gripper unmasked), as training writes them."""
    q01 = [-0.5 - 0.1 * d for d in range(action_dim)]
    q99 = [0.25 + 0.2 * d for d in range(action_dim)]
    proprio = {key: [0.0] * PROPRIO_DIM for key in ("mean", "std", "min", "max", "q01", "q99")}
    return {
        "action": {
            "mean": [0.0] * action_dim,
            "std": [1.0] * action_dim,
            "min": [v - 1 for v in q01],
            "max": [v + 1 for v in q99],
            "q01": q01,
            "q99": q99,
            "mask": [True] * (action_dim - 1) + [False],
        },
        "proprio": proprio,
        "num_transitions": 100,
        "num_trajectories": 5,
    }


def tiny_vla(**overrides: Any) -> VLAConfig:
    """The tiny preset with bf16 on, a constant learning rate (the first step already moves the weights) and
    2 micro-batches of `MICRO_BATCH` frames per step on one rank; `overrides` set further fields."""
    vla = get_vla_config(VLA)
    vla.enable_mixed_precision_training = True
    vla.lr_scheduler_type, vla.warmup_ratio = "constant", 0.0
    vla.per_device_batch_size, vla.global_batch_size = MICRO_BATCH, 2 * MICRO_BATCH
    for name, value in overrides.items():
        setattr(vla, name, value)
    return vla


@dataclass
class Built:
    strategy: TrainingStrategy
    head: ActionHead
    reference: PrismaticVLM  # the same initial weights, on the CPU in FP32, never wrapped


def build(vla: VLAConfig, info: DistInfo, grad_sync: str = "auto", seed: int = 0) -> Built:
    """The model, head and set-up strategy as training builds them (weights from `seed`), and the reference copy."""
    torch.manual_seed(seed)
    vlm = build_vlm(vla, None)
    flags = plan_flags(vla, info.world_size, info.device)
    head = attach_action_head(vlm, vla, {DATASET: action_statistics()}, flags.logits_at_labels)
    reference = copy.deepcopy(vlm)
    strategy = get_train_strategy(vlm, vla, info, grad_sync=grad_sync)
    strategy.setup(num_training_steps=10)
    return Built(strategy, head, reference)


def micro_batches(built: Built, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """`count` collated host batches of synthetic frames (seeds `seed`, `seed + 1`, ...), their lengths rounded up
    as training rounds them for this strategy (`pad_to_multiple`: 8 under CUDA graphs)."""
    multiple = built.strategy.pad_to_multiple
    return [
        synthetic_batch(built.reference, built.head, MICRO_BATCH, seed=seed + i, pad_to_multiple=multiple)
        for i in range(count)
    ]


class _Recorder:
    """A tracker that keeps each step's metrics."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append(dict(metrics))

    def finish(self) -> None:
        pass


class _NoCheckpoints:
    def should_save(self, step: int, is_last_step: bool) -> bool:
        return False

    def save(self, blocking: bool) -> Any:
        raise RuntimeError("no checkpoint is saved in these steps")

    def poll(self) -> None:
        pass

    def wait(self) -> None:
        pass


def train_steps(
    built: Built,
    batches: list[dict[str, Any]],
    start_step: int = 0,
    validate: Callable[[], dict[str, float]] | None = None,
) -> list[dict[str, float]]:
    """Run training's own `train_loop` over `batches` (all of them: len / micro-batches per step steps); returns
    each step's logged metrics (`loss`: the mean over micro-batches, `grad_norm`: before clipping), with
    `validate`'s after every step when given."""
    strategy = built.strategy
    n_micro = strategy.grad_accumulation_steps
    num_steps = len(batches) // n_micro
    recorder = _Recorder()
    metrics = StepMetrics([DATASET], built.head, strategy.dist.device)
    eval_interval = None if validate is None else 1
    plan = LoopPlan(
        start_step, start_step + num_steps, 10**9, MICRO_BATCH * n_micro, eval_interval, show_progress=False
    )
    counters = {"step": start_step, "epoch": 0, "frames": start_step * MICRO_BATCH * n_micro}
    with PreemptionHandler() as preemption:
        hooks = LoopHooks([recorder], _NoCheckpoints(), preemption, validate)
        train_loop(strategy, built.head, iter(batches), metrics, plan, counters, hooks)
    return recorder.steps


def reference_steps(
    built: Built,
    vla: VLAConfig,
    batches: list[dict[str, Any]],
    n_micro: int,
    held_out: list[dict[str, Any]] | None = None,
) -> list[dict]:
    """The same steps on the CPU in FP32 without a wrapper: mean micro-batch loss, the gradient norm before
    clipping (torch's `clip_grad_norm_`), then AdamW (`build_optimizer`: the same parameter groups) at the same LR.
    With `held_out` batches (each with as many supervised tokens), also `val_loss` after each step: their mean
    loss, in eval mode without gradients."""
    model, head = built.reference, built.head
    model.train()
    optimizer = build_optimizer(model, vla.learning_rate, vla.weight_decay)
    out: list[dict[str, float]] = []
    for first in range(0, len(batches), n_micro):
        losses = []
        for batch in batches[first : first + n_micro]:
            loss = head(model, batch).loss
            (loss / n_micro).backward()
            losses.append(loss.item())
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, vla.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.append({"loss": sum(losses) / len(losses), "grad_norm": norm.item()})
        if held_out:
            model.eval()
            with torch.no_grad():
                val_losses = [head(model, batch).loss.item() for batch in held_out]
            model.train()
            out[-1]["val_loss"] = sum(val_losses) / len(val_losses)
    return out


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of this rank's values (a DTensor's shard; on a group of one, the whole tensor)."""
    return (tensor.to_local() if isinstance(tensor, DTensor) else tensor).detach().clone()


def assert_matches_reference(got: list[dict[str, float]], want: list[dict[str, float]]) -> None:
    """Each step's loss and gradient norm within bf16 tolerance of the CPU reference."""
    assert len(got) == len(want) > 0
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert abs(g["loss"] - w["loss"]) <= LOSS_RTOL * abs(w["loss"]), (step, g, w)
        assert abs(g["grad_norm"] - w["grad_norm"]) <= GRAD_NORM_RTOL * w["grad_norm"], (step, g, w)
