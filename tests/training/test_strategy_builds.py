"""What each training strategy builds, read from the built objects (not from what it logs).

Every strategy is built through `get_train_strategy(...)` and `.setup()` on the tiny model, then inspected: the FSDP2
units' `reshard_after_forward` (FSDP's own per-unit state: the post-forward mesh is the unit's mesh when it
reshards, none when it keeps parameters gathered), DDP's wrapper, the device mesh's dimension names and sizes, and
the gradient-sync decision of `--grad_sync auto|micro-batch|step`, with `auto`'s choice computed here from the rule
`FSDPStrategy.choose_grad_sync` documents (FP32 gradients of the trainable parameters > a quarter of the free host
memory shared by the node's ranks) under a host memory size the test sets.

One rank suffices for most of it: a gloo group of one in this process. The hybrid mesh needs two ranks on two
"nodes": one `torchrun --nproc-per-node 2` of this file (its `__main__` is the worker), each rank told it is a node
of its own (LOCAL_WORLD_SIZE=1, which torchrun sets per node on a real cluster). The same launch shards the tiny
flow preset over both ranks in bf16: its expert's blocks are units of their own (`HeadModule.get_blocks`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils._python_dispatch import TorchDispatchMode

from prismatic.conf.vla import get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec, build_action_head
from prismatic.models.lora import LoraSettings, apply_lora
from prismatic.training.speed_plan import choose_train_strategy
from prismatic.training.strategies import get_train_strategy
from prismatic.training.strategies.ddp import ddp_fits
from prismatic.util.dist import DistInfo
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.synthetic import synthetic_batch

BASE, VLA = "tiny-vit+tiny-llama", "tiny+mx-toy"
CPU = torch.device("cpu")
FSDP_IDS = ("fsdp-full-shard", "fsdp-shard-grad-op")
# What each FSDP strategy must build: every unit reshards after forward (ZeRO-3) or none does (ZeRO-2).
RESHARD = {"fsdp-full-shard": "reshard", "fsdp-shard-grad-op": "keep"}


def _strategy(strategy_id: str, info: DistInfo, grad_sync: str = "auto", sharding: str = "auto") -> Any:
    vla = get_vla_config(VLA)
    vla.train_strategy = strategy_id
    vlm = build_vlm(BASE)
    vlm.attach_action_modules(ActionSpec())
    return get_train_strategy(vlm, vla, info, grad_sync=grad_sync, sharding=sharding)


def _built(strategy_id: str, info: DistInfo, sharding: str = "auto") -> Any:
    strategy = _strategy(strategy_id, info, sharding=sharding)
    strategy.setup(2)
    return strategy


def _reshard_kind(group: Any) -> str:
    """FSDP2 stores `reshard_after_forward` as the unit's post-forward mesh: its own mesh (True) or None (False)."""
    if group.post_forward_mesh_info is group.mesh_info:
        return "reshard"
    return "keep" if group.post_forward_mesh_info is None else "other"


def describe_fsdp(model: torch.nn.Module) -> dict[str, Any]:
    """What FSDP2 built: units, their resharding, the mesh they shard over and how one parameter is placed."""
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    groups = [u._get_fsdp_state()._fsdp_param_group for u in units]
    groups = [g for g in groups if g is not None]
    info = groups[0].mesh_info
    mesh = info.mesh
    param = next(p for p in model.parameters() if isinstance(p, DTensor) and p.ndim == 2)
    return {
        "root_is_unit": isinstance(model, FSDPModule),
        "units": len(units),
        "reshard": sorted({_reshard_kind(g) for g in groups}),
        "one_mesh": all(g.mesh_info.mesh == mesh for g in groups),
        "mesh_dim_names": list(mesh.mesh_dim_names),
        "mesh_shape": list(mesh.shape),
        "coordinate": mesh.get_coordinate(),
        "shard_size": info.shard_mesh_size,
        "replicate_size": getattr(info, "replicate_mesh_size", None),
        "param_mesh_dim_names": list(param.device_mesh.mesh_dim_names),
        "placements": [type(p).__name__ for p in param.placements],
        "local_rows": param.to_local().shape[0],
        "rows": param.shape[0],
    }


