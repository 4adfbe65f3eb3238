"""PrismaticVLM: vision backbone -> projector -> LLM, with projected patches inserted right after BOS.

Sequence layout fed to the LLM (L text tokens, P patches per image, N images, optional proprio token):
    [BOS] [patches of image 1 ... image N] [proprio] [text_2 ... text_L]   -> logits of length 1 + prefix + (L - 1)
Prefix positions attend (mask 1) but are never predicted (label IGNORE_INDEX); the LLM's own HF loss does the
shift-by-one. `freeze_backbones(stage)` implements OpenVLA's four VLA training stages.

`attach_action_modules` adds what an action spec needs: the head's module, if it has one
(`prismatic/models/action_heads/`, `action_head`), and a proprio projector (`proprio_projector`). With an
`action_mask`, the forward pass is OpenVLA-OFT's parallel decoding: the masked positions' embeddings are zero, they
attend to each other and to everything before them, nothing before them attends to them, and the LLM's last hidden
states go, with their masks and the head's own inputs (`actions`, `proprio`, `generator`), to the head module as one
`HeadInputs`; its `HeadModuleOutput` (predicted actions, or what its loss compares) is the output instead of logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from prismatic.models.action_heads.base import HeadInputs, HeadModuleOutput, ProprioProjector
from prismatic.models.action_heads.registry import ACTION_HEADS, ActionSpec
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


# The output of a forward with an `action_mask` (the name callers knew before heads had a module protocol).
ActionChunkOutput = HeadModuleOutput


def parallel_decoding_mask(attention_mask: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """bool `[B, 1, S, S]` (True = may attend) for a sequence whose `action_mask` positions decode in parallel.

    A query attends to every non-padding key at or before it (causal), and an action position also to every other
    action position of its row (bidirectional block); so the prompt never sees the actions.
    """
    valid = attention_mask.bool()
    positions = torch.arange(valid.shape[1], device=valid.device)
    causal = positions[None, :, None] >= positions[None, None, :]
    actions = action_mask.bool()
    block = actions[:, :, None] & actions[:, None, :]
    return ((causal | block) & valid[:, None, :])[:, None]


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
        self.action_spec = ActionSpec()

    @property
    def num_patches(self) -> int:
        return self.vision_backbone.num_patches

    @property
    def num_prefix_tokens(self) -> int:
        """Positions between BOS and the second text token: every image's patches, then the proprio token."""
        return self.action_spec.num_images * self.num_patches + (1 if self.action_spec.proprio_dim else 0)

    def attach_action_modules(self, spec: ActionSpec) -> None:
        """Give the VLM what `spec` needs: the head's read-out module (`action_head`), a proprio projector, and the
        number of camera views. New modules are built on the device of the LLM's embeddings (the meta device on
        ranks that receive their weights from rank 0). Call before `freeze_backbones` / LoRA / wrapping.

        Raises:
            ConfigError: the VLM already carries another action spec (a run folder trained with another head).
        """
        if spec == self.action_spec:
            return
        if not self.action_spec.is_default:
            raise ConfigError(
                f"This VLM was trained with action spec {self.action_spec.to_dict()} and cannot be given "
                f"{spec.to_dict()}: start from a model without an action head (a base VLM) or use the same "
                "--vla.action_head / --vla.chunk_size / --vla.use_proprio / --vla.num_images / --vla.head.* options."
            )
        device = self.llm_backbone.llm.get_input_embeddings().weight.device
        llm_dim = self.llm_backbone.embed_dim
        with torch.device(device):
            read_out = ACTION_HEADS.get_class(spec.head).build_module(spec, llm_dim)
            if read_out is not None:
                self.action_head = read_out
                self.all_module_keys.append("action_head")
            if spec.proprio_dim:
                self.proprio_projector = ProprioProjector(spec.proprio_dim, llm_dim)
                self.all_module_keys.append("proprio_projector")
        self.action_spec = spec
        self._apply_head_freezing()
        # The stage's lines (freeze_backbones) came before these modules existed: name them, and the new totals.
        for key, what in (
            ("action_head", f"action head '{spec.head}'"),
            ("proprio_projector", "proprio projector"),
        ):
            if hasattr(self, key):
                count = _count(list(getattr(self, key).parameters()))
                logger.info("  [TRAINABLE] %s: %s parameters", what, f"{count:,}")
        params = list(self.parameters())
        logger.info(
            "  %s parameters with the action side, %s trainable",
            f"{_count(params):,}",
            f"{_count([p for p in params if p.requires_grad]):,}",
        )

    def _apply_head_freezing(self) -> None:
        """Action modules always train; a head that does not read the LM head freezes it (no gradient reaches it)."""
        for key in ("action_head", "proprio_projector"):
            if hasattr(self, key):
                getattr(self, key).requires_grad_(True)
                if key not in self.trainable_module_keys:
                    self.trainable_module_keys.append(key)
        if not ACTION_HEADS.get_class(self.action_spec.head).uses_lm_head:
            self.llm_backbone.llm.get_output_embeddings().requires_grad_(False)

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
        self._apply_head_freezing()

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

    def prefix_embeddings(
        self, pixel_values: PixelValues, proprio: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`[B, num_prefix_tokens, llm_dim]`: projected patches of every camera view, then the proprio token.

        With N views, `pixel_values` hold them along the channel axis (`[B, 3N, H, W]`, per part for fused
        backbones), as the batch transform and the policy stack them; they go through the backbone as one batch.
        """
        views = self.action_spec.num_images
        if views > 1:
            split = (
                {k: torch.cat(v.chunk(views, dim=1), dim=0) for k, v in pixel_values.items()}
                if isinstance(pixel_values, dict)
                else torch.cat(pixel_values.chunk(views, dim=1), dim=0)
            )
        else:
            split = pixel_values
        # No autograd graph through a frozen vision backbone (saves its activations' memory).
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.vision_backbone_requires_grad):
            patch_features = self.vision_backbone(split)
        patches = self.projector(patch_features)
        if views > 1:
            patches = torch.cat(patches.chunk(views, dim=0), dim=1)
        dtype = self.llm_backbone.llm.get_input_embeddings().weight.dtype
        parts = [patches.to(dtype)]
        if self.action_spec.proprio_dim:
            if proprio is None:
                raise ValueError("This VLM reads proprio (use_proprio), but the batch has none.")
            weight = self.proprio_projector.fc1.weight
            parts.append(self.proprio_projector(proprio.to(weight.dtype)).to(dtype))
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        pixel_values: PixelValues,
        labels: torch.Tensor | None = None,
        proprio: torch.Tensor | None = None,
        action_mask: torch.Tensor | None = None,
        logits_positions: torch.Tensor | None = None,
        actions: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> CausalLMOutputWithPast | HeadModuleOutput:
        """Run the VLM on a batch where every example has an image.

        Args:
            input_ids: `[B, L]`, each row starting with BOS.
            attention_mask: `[B, L]` (1 = attend), or None for no padding.
            pixel_values: `[B, 3, H, W]` (`[B, 3N, H, W]` for N views), or a dict of them for fused backbones.
            labels: `[B, L]` with IGNORE_INDEX where no loss is wanted; None for no loss.
            proprio: `[B, proprio_dim]` normalised proprio (VLMs with a proprio projector only).
            action_mask: `[B, L]` bool, True at the action positions (a head may have none): parallel decoding
                through the `action_head` module (module docstring); `labels` are then ignored.
            logits_positions: `[B, K]` positions whose logits alone are computed (the tokens head's speed path).
            actions: `[B, K, D]` normalised target actions, handed to the head module (heads whose forward needs
                them in training, e.g. to noise them); with `action_mask` only.
            generator: the head module's source of randomness (same seed, same noise); with `action_mask` only.

        Returns:
            Without `action_mask`, the LLM's output: `logits` `[B, 1 + prefix + (L - 1), vocab]` and, with labels,
            the mean token loss. With it, the head module's `HeadModuleOutput` (`actions` `[B, chunk_size,
            action_dim]` for a chunk head).
        """
        text_embeddings = self.llm_backbone.embed_input_ids(input_ids)
        prefix = self.prefix_embeddings(pixel_values, proprio)
        batch_size, num_prefix = prefix.shape[:2]
        if action_mask is not None:  # empty action embeddings: the positions carry no token information
            text_embeddings = text_embeddings * (~action_mask.bool())[..., None].to(text_embeddings.dtype)

        inputs_embeds = torch.cat([text_embeddings[:, :1], prefix, text_embeddings[:, 1:]], dim=1)
        if attention_mask is not None:
            prefix_mask = attention_mask.new_ones((batch_size, num_prefix))
            attention_mask = torch.cat([attention_mask[:, :1], prefix_mask, attention_mask[:, 1:]], dim=1)
        if action_mask is not None:
            head_inputs = {"actions": actions, "proprio": proprio, "generator": generator}
            return self._parallel_decode(inputs_embeds, attention_mask, action_mask, num_prefix, head_inputs)
        if logits_positions is not None:
            logits = self.llm_backbone.logits_at(inputs_embeds, attention_mask, logits_positions)
            return CausalLMOutputWithPast(logits=logits)
        if labels is not None:
            prefix_labels = labels.new_full((batch_size, num_prefix), IGNORE_INDEX)
            labels = torch.cat([labels[:, :1], prefix_labels, labels[:, 1:]], dim=1)

        return self.llm_backbone(
            inputs_embeds=inputs_embeds, attention_mask=attention_mask, labels=labels, use_cache=False
        )

    def _parallel_decode(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor | None,
        action_mask: torch.Tensor,
        num_prefix: int,
        head_inputs: dict[str, Any],
    ) -> HeadModuleOutput:
        """Run the LLM under the parallel-decoding mask and hand its last hidden states to the head module."""
        if not hasattr(self, "action_head"):
            raise ValueError(
                f"action_mask given, but this VLM has no action head module (its head is '{self.action_spec.head}')."
            )
        batch_size, seq_len = inputs_embeds.shape[:2]
        action_mask = action_mask.bool()
        full_actions = torch.cat(
            [action_mask[:, :1], action_mask.new_zeros((batch_size, num_prefix)), action_mask[:, 1:]], dim=1
        )
        if attention_mask is None:
            attention_mask = full_actions.new_ones((batch_size, seq_len))
        mask = parallel_decoding_mask(attention_mask, full_actions)
        hidden = self.llm_backbone.last_hidden_state(inputs_embeds, mask)
        inputs = HeadInputs(
            hidden_BSE=hidden,
            mask_BS=attention_mask.bool(),
            action_mask_BS=full_actions,
            num_prefix_tokens=num_prefix,
            **head_inputs,
        )
        return self.action_head(inputs)
