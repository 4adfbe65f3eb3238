"""GPU benchmark: the registry's real VLM architectures (random weights, nothing downloaded) through the real set-up
path and `train_loop`'s step, then `predict_action` / `predict_action_batch` on the 7B shape.

    make bench-gpu                                   # one GPU: the 7B and ~1B cases with the defaults
    python benchmarks/bench_gpu.py --variants before new   # the same, also with every speed flag off
    python benchmarks/bench_gpu.py --device cpu      # the tiny ids on CPU (what CI runs)
    python benchmarks/bench_gpu.py --device cpu --cases lora-7b-narrow --no_predict --variants new new+ddp
                                                     # the 7B step's kernel launches, FSDP2 against DDP, on CPU
    python benchmarks/bench_gpu.py --cases lora-7b --variants new new+no-compile --peak_tflops 989
    python benchmarks/bench_gpu.py --cases lora-7b --no_predict \
        --variants new new+sac-ops new+no-ac new+no-compile new+live-data new+prefetch   # each means alone
    python benchmarks/bench_gpu.py --cases lora-7b --variants new new+no-compile --no_predict --print_losses \
        --set enable_mixed_precision_training=false     # compiled vs eager loss per step, in FP32
    python benchmarks/bench_gpu.py --cases lora-7b --variants new --profile 2 --profile_dir traces
                                                     # where a step's time goes: GPU idle, kernels by kind
    python benchmarks/bench_gpu.py --cases --compile_scopes layers whole
                                                     # compiled decoding by blocks against whole functions
    torchrun --standalone --nproc-per-node 8 benchmarks/bench_gpu.py --cases lora-7b full-1b --variants new new+fsdp
                                                     # 8 GPUs, a rank each: what `auto` picks (LoRA: DDP) against
                                                     # FSDP2; rank 0 prints, samples/s over all ranks, MFU per GPU

Per training case it prints ms/step, samples/s, model TFLOP/s (the matmul FLOPs of a sample's forward and backward,
counted by running it: `model_flops.py`; attention's own FLOPs are left out), MFU against the
device's dense bf16 peak (table below, or `--peak_tflops`), peak GPU memory, host syncs per step (counted with
`torch.cuda.set_sync_debug_mode`: each synchronising call warns once per occurrence) and the ATen ops a step runs
that launch a kernel (`aten_ops_per_step`, counted with a `TorchDispatchMode`; also on CPU, where the `-narrow`
cases run the GPU cases' architectures at width 64 with every layer and block, so the count is the 7B step's). Each
case runs under `variants`: `before` is every speed flag off (torch's default AdamW, full logits, the padding mask,
eager, each step read before the next is queued, FSDP2, every layer recomputed whole), `new` the defaults (`auto`:
on a GPU every case trains under DDP, compiles its blocks and replays them from CUDA graphs, steps overlap, and a
LoRA case keeps its matmul outputs, `selective-ops`, where they fit); `+compile`,
`+no-compile`, `+sac-ops`, `+full-ac`, `+every-2`, `+no-ac`, `+live-data`, `+prefetch`, `+no-overlap`, `+ddp`, `+fsdp`,
`+grad-op`, `+per-param-copy` (DDP's gradient copies one by one), `+cudagraphs` and `+no-cudagraphs`
(`--vla.speed.compile_mode`: compiled blocks replayed from CUDA graphs, or launched one by one) change one means each
(`MODIFIERS`), e.g. `new+compile+sac-ops`. On a GPU the variants are `new` alone unless `--variants` says otherwise
(the whole run within `gpu_targets.BENCH_BUDGET_S`); on CPU `before new`. Frames
come from the project's own batch transform and collator on synthetic images (`prismatic.vla.datasets.synthetic`):
no TensorFlow, no data on disk. Four batches are made once and cycled, except under `+live-data` (made on every
step, on the loop's thread) and `+prefetch` (made by the prefetch thread), which time the data path too. The set-up
is training's:
`freeze_backbones` -> `apply_lora` -> `attach_action_modules` -> training's speed plan
(`prismatic.training.speed_plan`: `plan_flags`, then `resolve_speed_plan` with the model) -> `build_strategy(...).setup()`
(on one GPU DDP, as `--vla.train_strategy auto` picks it for every case here, or FSDP2 over a group of one with
`+fsdp`; bf16, activation checkpointing on), then `train_loop` itself: each row times exactly what training would
do with its flags, and reports the plan it trained with (`speed_plan`, as a run's speed_plan.json). `--profile N` profiles N more steps
(and N more calls of each predict row) after the timed ones and prints where their time went
(`prismatic/util/kernel_profile.py`: device busy and idle, time and launches by kind of kernel, the costliest kernels
and host events); rows timed after a profiled one are marked `after_profile` (they ran slower). Last, the speed
targets, each met, not met or not timed by this run (`gpu_targets.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, IterableDataset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpu_targets import check_targets, format_verdicts  # noqa: E402 (benchmarks/, beside this file)
from model_flops import model_flops_per_sample  # noqa: E402

from prismatic.conf.speed import SpeedConfig  # noqa: E402
from prismatic.conf.vla import VLAConfig  # noqa: E402
from prismatic.models.action_heads import ActionSpec, build_action_head  # noqa: E402
from prismatic.models.backbones.llm.registry import get_llm_backbone_spec  # noqa: E402
from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer  # noqa: E402
from prismatic.models.backbones.vision.registry import (  # noqa: E402
    FusedViTSpec,
    ViTSpec,
    get_vision_backbone_spec,
)
from prismatic.models.compile_scope import COMPILE_SCOPES, DEFAULT_COMPILE_SCOPE  # noqa: E402
from prismatic.models.lora import apply_lora  # noqa: E402
from prismatic.models.materialize import VLMArchitecture, build_vlm, build_vlm_from_spec  # noqa: E402
from prismatic.models.registry import get_base_vlm_spec  # noqa: E402
from prismatic.models.vlms.prismatic import PrismaticVLM  # noqa: E402
from prismatic.training.metrics import StepMetrics  # noqa: E402
from prismatic.training.preemption import PreemptionHandler  # noqa: E402
from prismatic.training.speed_plan import plan_flags, resolve_speed_plan  # noqa: E402
from prismatic.training.strategies import build_strategy  # noqa: E402
from prismatic.training.trainer import LoopHooks, LoopPlan, train_loop  # noqa: E402
from prismatic.util.dist import destroy_distributed, init_distributed  # noqa: E402
from prismatic.util.kernel_profile import cuda_syncs, format_profile, profile_run  # noqa: E402
from prismatic.vla.action_tokenizer import ActionTokenizer  # noqa: E402
from prismatic.vla.datasets.prefetch import prefetched  # noqa: E402
from prismatic.vla.datasets.synthetic import (  # noqa: E402
    INSTRUCTIONS,
    synthetic_batch,
    synthetic_collator,
    synthetic_frames,
)

# Dense bf16 tensor-core peaks (TFLOP/s, vendors' datasheets, without sparsity), matched on the device name.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0}
ACTION_DIM = 7


@dataclass(frozen=True)
class Case:
    name: str
    base_vlm: str
    use_lora: bool
    batch: int
    accumulation: int = 1
    head: str = "tokens"
    chunk_size: int = 1
    width: int | None = None  # narrow the real architecture to this width (same depth, modules and ops)


GPU_CASES = {
    "lora-7b": Case("lora-7b", "prism-dinosiglip-224px+7b", True, 16),
    "l1-chunk-lora-7b": Case(
        "l1-chunk-lora-7b", "prism-dinosiglip-224px+7b", True, 16, head="l1-chunk", chunk_size=8
    ),
    "full-1b": Case("full-1b", "prism-qwen25-dinosiglip-224px+0_5b", False, 16, accumulation=2),
}
CPU_CASES = {
    "lora-tiny": Case("lora-tiny", "tiny-dinosiglip+tiny-llama", True, 4),
    "l1-chunk-tiny": Case("l1-chunk-tiny", "tiny-vit+tiny-llama", False, 4, head="l1-chunk", chunk_size=4),
    "full-tiny": Case("full-tiny", "tiny-vit+tiny-llama", False, 4, accumulation=2),
    # The GPU cases' architectures at width 64: every layer, block, hook and op of the real step, little math.
    "lora-7b-narrow": Case("lora-7b-narrow", "prism-dinosiglip-224px+7b", True, 2, width=64),
    "full-1b-narrow": Case(
        "full-1b-narrow", "prism-qwen25-dinosiglip-224px+0_5b", False, 2, accumulation=2, width=64
    ),
}
VARIANT_BASES = ("before", "new")
# `+name` after a base adds one means on top of it (e.g. `new+compile+sac-ops`): the VLAConfig fields it sets
# (`speed.<name>`: a `SpeedConfig` field).
MODIFIERS: dict[str, dict[str, Any]] = {
    "compile": {"speed.compile": "on"},
    "no-compile": {"speed.compile": "off"},
    "sac-ops": {"speed.checkpointing_policy": "selective-ops"},
    "full-ac": {"speed.checkpointing_policy": "full"},  # layers recomputed whole where `auto` keeps matmuls
    "every-2": {"speed.checkpointing_policy": "every-2"},
    "no-ac": {"enable_gradient_checkpointing": False},
    "live-data": {},  # batches made by the transform and collator on every step, on the loop's thread
    "prefetch": {"speed.prefetch_batches": 2},  # the same live batches, made by the prefetch thread
    "no-overlap": {"speed.overlap_steps": "off"},  # each step's metrics read before the next step is queued
    # One GPU without FSDP2's per-layer copies: on a group of one, FSDP2 still copies every parameter it gathers
    # (the 7B frozen weights, twice a step); DDP + autocast computes on them in place.
    "ddp": {"train_strategy": "ddp"},
    "fsdp": {"train_strategy": "fsdp-full-shard"},  # FSDP2 also where `auto` picks DDP (one GPU)
    "grad-op": {"train_strategy": "fsdp-shard-grad-op"},  # gathered once a step, kept until the backward
    "per-param-copy": {
        "speed.batched_grad_copy": "off"
    },  # DDP copies each gradient into its bucket as it arrives
    # How compiled blocks launch their kernels (`--vla.speed.compile_mode`): replayed from CUDA graphs (`auto`'s choice
    # for LoRA under DDP on a GPU), or one by one from inductor's Python wrapper.
    "cudagraphs": {"speed.compile": "on", "speed.compile_mode": "reduce-overhead"},
    "no-cudagraphs": {"speed.compile_mode": "default"},
}


def parse_variant(variant: str) -> tuple[bool, dict[str, Any], bool]:
    """`before` / `new` plus `+modifier`s -> (before, VLAConfig overrides, live batches)."""
    base, *mods = variant.split("+")
    unknown = [m for m in mods if m not in MODIFIERS]
    if base not in VARIANT_BASES or unknown:
        raise SystemExit(
            f"bench_gpu: unknown variant '{variant}': a base ({', '.join(VARIANT_BASES)}) followed by any of "
            f"+{', +'.join(MODIFIERS)}."
        )
    overrides = {k: v for m in mods for k, v in MODIFIERS[m].items()}
    return base == "before", overrides, "live-data" in mods or "prefetch" in mods


def peak_tflops(device: torch.device, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


NARROW_HEADS = 4  # attention heads of a narrowed architecture (`Case.width`)


def narrowed(arch: dict[str, Any], vision: Any, width: int) -> tuple[dict[str, Any], Any]:
    """The LLM's config fields and the vision spec at `width`, with every layer, block and head of the original:
    the same modules, hooks and kernels per step, with little arithmetic in each."""
    heads, kv_heads = (
        arch["num_attention_heads"],
        arch.get("num_key_value_heads", arch["num_attention_heads"]),
    )
    llm = {
        **arch,
        "hidden_size": width,
        "intermediate_size": width * arch["intermediate_size"] // arch["hidden_size"],
        "num_attention_heads": NARROW_HEADS,
        "num_key_value_heads": max(1, NARROW_HEADS * kv_heads // heads),
    }

    def vit(spec: ViTSpec) -> ViTSpec:
        return replace(
            spec, arch_overrides={**spec.arch_overrides, "embed_dim": width, "num_heads": NARROW_HEADS}
        )

    if isinstance(vision, FusedViTSpec):
        return llm, replace(vision, parts={name: vit(part) for name, part in vision.parts.items()})
    return llm, replace(vision, vit=vit(vision.vit))


def random_vlm(
    base_vlm: str, device: torch.device, tokenizer_dir: Path, width: int | None = None
) -> PrismaticVLM:
    """The base VLM's real architecture with random weights, built on `device` (no download, no CPU copy).

    Tiny ids build as training builds them. Real ids take the LLM's published shape from the registry (`arch`)
    and the in-repo tiny tokenizer, then resize the embeddings to the real vocabulary (Llama-2: 32000 + `<PAD>`,
    padded to 32064; Qwen2.5: 151936 + 1, padded to 152000, 0.2 % above what its tokenizer gives), so the LM head
    costs what the real one does. `width` narrows a real id (`narrowed`).
    """
    torch.manual_seed(0)
    spec = get_base_vlm_spec(base_vlm)
    llm_spec = get_llm_backbone_spec(spec.llm_backbone_id)
    with torch.device(device):
        if not llm_spec.arch:
            return build_vlm(base_vlm)
        from transformers import AutoConfig

        arch, vision = dict(llm_spec.arch), None
        if width is not None:
            arch, vision = narrowed(arch, get_vision_backbone_spec(spec.vision_backbone_id), width)
        config = AutoConfig.for_model(arch.pop("model_type"), **arch)
        vlm = build_vlm_from_spec(
            VLMArchitecture(
                base_vlm, spec, vision_spec=vision, llm_config=config, tokenizer_dir=tokenizer_dir
            ),
            pretrained_vision=False,
            pretrained_llm=False,
        )
        # The published vocabulary, not `config.vocab_size`: building resized it to the tiny tokenizer's.
        vlm.llm_backbone.llm.resize_token_embeddings(
            llm_spec.arch["vocab_size"] + 1, pad_to_multiple_of=64, mean_resizing=False
        )
    return vlm


def _vla(
    case: Case, variant: str, steps: int, overrides: dict[str, Any] | None = None, world_size: int = 1
) -> VLAConfig:
    before, variant_overrides, _ = parse_variant(variant)
    vla = VLAConfig(
        base_vlm=case.base_vlm,
        use_lora=case.use_lora,
        lora_rank=32,
        per_device_batch_size=case.batch,
        global_batch_size=case.batch * case.accumulation * world_size,
        expected_world_size=world_size,
        max_steps=steps,
        action_head=case.head,
        chunk_size=case.chunk_size,
        train_strategy="fsdp-full-shard" if before else "auto",
        speed=SpeedConfig(
            optimizer_impl="for-loop" if before else "auto",
            logits_at_labels="off" if before else "auto",
            causal_mask_only="off" if before else "auto",
            compile="off" if before else "auto",
            compile_mode="default" if before else "auto",
            overlap_steps="off" if before else "auto",
            batched_grad_copy="off" if before else "auto",
            checkpointing_policy="full" if before else "auto",
        ),
    )
    for name, value in {**variant_overrides, **(overrides or {})}.items():
        group, _, leaf = name.rpartition(".")  # `speed.compile`: a field of the speed group
        setattr(vla.speed if group else vla, leaf, value)
    vla.check_values()
    return vla


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set name=value ...` as VLAConfig fields, `speed.<name>` for the speed group's (as the flags name them:
    `--vla.speed.compile` is `speed.compile`): text fields take the text as given (`on` stays "on"), others read it
    as YAML (true, 1e-4, 32)."""
    import yaml

    fields = {
        **{n: f for n, f in VLAConfig.__dataclass_fields__.items() if n != "speed"},
        **{f"speed.{n}": f for n, f in SpeedConfig.__dataclass_fields__.items()},
    }
    overrides = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in fields:
            raise SystemExit(
                f"bench_gpu: --set takes name=value with a VLAConfig field name (speed.<name> for the speed "
                f"group's), got '{pair}'."
            )
        overrides[name] = value if fields[name].type in (str, "str") else yaml.safe_load(value)
    return overrides


