"""Training's CUDA paths on one GPU: NCCL, FSDP2 + bf16 + accumulation in both `--grad_sync` modes, CPU offload,
DDP + autocast, LoRA with its blocks compiled (`--vla.speed.compile auto`, and each `--vla.speed.compile_mode`),
validation between steps replayed from CUDA graphs, a step's host syncs. Each step runs through
`get_train_strategy(...).setup()` and training's own `train_loop` (or its `train_step`), and its loss and gradient
norm are checked against the same steps on the CPU in FP32 (`gpu_setup.reference_steps`).

    make test-gpu                                            # on a GPU machine
    PRISMATIC_GPU_TESTS_ON_CPU=1 pytest -q tests/gpu        # the CPU-capable ones, here
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gpu_setup import (
    DATASET,
    MICRO_BATCH,
    assert_matches_reference,
    build,
    local,
    micro_batches,
    reference_steps,
    tiny_vla,
    train_steps,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from prismatic.conf.speed import SpeedConfig
from prismatic.training.metrics import StepMetrics
from prismatic.training.strategies import ddp as ddp_strategy
from prismatic.training.trainer import train_step
from prismatic.training.validation import HeldOut, Validator
from prismatic.util.dist import DistInfo
from prismatic.util.kernel_profile import cuda_syncs
from prismatic.vla.datasets.synthetic import synthetic_collator, synthetic_frames

pytestmark = pytest.mark.gpu
# FP32 on both sides (on CPU they agree to 1e-8). The untrained model's held-out loss moves 0.3 % per step, and
# by as much if a batch's frames were counted wrongly: a looser bound would miss both.
VAL_LOSS_RTOL = 1e-4
HELD_OUT_SEED = (
    103  # held-out frames whose two batches pad to different lengths (29 and 38 tokens; 32 and 40)
)


def _record_compute_dtype(
    built_vlm: torch.nn.Module,
) -> tuple[list[torch.dtype], torch.utils.hooks.RemovableHandle]:
    """Record the output dtype of the first decoder layer's first Linear: what the layer computes in."""
    layer = built_vlm.llm_backbone.get_layers()[0]
    linear = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))
    seen: list[torch.dtype] = []
    handle = linear.register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    return seen, handle


def test_nccl_group_of_one(cuda_device: torch.device, process_group: DistInfo) -> None:
    assert dist.get_backend() == "nccl" and dist.get_world_size() == 1
    assert process_group.device == cuda_device == torch.device("cuda", torch.cuda.current_device())
    values = torch.tensor([1.5, -2.0, 3.25], device=cuda_device)
    dist.all_reduce(values)  # a sum over one rank: unchanged
    assert values.tolist() == [1.5, -2.0, 3.25]
    halves = torch.full((4,), 0.5, device=cuda_device, dtype=torch.bfloat16)
    dist.all_reduce(halves, op=dist.ReduceOp.MAX)
    assert halves.tolist() == [0.5] * 4
    dist.barrier()


@pytest.mark.parametrize("grad_sync", ["micro-batch", "step"])
def test_fsdp_bf16_accumulation_step_matches_cpu(process_group: DistInfo, grad_sync: str) -> None:
    vla = tiny_vla(train_strategy="fsdp-full-shard")
    built = build(vla, process_group, grad_sync=grad_sync)
    strategy = built.strategy
    assert strategy.grad_accumulation_steps == 2 and strategy.mixed_precision
    assert strategy.sync_every_micro_batch is (grad_sync == "micro-batch")
    assert isinstance(strategy.model, FSDPModule)
    sharded = [p for p in strategy.model.parameters() if isinstance(p, DTensor)]
    assert sharded and all(p.to_local().device == process_group.device for p in sharded)
    assert all(p.dtype == torch.float32 for p in sharded if p.requires_grad)  # FP32 master weights

    batches = micro_batches(built, 4)
    seen, handle = _record_compute_dtype(strategy.vlm)
    got = train_steps(built, batches)
    handle.remove()
    assert set(seen) == {torch.bfloat16}  # FSDP's policy computes in bf16
    assert_matches_reference(got, reference_steps(built, vla, batches, n_micro=2))


