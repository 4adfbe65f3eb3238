"""What `--vla.checkpointing_policy auto` recomputes: `selective-ops` for a LoRA run on CUDA where the activations it
keeps fit the GPU, `full` everywhere else.

`selective-ops` keeps the output of every matmul and attention kernel of each decoder layer from the forward to the
backward (`parallelize._SELECTIVE_SAVED_OPS`), where `full` keeps each layer's input alone and runs the layer's
forward again. On one H100 (docs/performance.md) the 7B LoRA step (r32, batch 16) was 1.26-1.34x faster with it
in every comparison made: under FSDP2 543.7 against 687.1 ms (one process), under DDP 408.5 against 548.8 ms (two
processes), replayed from CUDA graphs 325-339 against 428.7 ms (two leases); its peak rose by 24 GB, to 50.5
against 26.6 GB allocated under DDP. A full fine-tune has not been timed with it, and keeps `full`.

Whether it fits is decided before anything is on the GPU, from the model's structure
(`selective_saved_bytes`): per token, every `nn.Linear` output of each decoder layer (a LoRA layer runs three
matmuls: base, A and B) and the attention output, in the compute dtype. For the 7B LoRA structure that is 5.72 MB
per token in bf16: 26.5 GB for the H100 run's 16 x ~290 tokens, 11 % above the 23.9 GB its peak rose by. A run
counts `tokens_per_sample` (its prompt allowance makes that 327 for the 7B preset's single view: 29.9 GB at batch
16) on top of DDP's expected peak (two replicas, 33.6 GB for 7B LoRA r32, where 26.6 GB was measured): 63.5 GB,
within an 80 GB card's free memory; at batch 24 the 78.5 GB expected still fits one, at batch 32 it does not.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from prismatic.conf.vla import VLAConfig
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.strategies import AUTO
from prismatic.util.dist import first_over_ranks

logger = logging.getLogger(__name__)

# Text positions a sample may take beyond its patches and action positions: BOS, OpenVLA's prompt around the
# instruction, EOS. Open X-Embodiment instructions take 5-30 tokens (the H100 measurements: ~28 with the prompt).
PROMPT_TOKENS = 64


def tokens_per_sample(vlm: PrismaticVLM) -> int:
    """The LLM positions one training sample is expected to take: the prefix (every view's patches, the proprio
    token), the head's action positions, and `PROMPT_TOKENS` of text."""
    spec = vlm.action_spec
    return vlm.num_prefix_tokens + spec.chunk_size * spec.action_dim + PROMPT_TOKENS


def selective_saved_bytes(vlm: PrismaticVLM, tokens: int, element_size: int) -> int:
    """Bytes `selective-ops` keeps from a forward of `tokens` positions (batch x length) to its backward: per LLM
    decoder layer and token, the output of every `nn.Linear` in it and the attention output, `element_size` bytes
    each (the compute dtype), and the attention kernel's FP32 log-sum-exp per head."""
    config = vlm.llm_backbone.llm.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    per_token = 0
    for layer in vlm.llm_backbone.get_layers():
        outputs = sum(
            module.out_features for module in layer.modules() if isinstance(module, torch.nn.Linear)
        )
        per_token += (outputs + heads * head_dim) * element_size + heads * torch.float32.itemsize
    return tokens * per_token


def _bytes_on(module: torch.nn.Module, device: torch.device) -> int:
    """Bytes of `module`'s parameters and buffers already on `device` (a model built there): memory the run has,
    which the estimate counts again in the form training holds it."""
    tensors = [*module.parameters(), *module.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors if t.device == device)


def choose_checkpointing_policy(vla: VLAConfig, vlm: PrismaticVLM, device: Any, mixed_precision: bool) -> str:
    """The policy a run recomputes by: `vla.checkpointing_policy`, or for `auto` `selective-ops` where the run is a
    LoRA run on CUDA and, on every rank, DDP's expected peak (`DDP_PEAK_REPLICAS` replicas: an overestimate under
    FSDP2, which shards) plus what `selective-ops` keeps for `per_device_batch_size` samples of `tokens_per_sample`
    fits the memory there is for it on the GPU (free, cached by this process and unused, or held by the model
    already); `full` otherwise, and on CPU.
    Collective on CUDA for a LoRA run (the ranks agree): call it on every rank."""
    # lazy: the DDP strategy's module imports the strategies' base, which calls this
    from prismatic.training.strategies import ddp

    if vla.checkpointing_policy != AUTO:
        return vla.checkpointing_policy
    device = torch.device(device)
    if device.type != "cuda" or not vla.use_lora or not vla.enable_gradient_checkpointing:
        return "full"
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    frozen = torch.bfloat16 if mixed_precision else None  # as DDP stores frozen weights, and computes
    tokens = vla.per_device_batch_size * tokens_per_sample(vlm)
    kept = selective_saved_bytes(vlm, tokens, (frozen or torch.float32).itemsize)
    need = ddp.DDP_PEAK_REPLICAS * ddp.replica_bytes(vlm, frozen) + kept
    # Free on the device, cached by this process's allocator but unused, and what the model already holds there.
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    available = torch.cuda.mem_get_info(device)[0] + cached + _bytes_on(vlm, device)
    short = None
    if need > available:
        short = f"{need / 1e9:.1f} GB expected, {available / 1e9:.1f} GB free on {device}"
    found = first_over_ranks(short)
    policy = "full" if found is not None else "selective-ops"
    logger.info(
        "--vla.checkpointing_policy auto: %s (selective-ops keeps %.1f GB of activations for %d tokens per rank; "
        "%s).",
        policy,
        kept / 1e9,
        tokens,
        f"on rank {found[0]}, {found[1]}" if found is not None else f"{need / 1e9:.1f} GB expected, fits",
    )
    return policy
