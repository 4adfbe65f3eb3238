"""How the Prismatic VLM family is sharded and checkpointed: FSDP2 units, mixed precision, CPU offload, activation
checkpointing. The training strategies call these; they know nothing about the model's insides.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.checkpointing_policy import CHECKPOINTING_POLICIES, checkpointing_stride

logger = logging.getLogger(__name__)

# `selective-ops` keeps these ops' outputs: the matmuls (nn.Linear is addmm / mm, batched attention scores bmm) and
# the fused attention kernels, which hold nearly all of a layer's FLOPs. Everything else (norms, rotary, SiLU,
# residual adds, softmax) is elementwise or a reduction: cheap to recompute, and most of the activation memory.
_SELECTIVE_SAVED_OPS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.baddbmm.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    }
)


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


def offload_policy(enabled: bool, device_type: str) -> OffloadPolicy:
    """FSDP2's `CPUOffloadPolicy` when `enabled` (sharded parameters, gradients and optimizer state in host memory),
    else the no-offload default. Host memory is pinned only when the mesh has CUDA devices: pinning is what lets
    the host-device copies run asynchronously, and there is nothing to pin for without them."""
    if not enabled:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device_type == "cuda")


def place_for_cpu_offload(model: torch.nn.Module, device: str | torch.device) -> None:
    """Under CPU offload (after `apply_fsdp(..., cpu_offload=True)` and materializing): sharded parameters in host
    memory, buffers on `device`.

    FSDP2 refuses offloaded shards that are not on the host, and copies each unit's shards to `device` only while
    it computes; buffers (rotary `inv_freq`, ...) are used in place by the forward, so they must be on `device`.
    Parameters FSDP ignores (vision modules that never run) stay on the host with the shards.
    """
    model.to("cpu")  # FSDP2 re-registers the moved shards (pinned when its policy pins)
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            module._buffers[name] = buffer.to(device)


def cast_frozen_params_to_bf16(vlm: PrismaticVLM) -> int:
    """Store every frozen floating-point parameter in bf16 (OpenVLA keeps a frozen vision backbone in bf16).

    Only under bf16 mixed precision: FSDP computes with bf16 copies of every weight anyway, and DDP's autocast with
    bf16 copies of the matmul weights (its norms now see bf16 weights too, as in OpenVLA's LoRA fine-tuning, which
    loads the whole model in bf16); their memory halves. FSDP2 accepts mixed dtypes inside one unit as long as its
    *trainable* parameters share one dtype (they stay FP32: master weights and optimizer state). Buffers stay as
    they are. Sharded checkpoints store them as they are (bf16); `load_checkpoint_file` returns FP32. Returns the
    number cast.
    """
    cast = 0
    for param in vlm.parameters():
        if not param.requires_grad and param.is_floating_point() and param.dtype != torch.bfloat16:
            param.data = param.data.to(torch.bfloat16)
            cast += 1
    return cast


def param_bytes_by_dtype(model: torch.nn.Module) -> dict[str, dict[str, int]]:
    """Parameter memory per dtype: {"float32": {"total": bytes, "trainable": bytes, "local": bytes}, ...}.

    `total` counts full (logical) parameters; `local` what this rank holds (its FSDP shards, or everything).
    """
    out: dict[str, dict[str, int]] = {}
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        entry = out.setdefault(
            str(param.dtype).removeprefix("torch."), {"total": 0, "trainable": 0, "local": 0}
        )
        size = param.numel() * param.element_size()
        entry["total"] += size
        entry["trainable"] += size if param.requires_grad else 0
        entry["local"] += local.numel() * local.element_size()
    return out


def format_param_bytes(report: dict[str, dict[str, int]]) -> str:
    """One line: "float32 1.20 GB (1.20 GB trainable, 0.60 GB on this rank); bfloat16 ..."."""

    def gb(n: int) -> str:
        return f"{n / 1e9:.2f} GB" if n >= 1e7 else f"{n / 1e6:.2f} MB"

    return "; ".join(
        f"{dtype} {gb(v['total'])} ({gb(v['trainable'])} trainable, {gb(v['local'])} on this rank)"
        for dtype, v in sorted(report.items())
    )


def _save_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The op-level policy of `selective-ops`: keep the outputs of `_SELECTIVE_SAVED_OPS`, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in _SELECTIVE_SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class SelectiveCheckpointWrapper(CheckpointWrapper):
    """A decoder layer under `selective-ops`: torch's non-reentrant checkpoint with the op-level policy
    `_save_matmuls`. Its own class so that `compile_blocks` can tell it apart: it compiles this wrapper whole, as
    only the compiler's partitioner honours an op-level policy inside a compiled layer."""

    def __init__(self, module: torch.nn.Module) -> None:
        context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
        super().__init__(module, CheckpointImpl.NO_REENTRANT, context_fn=context_fn)


