"""An action head's own units: the blocks its module declares (`HeadModule.get_blocks`), checkpointed, compiled and
sharded by the strategies as the LLM's decoder layers are (`prismatic.models.parallelize`), whatever the head.

The strategies call these for every run; a head without a module (tokens) or without blocks (l1-chunk) has none, and
its parameters stay in the root FSDP unit. The order is the LLM's: checkpointing wraps a block, compiling compiles
the wrapped block's `forward` (or the wrapper, by `compile_blocks`' rule), sharding makes the wrapper a unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from prismatic.models.action_heads.base import HeadModule
from prismatic.models.parallelize import SelectiveCheckpointWrapper, compile_each_block
from prismatic.util.checkpointing_policy import checkpointing_stride


def head_module(vlm: nn.Module) -> HeadModule | None:
    """The VLM's action-head module (`action_head`), None when its head has none."""
    module = getattr(vlm, "action_head", None)
    return module if isinstance(module, HeadModule) else None


def checkpoint_head_blocks(head: HeadModule | None, policy: str) -> int:
    """Wrap `head`'s blocks for activation checkpointing as `policy` (`--vla.speed.checkpointing_policy`, resolved)
    wraps the LLM's decoder layers (`apply_llm_activation_checkpointing`): `full` every block, `selective-ops` every
    block keeping its matmul outputs, `every-N` blocks 0, N, 2N, ... Call before compiling and sharding. Returns
    the number wrapped.

    Raises:
        ValueError: `policy` is none of the resolved policies (the config refuses those first).
    """
    blocks = head.get_blocks() if head is not None else nn.ModuleList()
    every = checkpointing_stride(policy)
    if every is None:
        raise ValueError(
            f"Unknown checkpointing policy {policy!r} (`auto` is resolved by the speed plan first)."
        )
    wrap = SelectiveCheckpointWrapper if policy == "selective-ops" else checkpoint_wrapper
    chosen = range(0, len(blocks), every)
    for index in chosen:
        blocks[index] = wrap(blocks[index])
    return len(chosen)


def compile_head_blocks(head: HeadModule | None, compile_kwargs: Mapping[str, Any] | None = None) -> int:
    """`torch.compile` each of `head`'s blocks in place with `compile_kwargs`, by `compile_blocks`' rule: the wrapped
    block's `forward`, so that FSDP2's hooks and the checkpoint wrapper run outside the graph, except a
    `SelectiveCheckpointWrapper`, or any checkpoint wrapper under CUDA graphs (`reduce-overhead`), which is
    compiled whole. Call after `checkpoint_head_blocks`, before sharding. Returns the number compiled."""
    if head is None:
        return 0
    return compile_each_block(head.get_blocks(), compile_kwargs)


def shard_head_blocks(head: HeadModule | None, **fully_shard_kwargs: Any) -> int:
    """FSDP2: each of `head`'s blocks its own unit, with `fully_shard_kwargs` (`mesh`, `mp_policy`,
    `reshard_after_forward`, `offload_policy`: the LLM layers' own), each of `head.block_methods` registered as a
    forward method so that it too gathers the block's shards. Call before the root is sharded, on every rank.
    Returns the number of units."""
    if head is None:
        return 0
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    blocks = head.get_blocks()
    for block in blocks:
        fully_shard(block, **fully_shard_kwargs)
        for method in head.block_methods:
            register_fsdp_forward_method(block, method)
    return len(blocks)
