"""Exact resume with randomness in the step: dropout in the ViT and the LLM, LoRA dropout, image augmentation and
gradient accumulation, with bf16 mixed precision, under torchrun with 2 processes on CPU.

tests/test_resume_e2e.py resumes a model without dropout, so it cannot tell whether the checkpoint's per-rank RNG
states (`RNGState`) are restored at the right moment. Here every micro-batch draws dropout masks from the torch
generator: a resumed run reproduces the uninterrupted one bit for bit (`==`) only if the generator continues
exactly where the saved run left it. The model and experiment come from a plugin file, the user's own path.
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from train_runs import (
    assert_same_training_curve,
    checkpoints,
    consolidated,
    parameter_memory_line,
    run_train,
    tiny_args,
)

from prismatic.training.trackers import read_metrics

VLA_ID = "tiny-dropout-lora+mx-toy"
BASE_VLM_ID = "tiny-vit-dropout+tiny-llama-dropout"
DROPOUT = 0.1
STEPS, SAVE_EVERY = 4, 2

PLUGIN = textwrap.dedent(
    f'''
    """Test plugin: the tiny base VLM with dropout in the ViT and the LLM, and a LoRA experiment with LoRA dropout."""

    import dataclasses

    from prismatic.conf.vla import register_vla
    from prismatic.models.backbones.llm.registry import LLM_BACKBONES, register_llm_backbone
    from prismatic.models.backbones.vision.registry import VISION_BACKBONES, register_vision_backbone
    from prismatic.models.registry import BaseVLMSpec, register_base_vlm

    llm = LLM_BACKBONES["tiny-llama"]
    register_llm_backbone(
        "tiny-llama-dropout", dataclasses.replace(llm, config={{**llm.config, "attention_dropout": {DROPOUT}}})
    )
    vit = VISION_BACKBONES["tiny-vit-64px"]
    drop_rates = {{"pos_drop_rate": {DROPOUT}, "attn_drop_rate": {DROPOUT}, "proj_drop_rate": {DROPOUT}}}
    register_vision_backbone(
        "tiny-vit-dropout-64px",
        dataclasses.replace(
            vit, vit=dataclasses.replace(vit.vit, arch_overrides={{**vit.vit.arch_overrides, **drop_rates}})
        ),
    )
    register_base_vlm(
        "{BASE_VLM_ID}", BaseVLMSpec("tiny-vit-dropout-64px", "tiny-llama-dropout", "gelu-mlp", "resize-naive")
    )
    register_vla("{VLA_ID}", "tiny-lora+mx-toy", base_vlm="{BASE_VLM_ID}", lora_dropout={DROPOUT})
    '''
)


@pytest.fixture
def plugin(tmp_path: Path) -> Path:
    path = tmp_path / "dropout_plugin.py"
    path.write_text(PLUGIN)
    return path


def assert_dropout_is_active(plugin: Path) -> None:
    """Each source of randomness the plugin adds is live in train mode (the ViT's and the LLM's dropout, then LoRA
    dropout alone) and off in eval mode: without it the resume below would prove nothing about RNG states."""
    from prismatic.conf import vla as vla_module
    from prismatic.conf.vla import VLAConfig, get_vla_config
    from prismatic.models import BASE_VLMS, LLM_BACKBONES, VISION_BACKBONES, build_vlm
    from prismatic.models.lora import apply_lora
    from prismatic.models.registry import import_plugins

    # The registries are restored afterwards: other tests enumerate them.
    registries = (BASE_VLMS, LLM_BACKBONES, VISION_BACKBONES, vla_module._PRESETS, VLAConfig._choice_registry)
    saved = [dict(registry) for registry in registries]
    modules_before = set(sys.modules)
    try:
        import_plugins(["--plugins", str(plugin)])
        cfg = get_vla_config(VLA_ID)
        torch.manual_seed(0)
        vlm = build_vlm(cfg.base_vlm)
    finally:
        for registry, before in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(before)
        for name in set(sys.modules) - modules_before:
            if name.startswith("prismatic_plugin_"):
                del sys.modules[name]
    assert cfg.use_lora and cfg.lora_dropout == DROPOUT and cfg.base_vlm == BASE_VLM_ID
    assert vlm.llm_backbone.llm.config.attention_dropout == DROPOUT

    pixels = torch.randn(2, *vlm.vision_backbone.default_image_resolution, generator=torch.Generator())
    input_ids = vlm.llm_backbone.tokenizer(["In: push the can\nOut: "], return_tensors="pt").input_ids
    vit, llm = vlm.vision_backbone, vlm.llm_backbone.llm

    def random_twice() -> tuple[bool, bool]:
        with torch.no_grad():
            return (
                not torch.equal(vit(pixels), vit(pixels)),
                not torch.equal(llm(input_ids).logits, llm(input_ids).logits),
            )

    assert random_twice() == (True, True)  # built in train mode, no LoRA yet: the models' own dropout
    vlm.freeze_backbones(cfg.stage)
    apply_lora(vlm, cfg.lora_settings())
    vlm.eval()
    assert random_twice() == (False, False)
    lora_dropouts = [
        m for n, m in vlm.named_modules() if ".lora_dropout." in n and isinstance(m, torch.nn.Dropout)
    ]
    assert lora_dropouts and {m.p for m in lora_dropouts} == {DROPOUT}
    for module in lora_dropouts:
        module.train()
    # lora_B starts at zero, so the adapters' dropout only shows once B has trained: give B values.
    with torch.no_grad():
        for name, param in vlm.named_parameters():
            if ".lora_B." in name:
                param.normal_(generator=torch.Generator().manual_seed(0))
    assert random_twice() == (True, True)


def train_args(data_root: Path, run_root: Path, plugin: Path, *extra: str) -> list[str]:
    """The plugin's experiment, 4 steps of 16 frames as 2 micro-batches of 4 on each of 2 processes, augmented
    images, bf16 mixed precision (frozen base weights stored in bf16 beside FP32 adapters, as OpenVLA trains LoRA),
    a checkpoint every 2 steps."""
    args = tiny_args(data_root, run_root, "dropout", "--plugins", str(plugin), *extra)
    args[args.index("--vla.type") + 1] = VLA_ID
    args[args.index("--vla.max_steps") + 1] = str(STEPS)
    args[args.index("--save_interval") + 1] = str(SAVE_EVERY)
    args += ["--image_aug", "true", "--vla.enable_mixed_precision_training", "true"]
    return [*args, "--vla.global_batch_size", "16", "--vla.per_device_batch_size", "4"]


def test_resume_with_dropout_lora_dropout_image_aug_and_accumulation_is_bit_identical(
    plugin: Path, toy_data_root: Path, tmp_path: Path
):
    """Uninterrupted 4 steps vs resumed at step 2 in a copy of the run folder that holds no later checkpoint: the
    same training metrics (`==`), final weights and AdamW moments (`torch.equal`)."""
    with torch.random.fork_rng():  # the check draws from torch's global generator: leave it as it was
        assert_dropout_is_active(plugin)

    proc = run_train(train_args(toy_data_root, tmp_path / "full", plugin))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "Gradient accumulation over 2 micro-batches" in proc.stderr, proc.stderr[-3000:]
    memory = parameter_memory_line(proc.stderr)
    assert "bfloat16" in memory and "float32" in memory, memory  # frozen base in bf16, adapters in FP32
    run = tmp_path / "full" / "dropout"
    assert sorted(checkpoints(run)) == [2, 4]
    config = json.loads((run / "config.json").read_text())
    assert config["image_aug"] is True
    assert (config["vla"]["type"], config["vla"]["lora_dropout"]) == (VLA_ID, DROPOUT)

    resumed = tmp_path / "resumed" / "dropout"
    shutil.copytree(run, resumed)
    shutil.rmtree(checkpoints(resumed)[4])
    args = train_args(toy_data_root, tmp_path / "resumed", plugin, "--resume", str(checkpoints(resumed)[2]))
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    for line in ("and RNG states", "(snapshot)", f"Training steps {SAVE_EVERY + 1} to {STEPS}"):
        assert line in proc.stderr, (line, proc.stderr[-3000:])

    full, again = read_metrics(run), read_metrics(resumed)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1))
    assert_same_training_curve(full, again)
    end_full = consolidated(checkpoints(run)[STEPS], tmp_path / "full")
    end_again = consolidated(checkpoints(resumed)[STEPS], tmp_path / "resumed")
    assert end_full["optimizer"]["state"]
    for name, moments in end_full["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(end_again["optimizer"]["state"][name][key], moments[key]), (name, key)
    assert end_full["model"].keys() == end_again["model"].keys()
    for key, value in end_full["model"].items():
        assert torch.equal(end_again["model"][key], value), key
