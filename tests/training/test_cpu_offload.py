"""`--vla.speed.cpu_offload`: FSDP2's CPUOffloadPolicy on every unit, refused without CUDA, and the offloaded training
step (mixed precision, gradient clipping, optimizer, sharded checkpoint) in one process.

Real offload needs a GPU; on CPU the policy is still applied (FSDP2 accepts it on a gloo mesh, unpinned), so the
same sharding, clipping and checkpoint code runs, with host and device being the same memory. Expected values
come from copies taken by the test and from torch's own `clip_grad_norm_`, never from the code under test.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, OffloadPolicy
from torch.distributed.tensor import DTensor

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import VLAConfig, get_vla_config
from prismatic.models import load
from prismatic.models.distributed_init import materialize_from_rank0
from prismatic.models.parallelize import (
    apply_fsdp,
    cast_frozen_params_to_bf16,
    mixed_precision_policy,
    offload_policy,
    place_for_cpu_offload,
)
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.training.checkpointing import CheckpointManager, training_state
from prismatic.training.optim import build_lr_scheduler, build_optimizer
from prismatic.training.speed_plan import check_cpu_offload
from prismatic.training.strategies import get_train_strategy
from prismatic.training.strategies.fsdp import FSDPStrategy, clip_host_grad_norm_
from prismatic.util.dist import DistInfo
from prismatic.util.errors import ConfigError

BASE = "tiny-vit+tiny-llama"
CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.fixture(scope="module")
def mesh() -> Iterator[DeviceMesh]:
    """A process group of one (gloo, in this process) and its 1-D CPU mesh."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _vlm(stage: str = "vla-train") -> PrismaticVLM:
    torch.manual_seed(0)
    vlm = load(BASE)
    vlm.freeze_backbones(stage)
    return vlm


