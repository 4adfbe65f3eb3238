"""Training strategies: `--vla.train_strategy` name -> `TrainingStrategy` class, and building the one a run uses.

The registry (`TRAIN_STRATEGIES`) lives in the config layer (`prismatic.conf.registries`), which checks the flag
while it parses, before torch loads; it is re-exported here. A class loads when it is built. A new strategy is its
class plus one `TRAIN_STRATEGIES.register(name, "module:Class")` line, with the facts the speed plan reads
(`cpu_offload`, `static_parameters`, `compiles_full_fine_tune`: see `prismatic.conf.registries`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prismatic.conf.registries import AUTO, TRAIN_STRATEGIES
from prismatic.util.errors import ConfigError
from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.conf.vla import VLAConfig
    from prismatic.models.vlms.prismatic import PrismaticVLM
    from prismatic.training.strategies.base import TrainingStrategy
    from prismatic.util.dist import DistInfo

logger = logging.getLogger(__name__)


def choose_train_strategy(
    vla: VLAConfig, world_size: int, device: Any, ddp_fits: Callable[[], bool], sharding: str = "auto"
) -> str:
    """The strategy a run with `vla` uses on `world_size` processes on `device`: `vla.train_strategy`, or for
    `auto`, on CUDA GPUs without CPU offload:
    - one GPU: `ddp` for a LoRA run, and for a full fine-tune where `ddp_fits()`;
    - several GPUs (nodes): `ddp` for a LoRA run where `ddp_fits()` and `--sharding` is `auto`, as OpenVLA's LoRA
      fine-tuning does (`vla-scripts/finetune.py` wraps its bf16 model in DDP on any number of GPUs); a full
      fine-tune keeps `fsdp-full-shard`, as OpenVLA's `vla-scripts/train.py`;
    and `fsdp-full-shard` everywhere else: CPU runs, CPU offload, a named `--sharding` (`full`, `hybrid`).

    `ddp_fits` (`ddp.ddp_fits`: DDP's expected peak fits every rank's free memory; collective) is called only where
    the choice depends on it, which every rank decides alike. On a group of one, FSDP2 shards nothing but still
    copies every parameter it gathers and runs the optimizer on DTensors; DDP computes on the weights in place. On
    one H100 (docs/performance.md) a 7B LoRA step took 549-562 ms under DDP against 687 under FSDP2 at the same peak
    memory (325-339 ms replayed from CUDA graphs, which need DDP), and a ~1B full fine-tune step 613-653 ms against
    1,491-1,581 for 29 % more peak memory. On several GPUs FSDP2 also all-gathers every frozen weight before each
    layer's forward and again before its backward (7B LoRA on 8 GPUs: 2 x 13.2 GB of bf16 received per GPU a
    step), where DDP all-reduces the adapters' gradients (0.43 GB of FP32), for a replica of 16.8 GB per GPU
    instead of a shard. (Several GPUs have not been timed.)
    """
    if vla.train_strategy != AUTO:
        return vla.train_strategy
    if getattr(device, "type", device) != "cuda" or vla.cpu_offload:
        return "fsdp-full-shard"
    if world_size == 1:
        return "ddp" if vla.use_lora or ddp_fits() else "fsdp-full-shard"
    return "ddp" if vla.use_lora and sharding == "auto" and ddp_fits() else "fsdp-full-shard"


def blocks_compile_mode(
    vla: VLAConfig, strategy: str, world_size: int, device: Any, grad_sync: str = "auto"
) -> str | None:
    """How a run under `strategy` on `world_size` processes compiles its blocks: None where `--vla.compile` leaves
    them eager (`VLAConfig.compiles`), else the `COMPILE_MODES` name of `--vla.compile_mode`.

    `auto` replays the blocks from CUDA graphs (`reduce-overhead`) on CUDA wherever replaying is safe (below),
    LoRA or full fine-tune, and launches them one by one (`default`) elsewhere. On one H100 the host then no longer
    keeps the GPU waiting: the 7B LoRA step with `selective-ops` took 325-339 ms from CUDA graphs against 409-624 ms
    launched one by one, the ~1B full fine-tune (2 micro-batches) 299.7 against 627.0 ms at 34.0 against 37.6 GB
    reserved; in FP32 the losses and gradient norms equal the launched ones' (docs/performance.md, `make test-gpu`).

    A replay writes its outputs where the previous one did, so it needs parameters that keep their storage between
    steps (DDP's; FSDP2 frees and re-gathers them around every block) and gradients that leave the graphs' memory
    within each micro-batch: DDP copies them into its buckets when it reduces them, which under accumulation it does
    after every micro-batch (`--grad_sync auto` or `micro-batch`), not under `step`, where they would wait in the
    graphs' memory for the next micro-batch's replay to overwrite.

    Raises:
        ConfigError: for an explicit `reduce-overhead` where replaying is not safe, naming what stands in the way
            and what works.
    """
    if not vla.compiles(device, strategy):
        return None
    problems = []
    if not TRAIN_STRATEGIES.fact(strategy, "static_parameters", False):
        problems.append(f"the strategy is {strategy}, which frees and re-gathers the parameters every step")
    accumulation = vla.grad_accumulation_steps(world_size)
    if accumulation > 1 and grad_sync == "step":
        problems.append(
            f"--grad_sync step keeps the gradients of {accumulation} micro-batches in the graphs' memory until the "
            "step ends"
        )
    if vla.compile_mode == "auto":
        cuda = getattr(device, "type", device) == "cuda"
        return "reduce-overhead" if cuda and not problems else "default"
    if vla.compile_mode == "reduce-overhead" and problems:
        raise ConfigError(
            "--vla.compile_mode reduce-overhead (compiled blocks replayed from CUDA graphs) needs DDP "
            "(--vla.train_strategy ddp, or auto: LoRA on GPUs, a full fine-tune on one GPU where it fits) with "
            "gradients reduced after every micro-batch "
            "(--grad_sync auto or micro-batch), but "
            + " and ".join(problems)
            + ". Use --vla.compile_mode auto or default, or DDP with --grad_sync auto."
        )
    return vla.compile_mode


def get_train_strategy(
    vlm: PrismaticVLM, vla: VLAConfig, dist_info: DistInfo, *, grad_sync: str = "auto", sharding: str = "auto"
) -> TrainingStrategy:
    """The strategy `vla.train_strategy` names (`auto`: `choose_train_strategy`'s), built for `vlm` (a ConfigError
    listing the names when unknown)."""
    # lazy: the registry's names are read without torch
    from prismatic.training.strategies.ddp import ddp_fits

    def fits() -> bool:
        return ddp_fits(vlm, vla.enable_mixed_precision_training, dist_info.device)

    name = choose_train_strategy(vla, dist_info.world_size, dist_info.device, fits, sharding)
    compile_mode = blocks_compile_mode(vla, name, dist_info.world_size, dist_info.device, grad_sync)
    if vla.train_strategy == AUTO:
        logger.info(
            "--vla.train_strategy auto: %s (world size %d on %s)",
            name,
            dist_info.world_size,
            dist_info.device,
        )
    strategy = TRAIN_STRATEGIES.get_class(name)
    return strategy(vlm, vla, dist_info, grad_sync=grad_sync, sharding=sharding, compile_mode=compile_mode)


__getattr__ = lazy_getattr(__name__, {"TrainingStrategy": "prismatic.training.strategies.base"})

__all__ = [
    "AUTO",
    "TRAIN_STRATEGIES",
    "TrainingStrategy",
    "blocks_compile_mode",
    "choose_train_strategy",
    "get_train_strategy",
]
