"""Training's model set-up: the base VLM as the experiment trains it, then the action side the data decides.

`build_vlm` loads (rank 0) or builds on the meta device (other ranks: they receive their shards when the strategy
wraps the model, so host memory at 7B holds one full copy per node, not one per rank), freezes the backbones the
stage keeps fixed and adds LoRA adapters. `attach_action_head` reads the action and proprio widths from the
mixture's statistics, attaches the head's modules and returns the head (layout, loss, decoding).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prismatic.conf.vla import VLAConfig
from prismatic.models.action_heads import ActionHead, ActionSpec, build_action_head
from prismatic.models.distributed_init import load_on_rank0
from prismatic.models.lora import apply_lora
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer


def build_vlm(vla: VLAConfig, hf_token: str | None) -> PrismaticVLM:
    """The experiment's base VLM (`vla.base_vlm`: a registry id, a run folder, an HF folder or a Hub id), frozen
    by `vla.stage`, with LoRA adapters on the modules the stage trains when `vla.use_lora`."""
    vlm = load_on_rank0(vla.base_vlm, hf_token=hf_token)
    vlm.freeze_backbones(vla.stage)
    if vla.use_lora:  # the same loop and strategies train the adapters
        apply_lora(vlm, vla.lora_settings())
    return vlm


def action_spec(vla: VLAConfig, statistics: Mapping[str, Any]) -> ActionSpec:
    """The model's `ActionSpec`: the head, its options and the chunk from the flags, the action and proprio widths
    from the data.

    Raises:
        ConfigError: the mixture's datasets have actions (or proprio) of different widths.
    """

    def width(key: str) -> int:
        widths = {name: len(stats[key]["q01"]) for name, stats in statistics.items() if key in stats}
        if len(set(widths.values())) != 1:
            raise ConfigError(
                f"The datasets of mixture '{vla.data_mix}' have {key} vectors of different widths ({widths}); "
                "one model predicts one width: train them separately."
            )
        return next(iter(widths.values()))

    return ActionSpec(
        head=vla.action_head,
        chunk_size=vla.chunk_size,
        action_dim=width("action"),
        proprio_dim=width("proprio") if vla.use_proprio else 0,
        num_images=vla.num_images,
        head_options=vla.head_options(),
    )


def attach_action_head(
    vlm: PrismaticVLM, vla: VLAConfig, statistics: Mapping[str, Any], logits_at_labels: bool = False
) -> ActionHead:
    """Attach the action side `action_spec` decides to `vlm` (its read-out and proprio modules) and return the
    head that lays out, scores and decodes its actions; `logits_at_labels` is the speed plan's (the tokens head then
    runs the LM head at the labelled positions only)."""
    spec = action_spec(vla, statistics)
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)
    head.logits_at_labels = logits_at_labels
    return head
