"""`SpeedConfig`: how a run goes fast and fits in memory, apart from what it trains (`--vla.speed.*`).

None of these switches changes the experiment: the same recipe, data and model train, with other kernels, launch
patterns, overlap or memory means. They live in their own group under `VLAConfig.speed`, so a preset reads as the
recipe it is, and a run's config.yaml keeps them under `vla.speed`. OpenVLA's own memory and precision fields
(`enable_gradient_checkpointing`, `enable_mixed_precision_training`, `reduce_in_full_precision`, `train_strategy`)
stay in `VLAConfig`, where OpenVLA has them. Every `auto` here is decided by `prismatic/training/speed_plan.py`,
and the run folder's speed_plan.json records what it became.

Run folders written before the group existed keep these keys flat under `vla` in config.yaml / config.json:
`MOVED_FLAGS` maps each old dotted name to its new one (the command line's `--config_path` reads them through it).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prismatic.util.checkpointing_policy import CHECKPOINTING_POLICIES, checkpointing_stride
from prismatic.util.errors import ConfigError, did_you_mean

OPTIMIZER_IMPLEMENTATIONS = ("auto", "fused", "foreach", "for-loop")  # --vla.speed.optimizer_impl
SPEED_SWITCHES = ("auto", "on", "off")  # the speed switches: auto = on CUDA only (`speed_plan.speed_switch`)
# Field metadata of the speed switches: the command line and config files also take true / false for on / off (a
# run's config.yaml from before `compile` took `auto` says `compile: false`), and the flag alone means on.
SWITCH = {"switch": True}
# --vla.speed.compile_mode: how compiled blocks launch their kernels, as torch.compile's keyword arguments per name
# (`auto`, the default, picks one per run: `prismatic.training.speed_plan.blocks_compile_mode`). Both run inductor's
# kernels; they differ in what the host does per launch, which bounds a launch-bound step.
COMPILE_MODES: dict[str, dict[str, Any]] = {
    "default": {},  # launched one by one from inductor's Python wrapper
    "reduce-overhead": {"mode": "reduce-overhead"},  # replayed from CUDA graphs (CUDA, DDP)
}
FLAG_PREFIX = "--vla.speed."  # how the command line names this group's fields


@dataclass
class SpeedConfig:
    """The speed and memory means of a run. `auto` turns a means on on CUDA (where it was measured to win, or
    removes a wait without changing the work) and leaves CPU runs as they were; `on` / `off` force it
    (docs/performance.md says why each default is what it is)."""

    # Memory means (one `--help` group with the speed means: the `speed` field's comment in VLAConfig titles it).

    checkpointing_policy: str = "auto"
    """What activation checkpointing recomputes: auto (selective-ops for LoRA on CUDA where what it keeps fits:
    measured faster, else full), full, selective-ops (keeps the matmul outputs) or every-N (every Nth layer)."""
    cpu_offload: bool = False  # FSDP2: keep parameters, gradients and optimizer state on the host (GPU only)

    # Speed means.

    optimizer_impl: str = "auto"  # AdamW: auto (fused on CUDA), fused, foreach or for-loop
    logits_at_labels: str = field(default="auto", metadata=SWITCH)  # LM head only at labels: auto, on or off
    causal_mask_only: str = field(default="auto", metadata=SWITCH)  # drop right padding's mask: auto/on/off
    prefetch_batches: int = 0  # batches made ahead on a background thread (transform, collate, pin); 0: off
    compile: str = field(default="auto", metadata=SWITCH)  # compile blocks; auto: CUDA, if LoRA, DDP or no AC
    compile_mode: str = "auto"  # compiled blocks' launches: auto, default, reduce-overhead (CUDA graphs)
    overlap_steps: str = field(default="auto", metadata=SWITCH)  # read metrics after queuing the next step
    batched_grad_copy: str = field(default="auto", metadata=SWITCH)  # DDP: copies gradients per bucket
    pad_to_multiple: int | None = None  # batch lengths rounded up to it; null: 8 under CUDA graphs, else 1

    def __post_init__(self) -> None:
        # Checked on construction, so a bad flag fails while parsing, before torch loads.
        self.check_values()

    def check_values(self) -> None:
        """Check every name and range of the group; raise `ConfigError` with the bad value and the valid choices
        (the rules that need the rest of the experiment, e.g. CPU offload's strategy, are `VLAConfig`'s)."""
        for name, choices in (
            ("optimizer_impl", OPTIMIZER_IMPLEMENTATIONS),
            ("logits_at_labels", SPEED_SWITCHES),
            ("causal_mask_only", SPEED_SWITCHES),
            ("compile", SPEED_SWITCHES),
            ("compile_mode", ("auto", *COMPILE_MODES)),
            ("overlap_steps", SPEED_SWITCHES),
            ("batched_grad_copy", SPEED_SWITCHES),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"Unknown {name} '{value}' ({FLAG_PREFIX}{name}).{did_you_mean(value, choices)} Valid choices: "
                    f"{', '.join(choices)}."
                )
        if self.checkpointing_policy != "auto" and checkpointing_stride(self.checkpointing_policy) is None:
            raise ConfigError(
                f"Unknown checkpointing_policy '{self.checkpointing_policy}' ({FLAG_PREFIX}checkpointing_policy). "
                "full recomputes every LLM decoder layer in the backward pass, selective-ops all of it but the "
                "matmul and attention outputs, every-N the whole of layers 0, N, 2N, ... (N an integer >= 1), auto "
                "selective-ops for LoRA on GPUs where it fits and full elsewhere."
                f"{did_you_mean(self.checkpointing_policy, CHECKPOINTING_POLICIES[:3])} Valid choices: "
                f"{', '.join(CHECKPOINTING_POLICIES)}."
            )
        if self.pad_to_multiple is not None and self.pad_to_multiple < 1:
            raise ConfigError(
                f"{FLAG_PREFIX}pad_to_multiple={self.pad_to_multiple} is out of range: it must be an integer >= 1 "
                "(each batch's token length is rounded up to a multiple of it; 1 pads to the longest sequence only), "
                "or null for the default (8 where the compiled blocks replay CUDA graphs, else 1)."
            )
        if self.prefetch_batches < 0:
            raise ConfigError(
                f"{FLAG_PREFIX}prefetch_batches={self.prefetch_batches} is out of range: it must be an integer >= 0 "
                "(the batches a background thread makes ahead of the training step; 0 makes them on the step's "
                "thread)."
            )


SPEED_FIELDS = tuple(f.name for f in dataclasses.fields(SpeedConfig))

# A run folder's config.yaml / config.json from before the group: `vla.<name>` -> `vla.speed.<name>`. The command
# line reads old files through it (`prismatic.util.cli`); an old name typed as a flag is answered with the new one.
MOVED_FLAGS: dict[str, str] = {f"vla.{name}": f"vla.speed.{name}" for name in SPEED_FIELDS}


def speed_config_class(owner: str, defaults: Mapping[str, Any]) -> type[SpeedConfig]:
    """`SpeedConfig`, or for a preset that sets some of its switches a subclass whose defaults are those values:
    the command line then overrides one switch (`--vla.speed.compile off`) and keeps the preset's others, and
    `--help` shows the preset's values. `owner`: the preset's id, named in the class name and in errors.

    Raises:
        ValueError: a name that is no field of the group (a typo in a preset fails at import), or a bad value.
    """
    unknown = sorted(set(defaults) - set(SPEED_FIELDS))
    if unknown:
        raise ValueError(
            f"VLA preset '{owner}' sets unknown speed fields {unknown}; the group's fields: {', '.join(SPEED_FIELDS)}."
        )
    if not defaults:
        return SpeedConfig
    SpeedConfig(**defaults)  # refuses a bad value now
    hints = typing.get_type_hints(SpeedConfig)
    metadata = {f.name: f.metadata for f in dataclasses.fields(SpeedConfig)}
    fields = [
        (name, hints[name], field(default=value, metadata=metadata[name])) for name, value in defaults.items()
    ]
    class_name = "SpeedConfig_" + "".join(c if c.isalnum() else "_" for c in owner)
    cls = dataclasses.make_dataclass(class_name, fields, bases=(SpeedConfig,))
    cls.__module__ = __name__
    cls.__doc__ = SpeedConfig.__doc__
    return cls
