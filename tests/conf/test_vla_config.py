"""The VLA experiment registry and TrainConfig validation."""

from __future__ import annotations

from pathlib import Path

import draccus
import pytest

from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import TRAIN_STRATEGIES, VLAConfig, get_vla_config, register_vla, registered_vla_ids
from prismatic.training.run_folder import resume_point
from prismatic.util.errors import ConfigError


def test_openvla_published_experiments_carry_published_values():
    ids = set(registered_vla_ids())
    for vla_id in [
        "siglip-224px+mx-bridge",
        "siglip-224px-icy+mx-bridge",
        "prism-dinosiglip-224px+mx-bridge",
        "siglip-224px+mx-oxe-magic-soup",
        "prism-dinosiglip-224px+mx-oxe-magic-soup-plus",
        "siglip-224px+mx-tdroid_carrot_in_bowl",
        "siglip-224px-last_layer+mx-tdroid_carrot_in_bowl",
        "siglip-224px-sandwich+mx-tdroid_carrot_in_bowl",
        "siglip-224px+mx-droid_wipe",
    ]:
        assert vla_id in ids
    openvla = get_vla_config("prism-dinosiglip-224px+mx-oxe-magic-soup-plus")
    assert (openvla.base_vlm, openvla.data_mix) == ("prism-dinosiglip-224px+7b", "oxe_magic_soup_plus_minus")
    assert (openvla.expected_world_size, openvla.global_batch_size, openvla.per_device_batch_size) == (
        64,
        2048,
        32,
    )
    assert (openvla.learning_rate, openvla.lr_scheduler_type, openvla.shuffle_buffer_size) == (
        2e-5,
        "constant",
        256_000,
    )
    assert openvla.stage == "vla-full-train"
    assert get_vla_config("siglip-224px-icy+mx-bridge").stage == "vla-train"
    assert get_vla_config("siglip-224px-sandwich+mx-tdroid_carrot_in_bowl").stage == "vla-sandwich-train"
    assert get_vla_config("siglip-224px-last_layer+mx-tdroid_carrot_in_bowl").stage == "vla-last-layer-train"


def test_cli_selects_preset_and_overrides():
    cfg = draccus.parse(
        TrainConfig, args=["--vla.type", "tiny+mx-toy", "--vla.max_steps", "5", "--seed", "3"]
    )
    assert cfg.vla.vla_id == "tiny+mx-toy" and cfg.vla.max_steps == 5 and cfg.seed == 3
    assert cfg.vla.base_vlm == "tiny-vit+tiny-llama"


