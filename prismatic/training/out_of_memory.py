"""What a run says when a GPU runs out of memory: one paragraph from the rank that met it, naming where, the
strategy and batch it trained with, torch's own account of the memory, and the flags that lower the peak; not a
traceback per rank. The memory a run needs is decided by its flags (batch size, checkpointing, strategy), so this
is a `RankError`: exit code 2, like any other flag the machine cannot take.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from prismatic.conf.registries import TRAIN_STRATEGIES
from prismatic.conf.vla import VLAConfig
from prismatic.training.speed_plan import SpeedPlan
from prismatic.training.strategies import TrainingStrategy
from prismatic.util.errors import RankError


def out_of_memory_message(torch_message: str, rank: int, where: str, vla: VLAConfig, plan: SpeedPlan) -> str:
    """The paragraph for an out-of-memory error torch raised with `torch_message` on `rank`, `where` ("while
    setting up", "after step 3"), in a run with `vla` that trained as `plan` says (strategy, world size,
    checkpointing, CUDA graphs): what the run trained with and each flag that would lower its peak."""
    strategy, world, policy = plan.train_strategy, plan.world_size, plan.checkpointing_policy
    replicates = TRAIN_STRATEGIES.fact(strategy, "replicates", False)
    chosen = " (chosen by --vla.train_strategy auto)" if "train_strategy" in plan.chosen_by_auto else ""
    resolved = (
        " (chosen by --vla.speed.checkpointing_policy auto)"
        if "checkpointing_policy" in plan.chosen_by_auto
        else ""
    )
    checkpointing = (
        f"activation checkpointing {policy}{resolved}" if policy else "no activation checkpointing"
    )
    graphs = ", blocks replayed from CUDA graphs" if plan.cuda_graphs else ""
    ways = []
    if vla.per_device_batch_size > 1:
        ways.append(
            f"a smaller --vla.per_device_batch_size (gradient accumulation keeps --vla.global_batch_size "
            f"{vla.global_batch_size})"
        )
    if policy is None:
        ways.append("--vla.enable_gradient_checkpointing true")
    elif policy != "full":
        ways.append("--vla.speed.checkpointing_policy full (recomputes every layer, keeps the least)")
    if replicates and (world > 1 or not vla.use_lora):
        ways.append(
            "--vla.train_strategy fsdp-full-shard (DDP keeps a full replica of the model on every GPU; FSDP2 "
            + (
                f"shards it over the {world} GPUs)"
                if world > 1
                else "frees each layer's bf16 weights after use, so a full fine-tune peaks lower: "
                "docs/performance.md)"
            )
        )
    if TRAIN_STRATEGIES.fact(strategy, "cpu_offload", False) and not vla.speed.cpu_offload:
        ways.append(
            "--vla.speed.cpu_offload true (sharded weights, gradients and AdamW state in host memory)"
        )
    if plan.cuda_graphs:
        ways.append("--vla.speed.compile_mode default (CUDA graphs keep memory pools of their own)")
    if not ways:
        ways.append("a GPU with more memory (every flag above is already at its least)")
    return (
        f"Rank {rank} ran out of GPU memory {where}, training under {strategy}{chosen} with "
        f"--vla.per_device_batch_size {vla.per_device_batch_size}, {checkpointing}{graphs}. torch: "
        f"{torch_message.strip()} To lower the peak: {'; or '.join(ways)}."
    )


@contextmanager
def explain_out_of_memory(
    vla: VLAConfig, strategy: TrainingStrategy, where: Callable[[], str]
) -> Iterator[None]:
    """Turn a `torch.OutOfMemoryError` raised inside into a `RankError` with `out_of_memory_message` for the plan the
    strategy trains by (`where()` is read when it happens)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        plan = strategy.plan
        if not strategy.compiled:  # set-up had not compiled the blocks yet: nothing replays from CUDA graphs
            plan = dataclasses.replace(plan, compile_mode=None)
        message = out_of_memory_message(str(error), strategy.dist.rank, where(), vla, plan)
        raise RankError(message) from None