def apply_llm_activation_checkpointing(vlm: PrismaticVLM, policy: str = "full") -> int:
    """Recompute LLM decoder layers' activations in the backward pass, as `policy` (`--vla.speed.checkpointing_policy`)
    says: `full` every layer whole; `selective-ops` every layer but the outputs of its matmuls and attention
    kernels, which are kept (their FLOPs are not paid twice; the elementwise activations are not stored);
    `every-N` the whole of layers 0, N, 2N, ...; the others keep all their activations.

    Each chosen layer is replaced by a non-reentrant `CheckpointWrapper` around it, whose state-dict hooks keep the
    checkpoint keys. Call before `compile_blocks` and `apply_fsdp`. Returns the number of layers wrapped.

    Raises:
        ValueError: `policy` is none of `--vla.speed.checkpointing_policy`'s values (the config refuses those first).
    """
    every = checkpointing_stride(policy)
    if every is None:
        raise ValueError(
            f"Unknown checkpointing policy {policy!r}: valid are {', '.join(CHECKPOINTING_POLICIES[1:])} (`auto` is "
            "resolved by the strategy first)."
        )
    wrap = SelectiveCheckpointWrapper if policy == "selective-ops" else checkpoint_wrapper
    layers = vlm.llm_backbone.get_layers()
    chosen = range(0, len(layers), every)
    for index in chosen:
        layers[index] = wrap(layers[index])
    logger.info(
        "Activation checkpointing (%s): %d of %d LLM decoder layers checkpointed",
        policy,
        len(chosen),
        len(layers),
    )
    return len(chosen)


def running_blocks(vlm: PrismaticVLM) -> list[torch.nn.Module]:
    """Every ViT block whose output reaches the patch features, then every LLM decoder layer: the units compiled
    one by one (`compile_blocks`, and static decoding's `compile_scope="layers"`)."""
    unused = {id(module) for module in vlm.vision_backbone.unused_modules()}
    blocks = [block for block in vlm.vision_backbone.get_blocks() if id(block) not in unused]
    return blocks + list(vlm.llm_backbone.get_layers())


def compile_blocks(vlm: PrismaticVLM, compile_kwargs: Mapping[str, Any] | None = None) -> int:
    """`torch.compile` the `forward` of every LLM decoder layer and every ViT block that runs, in place (the modules,
    their parameters and checkpoint keys stay as they are), with `compile_kwargs` (`COMPILE_MODES`' entry of
    `--vla.speed.compile_mode`). Returns the number compiled.

    Per block, not the whole model (torchtitan's way): the blocks of a stack share one compiled graph, and a graph
    break in the glue between blocks costs nothing. Only `forward` is compiled, never the module's call: FSDP2's
    per-block hooks (all-gather, reduce-scatter, and their CUDA stream waits) and the activation-checkpointing
    wrapper run outside the graph, as without compilation. Except a `SelectiveCheckpointWrapper`: it is compiled
    with its layer, as only the compiler applies an op-level policy inside a compiled graph (outside, the policy does
    not reach into the compiled layer, whose backward then re-runs as many matmuls as under `full`, or more). Under
    CUDA graphs (`reduce-overhead`) every checkpoint wrapper is compiled with its layer: the recomputation is then
    part of the compiled backward, instead of a compiled forward run again from inside the backward pass. Call
    after activation checkpointing and before `apply_fsdp`.
    """
    return compile_each_block(running_blocks(vlm), compile_kwargs)


