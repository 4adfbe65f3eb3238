"""The FAST presets: the tiny ones are the tiny OFT ones with the FAST head (its options reaching the action spec
and yielding to a flag); the 7B ones are openpi's `pi0_fast_libero` recipe, each number pinned to its source."""

from __future__ import annotations

import dataclasses

import pytest

from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import get_vla_config
from prismatic.util.cli import parse_config

TINY_FAST = {"vocab_size": 512, "scale": 10.0, "fit_chunks": 1_000, "max_decode_tokens": 64}
FAST_OF = {"tiny-fast+mx-toy": "tiny-oft+mx-toy", "tiny-fast+metaworld": "tiny-oft+metaworld"}
SUITES = ("spatial", "object", "goal", "10")


@pytest.mark.parametrize("vla_id", sorted(FAST_OF))
def test_a_tiny_fast_preset_is_its_oft_preset_with_the_fast_head(vla_id: str) -> None:
    preset = dataclasses.asdict(get_vla_config(vla_id))
    oft = dataclasses.asdict(get_vla_config(FAST_OF[vla_id]))
    assert {k for k in preset if k != "vla_id" and preset[k] != oft[k]} == {"action_head", "head"}
    assert preset["action_head"] == "fast" and preset["head"] == {**oft["head"], "fast": TINY_FAST}


@pytest.mark.parametrize("vla_id", sorted(FAST_OF))
def test_the_preset_s_options_reach_the_action_spec_and_a_flag_overrides_one(vla_id: str) -> None:
    from prismatic.training.model_setup import action_spec

    stats = {"a": {"action": {"q01": [0.0] * 4}, "proprio": {"q01": [0.0] * 8}}}
    spec = action_spec(parse_config(TrainConfig, ["--vla.type", vla_id]).vla, stats)
    assert (spec.head, spec.chunk_size, spec.action_dim, dict(spec.head_options)) == ("fast", 8, 4, TINY_FAST)
    cfg = parse_config(TrainConfig, ["--vla.type", vla_id, "--vla.head.fast.fit_chunks", "64"])
    assert dict(action_spec(cfg.vla, stats).head_options) == {**TINY_FAST, "fit_chunks": 64}


@pytest.mark.parametrize("suite", SUITES)
def test_the_7b_libero_presets_are_openpi_s_pi0_fast_libero_recipe(suite: str) -> None:
    cfg = get_vla_config(f"openvla-fast-7b+libero_{suite}")
    # openpi src/openpi/training/config.py `pi0_fast_libero`: Pi0FASTConfig(action_dim=7, action_horizon=10), full
    # fine-tuning (no LoRA freeze filter), 30_000 steps, TrainConfig.batch_size 32; optimizer.py: AdamW weight
    # decay 1e-10, clip 1.0, CosineDecaySchedule warmup 1_000 steps to peak 2.5e-5; base and wrist cameras, state.
    assert (cfg.action_head, cfg.chunk_size, cfg.use_proprio, cfg.num_images) == ("fast", 10, True, 2)
    assert (cfg.use_lora, cfg.max_steps, cfg.global_batch_size) == (False, 30_000, 32)
    assert (cfg.learning_rate, cfg.weight_decay, cfg.max_grad_norm) == (2.5e-5, 1e-10, 1.0)
    assert cfg.lr_scheduler_type == "linear-warmup+cosine-decay"
    assert round(cfg.warmup_ratio * cfg.max_steps) == 1_000
    assert cfg.global_batch_size == cfg.per_device_batch_size * cfg.expected_world_size  # no accumulation
    assert cfg.data_mix == f"libero_{suite}_no_noops" and cfg.base_vlm == "openvla/openvla-7b"
    # The FAST tokenizer's defaults (physical-intelligence/fast: 1024 ids, scale 10); pi0_fast's 256 decode steps.
    head = dataclasses.asdict(cfg.head.fast)
    assert (head["vocab_size"], head["scale"], head["max_decode_tokens"]) == (1024, 10.0, 256)


def test_the_7b_metaworld_preset_is_the_libero_recipe_on_mt50_with_one_camera() -> None:
    libero = dataclasses.asdict(get_vla_config("openvla-fast-7b+libero_spatial"))
    metaworld = dataclasses.asdict(get_vla_config("openvla-fast-7b+metaworld_mt50"))
    assert {k for k in libero if k != "vla_id" and libero[k] != metaworld[k]} == {"data_mix", "num_images"}
    assert (metaworld["data_mix"], metaworld["num_images"]) == ("metaworld_mt50", 1)
