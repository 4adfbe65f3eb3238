"""freeze_backbones: which parameters train in each of OpenVLA's four VLA stages, and that gradients agree."""

from __future__ import annotations

import pytest
import torch

from prismatic.util.errors import ConfigError


def _trainable(module: torch.nn.Module, prefix: str) -> set[str]:
    return {f"{prefix}.{name}" for name, p in module.named_parameters() if p.requires_grad}


def _all(module: torch.nn.Module, prefix: str) -> set[str]:
    return {f"{prefix}.{name}" for name, _ in module.named_parameters()}


def _used_vision(vlm) -> set[str]:
    """Vision parameters that reach the patch features (everything except the unused tail)."""
    unused = {id(p) for m in vlm.vision_backbone.unused_modules() for p in m.parameters()}
    return {f"vision_backbone.{n}" for n, p in vlm.vision_backbone.named_parameters() if id(p) not in unused}


def _last_layer(vlm) -> set[str]:
    names = set()
    for module in vlm.llm_backbone.last_layer_finetune_modules():
        ids = {id(p) for p in module.parameters()}
        names |= {f"llm_backbone.{n}" for n, p in vlm.llm_backbone.named_parameters() if id(p) in ids}
    return names


def _expected(vlm, stage: str) -> tuple[set[str], list[str]]:
    projector, llm = _all(vlm.projector, "projector"), _all(vlm.llm_backbone, "llm_backbone")
    return {
        "vla-full-train": (
            _used_vision(vlm) | projector | llm,
            ["vision_backbone", "projector", "llm_backbone"],
        ),
        "vla-train": (projector | llm, ["projector", "llm_backbone"]),
        "vla-sandwich-train": (
            _used_vision(vlm) | projector | _last_layer(vlm),
            ["vision_backbone", "projector", "llm_backbone"],
        ),
        "vla-last-layer-train": (_last_layer(vlm), ["llm_backbone"]),
    }[stage]


STAGES = ["vla-full-train", "vla-train", "vla-sandwich-train", "vla-last-layer-train"]


@pytest.mark.parametrize("stage", STAGES)
def test_stage_trainable_set_and_gradients(tiny_vlm, make_batch, stage: str) -> None:
    tiny_vlm.freeze_backbones(stage)
    expected_params, expected_keys = _expected(tiny_vlm, stage)
    trainable = {name for name, p in tiny_vlm.named_parameters() if p.requires_grad}
    assert trainable == expected_params
    assert tiny_vlm.trainable_module_keys == expected_keys

    # Gradients reach exactly the trainable parameters: none is starved (DDP-safe), none leaks to frozen ones.
    tiny_vlm.zero_grad(set_to_none=True)
    tiny_vlm(**make_batch(tiny_vlm)).loss.backward()
    with_grad = {name for name, p in tiny_vlm.named_parameters() if p.grad is not None}
    tiny_vlm.zero_grad(set_to_none=True)
    assert with_grad == trainable


def test_last_layer_modules_are_openvlas(tiny_vlm) -> None:
    llm = tiny_vlm.llm_backbone.llm
    embed, last, head = tiny_vlm.llm_backbone.last_layer_finetune_modules()
    assert embed is llm.model.embed_tokens and last is llm.model.layers[-1] and head is llm.lm_head

    tiny_vlm.freeze_backbones("vla-last-layer-train")
    trainable = {name for name, p in tiny_vlm.named_parameters() if p.requires_grad}
    allowed = (
        "llm_backbone.llm.model.embed_tokens.",
        "llm_backbone.llm.model.layers.1.",
        "llm_backbone.llm.lm_head.",
    )
    assert trainable and all(name.startswith(allowed) for name in trainable)


def test_unused_vision_tail_is_the_last_block_and_heads(tiny_vlm) -> None:
    tiny_vlm.freeze_backbones("vla-full-train")
    frozen = {name for name, p in tiny_vlm.vision_backbone.named_parameters() if not p.requires_grad}
    assert frozen and all(
        ".blocks.2." in name or ".norm." in name or ".attn_pool." in name for name in frozen
    )


def test_stage_logs_parameter_counts(tiny_vlm, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="prismatic.models.vlms.prismatic"):
        tiny_vlm.freeze_backbones("vla-train")
    assert any("trainable" in record.getMessage() for record in caplog.records)


def test_stage_logs_name_the_action_modules_that_train(caplog: pytest.LogCaptureFixture) -> None:
    """An OFT-style action side (read-out head, proprio projector) is attached after the stage is set: the log names
    both as trainable, with their parameter counts, and the totals that include them."""
    from prismatic.models import build_vlm
    from prismatic.models.action_heads import ActionSpec

    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-train")
    spec = ActionSpec(head="l1-chunk", chunk_size=2, action_dim=4, proprio_dim=4)
    with caplog.at_level("INFO", logger="prismatic.models.vlms.prismatic"):
        vlm.attach_action_modules(spec)
    lines = [record.getMessage() for record in caplog.records]
    head = sum(p.numel() for p in vlm.action_head.parameters())
    proprio = sum(p.numel() for p in vlm.proprio_projector.parameters())
    assert f"  [TRAINABLE] action head 'l1-chunk': {head:,} parameters" in lines
    assert f"  [TRAINABLE] proprio projector: {proprio:,} parameters" in lines
    trainable = sum(p.numel() for p in vlm.parameters() if p.requires_grad)
    assert any(
        line.endswith(f", {trainable:,} trainable") and "with the action side" in line for line in lines
    )


def test_unknown_stage_lists_the_four(tiny_vlm) -> None:
    with pytest.raises(ConfigError, match="'vla-trian'.*Did you mean 'vla-train'") as info:
        tiny_vlm.freeze_backbones("vla-trian")
    assert all(stage in str(info.value) for stage in STAGES)