# === One rank, in this process ====================================================================================


@pytest.fixture
def one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process is the only rank of its node, whatever launched pytest."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")


@pytest.mark.parametrize("strategy_id", FSDP_IDS)
def test_each_fsdp_strategy_builds_units_with_its_own_resharding(
    one_rank: DistInfo, one_node: None, strategy_id: str
) -> None:
    built = describe_fsdp(_built(strategy_id, one_rank).model)
    assert built["root_is_unit"] and built["units"] > 2  # the root plus ViT blocks and decoder layers
    assert built["reshard"] == [RESHARD[strategy_id]]


@pytest.mark.parametrize("strategy_id", FSDP_IDS)
def test_one_node_shards_over_a_one_dimensional_mesh(
    one_rank: DistInfo, one_node: None, strategy_id: str
) -> None:
    built = describe_fsdp(_built(strategy_id, one_rank).model)
    assert built["one_mesh"]
    assert (built["mesh_dim_names"], built["mesh_shape"]) == (["shard"], [1])
    assert built["param_mesh_dim_names"] == ["shard"] and built["placements"] == ["Shard"]
    assert (built["shard_size"], built["replicate_size"]) == (1, None)


def test_ddp_builds_distributed_data_parallel_around_the_model(one_rank: DistInfo, one_node: None) -> None:
    strategy = _strategy("ddp", one_rank)
    vlm = strategy.vlm
    strategy.setup(2)
    assert type(strategy.model) is DistributedDataParallel
    assert strategy.model.module is vlm
    assert not any(isinstance(m, FSDPModule) for m in strategy.model.modules())


@pytest.mark.parametrize(
    ("use_lora", "world_size", "device", "cpu_offload", "sharding", "ddp_fits", "chosen"),
    [
        (True, 1, "cuda", False, "auto", False, "ddp"),  # 7B LoRA on an H100: 549-562 against 687 ms a step
        (True, 1, "cuda", False, "full", False, "ddp"),  # on one GPU FSDP2 shards nothing: DDP needs no more
        (
            False,
            1,
            "cuda",
            False,
            "auto",
            True,
            "ddp",
        ),  # ~1B full fine-tune on an H100: 613-653 against 1,491 ms
        (False, 1, "cuda", False, "auto", False, "fsdp-full-shard"),  # a full fine-tune DDP would not fit
        (True, 1, "cpu", False, "auto", True, "fsdp-full-shard"),  # CPU runs stay as they were
        (True, 2, "cpu", False, "auto", True, "fsdp-full-shard"),
        (True, 8, "cuda", False, "auto", True, "ddp"),  # LoRA on several GPUs: OpenVLA's finetune.py (DDP)
        (True, 16, "cuda", False, "auto", False, "fsdp-full-shard"),  # ... unless a replica would not fit
        (True, 8, "cuda", False, "full", True, "fsdp-full-shard"),  # a named sharding asks for FSDP2
        (True, 16, "cuda", False, "hybrid", True, "fsdp-full-shard"),
        (
            False,
            2,
            "cuda",
            False,
            "auto",
            True,
            "fsdp-full-shard",
        ),  # full fine-tunes: OpenVLA's train.py (FSDP)
        (True, 1, "cuda", True, "auto", True, "fsdp-full-shard"),  # offload is FSDP2's
        (True, 8, "cuda", True, "auto", True, "fsdp-full-shard"),
    ],
)
def test_auto_strategy_is_ddp_for_lora_on_gpus_and_for_a_full_fine_tune_on_one(
    use_lora: bool,
    world_size: int,
    device: str,
    cpu_offload: bool,
    sharding: str,
    ddp_fits: bool,
    chosen: str,
) -> None:
    vla = get_vla_config(VLA)
    assert vla.train_strategy == "auto"
    vla.use_lora, vla.speed.cpu_offload = use_lora, cpu_offload
    asked: list[bool] = []

    def fits() -> bool:
        asked.append(ddp_fits)
        return ddp_fits

    assert choose_train_strategy(vla, world_size, torch.device(device), fits, sharding) == chosen
    # The memory check (collective on several ranks) runs only where it decides: LoRA on one GPU needs none.
    decides = (
        device == "cuda"
        and not cpu_offload
        and ((world_size == 1 and not use_lora) or (world_size > 1 and use_lora and sharding == "auto"))
    )
    assert asked == ([ddp_fits] if decides else [])
    vla.train_strategy = "fsdp-shard-grad-op"  # a named strategy is kept whatever the run
    assert (
        choose_train_strategy(vla, world_size, torch.device(device), fits, sharding) == "fsdp-shard-grad-op"
    )