class _Times:
    """A tracker: the loop's own step times."""

    def __init__(self, print_losses: bool = False) -> None:
        self.steps: list[float] = []
        self.losses: list[float] = []
        self.print_losses = print_losses

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append(metrics["step_time_s"])
        self.losses.append(metrics["loss"])
        if self.print_losses:
            print(
                f"  step {step}: loss {metrics['loss']:.5f}, grad norm {metrics.get('grad_norm', float('nan')):.5f}"
            )


class _NoCheckpoints:
    def should_save(self, step: int, is_last_step: bool) -> bool:
        return False

    def save(self, blocking: bool) -> Path:
        raise AssertionError("the benchmark saves nothing")

    def poll(self) -> None: ...

    def wait(self) -> None: ...


CYCLED_BATCHES = 4  # the batches a row trains on, cycled (seeds 0-3)


class SyntheticBatches(IterableDataset):
    """Endless collated batches from the project's transform and collator, made when asked for (seeds cycle
    through 0-3, so every variant trains on the same 4 batches)."""

    def __init__(self, vlm: PrismaticVLM, head: Any, batch_size: int, pad_to_multiple: int) -> None:
        self.vlm, self.head, self.batch_size, self.pad_to_multiple = vlm, head, batch_size, pad_to_multiple

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in itertools.count():
            seed = i % CYCLED_BATCHES
            yield synthetic_batch(
                self.vlm, self.head, self.batch_size, seed, pad_to_multiple=self.pad_to_multiple
            )


