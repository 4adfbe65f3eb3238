"""Frozen parameters stored in bf16 under FSDP mixed precision, and the per-dtype parameter memory report."""

from __future__ import annotations

import torch

from prismatic.models import build_vlm
from prismatic.models.parallelize import cast_frozen_params_to_bf16, format_param_bytes, param_bytes_by_dtype


def test_frozen_vision_backbone_goes_bf16_trainable_parts_stay_fp32() -> None:
    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-train")  # vision backbone frozen
    before = param_bytes_by_dtype(vlm)
    assert set(before) == {"float32"}
    cast = cast_frozen_params_to_bf16(vlm)
    assert cast > 0
    assert all(p.dtype == torch.bfloat16 for p in vlm.vision_backbone.parameters())
    assert all(p.dtype == torch.float32 for p in vlm.parameters() if p.requires_grad)
    after = param_bytes_by_dtype(vlm)
    # Expected bytes counted here from the parameters themselves: 2 per bf16 element, 4 per FP32 one.
    vision_numel = sum(p.numel() for p in vlm.vision_backbone.parameters())
    other_numel = sum(p.numel() for n, p in vlm.named_parameters() if not n.startswith("vision_backbone."))
    trainable_numel = sum(p.numel() for p in vlm.parameters() if p.requires_grad)
    assert before["float32"] == {
        "total": 4 * (vision_numel + other_numel),
        "trainable": 4 * trainable_numel,
        "local": 4 * (vision_numel + other_numel),
    }
    assert after["bfloat16"] == {"total": 2 * vision_numel, "trainable": 0, "local": 2 * vision_numel}
    assert after["float32"] == {
        "total": 4 * other_numel,
        "trainable": 4 * trainable_numel,
        "local": 4 * other_numel,
    }
    line = format_param_bytes(after)
    assert line.startswith("bfloat16 ") and "trainable" in line and "on this rank" in line
