"""Training strategies registry: `train_strategy` id -> `TrainingStrategy` class."""

from __future__ import annotations

from prismatic.conf.vla import VLAConfig
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.training.strategies.ddp import DDPStrategy
from prismatic.training.strategies.fsdp import FSDPShardGradOpStrategy, FSDPStrategy
from prismatic.util.dist import DistInfo
from prismatic.util.errors import lookup

TRAIN_STRATEGIES: dict[str, type[TrainingStrategy]] = {
    "fsdp-full-shard": FSDPStrategy,
    "fsdp-shard-grad-op": FSDPShardGradOpStrategy,
    "ddp": DDPStrategy,
}


def get_train_strategy(
    vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, *, grad_sync: str = "auto", sharding: str = "auto"
) -> TrainingStrategy:
    strategy = lookup(TRAIN_STRATEGIES, vla.train_strategy, "train_strategy")
    return strategy(vlm, vla, dist_info, grad_sync=grad_sync, sharding=sharding)


__all__ = ["TRAIN_STRATEGIES", "TrainingStrategy", "get_train_strategy"]
