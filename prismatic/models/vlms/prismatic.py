"""PrismaticVLM: vision backbone -> projector -> LLM, with projected patches inserted right after BOS.

Sequence layout fed to the LLM (L text tokens, P patches):
    [BOS] [patch_1 ... patch_P] [text_2 ... text_L]      -> logits of length 1 + P + (L - 1)
Patch positions attend (mask 1) but are never predicted (label IGNORE_INDEX); the LLM's own HF loss does the
shift-by-one. `freeze_backbones(stage)` implements OpenVLA's four VLA training stages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from prismatic.models.backbones.llm.base_llm import LLMBackbone
from prismatic.models.backbones.vision.base_vision import PixelValues, VisionBackbone
from prismatic.models.projectors import build_projector
from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError, did_you_mean

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StagePlan:
    train_vision: bool
    train_projector: bool
    llm: str  # "all" | "last-layer" (embed_tokens + last decoder layer + lm_head only)


# OpenVLA's `freeze_backbones` stages (prismatic/models/vlms/prismatic.py in openvla/openvla).
VLA_STAGES: dict[str, _StagePlan] = {
    "vla-full-train": _StagePlan(train_vision=True, train_projector=True, llm="all"),
    "vla-train": _StagePlan(train_vision=False, train_projector=True, llm="all"),
    "vla-sandwich-train": _StagePlan(train_vision=True, train_projector=True, llm="last-layer"),
    "vla-last-layer-train": _StagePlan(train_vision=False, train_projector=False, llm="last-layer"),
}


def _count(params: list[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)


class PrismaticVLM(nn.Module):
    """A VLM whose children are exactly `vision_backbone`, `projector`, `llm_backbone` (the checkpoint keys).

    Args:
        model_id: the base-VLM id it was built from (for logs and checkpoints).
        vision_backbone: patch featurizer, `[B, P, vision_dim]`.
        llm_backbone: causal LM with tokenizer and prompt format.
        arch_specifier: projector name, optionally prefixed as in Prismatic ("no-align+gelu-mlp").
    """

    def __init__(
        self, model_id: str, vision_backbone: VisionBackbone, llm_backbone: LLMBackbone, arch_specifier: str
    ) -> None:
        super().__init__()
        self.model_id = model_id
        self.arch_specifier = arch_specifier
        self.vision_backbone = vision_backbone
        self.projector = build_projector(arch_specifier, vision_backbone.embed_dim, llm_backbone.embed_dim)
        self.llm_backbone = llm_backbone

        self.all_module_keys = ["vision_backbone", "llm_backbone", "projector"]
        # Until `freeze_backbones` says otherwise, everything trains (as built).
        self.trainable_module_keys = ["vision_backbone", "projector", "llm_backbone"]
        self.vision_backbone_requires_grad = True

    @property
    def num_patches(self) -> int:
        return self.vision_backbone.num_patches

    def freeze_backbones(self, stage: str) -> None:
        """Set `requires_grad` on every parameter for one of OpenVLA's VLA stages.

        - "vla-full-train": everything trains.
        - "vla-train": vision backbone frozen; projector and LLM train.
        - "vla-sandwich-train": vision backbone and projector train; LLM frozen except its last-layer modules
          (`embed_tokens`, last decoder layer, `lm_head`).
        - "vla-last-layer-train": only the LLM's last-layer modules train.
        Vision modules that never reach the patch features (blocks after the feature layer, heads) stay frozen
        in every stage; they get no gradient anyway, and DDP would otherwise wait for one.

        Raises:
            ConfigError: unknown stage.
        """
        if stage not in VLA_STAGES:
            raise ConfigError(
                f"Unknown training stage '{stage}'.{did_you_mean(stage, VLA_STAGES)} "
                f"Valid stages: {', '.join(VLA_STAGES)}."
            )
        plan = VLA_STAGES[stage]
        self.vision_backbone.requires_grad_(plan.train_vision)
        self.vision_backbone.freeze_unused()
        self.projector.requires_grad_(plan.train_projector)
        self.llm_backbone.requires_grad_(plan.llm == "all")
        if plan.llm == "last-layer":
            for module in self.llm_backbone.last_layer_finetune_modules():
                module.requires_grad_(True)

        self.vision_backbone_requires_grad = plan.train_vision
        # The LLM trains (at least its last layer) in every VLA stage.
        trains = {
            "vision_backbone": plan.train_vision,
            "projector": plan.train_projector,
            "llm_backbone": True,
        }
        self.trainable_module_keys = [key for key, trainable in trains.items() if trainable]

        llm_state = "TRAINABLE" if plan.llm == "all" else "Frozen except last layer"
        logger.info("Stage '%s' for base VLM '%s':", stage, self.model_id)
        logger.info(
            "  [%s] vision backbone '%s'",
            "TRAINABLE" if plan.train_vision else "Frozen",
            self.vision_backbone.identifier,
        )
        logger.info(
            "  [%s] projector '%s'", "TRAINABLE" if plan.train_projector else "Frozen", self.arch_specifier
        )
        logger.info("  [%s] LLM backbone '%s'", llm_state, self.llm_backbone.identifier)
        params = list(self.parameters())
        logger.info(
            "  %s parameters, %s trainable",
            f"{_count(params):,}",
            f"{_count([p for p in params if p.requires_grad]):,}",
        )
        logger.debug(
            "Trainable parameters: %s", [name for name, p in self.named_parameters() if p.requires_grad]
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        pixel_values: PixelValues,
        labels: torch.Tensor | None = None,
    ) -> CausalLMOutputWithPast:
        """Run the VLM on a batch where every example has an image.

        Args:
            input_ids: `[B, L]`, each row starting with BOS.
            attention_mask: `[B, L]` (1 = attend), or None for no padding.
            pixel_values: `[B, 3, H, W]`, or a dict of them for fused backbones.
            labels: `[B, L]` with IGNORE_INDEX where no loss is wanted; None for no loss.

        Returns:
            The LLM's output: `logits` `[B, 1 + P + (L - 1), vocab]` and, with labels, the mean token loss.
        """
        # No autograd graph through a frozen vision backbone (saves its activations' memory).
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.vision_backbone_requires_grad):
            patch_features = self.vision_backbone(pixel_values)
        text_embeddings = self.llm_backbone.embed_input_ids(input_ids)
        patch_embeddings = self.projector(patch_features).to(text_embeddings.dtype)
        batch_size, num_patches = patch_embeddings.shape[:2]

        inputs_embeds = torch.cat([text_embeddings[:, :1], patch_embeddings, text_embeddings[:, 1:]], dim=1)
        if attention_mask is not None:
            patch_mask = attention_mask.new_ones((batch_size, num_patches))
            attention_mask = torch.cat([attention_mask[:, :1], patch_mask, attention_mask[:, 1:]], dim=1)
        if labels is not None:
            patch_labels = labels.new_full((batch_size, num_patches), IGNORE_INDEX)
            labels = torch.cat([labels[:, :1], patch_labels, labels[:, 1:]], dim=1)

        return self.llm_backbone(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, labels=labels, use_cache=False
        )