def _units(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def _batch(vlm: PrismaticVLM) -> dict[str, torch.Tensor]:
    encoded = vlm.llm_backbone.tokenizer(
        ["In: pick up the can\nOut: ", "In: push\nOut: "], padding=True, return_tensors="pt"
    )
    labels = encoded.input_ids.clone()
    labels[encoded.attention_mask == 0] = -100
    size = vlm.vision_backbone.default_image_resolution
    pixels = torch.rand((2, *size), generator=torch.Generator().manual_seed(0))
    return {
        "input_ids": encoded.input_ids,
        "attention_mask": encoded.attention_mask,
        "pixel_values": pixels,
        "labels": labels,
    }


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value: FSDP's shards gathered, or the tensor itself (parameters FSDP ignores)."""
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _tiny_vla(**overrides: object) -> VLAConfig:
    vla = get_vla_config("tiny+mx-toy")
    for name, value in overrides.items():
        setattr(vla, name, value)
    return vla


# --- policy selection and refusal -------------------------------------------------------------------------------


def test_offload_policy_selection() -> None:
    off = offload_policy(False, "cuda")
    assert type(off) is OffloadPolicy
    on_gpu = offload_policy(True, "cuda")
    assert isinstance(on_gpu, CPUOffloadPolicy) and on_gpu.pin_memory is True
    on_cpu = offload_policy(True, "cpu")  # nothing to pin for without a GPU
    assert isinstance(on_cpu, CPUOffloadPolicy) and on_cpu.pin_memory is False


def test_offload_without_cuda_is_a_config_error() -> None:
    check_cpu_offload(True, CUDA)  # a CUDA device: accepted
    check_cpu_offload(False, CPU)  # no offload: nothing to check
    with pytest.raises(ConfigError) as err:
        check_cpu_offload(True, CPU)
    message = str(err.value)
    for words in ("--vla.speed.cpu_offload true needs CUDA GPUs", "'cpu'", "host memory", "Run without it"):
        assert words in message, message
    assert "\n" not in message  # one paragraph


def test_strategy_refuses_offload_on_a_cpu_rank() -> None:
    vlm = _vlm()
    cpu_rank = DistInfo(rank=0, local_rank=0, world_size=1, num_nodes=1, device=CPU)
    with pytest.raises(ConfigError, match="needs CUDA GPUs"):
        get_train_strategy(vlm, _tiny_vla(speed=SpeedConfig(cpu_offload=True)), cpu_rank)
    # without the flag the same rank is fine
    assert isinstance(
        get_train_strategy(vlm, _tiny_vla(speed=SpeedConfig(cpu_offload=False)), cpu_rank), FSDPStrategy
    )


def test_offload_reduce_scatters_every_micro_batch(caplog: pytest.LogCaptureFixture) -> None:
    """Unsharded gradients kept between micro-batches would sit on the GPU: `auto` syncs every micro-batch."""
    vlm = _vlm()
    gpu_rank = DistInfo(
        rank=0, local_rank=0, world_size=1, num_nodes=1, device=CUDA
    )  # nothing touches it here
    vla = _tiny_vla(speed=SpeedConfig(cpu_offload=True), enable_mixed_precision_training=False)
    assert get_train_strategy(vlm, vla, gpu_rank, grad_sync="auto").choose_grad_sync() is True
    assert get_train_strategy(vlm, vla, gpu_rank, grad_sync="micro-batch").choose_grad_sync() is True
    with caplog.at_level(logging.WARNING):
        assert get_train_strategy(vlm, vla, gpu_rank, grad_sync="step").choose_grad_sync() is False
    assert "stay on the GPU" in caplog.text


# --- FSDP2 with the policy, on a gloo mesh ------------------------------------------------------------------------


@pytest.mark.parametrize("cpu_offload", [True, False])
def test_apply_fsdp_gives_every_unit_the_offload_policy(mesh: DeviceMesh, cpu_offload: bool) -> None:
    vlm = _vlm()
    unused = {id(m) for m in vlm.vision_backbone.unused_modules()}
    expected_units = (
        sum(id(block) not in unused for block in vlm.vision_backbone.get_blocks())
        + len(vlm.llm_backbone.get_layers())
        + 1  # the root
    )
    model = apply_fsdp(vlm, mesh, mixed_precision_policy(False, True), True, cpu_offload=cpu_offload)
    units = _units(model)
    assert len(units) == expected_units
    for unit in units:
        group = unit._get_fsdp_state()._fsdp_param_group  # FSDP2 keeps each unit's policy on its param group
        assert group is not None
        assert isinstance(group.offload_policy, CPUOffloadPolicy) is cpu_offload
        assert all(param.offload_to_cpu is cpu_offload for param in group.fsdp_params)


def test_offloaded_training_step_clips_steps_and_checkpoints(mesh: DeviceMesh, tmp_path: Path) -> None:
    """One step as the strategy takes it under offload, then a sharded checkpoint round trip."""
    vlm = _vlm()
    batch = _batch(vlm)
    cast_frozen_params_to_bf16(vlm)
    model = apply_fsdp(vlm, mesh, mixed_precision_policy(True, True), True, cpu_offload=True)
    materialize_from_rank0(model, None, CPU)
    place_for_cpu_offload(model, CPU)

    # Mixed precision still applies: a decoder layer computes with bf16 weights gathered from FP32 shards.
    layer = vlm.llm_backbone.get_layers()[0]
    linear = next(m for m in layer.modules() if isinstance(m, torch.nn.Linear))
    seen: list[torch.dtype] = []
    handle = linear.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))

    optimizer = build_optimizer(model, learning_rate=1e-3, weight_decay=0.0)
    scheduler = build_lr_scheduler(optimizer, "constant", num_training_steps=10, warmup_ratio=0.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimized = [p for group in optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimized} == {id(p) for p in trainable}
    assert all(isinstance(p, DTensor) and p.device == CPU and p.dtype == torch.float32 for p in optimized)

    model(**batch).loss.backward()
    handle.remove()
    assert seen == [torch.bfloat16]
    with_grad = [p for p in trainable if p.grad is not None]
    assert with_grad and all(isinstance(p.grad, DTensor) and p.grad.device == CPU for p in with_grad)

    # Clipping: the same norm and clipped gradients as torch's own clip_grad_norm_ on copies of the gradients.
    max_norm = 1e-3
    copies = [torch.nn.Parameter(_full(p.grad)) for p in with_grad]
    for copy in copies:
        copy.grad = copy.detach().clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(copies, max_norm)
    assert expected_norm > max_norm  # so the gradients are really scaled
    norm = clip_host_grad_norm_(model.parameters(), max_norm, CPU)
    assert math.isclose(norm.item(), expected_norm.item(), rel_tol=1e-5)
    for param, copy in zip(with_grad, copies, strict=True):
        torch.testing.assert_close(_full(param.grad), copy.grad, rtol=1e-5, atol=1e-9)

    before = [_full(p) for p in with_grad]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    assert all(not torch.equal(b, _full(p)) for b, p in zip(before, with_grad, strict=True))

    # Sharded checkpoint of the offloaded run: saved, then restored over a further step.
    counters = {"step": 1, "epoch": 0, "frames": 2}
    state = training_state(model, optimizer, scheduler, counters)
    manager = CheckpointManager(tmp_path, save_interval=1, keep_last=None, async_save=False, rank=0)
    saved_params = {name: _full(p) for name, p in model.named_parameters()}
    saved_moments = [_full(optimizer.state[p]["exp_avg"]) for p in with_grad]
    path = manager.save(state, {"step": 1, "epoch": 0}, blocking=True)

    model(**batch).loss.backward()
    clip_host_grad_norm_(model.parameters(), max_norm, CPU)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    assert any(not torch.equal(saved_params[n], _full(p)) for n, p in model.named_parameters())

    manager.load(path, state, same_world_size=True)
    for name, param in model.named_parameters():
        torch.testing.assert_close(_full(param), saved_params[name], rtol=0, atol=0)
        assert param.device == CPU
    for param, moment in zip(with_grad, saved_moments, strict=True):
        torch.testing.assert_close(_full(optimizer.state[param]["exp_avg"]), moment, rtol=0, atol=0)
    model(**batch).loss.backward()  # FSDP2 still finds its offloaded shards on the host after the load
