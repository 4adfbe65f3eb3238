"""The speed plan: every speed and memory choice of a run, decided here and nowhere else, into one frozen `SpeedPlan`.

A run's flags say `auto` for most of these choices; what `auto` becomes depends on the device, the world size and,
for some choices, the model's size. The resolver works in two phases:

1. `plan_flags(vla, world_size, device, ...)` -> `FlagPlan`: what the flags, the world size and the device decide
   alone (AdamW's implementation, LM head at the labels only, the padding mask, step overlap, prefetching, DDP's
   gradient copies), and every refusal that needs no model (CPU offload without CUDA, batched gradient copies
   without torch's, CUDA graphs where no strategy the run can get replays them). `vla_scripts/train.py` runs it
   before anything loads; the head takes its `logits_at_labels`.
2. `resolve_speed_plan(vla, vlm, dist_info, ...)` -> `SpeedPlan`: with the model built, what needs its size: the
   strategy (`auto` asks whether DDP's replica fits), FSDP's mesh, bf16, whether and how the blocks compile,
   what activation checkpointing recomputes, when gradients are reduced, and the batch-length multiple.
   Collective: every rank resolves the same plan.

The strategy, the collator, the loop, the out-of-memory message and `benchmarks/bench_gpu.py` read the plan's plain
values. Set-up may still find the compiler broken on some rank, which `without_compile` records; the plan is then
logged once (`describe`) and written beside config.yaml as speed_plan.json (`SpeedPlan.to_dict`), so the run
folder says what `auto` became. docs/performance.md says why each `auto` chooses as it does and what it costs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from prismatic.conf.registries import AUTO, TRAIN_STRATEGIES
from prismatic.conf.speed import COMPILE_MODES, OPTIMIZER_IMPLEMENTATIONS
from prismatic.conf.vla import VLAConfig
from prismatic.models.parallelize import bf16_supported
from prismatic.util.dist import first_over_ranks
from prismatic.util.errors import ConfigError
from prismatic.util.topology import local_world_size

if TYPE_CHECKING:
    from prismatic.models.vlms.prismatic import PrismaticVLM
    from prismatic.util.dist import DistInfo

logger = logging.getLogger(__name__)

# Blocks replayed from CUDA graphs record a graph for every batch length they meet (torch warns past 8 and suggests
# padding to a few shapes). Rounding lengths up to a multiple of 8 bounds them, for a few padded tokens per sample.
CUDA_GRAPH_LENGTH_MULTIPLE = 8
# FSDP keeps unsharded gradients between micro-batches only while they take at most this share of free memory.
UNSHARDED_GRAD_MEMORY_SHARE = 0.25
FP32_BYTES = 4


@dataclass(frozen=True)
class FlagPlan:
    """Phase 1: what the flags, the world size and the device decide, before any model exists."""

    device: str  # the device type the run computes on: "cuda" or "cpu"
    world_size: int
    grad_accumulation_steps: int  # micro-batches per optimiser step
    optimizer_impl: str  # AdamW: fused, foreach, for-loop or default (torch's own choice)
    logits_at_labels: bool  # the tokens head runs the LM head at the labelled positions only
    causal_mask_only: bool  # a right-padded batch drops its padding mask
    overlap_steps: bool  # a step's metrics are read after the next step is queued
    prefetch_batches: int  # batches made ahead on a background thread; 0: none
    batched_grad_copy: bool  # DDP copies gradients into its buckets a bucket at a time


@dataclass(frozen=True)
class SpeedPlan(FlagPlan):
    """Phase 2: every speed and memory choice of the run, with the model's size known."""

    train_strategy: str  # a registered name (`TRAIN_STRATEGIES`)
    sharding: str | None  # FSDP's mesh: "full" or "hybrid"; None for a strategy that keeps whole replicas
    mixed_precision: bool  # bf16 compute
    compile_mode: str | None  # how the blocks compile (a `COMPILE_MODES` name); None: eager
    checkpointing_policy: (
        str | None
    )  # what activation checkpointing recomputes; None: nothing is checkpointed
    grad_sync: str  # under accumulation, gradients reduced after every "micro-batch" or once per "step"
    pad_to_multiple: int  # each batch's token length is rounded up to a multiple of it
    chosen_by_auto: tuple[str, ...]  # the flags whose `auto` this plan decided (messages say so)

    @property
    def cuda_graphs(self) -> bool:
        """Whether the compiled blocks replay from CUDA graphs."""
        return self.compile_mode == "reduce-overhead"

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain JSON data (speed_plan.json)."""
        return {**dataclasses.asdict(self), "chosen_by_auto": list(self.chosen_by_auto)}


# === Phase 1: the flags alone ======================================================================================


def _is_cuda(device: Any) -> bool:
    return getattr(device, "type", device) == "cuda"


def speed_switch(value: str, device: Any) -> bool:
    """Whether an `auto` / `on` / `off` speed flag with `value` is on for a run on `device`: `auto` turns it on on
    CUDA, where it was measured to win (or removes a wait without changing the work), and leaves CPU runs as they
    were."""
    return value == "on" or (value == AUTO and _is_cuda(device))


def adamw_implementation(choice: str, device: Any) -> str:
    """The AdamW implementation `--vla.speed.optimizer_impl` means on `device`: `auto` is fused on CUDA (torch would
    fall back to a Python loop over FSDP2's DTensor parameters) and torch's default ("default") elsewhere."""
    if choice not in OPTIMIZER_IMPLEMENTATIONS:
        raise ConfigError(
            f"Unknown optimizer_impl '{choice}' (--vla.speed.optimizer_impl). Valid choices: "
            f"{', '.join(OPTIMIZER_IMPLEMENTATIONS)}."
        )
    if choice == AUTO:
        return "fused" if _is_cuda(device) else "default"
    return choice


def batched_grad_copy(vla: VLAConfig, device: Any) -> bool:
    """Whether DDP copies gradients into its buckets a bucket at a time (`--vla.speed.batched_grad_copy`, a speed
    switch), where this torch has it. The buckets hold the same sums: dividing by the world size after the copy instead
    of multiplying by its inverse during it is exact for powers of two.

    Raises:
        ConfigError: `on` with a torch whose DDP lacks it.
    """
    # lazy: the strategies' package builds strategies from plans made here
    from prismatic.training.strategies import ddp

    if vla.speed.batched_grad_copy == "on" and not ddp.HAS_BATCHED_GRAD_COPY:
        raise ConfigError(
            f"--vla.speed.batched_grad_copy on needs DDP's batched_grad_copy, which torch {torch.__version__} does not "
            "have (torch >= 2.12 has it; `make install` pins 2.14.1). Use --vla.speed.batched_grad_copy auto "
            "(on where torch has it) or off."
        )
    return ddp.HAS_BATCHED_GRAD_COPY and speed_switch(vla.speed.batched_grad_copy, device)


def check_cpu_offload(cpu_offload: bool, device: Any) -> None:
    """Refuse `--vla.speed.cpu_offload` unless training runs on CUDA devices (`device`: where this rank computes)."""
    if cpu_offload and not _is_cuda(device):
        raise ConfigError(
            f"--vla.speed.cpu_offload true needs CUDA GPUs, but this run would train on "
            f"'{getattr(device, 'type', device)}' (no CUDA device is visible). CPU offload keeps FSDP's sharded "
            "parameters, gradients and optimizer state in host memory and copies each layer to the GPU only while it "
            "computes, so that a model too large for the GPUs' memory (a 7B VLA on 24 GB cards) still trains; "
            "without a GPU everything already lives in host memory. Run without it: drop --vla.speed.cpu_offload (or "
            "pass --vla.speed.cpu_offload false)."
        )


def plan_flags(
    vla: VLAConfig, world_size: int, device: Any, *, grad_sync: str = AUTO, sharding: str = AUTO
) -> FlagPlan:
    """Phase 1 for a run with `vla` on `world_size` processes on `device` (torch.device or its type): the choices the
    flags decide alone, after refusing every flag the device or torch cannot take, as far as that is known without
    the model (the strategy `auto` picks is assumed to be DDP where that waits for the model's size: a flag that
    only DDP takes is then checked again in phase 2).

    Raises:
        ConfigError: naming the flag, why it cannot run here and what can.
    """
    check_cpu_offload(vla.speed.cpu_offload, device)
    strategy = choose_train_strategy(vla, world_size, device, ddp_fits=lambda: True, sharding=sharding)
    blocks_compile_mode(vla, strategy, world_size, device, grad_sync)
    return FlagPlan(
        device=getattr(device, "type", device),
        world_size=world_size,
        grad_accumulation_steps=vla.grad_accumulation_steps(world_size),
        optimizer_impl=adamw_implementation(vla.speed.optimizer_impl, device),
        logits_at_labels=speed_switch(vla.speed.logits_at_labels, device),
        causal_mask_only=speed_switch(vla.speed.causal_mask_only, device),
        overlap_steps=speed_switch(vla.speed.overlap_steps, device),
        prefetch_batches=vla.speed.prefetch_batches,
        batched_grad_copy=batched_grad_copy(vla, device),
    )


# === The rules that need a strategy or the model ===================================================================


def choose_train_strategy(
    vla: VLAConfig, world_size: int, device: Any, ddp_fits: Callable[[], bool], sharding: str = AUTO
) -> str:
    """The strategy a run with `vla` uses on `world_size` processes on `device`: `vla.train_strategy`, or for
    `auto`, on CUDA GPUs without CPU offload:
    - one GPU: `ddp` for a LoRA run, and for a full fine-tune where `ddp_fits()`;
    - several GPUs (nodes): `ddp` for a LoRA run where `ddp_fits()` and `--sharding` is `auto`, as OpenVLA's LoRA
      fine-tuning does (`vla-scripts/finetune.py` wraps its bf16 model in DDP on any number of GPUs); a full
      fine-tune keeps `fsdp-full-shard`, as OpenVLA's `vla-scripts/train.py`;
    and `fsdp-full-shard` everywhere else: CPU runs, CPU offload, a named `--sharding` (`full`, `hybrid`).

    Why: on a group of one FSDP2 shards nothing but still copies every parameter it gathers and runs the optimizer
    on DTensors, where DDP computes on the weights in place; on several GPUs FSDP2 also all-gathers every frozen
    weight before each layer's forward and backward, where DDP all-reduces only the adapters' gradients.
    `ddp_fits` (`ddp.ddp_fits`: DDP's expected peak fits every rank's free memory; collective) is called only where
    the choice depends on it, which every rank decides alike.
    """
    if vla.train_strategy != AUTO:
        return vla.train_strategy
    if not _is_cuda(device) or vla.speed.cpu_offload:
        return "fsdp-full-shard"
    if world_size == 1:
        return "ddp" if vla.use_lora or ddp_fits() else "fsdp-full-shard"
    return "ddp" if vla.use_lora and sharding == AUTO and ddp_fits() else "fsdp-full-shard"


def compiles(vla: VLAConfig, device: Any, strategy: str) -> bool:
    """Whether `--vla.speed.compile` compiles the blocks of a run on `device` under `strategy` (a registered name).

    `auto` compiles on CUDA where compiling was measured faster: LoRA runs, runs without activation checkpointing,
    and full fine-tunes under the strategies registered with `compiles_full_fine_tune=True` (DDP). A full
    fine-tune with checkpointing under FSDP2 was slower compiled, so it stays eager there.
    """
    measured_faster = (
        vla.use_lora
        or not vla.enable_gradient_checkpointing
        or TRAIN_STRATEGIES.fact(strategy, "compiles_full_fine_tune", False)
    )
    return speed_switch(vla.speed.compile, device) and (vla.speed.compile == "on" or measured_faster)


def blocks_compile_mode(
    vla: VLAConfig, strategy: str, world_size: int, device: Any, grad_sync: str = AUTO
) -> str | None:
    """How a run under `strategy` on `world_size` processes compiles its blocks: None where `--vla.speed.compile` leaves
    them eager (`compiles`), else the `COMPILE_MODES` name of `--vla.speed.compile_mode`.

    `auto` replays the blocks from CUDA graphs (`reduce-overhead`) on CUDA wherever replaying is safe (below), and
    launches them one by one (`default`) elsewhere: replayed, the host no longer keeps the GPU waiting.

    A replay writes its outputs where the previous one did, so it needs parameters that keep their storage between
    steps (DDP's; FSDP2 frees and re-gathers them around every block) and gradients that leave the graphs' memory
    within each micro-batch: DDP copies them into its buckets when it reduces them, which under accumulation it does
    after every micro-batch (`--grad_sync auto` or `micro-batch`), not under `step`, where they would wait in the
    graphs' memory for the next micro-batch's replay to overwrite.

    Raises:
        ConfigError: for an explicit `reduce-overhead` where replaying is not safe, naming what stands in the way
            and what works.
    """
    if not compiles(vla, device, strategy):
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
    if vla.speed.compile_mode == AUTO:
        return "reduce-overhead" if _is_cuda(device) and not problems else "default"
    if vla.speed.compile_mode == "reduce-overhead" and problems:
        raise ConfigError(
            "--vla.speed.compile_mode reduce-overhead (compiled blocks replayed from CUDA graphs) needs DDP "
            "(--vla.train_strategy ddp, or auto: LoRA on GPUs, a full fine-tune on one GPU where it fits) with "
            "gradients reduced after every micro-batch "
            "(--grad_sync auto or micro-batch), but "
            + " and ".join(problems)
            + ". Use --vla.speed.compile_mode auto or default, or DDP with --grad_sync auto."
        )
    return vla.speed.compile_mode


def choose_checkpointing_policy(vla: VLAConfig, vlm: PrismaticVLM, device: Any, mixed_precision: bool) -> str:
    """The policy a run recomputes by: `vla.speed.checkpointing_policy`, or for `auto` `selective-ops` where the run is
    a LoRA run on CUDA and, on every rank, what it needs with the matmul outputs kept fits the GPU
    (`activation_memory.selective_ops_shortfall`); `full` otherwise, and on CPU. A full fine-tune has not been
    measured faster with `selective-ops`, and keeps `full`.
    Collective on CUDA for a LoRA run (the ranks agree): call it on every rank."""
    from prismatic.training.strategies import (
        activation_memory,
    )  # lazy: it reads the model's structure (torch)

    if vla.speed.checkpointing_policy != AUTO:
        return vla.speed.checkpointing_policy
    device = torch.device(device)
    if device.type != "cuda" or not vla.use_lora or not vla.enable_gradient_checkpointing:
        return "full"
    need, kept, tokens, short = activation_memory.selective_ops_shortfall(vla, vlm, device, mixed_precision)
    found = first_over_ranks(short)
    policy = "full" if found is not None else "selective-ops"
    logger.info(
        "--vla.speed.checkpointing_policy auto: %s (selective-ops keeps %.1f GB of activations for %d tokens per rank; "
        "%s).",
        policy,
        kept / 1e9,
        tokens,
        f"on rank {found[0]}, {found[1]}" if found is not None else f"{need / 1e9:.1f} GB expected, fits",
    )
    return policy


def fsdp_mesh(sharding: str, world_size: int) -> str:
    """FSDP's mesh for `--sharding` on `world_size` ranks: "hybrid" (shard in a node, replicate across nodes) for
    `hybrid`, and for `auto` on several nodes (torchrun's LOCAL_WORLD_SIZE ranks each); "full" otherwise."""
    local = local_world_size(world_size)
    nodes = world_size // local if local and world_size % local == 0 else 1
    if sharding == "hybrid" and nodes == 1:
        logger.info("--sharding hybrid on one node: that is full sharding over its %d ranks.", world_size)
    return "hybrid" if sharding in ("hybrid", AUTO) and nodes > 1 else "full"


def _free_bytes(device: torch.device, world_size: int) -> int:
    """Free memory for this rank: the GPU's free memory, or on CPU the host's available memory shared by the
    node's ranks."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    local = local_world_size(world_size)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // max(1, local)


def choose_grad_sync(
    grad_sync: str,
    strategy: str,
    vla: VLAConfig,
    vlm: torch.nn.Module,
    device: torch.device,
    world_size: int,
    compile_mode: str | None,
) -> str:
    """When a run under accumulation reduces gradients: after every "micro-batch" or once per "step".

    `--grad_sync micro-batch` / `step` is kept. `auto`:
    - a strategy that keeps whole replicas (DDP, `replicates=True`): every micro-batch under CUDA graphs, whose next
      replay would overwrite gradients left in the graphs' memory (DDP copies them out into its buckets when it
      reduces); once per step otherwise;
    - a sharding strategy (FSDP, `cpu_offload=True`): every micro-batch under CPU offload (gradients belong on the
      host), or where the unsharded FP32 gradients kept between micro-batches would take more than a quarter of the
      free memory (GPU: the device's; CPU: the node's available memory over its ranks); once per step otherwise;
    - any other strategy: once per step.
    """
    shards = TRAIN_STRATEGIES.fact(strategy, "cpu_offload", False)
    if shards and vla.speed.cpu_offload and grad_sync == "step":
        logger.warning(
            "--grad_sync step with --vla.speed.cpu_offload: the unsharded gradients stay on the GPU between "
            "micro-batches; --grad_sync auto (or micro-batch) keeps them sharded in host memory instead."
        )
    if grad_sync != AUTO:
        return grad_sync
    if TRAIN_STRATEGIES.fact(strategy, "replicates", False):
        return "micro-batch" if compile_mode == "reduce-overhead" else "step"
    if not shards:
        return "step"
    if vla.speed.cpu_offload:
        logger.info(
            "--grad_sync auto with --vla.speed.cpu_offload: reduce-scatter every micro-batch (gradients accumulate "
            "sharded in host memory)"
        )
        return "micro-batch"
    need = FP32_BYTES * sum(p.numel() for p in vlm.parameters() if p.requires_grad)
    free = _free_bytes(device, world_size)
    every = need > UNSHARDED_GRAD_MEMORY_SHARE * free
    logger.info(
        "--grad_sync auto: unsharded gradients would need %.2f GB of %.2f GB free -> %s",
        need / 1e9,
        free / 1e9,
        "reduce-scatter every micro-batch" if every else "reduce once per step",
    )
    return "micro-batch" if every else "step"


def pad_multiple(pad_to_multiple: int | None, compile_mode: str | None) -> int:
    """The multiple each batch's token length is rounded up to (the collator's `pad_to_multiple_of`):
    `--vla.speed.pad_to_multiple`, or where that is null `CUDA_GRAPH_LENGTH_MULTIPLE` if the blocks are to replay CUDA
    graphs, else 1. Padding changes nothing beyond float rounding: its labels are ignored and causal attention keeps
    it from every real token."""
    if pad_to_multiple is not None:
        return pad_to_multiple
    return CUDA_GRAPH_LENGTH_MULTIPLE if compile_mode == "reduce-overhead" else 1


# === Phase 2 ========================================================================================================


def resolve_speed_plan(
    vla: VLAConfig,
    vlm: PrismaticVLM,
    dist_info: DistInfo,
    *,
    grad_sync: str = AUTO,
    sharding: str = AUTO,
    flags: FlagPlan | None = None,
) -> SpeedPlan:
    """Phase 2: the whole plan of a run with `vla` training `vlm` (built, its heads attached, not yet wrapped) on
    `dist_info`'s ranks, from phase 1's `flags` (made here when not given). Collective on CUDA (whether DDP and the
    kept activations fit is agreed over the ranks): call it on every rank.

    Raises:
        ConfigError: a flag this run cannot take, naming it and what works.
    """
    device, world = dist_info.device, dist_info.world_size
    flags = flags or plan_flags(vla, world, device, grad_sync=grad_sync, sharding=sharding)
    chosen = ["train_strategy"] if vla.train_strategy == AUTO else []
    chosen += [
        name
        for name in (
            "optimizer_impl",
            "logits_at_labels",
            "causal_mask_only",
            "overlap_steps",
            "batched_grad_copy",
            "compile",
            "compile_mode",
            "checkpointing_policy",
        )
        if getattr(vla.speed, name) == AUTO
    ]
    mixed_precision = vla.enable_mixed_precision_training and bf16_supported(device)
    if vla.enable_mixed_precision_training and not mixed_precision:
        logger.warning("bf16 is not supported on %s: training in FP32.", device)

    def fits() -> bool:
        from prismatic.training.strategies.ddp import (
            ddp_fits,
        )  # lazy: the strategies' modules import this one

        return ddp_fits(vlm, vla.enable_mixed_precision_training, device)

    strategy = choose_train_strategy(vla, world, device, fits, sharding)
    TRAIN_STRATEGIES.check(strategy)
    if vla.train_strategy == AUTO:
        logger.info("--vla.train_strategy auto: %s (world size %d on %s)", strategy, world, device)
    compile_mode = blocks_compile_mode(vla, strategy, world, device, grad_sync)
    checkpointing = (
        choose_checkpointing_policy(vla, vlm, device, mixed_precision)
        if vla.enable_gradient_checkpointing
        else None
    )
    replicates = TRAIN_STRATEGIES.fact(strategy, "replicates", False)
    if grad_sync == AUTO:
        chosen.append("grad_sync")
    return SpeedPlan(
        **dataclasses.asdict(flags),
        train_strategy=strategy,
        sharding=None if replicates else fsdp_mesh(sharding, world),
        mixed_precision=mixed_precision,
        compile_mode=compile_mode,
        checkpointing_policy=checkpointing,
        grad_sync=choose_grad_sync(grad_sync, strategy, vla, vlm, device, world, compile_mode),
        pad_to_multiple=pad_multiple(vla.speed.pad_to_multiple, compile_mode),
        chosen_by_auto=tuple(chosen),
    )


def without_compile(plan: SpeedPlan) -> SpeedPlan:
    """`plan` for a run whose compiler cannot run on some rank (set-up's probe): eager blocks, and gradients reduced
    once per step where only CUDA graphs made `auto` reduce them after every micro-batch. The batch lengths keep
    their multiple: the data may already be made with it."""
    graphs_only = (
        plan.cuda_graphs
        and "grad_sync" in plan.chosen_by_auto
        and TRAIN_STRATEGIES.fact(plan.train_strategy, "replicates", False)
    )
    return dataclasses.replace(plan, compile_mode=None, grad_sync="step" if graphs_only else plan.grad_sync)


def describe(plan: SpeedPlan) -> str:
    """One line with what each choice became on this device (config.yaml records the flags, `auto` included)."""
    checkpointing = plan.checkpointing_policy or "off"
    compiled = "off"
    if plan.compile_mode is not None:
        compiled = f"on ({plan.compile_mode})" if plan.compile_mode != "default" else "on"
    sharding = f" ({plan.sharding} sharding)" if plan.sharding else ""
    copies = ""
    if TRAIN_STRATEGIES.fact(plan.train_strategy, "replicates", False):
        copies = f", DDP gradient copies {'per bucket' if plan.batched_grad_copy else 'per parameter'}"
    padding = (
        f", batch lengths rounded up to a multiple of {plan.pad_to_multiple}"
        if plan.pad_to_multiple > 1
        else ""
    )
    return (
        f"Speed plan: {plan.train_strategy}{sharding} on {plan.world_size} process(es), "
        f"{'bf16' if plan.mixed_precision else 'FP32'}, gradients reduced "
        f"{'after every micro-batch' if plan.grad_sync == 'micro-batch' else 'once per step'}. "
        f"Speed flags on {plan.device}: AdamW {plan.optimizer_impl}, LM head only at labels (tokens head) "
        f"{'on' if plan.logits_at_labels else 'off'}, padding mask dropped {'on' if plan.causal_mask_only else 'off'}, "
        f"compiled blocks {compiled}, activation checkpointing {checkpointing}, prefetched batches "
        f"{plan.prefetch_batches}, steps overlapped {'on' if plan.overlap_steps else 'off'}{padding}{copies} "
        "(docs/performance.md)."
    )


def compile_kwargs(plan: SpeedPlan) -> dict[str, Any]:
    """torch.compile's keyword arguments for the plan's compile mode."""
    return dict(COMPILE_MODES[plan.compile_mode]) if plan.compile_mode is not None else {}