# ATen ops that launch no kernel besides views (`OpOverload.is_view`): allocation, reshapes that copy nothing
# (`_unsafe_view`) and profiler markers.
NO_KERNEL_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "_unsafe_view",
        "_record_function_enter_new",
        "_record_function_exit",
    }
)


class _KernelOps(TorchDispatchMode):
    """Counts the ATen ops a step dispatches that run a kernel (on a GPU, each is at least one launch)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func.overloadpacket.__name__ not in NO_KERNEL_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def run_training_case(
    case: Case,
    variant: str,
    device: torch.device,
    args: argparse.Namespace,
    tokenizer_dir: Path,
    dist_info: Any,
) -> dict[str, Any]:
    # Room for every step the row may run: under CUDA graphs the warm-up is at least two passes over the batches.
    max_steps = max(args.warmup, 2 * CYCLED_BATCHES) + 1 + args.steps + args.profile_steps
    world = dist_info.world_size
    vla = _vla(case, variant, max_steps, args.overrides, world)
    vlm = random_vlm(case.base_vlm, device, tokenizer_dir, case.width)
    vlm.freeze_backbones(vla.stage)
    if vla.use_lora:
        apply_lora(vlm, vla.lora_settings())
    spec = ActionSpec(head=case.head, chunk_size=case.chunk_size, action_dim=ACTION_DIM)
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)
    # Training's resolver, in training's order: the flags decide the head's choice, the model's size the rest.
    flags = plan_flags(vla, world, device)
    head.logits_at_labels = flags.logits_at_labels
    _, _, live = parse_variant(variant)
    speed = resolve_speed_plan(vla, vlm, dist_info, flags=flags)
    strategy = build_strategy(vlm, vla, dist_info, speed)
    # The loader training uses (pinning on CUDA) over batches made when due; or 4 batches made once, cycled. Their
    # lengths are rounded up as training rounds them (the plan's `pad_to_multiple`).
    batch_maker = SyntheticBatches(vlm, head, case.batch, speed.pad_to_multiple)
    loader = DataLoader(batch_maker, batch_size=None, pin_memory=device.type == "cuda")
    batches = list(itertools.islice(iter(loader), CYCLED_BATCHES))
    frames = synthetic_frames(vlm, head, case.batch, seed=0)  # the first cycled batch's
    flops_per_sample = model_flops_per_sample(strategy, head, frames, synthetic_collator(vlm))
    strategy.setup(vla.max_steps)
    speed = strategy.plan  # as set up (eager where the compiler cannot run), as training writes it
    inductor_counts = torch._dynamo.utils.counters["inductor"]
    skips_before = inductor_counts["cudagraph_skips"]

    times = _Times(args.print_losses and dist_info.rank == 0)
    hooks = LoopHooks(trackers=[times], checkpoints=_NoCheckpoints(), preemption=PreemptionHandler())
    metrics = StepMetrics(["synthetic"], head, device)
    counters = {"step": 0, "epoch": 0, "frames": 0}
    # The prefetch thread (if any) stops when the case ends, failed or not.
    with prefetched(loader, speed.prefetch_batches if live else 0, device) as live_batches:
        stream_iter = live_batches if live else itertools.cycle(batches)

        def steps(start: int, end: int) -> None:
            plan = LoopPlan(
                start,
                end,
                10**9,
                case.batch * case.accumulation,
                None,
                show_progress=False,
                overlap_steps=speed.overlap_steps,
            )
            train_loop(strategy, head, stream_iter, metrics, plan, counters, hooks)

        # Compilation, allocator warm-up; under CUDA graphs every cycled batch twice (a block records its graph
        # for a shape on its second call with it), so that timed steps replay.
        warmup = max(args.warmup, 2 * CYCLED_BATCHES) if strategy.cuda_graphs else args.warmup
        started = time.perf_counter()
        steps(0, warmup)
        warmup_s = time.perf_counter() - started
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
        # One untimed step counts host syncs and kernel-running ops (a launch count that CPU runs give too; none
        # for compiled blocks, whose kernels are inductor's, not ATen's).
        kernel_ops = None if strategy.compiled else _KernelOps()
        with kernel_ops or contextlib.nullcontext():
            syncs = len(cuda_syncs(lambda: steps(warmup, warmup + 1)))
        timed_end = warmup + 1 + args.steps
        steps(warmup + 1, timed_end)
        step_times, last_loss = times.steps[-args.steps :], times.losses[-1]  # before any profiled step
        profiled = None
        if args.profile_steps:
            profiled = profile_run(
                lambda: steps(timed_end, timed_end + args.profile_steps),
                args.profile_steps,
                device,
                _trace_path(args, f"{case.name}-{variant}"),
            )
    # This rank's step time (rank 0 reports): every rank's step ends together. Samples/s counts all ranks; model
    # TFLOP/s is per GPU, what MFU compares with the card's peak.
    step_s = statistics.median(step_times)
    samples_per_s = case.batch * case.accumulation * world / step_s
    tflops = flops_per_sample * samples_per_s / world / 1e12
    peak = peak_tflops(device, args.peak_tflops)
    result = {
        "case": case.name,
        "variant": variant,
        "world_size": world,  # ranks (torchrun); samples_per_s counts all of them, model_tflops and MFU one GPU
        "strategy": type(strategy).__name__,  # what `--vla.train_strategy` resolved to
        "compiled": strategy.compiled,  # what `compile` resolved to (`auto`: every case here, under DDP on a GPU)
        # What `--vla.speed.checkpointing_policy` resolved to (`auto`: selective-ops for LoRA on a GPU where it fits).
        "checkpointing": speed.checkpointing_policy or "off",
        "pad_to_multiple": speed.pad_to_multiple,  # batch lengths rounded up to it (8 under CUDA graphs)
        "ms_per_step": round(step_s * 1e3, 1),
        "samples_per_s": round(samples_per_s, 2),
        "model_tflops": float(f"{tflops:.4g}"),
        "mfu_pct": round(100 * tflops / peak, 1) if peak else None,
        "peak_mem_gb": round(torch.cuda.max_memory_allocated(device) / 1e9, 1)
        if device.type == "cuda"
        else None,
        # What the allocator holds from the device: CUDA graphs replay into memory their pools reserved while
        # recording (in warm-up), which the allocated peak of the timed steps does not see.
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved(device) / 1e9, 1)
        if device.type == "cuda"
        else None,
        "host_syncs_per_step": syncs,
        "aten_ops_per_step": kernel_ops.count if kernel_ops is not None else None,
        # Compiled graphs inductor ran without CUDA graphs under `+cudagraphs` (its log says why): 0 on a GPU
        # when every block replays from graphs.
        "cudagraph_skips": inductor_counts["cudagraph_skips"] - skips_before
        if strategy.cuda_graphs
        else None,
        "warmup_s": round(warmup_s, 1),
        "last_loss": round(last_loss, 4),
        "speed_plan": speed.to_dict(),  # every choice the row trained with, as a run's speed_plan.json records it
    }
    if profiled is not None:
        result["profile"] = profiled
    return result


def _trace_path(args: argparse.Namespace, label: str) -> Path | None:
    """Where `--profile_dir` keeps the Chrome trace of `label` (None: no trace written)."""
    if args.profile_dir is None:
        return None
    return args.profile_dir / (re.sub(r"[^A-Za-z0-9_.+-]+", "_", label).strip("_") + ".json")


def _report(result: dict[str, Any]) -> None:
    """One JSON line per result; under `--profile`, its profile as a few readable lines after it."""
    profiled = result.get("profile")
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}), flush=True)
    if profiled is not None:
        label = " ".join(str(result[k]) for k in ("case", "variant") if k in result)
        print(format_profile(label, profiled, "step" if "variant" in result else "call"), flush=True)


def _mark_after_profile(result: dict[str, Any], earlier: list[dict[str, Any]]) -> None:
    """Flag a row timed after a profiled row of this process: such rows ran markedly slower than the same set-up
    timed first (benchmarks/results/ has the figures), so their times compare only with a run without `--profile`."""
    if any("profile" in row for row in earlier):
        result["after_profile"] = True


def _free(device: torch.device) -> None:
    """Between variants: memory back, and dynamo's compiled code dropped, so each variant compiles as a run of its
    own does (the blocks' code is shared by every model in the process: variants that differ in autocast or
    strides would otherwise pile up recompiles until dynamo's limit of 8 per function runs the rest eagerly)."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_predict(
    base_vlm: str, device: torch.device, args: argparse.Namespace, tokenizer_dir: Path
) -> list[dict]:
    """`predict_action` p50/p90 (KV cache and re-running), `predict_action_batch` actions/s at each batch size."""
    import numpy as np

    from prismatic.inference.policy import VLAPolicy, resolve_device_dtype

    vlm = random_vlm(base_vlm, device, tokenizer_dir)
    vlm.attach_action_modules(ActionSpec(action_dim=ACTION_DIM))
    stats = {
        "q01": [-1.0] * ACTION_DIM,
        "q99": [1.0] * ACTION_DIM,
        "mask": [True] * (ACTION_DIM - 1) + [False],
    }
    device_t, dtype = resolve_device_dtype(device, None)
    with torch.device("cpu"):  # host-side tables (image transforms), whatever the default device
        policy = VLAPolicy(vlm, {"bench": {"action": stats}}, base_vlm, device_t, dtype)
    rng = np.random.default_rng(0)
    # Frames at the backbone's size (224 px at 7B) take the array path, as a client's do.
    size = policy.image_size

    def images(n: int) -> list[Any]:
        return [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(n)]

    def timed(fn: Any, repeats: int) -> list[float]:
        out = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            fn()
            out.append(time.perf_counter() - started)
        return out

    results = []
    image = images(1)[0]
    # (use_cache, static cache, compile scope or None) per mode; compiled ones last: their graphs stay in the process.
    modes = {"KV cache, static + CUDA graphs": (True, True, None), "KV cache, dynamic": (True, False, None)}
    modes["re-running"] = (False, False, None)
    for scope in args.compile_scopes if args.compiled_decoding else []:
        modes[f"KV cache, static + CUDA graphs, compiled ({scope})"] = (True, True, scope)
    for mode, (use_cache, static, scope) in modes.items():
        _decoding_mode(policy, static, scope)

        def one(use_cache: bool = use_cache) -> None:
            policy.decode_batch([image], [INSTRUCTIONS[0]], "bench", use_cache=use_cache)

        warmup = timed(one, args.predict_warmup)  # graph capture, compiling: once per shape
        latencies = sorted(timed(one, args.predict_repeats))
        results.append(
            {
                "case": f"predict_action ({mode})",
                "p50_ms": round(1e3 * statistics.median(latencies), 1),
                "p90_ms": round(1e3 * latencies[math.ceil(0.9 * len(latencies)) - 1], 1),
                "warmup_s": round(sum(warmup), 1),
            }
        )
        _profile_requests(one, args, device, results[-1])
    for batch_size in args.predict_batch_sizes:
        batch_images = images(batch_size)
        instructions = [INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(batch_size)]
        pixel_ms = pixel_values_ms(policy, batch_images, timed)
        batch_modes = [("static + CUDA graphs", True, None), ("dynamic", False, None)]
        # Compiled rows at batch 1 (predict_action's shape) unless asked: the larger batches compile once more
        # between them (one request and larger batches compile apart, other sizes only capture).
        if args.compiled_decoding and (batch_size == 1 or args.compiled_decoding_all_sizes):
            batch_modes += [
                (f"static + CUDA graphs, compiled ({scope})", True, scope) for scope in args.compile_scopes
            ]
        for mode, static, scope in batch_modes:
            _decoding_mode(policy, static, scope)

            def many(batch_images: list = batch_images, instructions: list = instructions) -> None:
                policy.predict_action_batch(batch_images, instructions, "bench")

            warmup = timed(many, 1)
            seconds = statistics.median(timed(many, 3))
            results.append(
                {
                    "case": f"predict_action_batch {batch_size} ({mode})",
                    "actions_per_s": round(batch_size / seconds, 1),
                    "warmup_s": round(sum(warmup), 1),
                    "pixel_values_ms": pixel_ms,
                }
            )
            _profile_requests(many, args, device, results[-1])
    return results