def test_cpu_offload_step(cuda_device: torch.device, process_group: DistInfo) -> None:
    """Pinned host shards, clipping that bites, one optimizer step that changes the host weights."""
    vla = tiny_vla(train_strategy="fsdp-full-shard", speed=SpeedConfig(cpu_offload=True), max_grad_norm=1e-3)
    built = build(vla, process_group)  # --grad_sync auto: every micro-batch under offload
    strategy = built.strategy
    assert strategy.sync_every_micro_batch
    trainable = [p for p in strategy.model.parameters() if p.requires_grad]
    assert trainable and all(isinstance(p, DTensor) for p in trainable)
    shards = [p.to_local() for p in strategy.model.parameters() if isinstance(p, DTensor)]
    assert all(s.device.type == "cpu" and s.is_pinned() for s in shards)
    # What FSDP leaves unsharded are the vision modules that never run: frozen, on the host with the shards.
    unused = {id(p) for m in strategy.vlm.vision_backbone.unused_modules() for p in m.parameters()}
    for param in strategy.model.parameters():
        if not isinstance(param, DTensor):
            assert id(param) in unused and not param.requires_grad and param.device.type == "cpu", param.shape
    before = [local(p) for p in trainable]

    batches = micro_batches(built, 2)
    (got,) = train_steps(built, batches)
    (want,) = reference_steps(built, vla, batches, n_micro=2)
    assert_matches_reference([got], [want])
    assert got["grad_norm"] > 100 * vla.max_grad_norm  # so clipping scaled the gradients

    after = [local(p) for p in trainable]
    assert all(a.device.type == "cpu" for a in after)
    assert sum(not torch.equal(b, a) for b, a in zip(before, after, strict=True)) == len(trainable)
    for param in trainable:  # AdamW stepped on the host
        state = strategy.optimizer.state[param]
        assert local(state["exp_avg"]).device.type == "cpu" and int(state["step"]) == 1


@pytest.mark.parametrize("copies", ["auto", "off"])
def test_ddp_autocast_step_matches_cpu(process_group: DistInfo, copies: str) -> None:
    """DDP + bf16 autocast against the CPU reference, with DDP's gradient copies as `auto` makes them on CUDA (a
    bucket at a time, where this torch has `batched_grad_copy`) and one by one. Eager (`--vla.speed.compile auto`
    compiles a full fine-tune under DDP on CUDA): the hook that records the compute dtype is not traced into a graph."""
    vla = tiny_vla(train_strategy="ddp", speed=SpeedConfig(batched_grad_copy=copies, compile="off"))
    built = build(vla, process_group, grad_sync="step")
    strategy = built.strategy
    assert type(strategy.model) is DistributedDataParallel and strategy.mixed_precision
    on_cuda = process_group.device.type == "cuda"
    assert strategy.batched_grad_copy == (copies == "auto" and on_cuda and ddp_strategy.HAS_BATCHED_GRAD_COPY)
    # Trainable weights FP32 (AdamW's master weights), frozen ones bf16 (autocast computes with them as stored).
    assert all(
        p.device == process_group.device and p.dtype == (torch.float32 if p.requires_grad else torch.bfloat16)
        for p in strategy.model.parameters()
    )

    batches = micro_batches(built, 4)
    seen, handle = _record_compute_dtype(strategy.vlm)
    got = train_steps(built, batches)
    handle.remove()
    assert set(seen) == {torch.bfloat16}  # autocast: bf16 compute
    assert_matches_reference(got, reference_steps(built, vla, batches, n_micro=2))