def test_ddp_fits_when_two_replicas_fit_the_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica is the weights plus an FP32 gradient and two AdamW moments per trainable parameter: a 10 x 10
    Linear's 110 FP32 parameters take 110 x 4 x 4 = 1,760 bytes, so DDP is expected to fit in 3,520 free bytes.
    Under mixed precision DDP stores frozen weights in bf16, so they count 2 bytes each."""
    model = torch.nn.Linear(10, 10)
    free = {"bytes": 3_520}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 10**12))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    gpu = torch.device("cuda", 0)
    assert ddp_fits(model, False, gpu) and ddp_fits(model, True, gpu)  # nothing frozen: bf16 changes nothing
    free["bytes"] = 3_519
    assert not ddp_fits(model, False, gpu) and not ddp_fits(model, True, gpu)
    model.bias.requires_grad_(False)  # a frozen bias: its 40 bytes of weights, no gradient or moments
    free["bytes"] = 2 * (440 + 100 * 12)  # 3,280
    assert ddp_fits(model, False, gpu)
    free["bytes"] = 2 * (400 + 10 * 2 + 100 * 12)  # 3,240: the frozen bias in bf16
    assert ddp_fits(model, True, gpu) and not ddp_fits(model, False, gpu)
    free["bytes"] -= 1
    assert not ddp_fits(model, True, gpu)
    assert not ddp_fits(model, True, torch.device("cpu"))  # off CUDA: never (CPU runs keep FSDP2)


def test_auto_weighs_a_full_fine_tune_against_the_gpus_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """`get_train_strategy` measures the run's own model on its own device: a full fine-tune of the tiny model on
    one (stand-in) GPU trains under DDP with free memory for two replicas (FP32 weights, and per trainable
    parameter a gradient and two AdamW moments), under FSDP2 with a byte less. Nothing is set up."""
    vla = get_vla_config(VLA)
    vla.enable_mixed_precision_training = False  # no bf16 query of a GPU this machine lacks
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-train")  # the vision backbone frozen: weights only
    vlm.attach_action_modules(ActionSpec())
    params = list(vlm.parameters())
    need = 2 * (
        4 * sum(p.numel() for p in params) + 3 * 4 * sum(p.numel() for p in params if p.requires_grad)
    )
    free = {"bytes": need}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free["bytes"], 10**12))
    gpu = DistInfo(rank=0, local_rank=0, world_size=1, num_nodes=1, device=torch.device("cuda", 0))
    assert type(get_train_strategy(vlm, vla, gpu)).__name__ == "DDPStrategy"
    free["bytes"] = need - 1
    assert type(get_train_strategy(vlm, vla, gpu)).__name__ == "FSDPStrategy"


def test_auto_builds_fsdp2_for_a_lora_run_on_cpu(one_rank: DistInfo, one_node: None) -> None:
    vla = get_vla_config("tiny-lora+mx-toy")
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    apply_lora(vlm, LoraSettings(rank=vla.lora_rank, alpha=vla.lora_alpha))
    vlm.attach_action_modules(ActionSpec())
    strategy = get_train_strategy(vlm, vla, one_rank)
    strategy.setup(2)
    assert vla.train_strategy == "auto" and isinstance(strategy.model, FSDPModule)


def _lora_ddp(info: DistInfo, mixed_precision: bool) -> tuple[Any, Any, set[str]]:
    """A tiny LoRA model (base weights frozen) set up by the DDP strategy; also its head and the frozen names."""
    vla = get_vla_config(VLA)
    vla.train_strategy, vla.enable_mixed_precision_training = "ddp", mixed_precision
    vlm = build_vlm(BASE)
    vlm.freeze_backbones("vla-full-train")
    apply_lora(vlm, LoraSettings(rank=4, alpha=8.0))
    spec = ActionSpec()
    vlm.attach_action_modules(spec)
    head = build_action_head(spec, ActionTokenizer(vlm.llm_backbone.tokenizer), vlm.num_prefix_tokens)
    strategy = get_train_strategy(vlm, vla, info)
    strategy.setup(2)
    frozen = {name for name, param in vlm.named_parameters() if not param.requires_grad}
    return strategy, head, frozen


@pytest.mark.parametrize("mixed_precision", [True, False])
def test_ddp_stores_frozen_weights_in_bf16_under_mixed_precision(
    one_rank: DistInfo, one_node: None, mixed_precision: bool
) -> None:
    """As OpenVLA's LoRA fine-tuning loads its model (bf16) and as the FSDP strategies store them; trainable
    weights stay FP32 (AdamW's master weights), and without mixed precision everything stays FP32."""
    strategy, _, frozen = _lora_ddp(one_rank, mixed_precision)
    assert len(frozen) > 10  # the LoRA base weights and the frozen vision backbone
    dtypes = {name: param.dtype for name, param in strategy.vlm.named_parameters()}
    bf16 = torch.bfloat16 if mixed_precision else torch.float32
    assert dtypes == {name: bf16 if name in frozen else torch.float32 for name in dtypes}


class _CastInputs(TorchDispatchMode):
    """The dtype casts (`aten._to_copy`) run, and the storages they read from."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[int] = set()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten._to_copy.default:
            self.read.add(args[0].untyped_storage().data_ptr())
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_ddp_autocast_uses_the_frozen_bf16_weights_without_copying_them(
    one_rank: DistInfo, one_node: None
) -> None:
    """A forward and backward under DDP's bf16 autocast casts no frozen weight: it computes with them as stored
    (FP32 frozen weights were cast at every use). The trainable FP32 adapters are still cast, as autocast does."""
    strategy, head, frozen = _lora_ddp(one_rank, mixed_precision=True)
    params = dict(strategy.vlm.named_parameters())
    frozen_storages = {params[name].untyped_storage().data_ptr() for name in frozen}
    adapter_storages = {params[name].untyped_storage().data_ptr() for name in params if name not in frozen}
    batch = strategy.to_device(synthetic_batch(strategy.vlm, head, 2))
    casts = _CastInputs()
    with strategy.autocast(), casts:
        output = strategy.model(
            batch["input_ids"], batch["attention_mask"], batch["pixel_values"], labels=batch["labels"]
        )
        output.loss.backward()
    assert casts.read & adapter_storages  # autocast at work
    assert not casts.read & frozen_storages


def test_ddp_lora_layers_keep_their_bf16_input_and_compute_the_same_numbers(
    one_rank: DistInfo, one_node: None
) -> None:
    """peft casts each LoRA layer's bf16 input to the FP32 adapters' dtype and autocast casts it straight back; the
    DDP strategy turns that off (`keep_lora_input_dtype`). Loss and every gradient are bit-identical to peft's
    default, with fewer dtype casts."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    def step(peft_default: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        torch.manual_seed(0)
        strategy, head, _ = _lora_ddp(one_rank, mixed_precision=True)
        lora_layers = [m for m in strategy.vlm.modules() if isinstance(m, BaseTunerLayer)]
        assert lora_layers and not any(layer.cast_input_dtype_enabled for layer in lora_layers)
        for layer in lora_layers:
            layer.cast_input_dtype_enabled = peft_default
        batch = strategy.to_device(synthetic_batch(strategy.vlm, head, 2))
        casts = _CastInputs()
        with strategy.autocast(), casts:
            loss = strategy.model(
                batch["input_ids"], batch["attention_mask"], batch["pixel_values"], labels=batch["labels"]
            ).loss
            loss.backward()
        grads = {name: p.grad for name, p in strategy.vlm.named_parameters() if p.grad is not None}
        return loss.detach(), grads, casts.count

    loss, grads, casts = step(peft_default=False)
    expected_loss, expected_grads, peft_casts = step(peft_default=True)
    assert torch.equal(loss, expected_loss)
    assert grads.keys() == expected_grads.keys() and len(grads) > 10
    assert all(torch.equal(grads[name], expected_grads[name]) for name in grads)
    assert casts < peft_casts


# --- the gradient-sync decision -----------------------------------------------------------------------------------


def _host_memory(monkeypatch: pytest.MonkeyPatch, free_bytes: int) -> None:
    """Available host memory as `os.sysconf` reports it: `free_bytes` pages of one byte."""
    real = os.sysconf
    fake = {"SC_PAGE_SIZE": 1, "SC_AVPHYS_PAGES": free_bytes}
    monkeypatch.setattr(os, "sysconf", lambda name: fake[name] if name in fake else real(name))


def _auto_rule(trainable: int, free_host: int, ranks_on_node: int) -> bool:
    """The documented rule: reduce every micro-batch when FP32 gradients need > 1/4 of this rank's free memory."""
    return 4 * trainable > (free_host // ranks_on_node) / 4


def _decision(strategy_id: str, info: DistInfo, grad_sync: str) -> tuple[Any, bool, bool]:
    """Build and set up; return the strategy, whether it reduces after every micro-batch, and whether a non-final
    micro-batch actually runs with the model's gradient reduction on (read from the wrapper's own flag)."""
    strategy = _strategy(strategy_id, info, grad_sync=grad_sync)
    assert strategy.grad_accumulation_steps == 2  # tiny+mx-toy: 16 frames, 8 per device, one rank
    strategy.setup(2)
    model = strategy.model
    with strategy.accumulate(is_last_micro_batch=False):
        if isinstance(model, DistributedDataParallel):
            reduces = model.require_backward_grad_sync
        else:
            reduces = model._get_fsdp_state()._fsdp_param_group.reduce_grads
    return strategy, strategy.sync_every_micro_batch, reduces


def _trainable(strategy_id: str) -> int:
    vlm = _strategy(strategy_id, DistInfo(0, 0, 1, 1, CPU)).vlm
    return sum(p.numel() for p in vlm.parameters() if p.requires_grad)


@pytest.mark.parametrize("strategy_id", [*FSDP_IDS, "ddp"])
@pytest.mark.parametrize(("grad_sync", "every"), [("micro-batch", True), ("step", False)])
@pytest.mark.parametrize("free_host", [1, 10**15])
def test_an_explicit_grad_sync_is_what_the_strategy_does(
    one_rank: DistInfo,
    one_node: None,
    monkeypatch: pytest.MonkeyPatch,
    strategy_id: str,
    grad_sync: str,
    every: bool,
    free_host: int,
) -> None:
    _host_memory(monkeypatch, free_host)  # memory does not matter once chosen
    _, chosen, reduces = _decision(strategy_id, one_rank, grad_sync)
    assert (chosen, reduces) == (every, every)


@pytest.mark.parametrize("strategy_id", FSDP_IDS)
@pytest.mark.parametrize("ranks_on_node", [1, 2])
@pytest.mark.parametrize("below", [0, 1])
def test_auto_grad_sync_under_fsdp_follows_the_memory_rule(
    one_rank: DistInfo,
    monkeypatch: pytest.MonkeyPatch,
    strategy_id: str,
    ranks_on_node: int,
    below: int,
) -> None:
    """With exactly 4x the FP32 gradients' bytes free per rank they fit (reduce once per step); one byte less per
    rank and they do not (every micro-batch). The node's memory is shared by its LOCAL_WORLD_SIZE ranks."""
    trainable = _trainable(strategy_id)
    free_host = ranks_on_node * (4 * 4 * trainable - below)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(ranks_on_node))
    _host_memory(monkeypatch, free_host)
    expected = _auto_rule(trainable, free_host, ranks_on_node)
    assert expected is bool(below)  # the two cases sit on either side of the threshold
    _, chosen, reduces = _decision(strategy_id, one_rank, "auto")
    assert (chosen, reduces) == (expected, expected)


def test_auto_grad_sync_under_ddp_reduces_once_per_step(
    one_rank: DistInfo, one_node: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    _host_memory(monkeypatch, 1)  # even with no memory left: DDP keeps whole gradients anyway
    _, chosen, reduces = _decision("ddp", one_rank, "auto")
    assert (chosen, reduces) == (False, False)


@pytest.mark.parametrize(("grad_sync", "every"), [("auto", True), ("micro-batch", True), ("step", False)])
def test_cpu_offload_auto_reduces_every_micro_batch(
    one_rank: DistInfo, monkeypatch: pytest.MonkeyPatch, grad_sync: str, every: bool
) -> None:
    """Under --vla.speed.cpu_offload `auto` keeps gradients sharded on the host whatever the memory (CPU offload itself
    needs CUDA, so only the decision is asked for, on a strategy built with the CUDA check bypassed)."""
    monkeypatch.setattr("prismatic.training.speed_plan.check_cpu_offload", lambda *args: None)
    _host_memory(monkeypatch, 10**15)
    vla = get_vla_config(VLA)
    vla.train_strategy, vla.speed.cpu_offload = "fsdp-full-shard", True
    vlm = build_vlm(BASE)
    strategy = get_train_strategy(vlm, vla, one_rank, grad_sync=grad_sync)
    assert strategy.choose_grad_sync() is every


# === Two ranks on two "nodes": the hybrid mesh ====================================================================

# (LOCAL_WORLD_SIZE, --sharding, strategy) -> what the mesh must be at world size 2.
MESH_CASES = {
    "two-nodes-auto": ("1", "auto", "fsdp-full-shard"),
    "two-nodes-hybrid-grad-op": ("1", "hybrid", "fsdp-shard-grad-op"),
    "two-nodes-full": ("1", "full", "fsdp-full-shard"),
    "one-node-auto": ("2", "auto", "fsdp-full-shard"),
    "one-node-hybrid": ("2", "hybrid", "fsdp-full-shard"),
}


def _worker(out_dir: Path) -> None:
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = {}
    for case, (local_world, sharding, strategy_id) in MESH_CASES.items():
        os.environ["LOCAL_WORLD_SIZE"] = local_world
        nodes = world // int(local_world)
        strategy = _built(strategy_id, DistInfo(rank, 0 if nodes > 1 else rank, world, nodes, CPU), sharding)
        results[case] = describe_fsdp(strategy.model)
        dist.barrier()
    results["lora-auto"] = _lora_auto_on_stand_in_gpus(rank, world)
    results["flow-bf16"] = _flow_head_fsdp_bf16_steps(rank, world)
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _lora_auto_on_stand_in_gpus(rank: int, world: int) -> dict[str, str]:
    """What `auto` picks for a LoRA run on two stand-in GPUs (the memory query answered per rank, no GPU touched):
    with room for DDP on both ranks, and with room on rank 0 alone (a 10 x 10 Linear: two replicas are 3,520
    bytes)."""
    vla = get_vla_config(VLA)
    vla.use_lora, vla.enable_mixed_precision_training = True, False
    model, gpu = torch.nn.Linear(10, 10), torch.device("cuda", 0)
    real = torch.cuda.mem_get_info
    picked = {}
    try:
        for case, free in (("room-on-both", (3_520, 3_520)), ("room-on-rank-0", (3_520, 3_519))):
            torch.cuda.mem_get_info = lambda device, free=free: (free[rank], 10**12)
            picked[case] = choose_train_strategy(vla, world, gpu, lambda: ddp_fits(model, False, gpu))
    finally:
        torch.cuda.mem_get_info = real
    return picked


def _flow_head_fsdp_bf16_steps(rank: int, world: int) -> dict[str, Any]:
    """The tiny flow preset under fsdp-full-shard with bf16 mixed precision and activation checkpointing, over both
    ranks: how its expert's blocks are built, and two training steps (the expert's gates and output start at zero,
    so the blocks get gradients from the second step on)."""
    from prismatic.training.metrics import StepMetrics
    from prismatic.training.model_setup import attach_action_head
    from prismatic.training.model_setup import build_vlm as build_run_vlm
    from prismatic.training.trainer import train_step

    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    torch.manual_seed(0)
    vla = get_vla_config("tiny-flow+mx-toy")
    vla.train_strategy, vla.enable_mixed_precision_training = "fsdp-full-shard", True
    vla.per_device_batch_size, vla.global_batch_size = 2, 2 * world
    vlm = build_run_vlm(vla, None)
    stats = {"synthetic": {"action": {"q01": [-1.0] * 7}, "proprio": {"q01": [0.0] * 8}}}
    head = attach_action_head(vlm, vla, stats)
    strategy = get_train_strategy(vlm, vla, DistInfo(rank, rank, world, 1, CPU))
    strategy.setup(2)
    blocks = list(vlm.action_head.get_blocks())
    params = [p for block in blocks for p in block.parameters()]
    gates = [block.modulation.weight.detach().full_tensor() for block in blocks]
    metrics = StepMetrics(["synthetic"], head, CPU)
    batches = iter([synthetic_batch(vlm, head, 2, seed=2 * step + rank) for step in range(2)])
    losses = [metrics.reduce(train_step(strategy, head, batches, metrics))["loss"] for _ in range(2)]
    return {
        "losses": losses,
        "units": [type(b).__name__ for b in blocks if isinstance(b, FSDPModule)],
        "param_dtype": [str(b._get_fsdp_state()._mp_policy.param_dtype) for b in blocks],
        "placements": sorted({str(p.placements) for p in params if isinstance(p, DTensor)}),
        "sharded_rows": all(p.to_local().shape[0] * world == p.shape[0] for p in params),
        "dtensors": all(isinstance(p, DTensor) for p in params),
        "gates_at_start": [float(g.abs().max()) for g in gates],
        "gates_after": [float(b.modulation.weight.detach().full_tensor().abs().max()) for b in blocks],
    }


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from train_runs import run_torchrun_worker

    out = tmp_path_factory.mktemp("strategy_builds")
    run_torchrun_worker(__file__, out, timeout=300)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_nodes_build_a_replicate_by_shard_mesh(two_ranks: list[dict[str, Any]]) -> None:
    """2 nodes x 1 rank: replicate across the nodes (size 2), shard within a node (size 1), in that order; each rank
    holds whole parameters and is its own node's only rank."""
    for case, reshard in (("two-nodes-auto", "reshard"), ("two-nodes-hybrid-grad-op", "keep")):
        for rank, results in enumerate(two_ranks):
            built = results[case]
            assert built["one_mesh"]
            assert built["mesh_dim_names"] == ["replicate", "shard"], case
            assert built["mesh_shape"] == [2, 1], case
            assert built["coordinate"] == [rank, 0], case
            assert (built["replicate_size"], built["shard_size"]) == (2, 1), case
            assert built["param_mesh_dim_names"] == ["replicate", "shard"], case
            assert built["placements"] == ["Replicate", "Shard"], case
            assert built["local_rows"] == built["rows"], case
            assert built["reshard"] == [reshard], case


@pytest.mark.parametrize("case", ["two-nodes-full", "one-node-auto", "one-node-hybrid"])
def test_full_sharding_spans_both_ranks_on_one_dimension(two_ranks: list[dict[str, Any]], case: str) -> None:
    """`--sharding full` on two nodes, and any sharding on one node: one `shard` dimension over both ranks, each
    holding half of a parameter's rows."""
    for rank, results in enumerate(two_ranks):
        built = results[case]
        assert (built["mesh_dim_names"], built["mesh_shape"]) == (["shard"], [2])
        assert built["coordinate"] == [rank]
        assert (built["shard_size"], built["replicate_size"]) == (2, None)
        assert built["placements"] == ["Shard"]
        assert built["local_rows"] * 2 == built["rows"]
        assert built["reshard"] == ["reshard"]


def test_auto_picks_ddp_for_lora_on_several_gpus_only_where_every_rank_has_room(
    two_ranks: list[dict[str, Any]],
) -> None:
    """The ranks agree: one rank short of memory sends both to FSDP2 (a rank alone under DDP would hang the other
    in its first collective)."""
    for results in two_ranks:
        assert results["lora-auto"] == {"room-on-both": "ddp", "room-on-rank-0": "fsdp-full-shard"}


def test_flow_expert_blocks_are_sharded_units_that_train_in_bf16(two_ranks: list[dict[str, Any]]) -> None:
    """The action head's blocks (`HeadModule.get_blocks`) are FSDP2 units of their own, checkpointed, computing in
    bf16, each parameter split in halves along dim 0; two bf16 steps give finite losses and move every block's
    gates off zero."""
    for results in two_ranks:
        built = results["flow-bf16"]
        # tiny-flow's expert has 2 blocks; activation checkpointing is on (the preset's default).
        assert built["units"] == ["FSDPCheckpointWrapper"] * 2
        assert built["param_dtype"] == ["torch.bfloat16"] * 2
        assert built["dtensors"] and built["sharded_rows"] and built["placements"] == ["(Shard(dim=0),)"]
        assert all(math.isfinite(loss) for loss in built["losses"]), built["losses"]
        assert built["gates_at_start"] == [0.0, 0.0] and all(g > 0 for g in built["gates_after"])


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))


