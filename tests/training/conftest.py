"""Fixtures shared by the training tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from prismatic.conf.vla import get_vla_config
from prismatic.training.metrics import StepMetrics
from prismatic.training.model_setup import attach_action_head, build_vlm
from prismatic.training.speed_plan import plan_flags
from prismatic.training.strategies import get_train_strategy
from prismatic.training.trainer import train_step
from prismatic.util.dist import DistInfo
from prismatic.vla.datasets.synthetic import synthetic_batch


@pytest.fixture(scope="module")
def one_rank() -> Iterator[DistInfo]:
    """A gloo process group of one, in this process, removed afterwards (one test module at a time holds it)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistInfo(0, 0, 1, 1, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@pytest.fixture
def lora_ddp_steps(one_rank: DistInfo) -> Callable[..., tuple[list[float], Any]]:
    """Train the tiny preset's LoRA run as CUDA's defaults would (mask dropped, DDP), in FP32, through training's
    `train_step`: `(compile, compile_mode, steps, batched_grad_copy)` -> (each step's loss, the strategy); 2
    micro-batches of 2 frames per step, the same seeds every time."""

    def run(
        compile: str, compile_mode: str = "default", steps: int = 3, batched_grad_copy: str = "auto"
    ) -> tuple[list[float], Any]:
        torch.manual_seed(0)
        torch._dynamo.reset()
        vla = get_vla_config("tiny+mx-toy")
        vla.speed.causal_mask_only, vla.use_lora, vla.train_strategy = "on", True, "ddp"
        vla.speed.compile, vla.speed.compile_mode, vla.enable_mixed_precision_training = (
            compile,
            compile_mode,
            False,
        )
        vla.speed.batched_grad_copy = batched_grad_copy
        vla.per_device_batch_size, vla.global_batch_size = 2, 4
        vlm = build_vlm(vla, None)
        flags = plan_flags(vla, one_rank.world_size, one_rank.device)
        head = attach_action_head(
            vlm, vla, {"synthetic": {"action": {"q01": [-1.0] * 7}}}, flags.logits_at_labels
        )
        strategy = get_train_strategy(vlm, vla, one_rank)
        strategy.setup(steps)
        batches = iter([synthetic_batch(vlm, head, 2, seed=seed) for seed in range(2 * steps)])
        metrics = StepMetrics(["synthetic"], head, one_rank.device)
        return [
            metrics.reduce(train_step(strategy, head, batches, metrics))["loss"] for _ in range(steps)
        ], strategy

    return run
