"""The names of the parts a run chooses by flag whose classes live above the config layer: training strategies
(`--vla.train_strategy`) and metric trackers (`--trackers`).

The config checks a flag against these names while it parses, before torch loads, and without importing
`prismatic.training`: an entry is a "package.module:Class" string, imported on first look-up, or, from a plugin,
the class itself (`prismatic.util.lazy.LazyRegistry`). The classes register nowhere else; their modules re-export
the registry (`prismatic.training.strategies.TRAIN_STRATEGIES`, `prismatic.training.trackers.TRACKERS`).
"""

from __future__ import annotations

from prismatic.util.lazy import LazyRegistry

AUTO = "auto"  # --vla.train_strategy auto: a registered strategy chosen per run (`prismatic.training.speed_plan`)

# Facts the speed plan reads without importing a class: `cpu_offload=True` marks a strategy that can keep parameters
# on the host (`--vla.speed.cpu_offload`); `static_parameters=True` one whose parameters keep their storage from step to
# step (what CUDA graphs replay on: `--vla.speed.compile_mode`); `compiles_full_fine_tune=True` one under which
# `--vla.speed.compile auto` compiles full fine-tunes too (docs/performance.md says why); `replicates=True` one that
# keeps a whole replica of the model on every rank (its gradients are all-reduced whole; FSDP2 shards them).
TRAIN_STRATEGIES = LazyRegistry("train_strategy")
TRAIN_STRATEGIES.register(
    "fsdp-full-shard", "prismatic.training.strategies.fsdp:FSDPStrategy", cpu_offload=True
)
TRAIN_STRATEGIES.register(
    "fsdp-shard-grad-op", "prismatic.training.strategies.fsdp:FSDPShardGradOpStrategy", cpu_offload=True
)
TRAIN_STRATEGIES.register(
    "ddp",
    "prismatic.training.strategies.ddp:DDPStrategy",
    static_parameters=True,
    compiles_full_fine_tune=True,
    replicates=True,
)

TRACKERS = LazyRegistry("tracker")
TRACKERS.register("jsonl", "prismatic.training.trackers:JSONLinesTracker")
TRACKERS.register("wandb", "prismatic.training.trackers:WandBTracker")
