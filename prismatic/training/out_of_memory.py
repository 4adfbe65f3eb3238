"""What a run says when a GPU runs out of memory: one paragraph from the rank that met it, naming where, the
strategy and batch it trained with, torch's own account of the memory, and the flags that lower the peak; not a
traceback per rank. The memory a run needs is decided by its flags (batch size, checkpointing, strategy), so this
is a `RankError`: exit code 2, like any other flag the machine cannot take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from prismatic.conf.vla import VLAConfig
from prismatic.training.strategies import AUTO, TRAIN_STRATEGIES, TrainingStrategy
from prismatic.util.errors import RankError


def out_of_memory_message(
    torch_message: str,
    rank: int,
    where: str,
    vla: VLAConfig,
    strategy: str,
    world: int,
    cuda_graphs: bool,
    checkpointing_policy: str | None = None,
) -> str:
    """The paragraph for an out-of-memory error torch raised with `torch_message` on `rank`, `where` ("while
    setting up", "after step 3"), in a run of `world` ranks under `strategy` (a registered name; its blocks
    replayed from CUDA graphs or not) recomputing by `checkpointing_policy` (what `--vla.checkpointing_policy`
    resolved to; None: the flag as given): what the run trained with and each flag that would lower its peak."""
    ddp = strategy == "ddp"
    chosen = " (chosen by --vla.train_strategy auto)" if vla.train_strategy == AUTO else ""
    policy = checkpointing_policy or vla.checkpointing_policy
    resolved = vla.checkpointing_policy == AUTO and policy != AUTO
    checkpointing = (
        f"activation checkpointing {policy}"
        + (" (chosen by --vla.checkpointing_policy auto)" if resolved else "")
        if vla.enable_gradient_checkpointing
        else "no activation checkpointing"
    )
    graphs = ", blocks replayed from CUDA graphs" if cuda_graphs else ""
    ways = []
    if vla.per_device_batch_size > 1:
        ways.append(
            f"a smaller --vla.per_device_batch_size (gradient accumulation keeps --vla.global_batch_size "
            f"{vla.global_batch_size})"
        )
    if not vla.enable_gradient_checkpointing:
        ways.append("--vla.enable_gradient_checkpointing true")
    elif policy not in ("full", AUTO):
        ways.append("--vla.checkpointing_policy full (recomputes every layer, keeps the least)")
    if ddp and (world > 1 or not vla.use_lora):
        ways.append(
            "--vla.train_strategy fsdp-full-shard (DDP keeps a full replica of the model on every GPU; FSDP2 "
            + (
                f"shards it over the {world} GPUs)"
                if world > 1
                else "frees each layer's bf16 weights after use: 28.5 against 36.7 GB for the ~1B full "
                "fine-tune on an H100)"
            )
        )
    if not ddp and not vla.cpu_offload:
        ways.append("--vla.cpu_offload true (sharded weights, gradients and AdamW state in host memory)")
    if cuda_graphs:
        ways.append("--vla.compile_mode default (CUDA graphs keep memory pools of their own)")
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
    """Turn a `torch.OutOfMemoryError` raised inside into a `RankError` with `out_of_memory_message` (`where()` is
    read when it happens)."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        name = TRAIN_STRATEGIES.name_of(type(strategy)) or type(strategy).__name__
        info = strategy.dist
        message = out_of_memory_message(
            str(error),
            info.rank,
            where(),
            vla,
            name,
            info.world_size,
            strategy.cuda_graphs,
            strategy.checkpointing_policy,
        )
        raise RankError(message) from None
