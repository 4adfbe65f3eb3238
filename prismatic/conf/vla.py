"""VLA experiment registry: `VLAConfig` (a draccus `ChoiceRegistry`) and every named experiment, chosen with
`--vla.type <vla_id>`.

An experiment fixes the base VLM, the data mixture, which backbones train, and the optimisation recipe; how the run
goes fast and fits in memory is its nested `speed` group (`prismatic/conf/speed.py`, `--vla.speed.*`). Each
preset is data (a dict of overrides on top of a parent preset) registered once with `register_vla`, which makes
the draccus subclass and refuses duplicate ids. OpenVLA's published experiments are registered with their
published values, even though they need GPUs, real weights and Open-X data; the `tiny-*` presets run the same
code on CPU in seconds. The LIBERO presets (`openvla-7b+libero_<suite>`, `openvla-oft-7b+libero_<suite>`, and
their `tiny` counterparts) are described in docs/libero.md.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from draccus import ChoiceRegistry

from prismatic.conf.registries import AUTO, TRAIN_STRATEGIES
from prismatic.conf.speed import SpeedConfig, speed_config_class
from prismatic.models.action_heads.options import HeadOptions, chosen_options, preset_head_options
from prismatic.util.errors import ConfigError, did_you_mean

if typing.TYPE_CHECKING:
    from prismatic.models.lora import LoraSettings

LR_SCHEDULERS = ("constant", "linear-warmup+cosine-decay", "step-decay")


@dataclass
class VLAConfig(ChoiceRegistry):
    """One VLA experiment. Field defaults are OpenVLA's `siglip-224px+mx-bridge` recipe."""

    # Model and freezing
    vla_id: str = "siglip-224px+mx-bridge"  # unique id of the experiment; the `--vla.type` choice sets it
    base_vlm: str = "siglip-224px+7b"
    """Base-VLM registry id (prismatic/models/registry.py), a Prismatic run folder, an HF OpenVLA folder, or a Hub
    repo id to start from (a path is kept as text so configs stay plain YAML)."""
    freeze_vision_backbone: bool = False  # keep the vision backbone's weights fixed (OpenVLA's "icy" runs)
    freeze_llm_backbone: bool = False  # keep the LLM's weights fixed (with unfreeze_last_llm_layer: sandwich)
    unfreeze_last_llm_layer: bool = False  # train the LLM's last layer (only when the LLM is frozen)

    # Data
    data_mix: str = "bridge"  # mixture or dataset name (prismatic/vla/datasets/rlds/mixtures.py)
    shuffle_buffer_size: int = 256_000  # frames held by the frame-level shuffle buffer (per rank, >= 1)
    # The recipe's image augmentation (OpenVLA's: random crop of 90% area, colour jitter). `--image_aug true/false`
    # overrides it for one run; the run's config.yaml records the effective value as its top-level `image_aug`.
    image_aug: bool = False  # augment training images (policies trained with it center-crop at inference)

    # Action representation (prismatic/models/action_heads/). "tokens": OpenVLA's 256-bin action tokens,
    # decoded one dimension per forward. "l1-chunk": OpenVLA-OFT's recipe, a chunk of `chunk_size` continuous
    # actions predicted in one forward (parallel decoding) by an MLP on the LLM's last hidden states, L1 loss.
    # "flow": π0's recipe, a chunk sampled by a flow-matching expert attending to the LLM's hidden states.
    # "fast": π0-FAST's recipe, a chunk as a few BPE ids over its DCT coefficients, decoded token by token.
    action_head: str = "tokens"  # tokens, l1-chunk, flow or fast
    chunk_size: int = 1  # actions predicted per forward (the current one and chunk_size - 1 future ones)
    use_proprio: bool = False  # feed the normalised proprio state through a projector into the sequence
    num_images: int = 1  # camera views per frame: the primary image, then the dataset's wrist image(s)
    # Each head's own options, one group per head (prismatic/models/action_heads/options.py): only the chosen
    # head's are used (in its action spec), recorded in config.yaml and checked when a run resumes.
    head: HeadOptions = field(default_factory=HeadOptions)  # --vla.head.<head>.*, e.g. --vla.head.l1_chunk.*

    # Optimisation
    epochs: int = 1000  # passes over the data; used when max_steps is null
    max_steps: int | None = None  # optimiser steps to train for (>= 1); overrides epochs
    expected_world_size: int = 8  # training refuses to start on another number of processes
    global_batch_size: int = 256  # = per_device_batch_size * world_size * grad accumulation steps
    per_device_batch_size: int = 32  # samples per process per forward pass
    learning_rate: float = 2e-5  # peak learning rate of AdamW (> 0)
    weight_decay: float = 0.0  # AdamW's decoupled weight decay (>= 0)
    max_grad_norm: float = 1.0  # gradients are clipped to this global L2 norm (> 0)
    lr_scheduler_type: str = "constant"  # constant, linear-warmup+cosine-decay or step-decay
    warmup_ratio: float = 0.0  # fraction of steps spent warming up, in [0, 1) (warmup schedules only)
    # step-decay (OpenVLA-OFT's MultiStepLR): the peak LR for this many optimiser steps, then a tenth of it.
    num_steps_before_decay: int | None = None  # >= 1; read by step-decay only
    # auto: on CUDA GPUs, ddp for LoRA where DDP's memory fits (as OpenVLA's LoRA fine-tuning; measured faster on
    # one GPU) and for a full fine-tune on one GPU where it fits, else fsdp-full-shard (OpenVLA's choice).
    train_strategy: str = "auto"  # auto, fsdp-full-shard, fsdp-shard-grad-op or ddp

    # LoRA (peft): train low-rank adapters instead of the weights, through the same loop and strategies. The
    # freeze flags still choose which modules train; LoRA puts adapters on their linear layers (lm_head excluded)
    # and freezes the rest. Merge into plain weights with vla_scripts/merge_lora.py (export_hf.py merges too).
    use_lora: bool = False  # train LoRA adapters instead of the weights
    lora_rank: int = 32  # rank of each adapter (>= 1)
    lora_alpha: float | None = None  # adapter scale (> 0); null: min(lora_rank, 16), OpenVLA's choice
    lora_dropout: float = 0.0  # dropout on the adapters' input, in [0, 1)
    lora_target_modules: str = "all-linear"  # all-linear, or comma-separated Linear names, e.g. q_proj,v_proj

    # Memory and precision (OpenVLA's fields; the other memory means are in `speed`)
    enable_gradient_checkpointing: bool = True  # activation checkpointing of the LLM's decoder layers
    enable_mixed_precision_training: bool = True  # bf16 compute where the device supports it
    reduce_in_full_precision: bool = True  # reduce gradients in FP32 under mixed precision

    # Speed and memory means (prismatic/conf/speed.py): how the run goes fast and fits, not what it trains. Every
    # `auto` is decided in `prismatic/training/speed_plan.py`; the run folder's speed_plan.json says what it became.
    speed: SpeedConfig = field(default_factory=SpeedConfig)  # --vla.speed.*: compile, checkpointing, ...

    def __post_init__(self) -> None:
        # Ranges and names are checked on construction, so a bad flag fails while parsing, before torch loads.
        self.check_values()

    def head_options(self) -> dict[str, Any]:
        """The chosen head's options (`--vla.head.<action_head>.*`) as a dict; {} for a head without options."""
        return chosen_options(self.head, self.action_head)

    def lora_settings(self) -> LoraSettings | None:
        """The LoRA settings when `use_lora`, else None."""
        if not self.use_lora:
            return None
        from prismatic.models.lora import LoraSettings  # lazy: peft and torch stay out of the config layer

        return LoraSettings(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_target_modules)

    @property
    def stage(self) -> str:
        """The freezing stage implied by the freeze flags (OpenVLA's mapping)."""
        if not self.freeze_vision_backbone and not self.freeze_llm_backbone:
            return "vla-full-train"
        if self.freeze_vision_backbone and not self.freeze_llm_backbone:
            return "vla-train"
        if not self.unfreeze_last_llm_layer:
            raise ConfigError(
                f"vla '{self.vla_id}' freezes the LLM (freeze_llm_backbone=True) without "
                "unfreeze_last_llm_layer=True, so "
                + ("only the vision backbone and projector" if not self.freeze_vision_backbone else "nothing")
                + " would train the LLM side. Set --vla.unfreeze_last_llm_layer true (sandwich / last-layer "
                "training) or --vla.freeze_llm_backbone false."
            )
        return "vla-sandwich-train" if not self.freeze_vision_backbone else "vla-last-layer-train"

    def grad_accumulation_steps(self, world_size: int) -> int:
        """Micro-batches per optimiser step so that global = per_device * world_size * accumulation."""
        per_step = self.per_device_batch_size * world_size
        if self.global_batch_size % per_step != 0:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is not a multiple of per_device_batch_size="
                f"{self.per_device_batch_size} x world_size={world_size} (= {per_step}); choose "
                f"--vla.global_batch_size as a multiple of {per_step}."
            )
        return self.global_batch_size // per_step

    def check_values(self) -> None:
        """Check every range and name that needs no world size; raise `ConfigError` with the bad value and the
        valid range (called on construction and again by `validate`, as fields can be set afterwards)."""
        # lazy: the heads' registry is torch-free, but the config layer imports nothing of `models/` at module level
        from prismatic.models.action_heads.registry import ACTION_HEADS, is_chunked

        for name, value, choices in (
            ("lr_scheduler_type", self.lr_scheduler_type, LR_SCHEDULERS),
            ("train_strategy", self.train_strategy, (AUTO, *TRAIN_STRATEGIES)),
            ("action_head", self.action_head, ACTION_HEADS),
        ):
            if value not in choices:
                raise ConfigError(
                    f"Unknown {name} '{value}' (--vla.{name}).{did_you_mean(value, choices)} Valid choices: "
                    f"{', '.join(choices)}."
                )
        self.speed.check_values()
        for name in (
            "per_device_batch_size",
            "global_batch_size",
            "epochs",
            "expected_world_size",
            "shuffle_buffer_size",
            "lora_rank",
            "chunk_size",
            "num_images",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--vla.{name}={getattr(self, name)} is out of range: it must be an integer >= 1."
                )
        if self.num_steps_before_decay is not None and self.num_steps_before_decay < 1:
            raise ConfigError(
                f"--vla.num_steps_before_decay={self.num_steps_before_decay} is out of range: it must be an integer "
                ">= 1 (optimiser steps at the peak learning rate before step-decay divides it by 10)."
            )
        if self.lr_scheduler_type == "step-decay" and self.num_steps_before_decay is None:
            raise ConfigError(
                "--vla.lr_scheduler_type step-decay needs --vla.num_steps_before_decay: the optimiser steps at the "
                "peak learning rate before it drops to a tenth (OpenVLA-OFT's LIBERO recipe: 100000). Pass it, or "
                "choose another schedule: constant or linear-warmup+cosine-decay."
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(
                f"--vla.max_steps={self.max_steps} is out of range: it must be an integer >= 1 (or null to train "
                "for --vla.epochs)."
            )
        for name, value, valid, ok in (
            ("learning_rate", self.learning_rate, "a finite number > 0, e.g. 2e-5", 0 < self.learning_rate),
            ("max_grad_norm", self.max_grad_norm, "a finite number > 0, e.g. 1.0", 0 < self.max_grad_norm),
            ("weight_decay", self.weight_decay, "a finite number >= 0, e.g. 0.01", 0 <= self.weight_decay),
            ("warmup_ratio", self.warmup_ratio, "in [0, 1), e.g. 0.05", 0 <= self.warmup_ratio < 1),
            ("lora_dropout", self.lora_dropout, "in [0, 1), e.g. 0.05", 0 <= self.lora_dropout < 1),
        ):
            if not (ok and math.isfinite(value)):  # NaN fails every comparison, so it lands here too
                raise ConfigError(f"--vla.{name}={value} is out of range: it must be {valid}.")
        if self.lora_alpha is not None and not (0 < self.lora_alpha and math.isfinite(self.lora_alpha)):
            raise ConfigError(
                f"--vla.lora_alpha={self.lora_alpha} is out of range: it must be a finite number > 0 (or null for "
                "min(lora_rank, 16))."
            )

        if not is_chunked(self.action_head) and self.chunk_size != 1:
            chunk_heads = " or ".join(name for name in ACTION_HEADS if is_chunked(name))
            raise ConfigError(
                f"--vla.chunk_size={self.chunk_size} needs a chunk head: the '{self.action_head}' head predicts one "
                f"action per forward. Pass --vla.action_head {chunk_heads} (OpenVLA-OFT's recipe) or "
                "--vla.chunk_size 1."
            )
        offloads = self.train_strategy == AUTO or TRAIN_STRATEGIES.fact(
            self.train_strategy, "cpu_offload", False
        )
        if self.speed.cpu_offload and not offloads:
            raise ConfigError(
                f"--vla.speed.cpu_offload true needs an FSDP strategy (FSDP2's offload policy), not "
                f"--vla.train_strategy {self.train_strategy}. Valid choices with offload: {AUTO} (it picks FSDP "
                f"then), {', '.join(s for s in TRAIN_STRATEGIES if TRAIN_STRATEGIES.fact(s, 'cpu_offload', False))}."
            )

    def validate(self, world_size: int) -> None:
        """Check the config for this world size; raise `ConfigError` naming the bad value and the valid range."""
        if world_size != self.expected_world_size:
            raise ConfigError(
                f"vla '{self.vla_id}' expects expected_world_size={self.expected_world_size} processes but "
                f"this run has world_size={world_size}. Launch with `torchrun --nproc-per-node "
                f"{self.expected_world_size} ...` or pass --vla.expected_world_size {world_size} (and check "
                "the batch sizes)."
            )
        self.check_values()
        _ = self.stage
        self.grad_accumulation_steps(world_size)


_PRESETS: dict[str, dict[str, Any]] = {}


def register_vla(vla_id: str, parent: str | None = None, **overrides: Any) -> type[VLAConfig]:
    """Register experiment `vla_id` as `parent`'s values (or the `VLAConfig` defaults) plus `overrides`.

    `speed={"compile": "on", ...}` sets speed switches (`SpeedConfig` fields) over the parent's: a preset names the
    recipe, and the few speed means it needs, in one call; `head={"<head group>": {...}}` likewise sets head options. Returns the generated dataclass, which `--vla.type vla_id`
    selects. Raises on a duplicate id or an unknown field, so a typo in a preset fails at import rather than silently
    training the wrong thing.
    """
    if vla_id in _PRESETS:
        raise ValueError(f"VLA id '{vla_id}' is registered twice.")
    values = dict(_PRESETS[parent]) if parent is not None else {}
    unknown = set(overrides) - {f.name for f in dataclasses.fields(VLAConfig)}
    if unknown:
        raise ValueError(f"VLA preset '{vla_id}' sets unknown fields {sorted(unknown)}.")
    speed = overrides.pop("speed", {})
    head = overrides.pop("head", {})
    for given, group, what, example in (
        (speed, "speed", "switches", 'speed={"compile": "on"}'),
        (head, "head", "head options", 'head={"l1_chunk": {"mlp_blocks": 3}}'),
    ):
        if not isinstance(given, Mapping):
            raise ValueError(
                f"VLA preset '{vla_id}' sets {group}={given!r}: pass the {what} it changes as a mapping, e.g. "
                f"{example}."
            )
    parent_head = values.get("head", {})
    head = {g: {**parent_head.get(g, {}), **head.get(g, {})} for g in (*parent_head, *head)}
    values.update(overrides, vla_id=vla_id, speed={**values.get("speed", {}), **speed}, head=head)
    speed_class = speed_config_class(vla_id, values["speed"])
    head_class = preset_head_options(vla_id, values["head"])
    _PRESETS[vla_id] = values
    hints = typing.get_type_hints(VLAConfig)
    base_fields = {f.name: f for f in dataclasses.fields(VLAConfig)}
    fields = [
        (name, hints[name], dataclasses.field(default=value, metadata=base_fields[name].metadata))
        for name, value in values.items()
        if name not in ("speed", "head")
    ]
    # A preset's switches are its speed class's defaults (`speed_config_class`): a `--vla.speed.*` flag keeps them;
    # likewise its head options (`preset_head_options`).
    fields.append(("speed", speed_class, dataclasses.field(default_factory=speed_class)))
    fields.append(("head", head_class, dataclasses.field(default_factory=head_class)))
    class_name = "VLA_" + "".join(c if c.isalnum() else "_" for c in vla_id)
    cls = dataclasses.make_dataclass(class_name, fields, bases=(VLAConfig,))
    cls.__module__ = __name__
    cls.__doc__ = f"VLA experiment preset '{vla_id}'."
    VLAConfig.register_subclass(vla_id, cls)
    return cls


def registered_vla_ids() -> list[str]:
    return list(_PRESETS)


def get_vla_config(vla_id: str) -> VLAConfig:
    """Instantiate the preset `vla_id` (a `ConfigError` with the closest ids when it is unknown)."""
    if vla_id not in _PRESETS:
        raise ConfigError(
            f"Unknown vla id '{vla_id}'.{did_you_mean(vla_id, _PRESETS)} Valid choices: {', '.join(_PRESETS)}."
        )
    return VLAConfig.get_choice_class(vla_id)()


# === OpenVLA's published training experiments (values as released) ===
register_vla(
    "siglip-224px+mx-bridge",
    base_vlm="siglip-224px+7b",
    freeze_vision_backbone=False,
    freeze_llm_backbone=False,
    unfreeze_last_llm_layer=False,
    data_mix="bridge",
    shuffle_buffer_size=256_000,
    epochs=1000,
    max_steps=None,
    expected_world_size=8,
    global_batch_size=256,
    per_device_batch_size=32,
    learning_rate=2e-5,
    weight_decay=0.0,
    max_grad_norm=1.0,
    lr_scheduler_type="constant",
    warmup_ratio=0.0,
    train_strategy="auto",  # OpenVLA's fsdp-full-shard, except where DDP fits (speed_plan.choose_train_strategy)
)
register_vla("siglip-224px-icy+mx-bridge", "siglip-224px+mx-bridge", freeze_vision_backbone=True)
register_vla(
    "prism-dinosiglip-224px+mx-bridge", "siglip-224px+mx-bridge", base_vlm="prism-dinosiglip-224px+7b"
)
register_vla(
    "siglip-224px+mx-oxe-magic-soup",
    "siglip-224px+mx-bridge",
    data_mix="oxe_magic_soup",
    expected_world_size=64,
    global_batch_size=2048,
    per_device_batch_size=32,
)
# OpenVLA 7B: trained on the "plus" mixture with DROID for ~70% of training, then on "plus_minus" (no DROID).
register_vla(
    "prism-dinosiglip-224px+mx-oxe-magic-soup-plus",
    "siglip-224px+mx-bridge",
    base_vlm="prism-dinosiglip-224px+7b",
    data_mix="oxe_magic_soup_plus_minus",
    expected_world_size=64,
    global_batch_size=2048,
    per_device_batch_size=32,
)
# === OpenVLA's published fine-tuning experiments ===
register_vla(
    "siglip-224px+mx-tdroid_carrot_in_bowl", "siglip-224px+mx-bridge", data_mix="tdroid_carrot_in_bowl"
)
register_vla(
    "siglip-224px+mx-tdroid_pour_corn_in_pot", "siglip-224px+mx-bridge", data_mix="tdroid_pour_corn_in_pot"
)
register_vla(
    "siglip-224px-icy+mx-tdroid_carrot_in_bowl",
    "siglip-224px+mx-tdroid_carrot_in_bowl",
    freeze_vision_backbone=True,
)
register_vla(
    "siglip-224px-last_layer+mx-tdroid_carrot_in_bowl",
    "siglip-224px+mx-tdroid_carrot_in_bowl",
    freeze_vision_backbone=True,
    freeze_llm_backbone=True,
    unfreeze_last_llm_layer=True,
)
register_vla(
    "siglip-224px-sandwich+mx-tdroid_carrot_in_bowl",
    "siglip-224px+mx-tdroid_carrot_in_bowl",
    freeze_llm_backbone=True,
    unfreeze_last_llm_layer=True,
)
register_vla("siglip-224px+mx-droid_wipe", "siglip-224px+mx-bridge", data_mix="droid_wipe")

# === LIBERO fine-tuning of openvla/openvla-7b, one run per suite (docs/libero.md, "Training presets") ===
# OpenVLA: openvla/openvla `vla-scripts/finetune.py` FinetuneConfig (LoRA r32, dropout 0, lr 5e-4 constant, image
# augmentation, 100k-frame buffer, DDP, torch AdamW's default weight decay 0.01) and the LIBERO checkpoints' model
# cards (8 GPUs x 16 = 128 per step, no accumulation; 50k / 50k / 60k / 80k steps). tests/conf/test_libero_presets.py
# pins each value against its source.
_OPENVLA_LIBERO_STEPS = {"spatial": 50_000, "object": 50_000, "goal": 60_000, "10": 80_000}
# OpenVLA-OFT: moojink/openvla-oft LIBERO.md's command (8 GPUs x 8 = 64, L1 head on 8-action chunks, proprio, third-
# person + wrist image, lr 5e-4 divided by 10 after 100k steps, the 150k checkpoint evaluated; LIBERO-Goal's best
# and released checkpoint is the 50k one of the same run).
_OFT_LIBERO_STEPS = {"spatial": 150_000, "object": 150_000, "goal": 50_000, "10": 150_000}
_LIBERO_SUITES = tuple(_OPENVLA_LIBERO_STEPS)
register_vla(
    "openvla-7b+libero_spatial",
    base_vlm="openvla/openvla-7b",
    freeze_vision_backbone=False,
    freeze_llm_backbone=False,
    data_mix="libero_spatial_no_noops",
    shuffle_buffer_size=100_000,
    image_aug=True,
    action_head="tokens",
    max_steps=_OPENVLA_LIBERO_STEPS["spatial"],
    expected_world_size=8,
    global_batch_size=128,
    per_device_batch_size=16,
    learning_rate=5e-4,
    weight_decay=0.01,
    lr_scheduler_type="constant",
    warmup_ratio=0.0,
    train_strategy="ddp",
    use_lora=True,
    lora_rank=32,
    lora_alpha=None,
    lora_dropout=0.0,
    lora_target_modules="all-linear",
)
register_vla(
    "openvla-oft-7b+libero_spatial",
    "openvla-7b+libero_spatial",
    action_head="l1-chunk",
    chunk_size=8,
    use_proprio=True,
    num_images=2,
    max_steps=_OFT_LIBERO_STEPS["spatial"],
    global_batch_size=64,
    per_device_batch_size=8,
    lr_scheduler_type="step-decay",
    num_steps_before_decay=100_000,
)
for _suite in _LIBERO_SUITES[1:]:
    for _family, _steps in (("openvla-7b", _OPENVLA_LIBERO_STEPS), ("openvla-oft-7b", _OFT_LIBERO_STEPS)):
        register_vla(
            f"{_family}+libero_{_suite}",
            f"{_family}+libero_spatial",
            data_mix=f"libero_{_suite}_no_noops",
            max_steps=_steps[_suite],
        )

# === π0's flow head at 7B (`--vla.action_head flow`): the OpenVLA-OFT LIBERO runs above (their data, proprio, both
# cameras, image augmentation) trained by openpi's `pi0_libero` recipe (Physical-Intelligence/openpi,
# src/openpi/training/config.py: full fine-tuning, 30k steps, TrainConfig's batch 32; training/optimizer.py: AdamW,
# weight decay 1e-10, gradient clip 1.0, 1k warmup steps to a 2.5e-5 peak, cosine decay). The head is π0's:
# models/pi0_config.py action_horizon 50 (the chunk) and action_expert_variant gemma_300m (models/gemma.py: width
# 1024, 18 layers, MLP 4096, 8 heads), models/pi0.py sample_actions' 10 Euler steps and Beta(1.5, 1) times (the flow
# rule's own, flow/matching.py). openpi fine-tunes a pretrained expert (and keeps an EMA of the weights, which we do
# not); this one starts from scratch beside OpenVLA. Meta-World has no published π0 recipe: the LIBERO one on MT50's
# demonstrations with its one camera. tests/conf/test_flow_7b_presets.py pins each value against its source. ===
# openpi's LIBERO training for both its heads (π0 here, π0-FAST below): full fine-tuning, TrainConfig's 30k steps at
# batch 32, and its optimizer defaults.
_OPENPI_LIBERO_TRAINING: dict[str, Any] = {
    "use_lora": False,
    "train_strategy": "auto",
    "max_steps": 30_000,
    "global_batch_size": 32,
    "per_device_batch_size": 4,  # 8 GPUs x 4 = 32, no accumulation
    "learning_rate": 2.5e-5,
    "weight_decay": 1e-10,
    "max_grad_norm": 1.0,
    "lr_scheduler_type": "linear-warmup+cosine-decay",
    "warmup_ratio": 1_000 / 30_000,
    "num_steps_before_decay": None,  # OFT's step decay is not openpi's schedule
}
_PI0_LIBERO: dict[str, Any] = {
    "action_head": "flow",
    "chunk_size": 50,
    "head": {"flow": {"width": 1024, "depth": 18, "num_heads": 8, "mlp_ratio": 4.0, "num_steps": 10}},
    **_OPENPI_LIBERO_TRAINING,
}
for _suite in _LIBERO_SUITES:
    register_vla(f"openvla-flow-7b+libero_{_suite}", f"openvla-oft-7b+libero_{_suite}", **_PI0_LIBERO)
register_vla(
    "openvla-flow-7b+metaworld_mt50",
    "openvla-flow-7b+libero_spatial",
    data_mix="metaworld_mt50",
    num_images=1,
)

# === Tiny presets: the real code path on CPU (2 processes) on the toy RLDS mixture, in seconds ===
_TINY_CPU_RUN: dict[str, Any] = {
    "base_vlm": "tiny-vit+tiny-llama",
    "per_device_batch_size": 8,
    "learning_rate": 3e-3,
    # bf16 on CPU is slow and adds nothing at this size; the bf16 path is tested with an override.
    "enable_mixed_precision_training": False,
}
register_vla(
    "tiny+mx-toy",
    "siglip-224px+mx-bridge",
    **_TINY_CPU_RUN,
    data_mix="toy",
    shuffle_buffer_size=2_000,
    epochs=1,
    max_steps=300,
    expected_world_size=2,
    global_batch_size=16,
    weight_decay=0.01,
    lr_scheduler_type="linear-warmup+cosine-decay",
    warmup_ratio=0.1,
)
register_vla("tiny-dinosiglip+mx-toy", "tiny+mx-toy", base_vlm="tiny-dinosiglip+tiny-llama")
register_vla("tiny-lora+mx-toy", "tiny+mx-toy", use_lora=True, lora_rank=8, lora_alpha=16.0)
register_vla("tiny-icy+mx-toy", "tiny+mx-toy", freeze_vision_backbone=True)
# OpenVLA-OFT's recipe at toy scale: 8-action chunks from an L1 head, parallel decoding, proprio input.
register_vla("tiny-oft+mx-toy", "tiny+mx-toy", action_head="l1-chunk", chunk_size=8, use_proprio=True)
# π0's recipe at toy scale: the same 8-action chunks and proprio, sampled by a flow-matching expert the tiny LLM's
# size (width 64, 2 blocks, MLP 2x) with π0's 10 Euler steps.
_TINY_FLOW_EXPERT = {"width": 64, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "num_steps": 10}
register_vla("tiny-flow+mx-toy", "tiny-oft+mx-toy", action_head="flow", head={"flow": _TINY_FLOW_EXPERT})
# π0-FAST's recipe at toy scale: the same chunks and proprio as FAST action tokens, a vocabulary of 512 ids (the tiny
# LLM has 1024; 8 x 7 coefficients at π0-FAST's scale 10 need few merges), decoding capped near one chunk's length.
_TINY_FAST = {"vocab_size": 512, "scale": 10.0, "fit_chunks": 1_000, "max_decode_tokens": 64}
register_vla("tiny-fast+mx-toy", "tiny-oft+mx-toy", action_head="fast", head={"fast": _TINY_FAST})
register_vla("tiny-sandwich+mx-toy", "tiny+mx-toy", freeze_llm_backbone=True, unfreeze_last_llm_layer=True)
register_vla(
    "tiny-last_layer+mx-toy",
    "tiny+mx-toy",
    freeze_vision_backbone=True,
    freeze_llm_backbone=True,
    unfreeze_last_llm_layer=True,
)

# === Tiny LIBERO presets: the LIBERO recipes' structure (head, chunk, proprio, cameras, image augmentation, LoRA,
# schedule) on the tiny VLM, 1 process on CPU, trained on the LIBERO-shaped toys (`build_toy_dataset.py --libero
# true`), whose statistics key is the real suite's ===
for _suite in _LIBERO_SUITES:
    register_vla(
        f"tiny+libero_{_suite}",
        f"openvla-7b+libero_{_suite}",
        **_TINY_CPU_RUN,
        shuffle_buffer_size=1_000,
        max_steps=60,
        expected_world_size=1,
        global_batch_size=8,
        lora_rank=8,
    )
    register_vla(
        f"tiny-oft+libero_{_suite}",
        f"tiny+libero_{_suite}",
        action_head="l1-chunk",
        chunk_size=8,
        use_proprio=True,
        num_images=2,
        lr_scheduler_type="step-decay",
        num_steps_before_decay=40,  # OFT's 100k of 150k steps at the peak LR, scaled to 60 steps
    )

# === Meta-World (docs/metaworld.md): demonstrations from `vla_scripts/collect_demos.py`, evaluated closed loop by
# `vla_scripts/eval_sim.py --benchmark metaworld` (LeRobot's protocol). The 7B presets are OpenVLA's and OpenVLA-OFT's
# LIBERO recipes above on MT50's demonstrations (`collect_demos.py --task_suite MT50` names them metaworld_mt50), with
# Meta-World's one camera; the steps are the recipes' LIBERO-Spatial budgets (no published Meta-World recipe of
# either exists). The tiny ones are what `make demo` trains on 2 CPU cores: OFT's structure (8-action chunks from an
# L1 head, proprio) fully fine-tuned (LoRA on a randomly initialised model only slows learning), and the tokens head;
# `tiny-flow+metaworld` is the OFT one with π0's flow head. ===
register_vla("openvla-7b+metaworld_mt50", "openvla-7b+libero_spatial", data_mix="metaworld_mt50")
register_vla(
    "openvla-oft-7b+metaworld_mt50", "openvla-oft-7b+libero_spatial", data_mix="metaworld_mt50", num_images=1
)
register_vla(
    "tiny-oft+metaworld",
    "openvla-oft-7b+metaworld_mt50",
    **{**_TINY_CPU_RUN, "per_device_batch_size": 16},
    use_lora=False,
    train_strategy="auto",
    image_aug=False,
    shuffle_buffer_size=4_000,
    max_steps=1_000,
    expected_world_size=2,
    global_batch_size=32,
    lr_scheduler_type="linear-warmup+cosine-decay",
    warmup_ratio=0.1,
)
register_vla("tiny+metaworld", "tiny-oft+metaworld", action_head="tokens", chunk_size=1, use_proprio=False)
register_vla(
    "tiny-flow+metaworld", "tiny-oft+metaworld", action_head="flow", head={"flow": _TINY_FLOW_EXPERT}
)
register_vla("tiny-fast+metaworld", "tiny-oft+metaworld", action_head="fast", head={"fast": _TINY_FAST})

# === FAST action tokens at 7B (`--vla.action_head fast`): π0-FAST's LIBERO recipe, openpi's `pi0_fast_libero`
# TrainConfig (src/openpi/training/config.py): full fine-tuning, action_horizon 10, the state and both cameras,
# 30k steps, TrainConfig's default batch 32; its optimizer defaults (training/optimizer.py): AdamW, weight decay
# 1e-10, gradient clip 1.0, 1k warmup steps to a 2.5e-5 peak, cosine decay (openpi's ends at 2.5e-6, ours at 0).
# The vocabulary's size and scale are the FAST tokenizer's (physical-intelligence/fast: 1024, 10) and decoding stops
# after `Pi0FAST.sample_actions`'s 256 steps: `FastOptions`' defaults. openpi has one config for every LIBERO suite;
# Meta-World has no published π0-FAST recipe: the LIBERO one on MT50's demonstrations with its one camera. ===
_PI0_FAST_LIBERO: dict[str, Any] = {
    "action_head": "fast",
    "chunk_size": 10,
    "use_proprio": True,
    "num_images": 2,
    **_OPENPI_LIBERO_TRAINING,
}
for _suite in _LIBERO_SUITES:
    register_vla(f"openvla-fast-7b+libero_{_suite}", f"openvla-7b+libero_{_suite}", **_PI0_FAST_LIBERO)
register_vla(
    "openvla-fast-7b+metaworld_mt50",
    "openvla-fast-7b+libero_spatial",
    data_mix="metaworld_mt50",
    num_images=1,
)

DEFAULT_VLA_ID = "prism-dinosiglip-224px+mx-oxe-magic-soup-plus"