def _decoding_mode(policy: Any, static: bool, scope: str | None) -> None:
    """The policy's decoding: static cache or dynamic, compiled with `scope` (`compile_scope`) or not."""
    policy.static_cache, policy.compile_decoding = static, scope is not None
    policy.compile_scope = scope or DEFAULT_COMPILE_SCOPE


def pixel_values_ms(policy: Any, batch_images: list[Any], timed: Any) -> dict[str, float]:
    """Median ms to turn a batch's uint8 frames into pixel values on the policy's device: normalised on the host
    then uploaded, and uploaded as bytes then normalised by the device (`VLAPolicy.pixels_on_device`, the default
    on a GPU). Its share of a request is the difference between the two rows' figures."""
    out = {}
    for name, on_device in (("host", False), ("on_device", True)):
        policy.pixels_on_device = on_device

        def make() -> None:
            policy.pixel_values(batch_images)
            if policy.device.type == "cuda":
                torch.cuda.synchronize()

        timed(make, 1)
        out[name] = round(1e3 * statistics.median(timed(make, 5)), 2)
    policy.pixels_on_device = None
    return out


def _profile_requests(
    request: Any, args: argparse.Namespace, device: torch.device, result: dict[str, Any]
) -> None:
    """Under `--profile N`: N more calls of `request` profiled, per call, into `result["profile"]`."""
    if args.profile_steps:
        result["profile"] = profile_run(
            lambda: [request() for _ in range(args.profile_steps)],
            args.profile_steps,
            device,
            _trace_path(args, result["case"]),
        )


