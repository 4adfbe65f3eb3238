"""Training strategies registry: `--vla.train_strategy` name -> `TrainingStrategy` class.

The names are read without torch (the config checks the flag while it parses); a class loads when it is built. A
new strategy is its class plus one `TRAIN_STRATEGIES.register(name, "module:Class")` line; `cpu_offload=True`
marks one that can keep parameters on the host (`--vla.cpu_offload`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.util.lazy import LazyRegistry, lazy_getattr

if TYPE_CHECKING:
    from prismatic.conf.vla import VLAConfig
    from prismatic.models.vlms.prismatic import PrismaticVLM
    from prismatic.training.strategies.base import TrainingStrategy
    from prismatic.util.dist import DistInfo

TRAIN_STRATEGIES = LazyRegistry("train_strategy")
TRAIN_STRATEGIES.register(
    "fsdp-full-shard", "prismatic.training.strategies.fsdp:FSDPStrategy", cpu_offload=True
)
TRAIN_STRATEGIES.register(
    "fsdp-shard-grad-op", "prismatic.training.strategies.fsdp:FSDPShardGradOpStrategy", cpu_offload=True
)
TRAIN_STRATEGIES.register("ddp", "prismatic.training.strategies.ddp:DDPStrategy")


def get_train_strategy(
    vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, *, grad_sync: str = "auto", sharding: str = "auto"
) -> TrainingStrategy:
    """The strategy `vla.train_strategy` names, built for `vlm` (a ConfigError listing the names when unknown)."""
    strategy = TRAIN_STRATEGIES.get_class(vla.train_strategy)
    return strategy(vlm, vla, dist_info, grad_sync=grad_sync, sharding=sharding)


__getattr__ = lazy_getattr(__name__, {"TrainingStrategy": "prismatic.training.strategies.base"})

__all__ = ["TRAIN_STRATEGIES", "TrainingStrategy", "get_train_strategy"]
