"""A GPU out of memory ends the run with one paragraph from the rank that met it (exit code 2, no traceback):
where, what the run trained with, torch's account, and the flags that lower the peak for that run."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from train_runs import run_train, tiny_args

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import get_vla_config
from prismatic.training.out_of_memory import out_of_memory_message
from prismatic.training.speed_plan import SpeedPlan

DOC = Path(__file__).resolve().parents[2] / "docs" / "common_errors.md"
TORCH_SAYS = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.19 GiB."


def _vla(**fields):
    vla = get_vla_config("tiny+mx-toy")
    for name, value in fields.items():
        setattr(vla, name, value)
    return vla


def _plan(vla, strategy: str, world: int, cuda_graphs: bool = False, checkpointing_policy: str | None = None):
    """What a run with `vla` trained as: under `strategy` on `world` GPUs, its checkpointing policy (`auto`: full
    unless given) and whether its blocks replayed CUDA graphs; `chosen_by_auto` the flags `vla` left at `auto`."""
    policy = checkpointing_policy or (
        vla.speed.checkpointing_policy if vla.speed.checkpointing_policy != "auto" else "full"
    )
    auto = tuple(
        name
        for name, value in (
            ("train_strategy", vla.train_strategy),
            ("checkpointing_policy", vla.speed.checkpointing_policy),
        )
        if value == "auto"
    )
    return SpeedPlan(
        device="cuda",
        world_size=world,
        grad_accumulation_steps=1,
        optimizer_impl="fused",
        logits_at_labels=True,
        causal_mask_only=True,
        overlap_steps=True,
        prefetch_batches=0,
        batched_grad_copy=True,
        train_strategy=strategy,
        sharding=None if strategy == "ddp" else "full",
        mixed_precision=True,
        compile_mode="reduce-overhead" if cuda_graphs else None,
        checkpointing_policy=policy if vla.enable_gradient_checkpointing else None,
        grad_sync="step",
        pad_to_multiple=8 if cuda_graphs else 1,
        chosen_by_auto=auto,
    )


def test_lora_under_ddp_on_eight_gpus_names_every_way_to_a_lower_peak() -> None:
    vla = _vla(use_lora=True, per_device_batch_size=16, global_batch_size=256)
    assert vla.train_strategy == "auto" and vla.enable_gradient_checkpointing
    plan = _plan(vla, "ddp", 8, cuda_graphs=True, checkpointing_policy="selective-ops")
    message = out_of_memory_message(TORCH_SAYS, 3, "after step 12", vla, plan)
    assert message == (
        "Rank 3 ran out of GPU memory after step 12, training under ddp (chosen by --vla.train_strategy auto) with "
        "--vla.per_device_batch_size 16, activation checkpointing selective-ops (chosen by "
        "--vla.speed.checkpointing_policy auto), blocks replayed from CUDA graphs. torch: "
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.19 GiB. To lower the "
        "peak: a smaller --vla.per_device_batch_size (gradient accumulation keeps --vla.global_batch_size 256); "
        "or --vla.speed.checkpointing_policy full (recomputes every layer, keeps the least); "
        "or --vla.train_strategy fsdp-full-shard (DDP keeps a full replica of the model on every GPU; FSDP2 "
        "shards it over the 8 GPUs); or --vla.speed.compile_mode default (CUDA graphs keep memory pools of their own)."
    )


@pytest.mark.parametrize(
    ("fields", "strategy", "world", "offered", "not_offered"),
    [
        # LoRA on one GPU under DDP: FSDP2 would hold the same there, so it is not offered.
        (
            {"use_lora": True, "per_device_batch_size": 1},
            "ddp",
            1,
            ["a GPU with more memory"],
            ["fsdp", "batch"],
        ),
        # A full fine-tune under DDP on one GPU: FSDP2 peaks lower.
        ({}, "ddp", 1, ["--vla.train_strategy fsdp-full-shard", "peaks lower"], ["cpu_offload"]),
        # FSDP2: offload is the next step; no checkpointing: turn it on.
        (
            {"enable_gradient_checkpointing": False},
            "fsdp-full-shard",
            4,
            [
                "--vla.speed.cpu_offload true",
                "--vla.enable_gradient_checkpointing true",
                "no activation checkpointing",
            ],
            ["--vla.train_strategy", "compile_mode"],
        ),
        (
            {"speed": SpeedConfig(checkpointing_policy="selective-ops")},
            "fsdp-full-shard",
            2,
            ["--vla.speed.checkpointing_policy full"],
            [],
        ),
        (
            {"speed": SpeedConfig(cpu_offload=True)},
            "fsdp-full-shard",
            2,
            ["per_device_batch_size"],
            ["--vla.speed.cpu_offload true"],
        ),
    ],
)
def test_only_the_flags_that_would_lower_this_runs_peak_are_offered(
    fields: dict, strategy: str, world: int, offered: list[str], not_offered: list[str]
) -> None:
    vla = _vla(**fields)
    message = out_of_memory_message(TORCH_SAYS, 0, "while setting up", vla, _plan(vla, strategy, world))
    assert message.startswith(f"Rank 0 ran out of GPU memory while setting up, training under {strategy}")
    for text in offered:
        assert text in message, text
    for text in not_offered:
        assert text not in message.split("To lower the peak:")[1], text


PLUGIN = textwrap.dedent(
    '''
    """Test plugin: the second optimizer step runs out of GPU memory (as a real one raises it, from inside)."""
    import torch

    import prismatic.training.trainer as trainer

    _real, _calls = trainer.train_step, []


    def _train_step(*args, **kwargs):
        _calls.append(1)
        if len(_calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.")
        return _real(*args, **kwargs)


    trainer.train_step = _train_step
    '''
)


def test_a_run_out_of_memory_exits_2_with_one_paragraph(toy_data_root: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "oom_plugin.py"
    plugin.write_text(PLUGIN)
    args = tiny_args(toy_data_root, tmp_path, "oom", "--plugins", str(plugin), "--vla.train_strategy", "ddp")
    args += ["--vla.expected_world_size", "1", "--vla.per_device_batch_size", "8"]
    proc = run_train(args, nproc=None)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: Rank 0 ran out of GPU memory after step 1, training under ddp with --vla.per_device_batch_size 8, "
        "activation checkpointing full (chosen by --vla.speed.checkpointing_policy auto). torch: CUDA out of memory. Tried to allocate 20.00 GiB. To lower the peak: "
        "a smaller --vla.per_device_batch_size (gradient accumulation keeps --vla.global_batch_size "
    ), line
    assert "or --vla.train_strategy fsdp-full-shard" in line  # a full fine-tune under DDP
    # The run folder says what every choice became (its config.yaml records `auto`): the named strategy, what
    # `auto` made of checkpointing, compiling and the speed switches on CPU, written before the first step.
    plan = json.loads((tmp_path / "oom" / "speed_plan.json").read_text())
    assert (plan["train_strategy"], plan["sharding"], plan["device"], plan["world_size"]) == (
        "ddp",
        None,
        "cpu",
        1,
    )
    assert (plan["checkpointing_policy"], plan["compile_mode"], plan["optimizer_impl"]) == (
        "full",
        None,
        "default",
    )
    assert not (plan["logits_at_labels"] or plan["causal_mask_only"] or plan["overlap_steps"])
    assert (plan["grad_sync"], plan["pad_to_multiple"], plan["grad_accumulation_steps"]) == ("step", 1, 2)
    assert "checkpointing_policy" in plan["chosen_by_auto"] and "train_strategy" not in plan["chosen_by_auto"]
    # docs/common_errors.md quotes what this message says.
    (row,) = [row for row in DOC.read_text().splitlines() if "ran out of GPU memory" in row]
    quoted = re.findall(r'"([^"]+)"', row.split("|")[2])
    assert len(quoted) == 3 and all(phrase in line for phrase in quoted), quoted