def test_config_path_yaml(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("vla:\n  type: tiny-icy+mx-toy\n  learning_rate: 0.01\nsave_interval: 7\n")
    cfg = draccus.parse(TrainConfig, config_path=str(path), args=[])
    assert cfg.vla.vla_id == "tiny-icy+mx-toy" and cfg.vla.learning_rate == 0.01 and cfg.save_interval == 7
    assert cfg.vla.freeze_vision_backbone is True


def test_duplicate_and_bad_presets_are_refused():
    with pytest.raises(ValueError, match="registered twice"):
        register_vla("tiny+mx-toy", learning_rate=1.0)
    with pytest.raises(ValueError, match="unknown fields"):
        register_vla("tiny-typo", "tiny+mx-toy", learning_rat=1.0)


def test_unknown_vla_id_suggests_closest():
    with pytest.raises(ConfigError, match=r"Unknown vla id 'tiny\+mx-tyo'.*Did you mean 'tiny\+mx-toy'"):
        get_vla_config("tiny+mx-tyo")


def test_both_frozen_without_last_layer_is_an_error():
    vla = get_vla_config("tiny+mx-toy")
    vla.freeze_vision_backbone = vla.freeze_llm_backbone = True
    with pytest.raises(ConfigError, match="unfreeze_last_llm_layer"):
        _ = vla.stage


def test_world_size_and_batch_checks():
    vla = get_vla_config("tiny+mx-toy")
    with pytest.raises(ConfigError, match="expected_world_size=2.*world_size=4"):
        vla.validate(world_size=4)
    assert vla.grad_accumulation_steps(world_size=2) == 1
    vla.global_batch_size = 32
    assert vla.grad_accumulation_steps(world_size=2) == 2
    vla.global_batch_size = 20
    with pytest.raises(ConfigError, match="global_batch_size=20"):
        vla.validate(world_size=2)
    vla = get_vla_config("tiny+mx-toy")
    vla.lr_scheduler_type = "cosine"
    with pytest.raises(ConfigError, match="Unknown lr_scheduler_type 'cosine'"):
        vla.validate(world_size=2)


def test_strategy_names_match_strategy_registry():
    from prismatic.training.strategies import TRAIN_STRATEGIES as REGISTRY

    assert set(TRAIN_STRATEGIES) == set(REGISTRY)


def test_train_strategy_auto_is_the_default_and_refuses_no_offload():
    """`auto` is what a preset and a bare VLAConfig get (OpenVLA's fsdp-full-shard wherever it has several GPUs:
    tests/training/test_strategy_builds.py); CPU offload takes it (it picks FSDP then) and refuses ddp, naming the
    strategies that can offload."""
    assert VLAConfig().train_strategy == "auto"
    assert get_vla_config("prism-dinosiglip-224px+mx-oxe-magic-soup-plus").train_strategy == "auto"
    assert get_vla_config("openvla-7b+libero_spatial").train_strategy == "ddp"  # OpenVLA's LIBERO recipe: DDP
    vla = get_vla_config("tiny+mx-toy")
    vla.speed.cpu_offload = True
    vla.check_values()
    vla.train_strategy = "ddp"
    with pytest.raises(ConfigError) as err:
        vla.check_values()
    assert str(err.value) == (
        "--vla.speed.cpu_offload true needs an FSDP strategy (FSDP2's offload policy), not --vla.train_strategy ddp. "
        "Valid choices with offload: auto (it picks FSDP then), fsdp-full-shard, fsdp-shard-grad-op."
    )
    vla = get_vla_config("tiny+mx-toy")
    vla.train_strategy = "fsdp"
    with pytest.raises(
        ConfigError, match=r"Unknown train_strategy 'fsdp'.*auto, fsdp-full-shard, fsdp-shard-grad-op, ddp"
    ):
        vla.check_values()


def test_resume_point_validates_file_name(tmp_path: Path):
    ckpt = tmp_path / "checkpoints" / "step-000010-epoch-01-loss=1.2345.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"x")
    cfg = TrainConfig(vla=VLAConfig.get_choice_class("tiny+mx-toy")(), pretrained_checkpoint=ckpt)
    cfg.resume_step, cfg.resume_epoch = 10, 1
    point = resume_point(cfg)
    assert (point.path, point.step, point.epoch, point.sharded) == (ckpt, 10, 1, False)
    assert cfg.resolve_run_id(num_nodes=1) == tmp_path.name
    assert cfg.resolve_run_dir(num_nodes=1) == tmp_path.resolve()
    cfg.resume_step = 11
    with pytest.raises(ConfigError, match="--resume_step 11.*step 10"):
        resume_point(cfg)
    cfg.is_resume = False
    assert resume_point(cfg) is None


def test_resume_flag_finds_the_newest_complete_checkpoint_folder(tmp_path: Path):
    run_dir = tmp_path / "runs" / "r"
    cfg = TrainConfig(vla=VLAConfig.get_choice_class("tiny+mx-toy")(), resume="latest")
    with pytest.raises(
        ConfigError, match="--resume found no complete checkpoint of run 'r'.*without --resume"
    ):
        resume_point(cfg, run_dir)
    for step, complete in ((20, True), (40, True), (60, False)):
        folder = run_dir / "checkpoints" / f"step-{step:06d}-epoch-01"
        folder.mkdir(parents=True)
        if complete:
            (folder / ".metadata").write_bytes(b"")
            (folder / "train_state.json").write_text(f'{{"step": {step}, "epoch": 1}}')
    point = resume_point(cfg, run_dir)
    assert (point.path.name, point.step, point.epoch, point.sharded) == ("step-000040-epoch-01", 40, 1, True)
    cfg.resume_step = 20
    with pytest.raises(ConfigError, match="do not match checkpoint 'step-000040-epoch-01'"):
        resume_point(cfg, run_dir)
    with pytest.raises(ConfigError, match="not a complete checkpoint folder"):
        resume_point(TrainConfig(resume=str(run_dir / "checkpoints" / "step-000060-epoch-01")))
    with pytest.raises(ConfigError, match="both name what to start from"):
        TrainConfig(resume="latest", pretrained_checkpoint=tmp_path)


def test_lora_fields_and_validation():
    cfg = draccus.parse(
        config_class=TrainConfig,
        args=[
            "--vla.type",
            "tiny-lora+mx-toy",
            "--vla.lora_rank",
            "4",
            "--vla.lora_target_modules",
            "q_proj,v_proj",
        ],
    )
    assert cfg.vla.use_lora and cfg.vla.lora_rank == 4 and cfg.vla.lora_alpha == 16.0
    settings = cfg.vla.lora_settings()
    assert (settings.rank, settings.resolved_alpha, settings.target_modules) == (4, 16.0, "q_proj,v_proj")
    assert get_vla_config("tiny+mx-toy").lora_settings() is None
    assert get_vla_config("siglip-224px+mx-bridge").lora_target_modules == "all-linear"
    bad = get_vla_config("tiny-lora+mx-toy")
    bad.lora_rank = 0
    with pytest.raises(ConfigError, match="lora_rank=0"):
        bad.validate(2)


def test_base_vlm_may_be_a_path(tmp_path: Path):
    cfg = draccus.parse(
        config_class=TrainConfig, args=["--vla.type", "tiny+mx-toy", "--vla.base_vlm", str(tmp_path)]
    )
    assert cfg.vla.base_vlm == str(tmp_path)
