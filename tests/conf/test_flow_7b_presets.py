"""The 7B flow presets carry π0's published LIBERO recipe on the OpenVLA-OFT LIBERO runs' data and inputs.

Source (the expected numbers below are copied from it, with file and line): Physical-Intelligence/openpi @
15a9616a00943ada6c20a0f158e3adb39df2ccac:
- CFG: src/openpi/training/config.py (`TrainConfig` and the `pi0_libero` entry);
- OPT: src/openpi/training/optimizer.py (`CosineDecaySchedule`, `AdamW`);
- PI0: src/openpi/models/pi0_config.py (`Pi0Config`), src/openpi/models/gemma.py (`gemma_300m`),
  src/openpi/models/pi0.py (`sample_actions`);
- POL: src/openpi/policies/libero_policy.py (`LiberoInputs`).
"""

from __future__ import annotations

import dataclasses

import pytest

from prismatic.conf.vla import get_vla_config

SUITES = ("spatial", "object", "goal", "10")
PI0_LIBERO = {
    "action_head": "flow",
    "chunk_size": 50,  # PI0 pi0_config.py L26 action_horizon: int = 50 (CFG L657 pi0_libero: Pi0Config())
    "use_lora": False,  # CFG L493 freeze_filter defaults to nnx.Nothing: pi0_libero trains every weight
    "max_steps": 30_000,  # CFG L676 num_train_steps=30_000
    "global_batch_size": 32,  # CFG L506 batch_size: int = 32 (pi0_libero keeps it)
    "learning_rate": 2.5e-5,  # OPT L20 peak_lr
    "lr_scheduler_type": "linear-warmup+cosine-decay",  # CFG L488 CosineDecaySchedule, OPT L24-31 warmup + cosine
    "weight_decay": 1e-10,  # OPT L73
    "max_grad_norm": 1.0,  # OPT L74 clip_gradient_norm
    "use_proprio": True,  # POL L57 "state": data["observation/state"]
    "num_images": 2,  # POL L59-60 base_0_rgb and left_wrist_0_rgb
}
WARMUP_STEPS = 1_000  # OPT L19 warmup_steps
# PI0 L22 action_expert_variant "gemma_300m" -> gemma.py L72-75 width 1024, depth 18, mlp_dim 4096, num_heads 8;
# pi0.py L222 sample_actions(..., num_steps=10).
PI0_EXPERT = {"width": 1024, "depth": 18, "num_heads": 8, "mlp_ratio": 4096 / 1024, "num_steps": 10}


@pytest.mark.parametrize("suite", SUITES)
def test_libero_flow_presets_carry_pi0_s_recipe(suite: str) -> None:
    vla = get_vla_config(f"openvla-flow-7b+libero_{suite}")
    assert {name: getattr(vla, name) for name in PI0_LIBERO} == PI0_LIBERO
    assert dataclasses.asdict(vla.head.flow) == PI0_EXPERT
    assert round(vla.warmup_ratio * vla.max_steps) == WARMUP_STEPS
    assert vla.grad_accumulation_steps(world_size=8) == 1  # 8 GPUs x 4 samples: openpi's 32 in one step
    # The OFT run's data and base model (openpi has one recipe for every LIBERO suite).
    oft = get_vla_config(f"openvla-oft-7b+libero_{suite}")
    assert (vla.data_mix, vla.base_vlm, vla.image_aug) == (
        f"libero_{suite}_no_noops",
        "openvla/openvla-7b",
        True,
    )
    assert (vla.shuffle_buffer_size, vla.expected_world_size) == (
        oft.shuffle_buffer_size,
        oft.expected_world_size,
    )


def test_the_metaworld_flow_preset_is_the_libero_one_on_mt50_with_one_camera() -> None:
    preset = dataclasses.asdict(get_vla_config("openvla-flow-7b+metaworld_mt50"))
    recipe = dataclasses.asdict(get_vla_config("openvla-flow-7b+libero_spatial"))
    differing = {k: preset[k] for k in preset if k != "vla_id" and preset[k] != recipe[k]}
    assert differing == {"data_mix": "metaworld_mt50", "num_images": 1}
