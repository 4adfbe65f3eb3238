"""The speed plan (`prismatic.training.speed_plan`): one resolver for every `auto`, in two phases, whose plan is what
the strategy trains by and what the run folder records. The choices' own rules are tested where their effect is
(test_speed_options, test_strategy_builds, test_compile_modes, test_activation_memory); here: the phases agree,
the first refuses before any model exists, a compiler that cannot run changes the plan as it changes the run, and
the plan is plain JSON data."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from prismatic.conf.vla import get_vla_config
from prismatic.models import build_vlm
from prismatic.models.action_heads import ActionSpec
from prismatic.training.speed_plan import SpeedPlan, plan_flags, resolve_speed_plan, without_compile
from prismatic.training.strategies import build_strategy
from prismatic.util.dist import DistInfo
from prismatic.util.errors import ConfigError

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)
ONE_CPU = DistInfo(0, 0, 1, 1, CPU)


def _plan(**fields: object) -> SpeedPlan:
    """A DDP plan replaying CUDA graphs, gradients reduced every micro-batch because `auto` chose so."""
    values: dict[str, object] = {
        "device": "cuda",
        "world_size": 1,
        "grad_accumulation_steps": 2,
        "optimizer_impl": "fused",
        "logits_at_labels": True,
        "causal_mask_only": True,
        "overlap_steps": True,
        "prefetch_batches": 0,
        "batched_grad_copy": True,
        "train_strategy": "ddp",
        "sharding": None,
        "mixed_precision": True,
        "compile_mode": "reduce-overhead",
        "checkpointing_policy": "selective-ops",
        "grad_sync": "micro-batch",
        "pad_to_multiple": 8,
        "chosen_by_auto": ("train_strategy", "compile_mode", "grad_sync"),
    }
    return SpeedPlan(**{**values, **fields})


def test_the_first_phase_refuses_before_any_model_and_the_second_keeps_its_choices() -> None:
    """CPU offload on a CPU and CUDA graphs under FSDP2 are refused from the flags alone; on CPU every `auto` speed
    switch is off and the strategy is FSDP2 with full sharding, and the second phase keeps what the first decided."""
    vla = get_vla_config("tiny+mx-toy")
    vla.speed.cpu_offload = True
    with pytest.raises(ConfigError, match="--vla.speed.cpu_offload true needs CUDA GPUs"):
        plan_flags(vla, 1, CPU)
    vla = get_vla_config("tiny+mx-toy")
    vla.train_strategy, vla.speed.compile, vla.speed.compile_mode = "fsdp-full-shard", "on", "reduce-overhead"
    with pytest.raises(ConfigError, match="the strategy is fsdp-full-shard, which frees and re-gathers"):
        plan_flags(vla, 1, CUDA)
    vla = get_vla_config("tiny+mx-toy")
    flags = plan_flags(vla, 1, CPU)
    assert (flags.device, flags.grad_accumulation_steps, flags.optimizer_impl) == ("cpu", 2, "default")
    assert not (
        flags.logits_at_labels or flags.causal_mask_only or flags.overlap_steps or flags.batched_grad_copy
    )
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.attach_action_modules(ActionSpec())
    plan = resolve_speed_plan(vla, vlm, ONE_CPU, flags=flags)
    assert {k: v for k, v in dataclasses.asdict(plan).items() if k in dataclasses.asdict(flags)} == (
        dataclasses.asdict(flags)
    )
    assert (plan.train_strategy, plan.sharding, plan.compile_mode, plan.checkpointing_policy) == (
        "fsdp-full-shard",
        "full",
        None,
        "full",
    )
    assert plan.pad_to_multiple == 1 and plan.mixed_precision is False  # the tiny preset trains in FP32
    assert {"train_strategy", "checkpointing_policy", "compile", "grad_sync"} <= set(plan.chosen_by_auto)
    strategy = build_strategy(vlm, vla, ONE_CPU, plan)
    assert strategy.plan is plan and type(strategy).__name__ == "FSDPStrategy"


def test_a_compiler_that_cannot_run_leaves_the_blocks_eager_in_the_plan() -> None:
    """Without compiling there are no CUDA graphs to keep gradients out of: `auto` then reduces once per step, as
    without graphs from the start; a `--grad_sync micro-batch` the user gave stays, and so does the batch-length
    multiple (the data may already be made with it)."""
    eager = without_compile(_plan())
    assert (eager.compile_mode, eager.cuda_graphs, eager.grad_sync, eager.pad_to_multiple) == (
        None,
        False,
        "step",
        8,
    )
    given = without_compile(_plan(chosen_by_auto=("train_strategy", "compile_mode")))
    assert given.grad_sync == "micro-batch"
    fsdp = without_compile(_plan(train_strategy="fsdp-full-shard", sharding="full", compile_mode="default"))
    assert (fsdp.compile_mode, fsdp.grad_sync) == (None, "micro-batch")  # FSDP's rule never read the graphs


def test_the_plan_is_plain_json_data() -> None:
    plan = _plan()
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["chosen_by_auto"] == ["train_strategy", "compile_mode", "grad_sync"]
    assert SpeedPlan(**{**data, "chosen_by_auto": tuple(data["chosen_by_auto"])}) == plan
