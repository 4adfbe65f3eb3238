"""Training strategies: `--vla.train_strategy` name -> `TrainingStrategy` class, and building the one a run uses.

The registry (`TRAIN_STRATEGIES`) lives in the config layer (`prismatic.conf.registries`), which checks the flag
while it parses, before torch loads; it is re-exported here. A class loads when it is built. A new strategy is its
class plus one `TRAIN_STRATEGIES.register(name, "module:Class")` line, with the facts the speed plan reads
(`cpu_offload`, `static_parameters`, `compiles_full_fine_tune`: see `prismatic.conf.registries`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.conf.registries import AUTO, TRAIN_STRATEGIES
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.conf.vla import VLAConfig
    from prismatic.models.vlms.prismatic import PrismaticVLM
    from prismatic.training.speed_plan import SpeedPlan
    from prismatic.training.strategies.base import TrainingStrategy
    from prismatic.util.dist import DistInfo


def build_strategy(
    vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, plan: SpeedPlan
) -> TrainingStrategy:
    """The strategy `plan.train_strategy` names, built for `vlm` to train as `plan` says (a ConfigError listing the
    names when unknown)."""
    return TRAIN_STRATEGIES.get_class(plan.train_strategy)(vlm, vla, dist_info, plan)


def get_train_strategy(
    vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, *, grad_sync: str = AUTO, sharding: str = AUTO
) -> TrainingStrategy:
    """The strategy a run with `vla` trains `vlm` under on `dist_info`'s ranks, built from the run's speed plan
    (`speed_plan.resolve_speed_plan`; collective on CUDA: call it on every rank)."""
    # lazy: the plan's rules read facts of the strategies' modules
    from prismatic.training.speed_plan import resolve_speed_plan

    plan = resolve_speed_plan(vla, vlm, dist_info, grad_sync=grad_sync, sharding=sharding)
    return build_strategy(vlm, vla, dist_info, plan)


__getattr__ = lazy_getattr(__name__, {"TrainingStrategy": "prismatic.training.strategies.base"})

__all__ = ["AUTO", "TRAIN_STRATEGIES", "TrainingStrategy", "build_strategy", "get_train_strategy"]
