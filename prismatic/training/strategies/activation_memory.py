"""How much memory `--vla.speed.checkpointing_policy selective-ops` needs, from the model's structure: what the speed
plan (`prismatic.training.speed_plan.choose_checkpointing_policy`) weighs when `auto` chooses between it and `full`.

`selective-ops` keeps the output of every matmul and attention kernel of each decoder layer from the forward to the
backward (`parallelize._SELECTIVE_SAVED_OPS`), where `full` keeps each layer's input alone and runs the layer's
forward again: fewer FLOPs paid twice, for more memory (docs/performance.md has the measurements).

Whether it fits is decided before anything is on the GPU, from the model's structure (`selective_saved_bytes`): per
token, every `nn.Linear` output of each decoder layer (a LoRA layer runs three matmuls: base, A and B) and the
attention output, in the compute dtype; a run counts `per_device_batch_size` samples of `tokens_per_sample` on top
of DDP's expected peak (`ddp.DDP_PEAK_REPLICAS` replicas).
"""

from __future__ import annotations

import torch

from prismatic.conf.vla import VLAConfig
from prismatic.models.vlms.prismatic import PrismaticVLM

# Text positions a sample may take beyond its patches and action positions: BOS, OpenVLA's prompt around the
# instruction, EOS (Open X-Embodiment instructions are short: well within this allowance).
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


def selective_ops_shortfall(
    vla: VLAConfig, vlm: PrismaticVLM, device: torch.device, mixed_precision: bool
) -> tuple[int, int, int, str | None]:
    """What a LoRA run on CUDA `device` needs with `selective-ops`: DDP's expected peak (`DDP_PEAK_REPLICAS`
    replicas, frozen weights as DDP stores them: an overestimate under FSDP2, which shards) plus what it keeps for
    `per_device_batch_size` samples of `tokens_per_sample`, against the memory there is for it on the GPU (free,
    cached by this process and unused, or held by the model already). Returns (bytes needed, bytes kept, tokens,
    why it does not fit or None); the decision is `speed_plan.choose_checkpointing_policy`'s."""
    # lazy: the DDP strategy's module imports the strategies' base
    from prismatic.training.strategies import ddp

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
    return need, kept, tokens, short