def test_auto_trains_under_ddp_on_one_gpu_and_under_fsdp2_where_ddp_would_not_fit(
    cuda_device: torch.device, process_group: DistInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--vla.train_strategy auto` on one GPU: DDP for LoRA and for a full fine-tune whose DDP peak (two replicas)
    fits the free memory, as the tiny model's does; FSDP2 for one that would not (here: a peak of 10^9 replicas)."""
    lora = build(tiny_vla(use_lora=True, speed=SpeedConfig(compile="off")), process_group).strategy
    full = build(tiny_vla(speed=SpeedConfig(compile="off")), process_group).strategy
    assert type(lora.model) is DistributedDataParallel and type(full.model) is DistributedDataParallel
    monkeypatch.setattr(ddp_strategy, "DDP_PEAK_REPLICAS", 10**9)
    assert isinstance(
        build(tiny_vla(speed=SpeedConfig(compile="off")), process_group).strategy.model, FSDPModule
    )


@pytest.mark.parametrize(
    ("strategy_name", "bf16"), [("fsdp-full-shard", False), ("ddp", False), ("ddp", True)]
)
def test_lora_compiles_its_blocks_by_default_and_matches_cpu(
    process_group: DistInfo, strategy_name: str, bf16: bool
) -> None:
    """`--vla.speed.compile auto` compiles a LoRA run's blocks on CUDA (FSDP2 and DDP, the LIBERO presets' strategy,
    activation checkpointing on). In FP32 two steps match the CPU reference; in bf16 the first step does (from the
    second on, AdamW's first step on the zero-initialised LoRA B matrices turns bf16 rounding into full-size
    updates, compiled or not: docs/performance.md)."""
    vla = tiny_vla(use_lora=True, train_strategy=strategy_name, enable_mixed_precision_training=bf16)
    built = build(vla, process_group, grad_sync="step")
    assert built.strategy.compiled is (process_group.device.type == "cuda")
    batches = micro_batches(built, 2 if bf16 else 4)
    assert_matches_reference(train_steps(built, batches), reference_steps(built, vla, batches, n_micro=2))


@pytest.mark.parametrize(
    ("mode", "policy", "n_micro", "lora"),
    [
        ("auto", "full", 1, True),
        ("reduce-overhead", "full", 1, True),
        ("reduce-overhead", "selective-ops", 2, True),
        ("auto", "full", 2, False),
    ],
)
def test_compile_modes_train_like_cpu(
    process_group: DistInfo, mode: str, policy: str, n_micro: int, lora: bool
) -> None:
    """`--vla.speed.compile_mode` on the GPU: LoRA and a full fine-tune under DDP, FP32, four steps (CUDA graphs are
    recorded on a block's second call and replayed from its third; with accumulation, DDP reduces every
    micro-batch's gradients out of the graphs' memory) against the CPU reference. Under `reduce-overhead`, and
    `auto` (the default) on CUDA, every compiled graph runs from CUDA graphs: inductor skipped none."""
    vla = tiny_vla(use_lora=lora, train_strategy="ddp", speed=SpeedConfig(compile="on", compile_mode=mode))
    vla.speed.checkpointing_policy, vla.enable_mixed_precision_training = policy, False
    vla.global_batch_size = n_micro * vla.per_device_batch_size
    counts = torch._dynamo.utils.counters["inductor"]
    skips_before = counts["cudagraph_skips"]
    built = build(vla, process_group)
    on_cuda = process_group.device.type == "cuda"
    assert built.strategy.compiled and built.strategy.cuda_graphs is (mode == "reduce-overhead" or on_cuda)
    batches = micro_batches(built, 4 * n_micro)
    assert_matches_reference(train_steps(built, batches), reference_steps(built, vla, batches, n_micro))
    if on_cuda:
        assert counts["cudagraph_skips"] == skips_before


def test_validation_between_steps_matches_cpu(process_group: DistInfo) -> None:
    """`--eval.interval` with the default `auto` on CUDA (LoRA under DDP: the blocks replay CUDA graphs). Validation
    runs no-grad forwards through the same compiled blocks between training steps, so they record graphs of their
    own, for held-out batches of two padded lengths, and training goes on replaying its own. FP32, three steps,
    validation after each: every loss, gradient norm and held-out loss against the CPU reference."""
    vla = tiny_vla(use_lora=True, train_strategy="ddp", speed=SpeedConfig(compile="on", compile_mode="auto"))
    vla.enable_mixed_precision_training = False
    vla.global_batch_size = vla.per_device_batch_size
    counts = torch._dynamo.utils.counters["inductor"]
    skips_before = counts["cudagraph_skips"]
    built = build(vla, process_group)
    on_cuda = process_group.device.type == "cuda"
    assert built.strategy.cuda_graphs is on_cuda
    frames = synthetic_frames(built.reference, built.head, 2 * MICRO_BATCH, seed=HELD_OUT_SEED)
    collate = synthetic_collator(built.reference, built.strategy.pad_to_multiple)  # training's: 8 on CUDA
    held_out = [collate(frames[:MICRO_BATCH]), collate(frames[MICRO_BATCH:])]
    assert held_out[0]["input_ids"].shape[1] != held_out[1]["input_ids"].shape[1]  # two lengths to record
    validator = Validator(
        [HeldOut(DATASET, frames)],
        collate,
        built.head,
        per_device_batch_size=MICRO_BATCH,
        num_batches=2,
        device=process_group.device,
    )
    batches = micro_batches(built, 3)
    got = train_steps(built, batches, validate=validator.for_strategy(built.strategy))
    want = reference_steps(built, vla, batches, n_micro=1, held_out=held_out)
    assert_matches_reference(got, want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert g["val/samples"] == 2 * MICRO_BATCH, (step, g)
        assert abs(g["val/loss"] - w["val_loss"]) <= VAL_LOSS_RTOL * w["val_loss"], (step, g, w)
    if on_cuda:
        assert counts["cudagraph_skips"] == skips_before


@pytest.mark.parametrize("strategy_name", ["fsdp-full-shard", "ddp"])
def test_a_lora_step_never_waits_for_the_gpu(
    cuda_device: torch.device, process_group: DistInfo, strategy_name: str
) -> None:
    """The host syncs tests/training/test_host_syncs.py pins on CPU, counted on CUDA (`set_sync_debug_mode`): none
    in `train_step` (forward, backward, clipping, fused AdamW; transformers' mask preparation skipped by
    `causal_attention`). The defaults on CUDA: mask dropped, blocks compiled."""
    vla = tiny_vla(use_lora=True, train_strategy=strategy_name)
    built = build(vla, process_group, grad_sync="step")
    strategy = built.strategy
    assert strategy.causal_mask_only and strategy.compiled
    batches = iter(micro_batches(built, 6))
    metrics = StepMetrics([DATASET], built.head, cuda_device)
    for _ in range(2):  # compiling, lazy initialisation, DDP's bucket rebuild
        train_step(strategy, built.head, batches, metrics)
    torch.cuda.synchronize()
    syncs = cuda_syncs(lambda: train_step(strategy, built.head, batches, metrics))
    assert syncs == [] and strategy.grad_accumulation_steps == 2, syncs


class _SumsHead:
    """What StepMetrics reads from a head: its sum columns and ratios."""

    columns = ("hits", "tokens")
    ratios = {"loss": ("hits", "tokens"), "accuracy": ("hits", "tokens")}


def test_a_steps_metrics_wait_for_that_step_alone(cuda_device: torch.device, process_group: DistInfo) -> None:
    """`--vla.speed.overlap_steps` (on by default on CUDA): `start` queues the all-reduce and the copy to pinned host
    memory; `result` waits for them, not for the work queued after (the next step), which is still running."""
    metrics = StepMetrics([DATASET], _SumsHead(), cuda_device)
    sums = torch.tensor([[3.0, 4.0]], device=cuda_device)
    metrics.update(torch.tensor(0.5, device=cuda_device), sums, [DATASET])
    votes = torch.tensor([1.0, 0.0], dtype=torch.float64)
    pending = metrics.start(torch.tensor(2.0, device=cuda_device), also_sum=votes)
    torch.cuda._sleep(2_000_000_000)  # about a second of device time, queued after the step
    out = pending.result()
    assert not torch.cuda.current_stream().query()  # the later work is still running
    assert out == {"loss": 0.5, "accuracy": 3.0 / 4.0, "grad_norm": 2.0}
    assert votes.tolist() == [1.0, 0.0]
    torch.cuda.synchronize()