# Options that leave a run the default one (`make bench-gpu`): where it runs and writes, not what it times.
_NEUTRAL_OPTIONS = {"device", "peak_tflops", "json_out", "profile_dir"}


def _is_default_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> bool:
    """Whether every option that decides what is timed has its default: only then is the run's time the
    budget's (`gpu_targets.BENCH_BUDGET_S`)."""
    return all(
        getattr(args, action.dest) == action.default
        for action in parser._actions
        if action.dest not in _NEUTRAL_OPTIONS and action.dest != "help"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cases", nargs="*", default=None, help="default: every case of the device kind")
    parser.add_argument(
        "--variants",
        nargs="*",
        default=None,
        help=f"default: new on a GPU, before new on CPU; a base ({', '.join(VARIANT_BASES)}) and any of "
        f"+{', +'.join(MODIFIERS)}",
    )
    parser.add_argument("--steps", type=int, default=5, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--peak_tflops", type=float, default=None, help="the device's dense bf16 peak")
    parser.add_argument("--predict_base_vlm", default=None, help="default: the 7B id on GPU, tiny on CPU")
    parser.add_argument("--predict_repeats", type=int, default=20)
    parser.add_argument("--predict_warmup", type=int, default=3)
    parser.add_argument(
        "--predict_batch_sizes", type=int, nargs="*", default=None, help="default 1 16 64 (CPU 1 4)"
    )
    parser.add_argument("--no_predict", action="store_true")
    parser.add_argument(
        "--compiled_decoding",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=None,
        help="also time the policy's compiled static decoding (default: on GPU only; CPU compiles C++ first)",
    )
    parser.add_argument(
        "--compile_scopes",
        nargs="+",
        choices=COMPILE_SCOPES,
        default=[DEFAULT_COMPILE_SCOPE],
        help="what compiled decoding compiles, a row each: every ViT block and decoder layer (layers, the policy's "
        "default), or the prefill and the decode step whole",
    )
    parser.add_argument(
        "--compiled_decoding_all_sizes",
        action="store_true",
        help="compiled decoding at every --predict_batch_sizes (default: batch 1 only; the larger sizes share "
        "one more compile)",
    )
    parser.add_argument(
        "--set", nargs="*", default=[], metavar="NAME=VALUE", help="VLAConfig overrides for every case"
    )
    parser.add_argument("--print_losses", action="store_true", help="each step's loss and gradient norm")
    parser.add_argument(
        "--profile",
        dest="profile_steps",
        type=int,
        nargs="?",
        const=2,
        default=0,
        metavar="N",
        help="after timing, profile N more steps (and N calls of each predict row; N=2 if not given): device "
        "busy / idle, time by kind of kernel, the costliest kernels (prismatic/util/kernel_profile.py)",
    )
    parser.add_argument(
        "--profile_dir", type=Path, default=None, help="with --profile: also write each Chrome trace here"
    )
    parser.add_argument(
        "--json_out", type=Path, default=None, help="also write every result here (JSON lines)"
    )
    args = parser.parse_args(argv)
    default_run = _is_default_run(parser, args)  # before the defaults below are filled in
    args.overrides = parse_overrides(args.set)
    if args.profile_steps < 0:
        print(
            f"bench_gpu: --profile takes a number of steps >= 0, got {args.profile_steps}.", file=sys.stderr
        )
        return 2

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            "bench_gpu: --device cuda, but no CUDA device is visible here; use --device cpu.", file=sys.stderr
        )
        return 2
    on_gpu = device.type == "cuda"
    cases = GPU_CASES if on_gpu else CPU_CASES
    names = list(cases) if args.cases is None else args.cases  # `--cases` with no names: predict only
    unknown = [name for name in names if name not in {**GPU_CASES, **CPU_CASES}]
    if unknown:
        print(
            f"bench_gpu: unknown case(s) {unknown}; valid: {', '.join({**GPU_CASES, **CPU_CASES})}.",
            file=sys.stderr,
        )
        return 2
    variants = args.variants or (["new"] if on_gpu else ["before", "new"])
    for variant in variants:
        parse_variant(variant)  # a typo fails before any model is built
    args.predict_batch_sizes = args.predict_batch_sizes or ([1, 16, 64] if on_gpu else [1, 4])
    args.compiled_decoding = on_gpu if args.compiled_decoding is None else args.compiled_decoding
    predict_id = args.predict_base_vlm or ("prism-dinosiglip-224px+7b" if on_gpu else "tiny-vit+tiny-llama")

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dist_info = init_distributed()
    if on_gpu and device.index is None:  # under torchrun each rank takes its own GPU
        device = torch.device("cuda", dist_info.local_rank)
    dist_info = replace(dist_info, device=device)
    world, main_rank = dist_info.world_size, dist_info.rank == 0
    report = _report if main_rank else (lambda result: None)
    name = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    if main_rank:
        print(
            f"bench_gpu on {world} x {name} (torch {torch.__version__}), peak bf16 "
            f"{peak_tflops(device, args.peak_tflops)} TFLOP/s per device"
        )
    if world > 1 and not args.no_predict:
        args.no_predict = True
        if main_rank:
            print("bench_gpu: predict rows are for one process; under torchrun only the training cases run.")
    results: list[dict[str, Any]] = []
    bench_started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp) / "tokenizer"
        load_tiny_tokenizer().save_pretrained(tokenizer_dir)
        for case_name in names:
            case = {**GPU_CASES, **CPU_CASES}[case_name]
            for variant in variants:
                started = time.perf_counter()
                try:
                    result = run_training_case(case, variant, device, args, tokenizer_dir, dist_info)
                except torch.OutOfMemoryError as err:
                    result = {
                        "case": case.name,
                        "variant": variant,
                        "error": f"out of memory: {str(err)[:120]}",
                    }
                except Exception as err:  # noqa: BLE001 (one broken case must not hide the others' figures)
                    traceback.print_exc()
                    result = {
                        "case": case.name,
                        "variant": variant,
                        "error": f"{type(err).__name__}: {err}"[:300],
                    }
                _free(device)
                result["case_s"] = round(time.perf_counter() - started, 1)
                _mark_after_profile(result, results)
                report(result)
                results.append(result)
        if not args.no_predict:
            for result in run_predict(predict_id, device, args, tokenizer_dir):
                _mark_after_profile(result, results)
                report(result)
                results.append(result)
    if args.json_out is not None and main_rank:
        args.json_out.write_text("".join(json.dumps(r) + "\n" for r in results))
    # The whole run's time, which a default run's target compares with `gpu_targets.BENCH_BUDGET_S`.
    run_s = time.perf_counter() - bench_started
    if main_rank:
        print(f"bench_gpu: {len(results)} results in {run_s:.0f} s")
        verdicts = check_targets(
            results,
            name,
            predict_id,
            run_s if default_run else None,
            training_defaults=not args.overrides,
        )
        print(format_verdicts(verdicts, name))
    destroy_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