def test_ddp_refuses_a_gpu_whose_free_memory_cannot_hold_the_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights in their dtype plus, per trainable parameter, an FP32 gradient and two FP32 AdamW moments."""
    from prismatic.training.strategies.ddp import check_replica_fits, replica_bytes
    from prismatic.util.errors import ConfigError

    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 2).to(torch.bfloat16))
    model[1].requires_grad_(False)
    need = 110 * 4 + 22 * 2 + 110 * 4 * 3  # FP32 layer: 110 params, trainable; bf16 layer: 22 params, frozen
    assert replica_bytes(model) == need == 1804
    check_replica_fits(model, torch.device("cpu"))  # CPU memory is not checked
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (need, 80 * 10**9))
    check_replica_fits(model, torch.device("cuda", 0))  # exactly fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (need - 1, 80 * 10**9))
    with pytest.raises(ConfigError, match=r"full replica .* on every GPU.*fsdp-full-shard"):
        check_replica_fits(model, torch.device("cuda", 0))


def test_each_strategy_class_knows_its_registered_name() -> None:
    """What an error names the strategy a run trained under (`auto` resolved): the registry's own name."""
    from prismatic.training.strategies import TRAIN_STRATEGIES

    for name in ("fsdp-full-shard", "fsdp-shard-grad-op", "ddp"):
        assert TRAIN_STRATEGIES.name_of(TRAIN_STRATEGIES.get_class(name)) == name
    assert TRAIN_STRATEGIES.name_of(dict) is None
