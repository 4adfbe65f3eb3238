"""How the Prismatic VLM family is sharded and checkpointed: FSDP2 units, mixed precision, activation
checkpointing. The training strategies call these; they know nothing about the model's insides.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from prismatic.models.vlms.prismatic import PrismaticVLM


def bf16_supported(device: torch.device) -> bool:
    """bf16 compute works on CPU and on CUDA devices that support it."""
    return device.type == "cpu" or (device.type == "cuda" and torch.cuda.is_bf16_supported())


def mixed_precision_policy(enabled: bool, reduce_in_full_precision: bool) -> MixedPrecisionPolicy:
    """bf16 parameters/compute when enabled; gradients reduced in FP32 when `reduce_in_full_precision`.

    Sharded parameters (and so the optimizer state) always stay FP32.
    """
    if not enabled:
        return MixedPrecisionPolicy()
    reduce_dtype = torch.float32 if reduce_in_full_precision else torch.bfloat16
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)


def apply_llm_activation_checkpointing(vlm: PrismaticVLM) -> None:
    """Recompute each LLM decoder layer's activations in the backward pass (must precede `apply_fsdp`)."""
    layer_ids = {id(layer) for layer in vlm.llm_backbone.get_layers()}
    apply_activation_checkpointing(
        vlm.llm_backbone,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in layer_ids,
    )


def apply_fsdp(
    vlm: PrismaticVLM, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy, reshard_after_forward: bool
) -> PrismaticVLM:
    """FSDP2: one unit per ViT block and per LLM decoder layer, then the root (projector, embeddings, head).

    `reshard_after_forward=True` is full sharding (ZeRO-3); False keeps parameters gathered between forward and
    backward (ZeRO-2, "shard-grad-op").
    """
    kwargs = {"mesh": mesh, "mp_policy": mp_policy, "reshard_after_forward": reshard_after_forward}
    for block in vlm.vision_backbone.get_blocks():
        fully_shard(block, **kwargs)
    for layer in vlm.llm_backbone.get_layers():
        fully_shard(layer, **kwargs)
    fully_shard(vlm, **kwargs)
    return vlm