def compile_each_block(
    blocks: Sequence[torch.nn.Module], compile_kwargs: Mapping[str, Any] | None = None
) -> int:
    """`compile_blocks`' rule for any stack of blocks (an action head's too): each block's wrapped `forward`, or the
    whole wrapper for a `SelectiveCheckpointWrapper` or any checkpoint wrapper under `reduce-overhead`. Returns the
    number compiled."""
    kwargs = dict(compile_kwargs or {})
    graphs = kwargs.get("mode") == "reduce-overhead"
    for block in blocks:
        inner = getattr(block, "_checkpoint_wrapped_module", block)
        whole = isinstance(block, SelectiveCheckpointWrapper) or (graphs and inner is not block)
        target = block if whole else inner
        target.forward = torch.compile(target.forward, **kwargs)
    return len(blocks)


def compiler_problem(device: torch.device, compile_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """Why `torch.compile` with `compile_kwargs` cannot run on `device` in this environment, or None when it can.

    Compiles one tiny function's forward and backward and runs them (seconds, once per process), so that a broken
    toolchain (no C compiler, no Triton, a card Triton does not support, an unwritable cache directory, a C++
    wrapper that cannot build) shows at set-up, where training can go on without compiling, instead of as a
    traceback inside the first step.
    """
    try:
        x = torch.ones(4, device=device, requires_grad=True)
        torch.compile(_probe, dynamic=False, **dict(compile_kwargs or {}))(x).sum().backward()
        x.grad.cpu()
    except Exception as error:  # noqa: BLE001 - whatever fails, the compiler stack cannot be used here
        first_line = next((line for line in str(error).splitlines() if line.strip()), "")
        return f"{type(error).__name__}: {first_line.strip()}" if first_line else type(error).__name__
    return None


def _probe(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def apply_fsdp(
    vlm: PrismaticVLM,
    mesh: DeviceMesh,
    mp_policy: MixedPrecisionPolicy,
    reshard_after_forward: bool,
    cpu_offload: bool = False,
) -> PrismaticVLM:
    """FSDP2: one unit per ViT block and per LLM decoder layer, then the root (projector, embeddings, head).

    `reshard_after_forward=True` is full sharding (ZeRO-3); False keeps parameters gathered between forward and
    backward (ZeRO-2, "shard-grad-op"). `cpu_offload` gives every unit `offload_policy(True, ...)`: shards,
    gradients and optimizer state live in host memory (then call `place_for_cpu_offload` after materializing).

    Vision modules that never run (blocks after the feature layer, final norm, heads; frozen by
    `freeze_unused`) are left out of FSDP (`ignored_params`): a unit whose forward never runs is never gathered,
    and its post-backward hook then fails on micro-batches without gradient sync (accumulation). They stay in
    the module, whole on every rank (one ViT block at most), so checkpoints keep timm's and Prismatic's keys.
    """
    kwargs = {
        "mesh": mesh,
        "mp_policy": mp_policy,
        "reshard_after_forward": reshard_after_forward,
        "offload_policy": offload_policy(cpu_offload, mesh.device_type),
    }
    unused = vlm.vision_backbone.unused_modules()
    unused_ids = {id(module) for module in unused}
    for block in vlm.vision_backbone.get_blocks():
        if id(block) not in unused_ids:
            fully_shard(block, **kwargs)
    for layer in vlm.llm_backbone.get_layers():
        fully_shard(layer, **kwargs)
    fully_shard(vlm, **kwargs, ignored_params={p for module in unused for p in module.parameters()})
    return vlm
