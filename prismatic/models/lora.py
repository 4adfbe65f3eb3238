"""LoRA adapters (peft) injected into a PrismaticVLM in place, so the SAME training loop, strategies (FSDP2, DDP),
checkpointing and resume train them; and merging them back into plain weights.

`apply_lora` keeps the module tree (no `PeftModel` wrapper): `q_proj` becomes a peft `lora.Linear` holding
`base_layer` (frozen) and `lora_A` / `lora_B` (trained), so FSDP units, activation checkpointing and the three
checkpoint module keys stay as they are; checkpoints hold base weights and adapters under peft's names
(`...q_proj.base_layer.weight`, `...q_proj.lora_A.default.weight`) and resume like any other run.

Where adapters go: the freezing stage picks which modules train (vision backbone, projector, LLM); LoRA then
decides how: "all-linear" puts an adapter on every `nn.Linear` of those modules except the LM head (OpenVLA's
choice, `target_modules="all-linear"`), and everything that is not an adapter is frozen.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

ALL_LINEAR = "all-linear"
ADAPTER_NAME = "default"


@dataclass(frozen=True)
class LoraSettings:
    """LoRA hyper-parameters. `alpha` None means OpenVLA's `min(rank, 16)`."""

    rank: int = 32
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: str = (
        ALL_LINEAR  # "all-linear", or comma-separated module-name suffixes ("q_proj,v_proj")
    )

    @property
    def resolved_alpha(self) -> float:
        return float(self.alpha) if self.alpha is not None else float(min(self.rank, 16))


def _trainable_linear_names(vlm: PrismaticVLM) -> list[str]:
    """Every `nn.Linear` whose weight trains under the current stage, except the LM head."""
    lm_head = vlm.llm_backbone.llm.get_output_embeddings()
    return [
        name
        for name, module in vlm.named_modules()
        if isinstance(module, nn.Linear) and module is not lm_head and module.weight.requires_grad
    ]


def resolve_target_modules(vlm: PrismaticVLM, target_modules: str) -> list[str]:
    """Full module names to adapt: "all-linear" or suffixes, restricted to modules the stage trains.

    Raises:
        ConfigError: nothing matches.
    """
    candidates = _trainable_linear_names(vlm)
    if target_modules != ALL_LINEAR:
        suffixes = [s.strip() for s in target_modules.split(",") if s.strip()]
        candidates = [n for n in candidates if any(n == s or n.endswith(f".{s}") for s in suffixes)]
    if not candidates:
        raise ConfigError(
            f"LoRA target_modules '{target_modules}' matches no trainable nn.Linear of this VLM under the current "
            "stage. Use 'all-linear' or name Linear layers, e.g. 'q_proj,k_proj,v_proj,o_proj'."
        )
    return candidates


def apply_lora(
    vlm: PrismaticVLM, settings: LoraSettings, target_names: Sequence[str] | None = None
) -> list[str]:
    """Inject LoRA adapters in place and freeze everything else. Call after `freeze_backbones`, before wrapping.

    Args:
        vlm: the model; its current `requires_grad` flags (the stage) choose the modules when `target_names` is None.
        settings: rank, alpha, dropout, target modules.
        target_names: exact module names to adapt (used when re-creating a saved model's adapters).

    Returns:
        The adapted module names.
    """
    from peft import LoraConfig, inject_adapter_in_model  # lazy: peft takes ~2 s to import; LoRA runs only

    if settings.rank < 1 or not 0.0 <= settings.dropout < 1.0:
        raise ConfigError(f"LoRA rank={settings.rank} must be >= 1 and dropout={settings.dropout} in [0, 1).")
    names = (
        list(target_names)
        if target_names is not None
        else resolve_target_modules(vlm, settings.target_modules)
    )
    pattern = "^(" + "|".join(re.escape(n) for n in names) + ")$"
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.resolved_alpha,
        lora_dropout=settings.dropout,
        # Anchored full names: peft matches a string list by suffix, which would also catch same-named modules
        # in frozen parts.
        target_modules=pattern,
        init_lora_weights="gaussian",
    )
    inject_adapter_in_model(config, vlm, adapter_name=ADAPTER_NAME)
    for name, param in vlm.named_parameters():
        param.requires_grad_(".lora_" in name)
    vlm.vision_backbone_requires_grad = any(p.requires_grad for p in vlm.vision_backbone.parameters())
    vlm.trainable_module_keys = [
        key for key in vlm.all_module_keys if any(p.requires_grad for p in getattr(vlm, key).parameters())
    ]
    vlm.lora_settings = settings
    trainable = sum(p.numel() for p in vlm.parameters() if p.requires_grad)
    total = sum(p.numel() for p in vlm.parameters())
    logger.info(
        "LoRA rank %d, alpha %g on %d modules: %s of %s parameters train (%.2f%%)",
        settings.rank,
        settings.resolved_alpha,
        len(names),
        f"{trainable:,}",
        f"{total:,}",
        100 * trainable / max(total, 1),
    )
    return names


def has_lora(module: nn.Module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: peft takes ~2 s to import; LoRA runs only

    return any(isinstance(m, BaseTunerLayer) for m in module.modules())


def keep_lora_input_dtype(module: nn.Module) -> int:
    """Stop every LoRA layer in `module` from casting its input to its adapters' dtype; returns how many.

    For training under bf16 autocast with FP32 adapters (DDP): peft casts each bf16 activation to FP32 before the
    adapter, and autocast casts it straight back to bf16 for the matmul, so the values are the same (a bf16 value
    is exact in FP32) and the casts only copy the activation twice per adapted layer and pass. Only where every
    forward runs under autocast: outside it, a bf16 input would meet FP32 weights.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: peft takes ~2 s to import; LoRA runs only

    layers = [m for m in module.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.cast_input_dtype_enabled = False
    return len(layers)


def merge_lora(vlm: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight (W += B A * alpha / r) and put the plain layer back, in place.

    The result has the original module tree and state-dict keys, loadable by a model built without LoRA.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer  # lazy: peft takes ~2 s to import; LoRA runs only

    targets = [(name, m) for name, m in vlm.named_modules() if isinstance(m, BaseTunerLayer)]
    for name, layer in targets:
        with torch.no_grad():
            layer.merge(safe_merge=True)
        parent_name, _, child = name.rpartition(".")
        parent = vlm.get_submodule(parent_name) if parent_name else vlm
        setattr(parent, child, layer.get_base_layer())
    if hasattr(vlm, "lora_settings"):
        del vlm.lora_settings
    logger.info("Merged %d LoRA adapters into their base weights", len(targets))
    return vlm


def lora_targets_in_state_dict(state: Mapping[str, torch.Tensor]) -> tuple[list[str], int]:
    """(adapted module names, rank) from a LoRA checkpoint's flat keys; ([], 0) for a plain checkpoint."""
    suffix = f".lora_A.{ADAPTER_NAME}.weight"
    names = [k.removesuffix(suffix) for k in state if k.endswith(suffix)]
    if not names:
        return [], 0
    return names, int(state[names[0] + suffix].shape[0])
