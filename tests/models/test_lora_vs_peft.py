"""The LoRA flags a user passes (`--vla.lora_rank / lora_alpha / lora_dropout / lora_target_modules`) reach peft:
our `apply_lora` on the tiny VLM is compared with a reference built by peft directly (`LoraConfig` +
`inject_adapter_in_model`, what `apply_lora` calls) from settings and module names written here by hand."""

from __future__ import annotations

import pytest
import torch

from prismatic.conf.vla import VLAConfig
from prismatic.models import build_vlm
from prismatic.models.lora import apply_lora

LLM = "llm_backbone.llm.model.layers"
# --vla.lora_target_modules v_proj,down_proj,fc1,projector.2 under full fine-tuning: the tiny ViT's third block is
# past the feature layer (frozen, never run), so only blocks 0 and 1 get an fc1 adapter.
SUFFIX_TARGETS = [
    "vision_backbone.featurizer.blocks.0.mlp.fc1",
    "vision_backbone.featurizer.blocks.1.mlp.fc1",
    "projector.projector.2",
    f"{LLM}.0.self_attn.v_proj",
    f"{LLM}.0.mlp.down_proj",
    f"{LLM}.1.self_attn.v_proj",
    f"{LLM}.1.mlp.down_proj",
]
# "all-linear" with the vision backbone frozen (OpenVLA's LoRA recipe): every projector and LLM Linear but lm_head.
ALL_LINEAR_TARGETS = ["projector.projector.0", "projector.projector.2"] + [
    f"{LLM}.{i}.{name}"
    for i in (0, 1)
    for name in (
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "self_attn.o_proj",
        "mlp.gate_proj",
        "mlp.up_proj",
        "mlp.down_proj",
    )
]


def _tiny(stage: str):
    torch.manual_seed(11)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones(stage)
    return vlm


def _lora_layers(vlm) -> dict:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in vlm.named_modules() if isinstance(m, LoraLayer)}


def _forward(vlm, batch) -> torch.Tensor:
    return vlm(
        batch["input_ids"], batch["attention_mask"], batch["pixel_values"], labels=batch["labels"]
    ).logits


@pytest.mark.parametrize(
    ("stage", "targets", "expected_names"),
    [
        ("vla-full-train", "v_proj,down_proj,fc1,projector.2", SUFFIX_TARGETS),
        ("vla-train", "all-linear", ALL_LINEAR_TARGETS),
    ],
)
def test_lora_flags_reach_peft_as_a_direct_peft_build_would(stage, targets, expected_names, make_batch):
    """Rank 4, alpha 12 (scale 3, not the default min(r, 16) / r = 1), dropout 0.25: every adapter carries them,
    exactly the hand-listed modules are adapted, and the model computes what peft's own build computes."""
    from peft import LoraConfig, inject_adapter_in_model

    cfg = VLAConfig.get_choice_class("tiny+mx-toy")(
        use_lora=True, lora_rank=4, lora_alpha=12.0, lora_dropout=0.25, lora_target_modules=targets
    )
    ours = _tiny(stage)
    names = apply_lora(ours, cfg.lora_settings())
    reference = _tiny(stage)
    peft_config = LoraConfig(r=4, lora_alpha=12, lora_dropout=0.25, target_modules=list(expected_names))
    inject_adapter_in_model(peft_config, reference, adapter_name="default")

    layers, ref_layers = _lora_layers(ours), _lora_layers(reference)
    assert sorted(names) == sorted(expected_names)
    assert sorted(layers) == sorted(expected_names) == sorted(ref_layers)
    for name, layer in layers.items():
        assert layer.r["default"] == 4, name
        assert layer.scaling["default"] == 3.0, name
        assert layer.lora_dropout["default"].p == 0.25, name
        assert tuple(layer.lora_A["default"].weight.shape) == (4, layer.in_features), name
    trainable = {n.rsplit(".lora_", 1)[0] for n, p in ours.named_parameters() if p.requires_grad}
    assert trainable == set(expected_names)
    assert not any(p.requires_grad for n, p in ours.named_parameters() if ".lora_" not in n)

    # The same non-zero adapters in both (peft initialises lora_B to zero: outputs would not depend on alpha).
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, layer in layers.items():
            for part in ("lora_A", "lora_B"):
                weight = getattr(layer, part)["default"].weight
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.3)
                getattr(ref_layers[name], part)["default"].weight.copy_(weight)
        ours.eval(), reference.eval()
        batch = make_batch(ours)
        expected = _forward(reference, batch)
        assert torch.equal(_forward(ours, batch), expected)
        # Dropout acts in training mode, and the same way as peft's (same random stream).
        ours.train(), reference.train()
        torch.manual_seed(3)
        train_ours = _forward(ours, batch)
        torch.manual_seed(3)
        assert torch.equal(train_ours, _forward(reference, batch))
        assert not torch.allclose(train_ours, expected, rtol=1e-3, atol=1e-3)
