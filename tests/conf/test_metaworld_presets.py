"""The Meta-World presets: the 7B ones are OpenVLA's and OpenVLA-OFT's LIBERO recipes on MT50's demonstrations (one
camera), the tiny ones what `make demo` trains; every one reads the dataset `collect_demos.py --task_suite MT50`
writes, whose statistics `eval_sim.py --benchmark metaworld` then finds."""

from __future__ import annotations

import dataclasses

import pytest

from prismatic.conf.vla import get_vla_config
from prismatic.sim.metaworld.benchmark import BENCHMARK, default_dataset_name

# What may differ from the LIBERO-Spatial recipe a preset copies (everything else must be equal).
MT50_CHANGES = {
    "openvla-7b+metaworld_mt50": ("openvla-7b+libero_spatial", {"data_mix": "metaworld_mt50"}),
    "openvla-oft-7b+metaworld_mt50": (
        "openvla-oft-7b+libero_spatial",
        {"data_mix": "metaworld_mt50", "num_images": 1},  # Meta-World renders one camera (corner2)
    ),
}


@pytest.mark.parametrize("vla_id", sorted(MT50_CHANGES))
def test_7b_presets_are_the_libero_recipes_on_mt50(vla_id: str) -> None:
    recipe_id, changes = MT50_CHANGES[vla_id]
    preset, recipe = dataclasses.asdict(get_vla_config(vla_id)), dataclasses.asdict(get_vla_config(recipe_id))
    differing = {k: preset[k] for k in preset if k != "vla_id" and preset[k] != recipe[k]}
    assert differing == changes


def test_tiny_presets_learn_on_two_cpu_processes() -> None:
    oft, tokens = get_vla_config("tiny-oft+metaworld"), get_vla_config("tiny+metaworld")
    assert (oft.action_head, oft.chunk_size, oft.use_proprio, oft.num_images) == ("l1-chunk", 8, True, 1)
    assert (tokens.action_head, tokens.chunk_size, tokens.use_proprio, tokens.num_images) == (
        "tokens",
        1,
        False,
        1,
    )
    for cfg in (oft, tokens):
        assert cfg.base_vlm == "tiny-vit+tiny-llama" and not cfg.use_lora and not cfg.image_aug
        assert (cfg.expected_world_size, cfg.per_device_batch_size, cfg.global_batch_size) == (2, 16, 32)
        assert cfg.grad_accumulation_steps(2) == 1
        assert cfg.train_strategy == "auto"  # the CPU's choice (FSDP2 on gloo), not the 7B recipe's DDP


@pytest.mark.parametrize(
    "vla_id",
    ["openvla-7b+metaworld_mt50", "openvla-oft-7b+metaworld_mt50", "tiny-oft+metaworld", "tiny+metaworld"],
)
def test_presets_read_what_collect_demos_writes_and_eval_finds(vla_id: str) -> None:
    data_mix = get_vla_config(vla_id).data_mix
    assert data_mix == default_dataset_name("MT50") == "metaworld_mt50"
    # A run trained on it carries that key; the evaluation of suite MT50 picks it among others.
    assert BENCHMARK.unnorm_key("MT50", ["bridge_orig", data_mix]) == data_mix
