"""LoRA application on a small stand-in VLM (the attributes `apply_lora` reads, plain nn.Linear layers): the rank,
alpha (OpenVLA's default min(rank, 16)), dropout and targets each adapter gets, which modules are adapted and
which train, the merge formula W + B A alpha / r by hand, and reading the targets back from a state dict."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from prismatic.models.lora import (
    LoraSettings,
    apply_lora,
    has_lora,
    lora_targets_in_state_dict,
    merge_lora,
    resolve_target_modules,
)
from prismatic.util.errors import ConfigError


class _LLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.qq_proj, self.v_proj = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
        self.lm_head = nn.Linear(4, 8)

    def get_output_embeddings(self):
        return self.lm_head


class _VLM(nn.Module):
    all_module_keys = ["vision_backbone", "projector", "llm_backbone"]

    def __init__(self) -> None:
        super().__init__()
        self.vision_backbone = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 4))
        self.projector = nn.Sequential(nn.Linear(4, 4))
        self.llm_backbone = nn.Module()
        self.llm_backbone.llm = _LLM()
        self.vision_backbone_requires_grad = True


def _vlm(frozen_vision: bool = False) -> _VLM:
    torch.manual_seed(0)
    vlm = _VLM()
    if frozen_vision:
        vlm.vision_backbone.requires_grad_(False)
    return vlm


def _lora_layers(vlm):
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in vlm.named_modules() if isinstance(m, LoraLayer)}


@pytest.mark.parametrize(
    ("rank", "alpha", "expected"), [(32, None, 16.0), (8, None, 8.0), (16, None, 16.0), (4, 2, 2.0)]
)
def test_alpha_defaults_to_min_of_rank_and_16(rank, alpha, expected):
    resolved = LoraSettings(rank=rank, alpha=alpha).resolved_alpha
    assert resolved == expected and isinstance(resolved, float)


def test_default_settings_are_openvlas():
    s = LoraSettings()
    assert (s.rank, s.alpha, s.dropout, s.target_modules) == (32, None, 0.0, "all-linear")
    with pytest.raises(
        dataclasses.FrozenInstanceError
    ):  # the model keeps them: they cannot change afterwards
        s.rank = 4


def test_rank_alpha_and_dropout_reach_every_adapter():
    vlm = _vlm()
    names = apply_lora(vlm, LoraSettings(rank=2, alpha=6.0, dropout=0.25))
    layers = _lora_layers(vlm)
    assert sorted(layers) == sorted(names)
    for layer in layers.values():
        assert layer.r["default"] == 2
        assert layer.scaling["default"] == 3.0  # alpha / r
        assert layer.lora_dropout["default"].p == 0.25
        assert layer.lora_A["default"].weight.shape[0] == 2


def test_all_linear_adapts_every_trained_linear_but_the_lm_head():
    vlm = _vlm(frozen_vision=True)
    names = apply_lora(vlm, LoraSettings(rank=2))
    assert sorted(names) == [
        "llm_backbone.llm.q_proj",
        "llm_backbone.llm.qq_proj",
        "llm_backbone.llm.v_proj",
        "projector.0",
    ]
    trainable = sorted(n for n, p in vlm.named_parameters() if p.requires_grad)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert vlm.vision_backbone_requires_grad is False
    assert vlm.trainable_module_keys == ["projector", "llm_backbone"]
    assert vlm.lora_settings == LoraSettings(rank=2)


def test_vision_adapters_make_the_vision_backbone_trainable():
    vlm = _vlm()
    apply_lora(vlm, LoraSettings(rank=2, target_modules="vision_backbone.0"))
    assert vlm.vision_backbone_requires_grad is True
    assert vlm.trainable_module_keys == ["vision_backbone"]


def test_suffixes_match_whole_names_and_ignore_blanks():
    vlm = _vlm()
    assert resolve_target_modules(vlm, " q_proj , ,v_proj") == [
        "llm_backbone.llm.q_proj",
        "llm_backbone.llm.v_proj",
    ]
    assert resolve_target_modules(vlm, "projector.0") == ["projector.0"]
    with pytest.raises(ConfigError, match="matches no trainable"):
        resolve_target_modules(vlm, "lm_head")


def test_explicit_target_names_are_used_as_given():
    vlm = _vlm()
    assert apply_lora(vlm, LoraSettings(rank=2), target_names=["projector.0"]) == ["projector.0"]
    assert sorted(_lora_layers(vlm)) == ["projector.0"]


@pytest.mark.parametrize(("rank", "dropout"), [(0, 0.0), (-1, 0.0), (2, 1.0), (2, -0.1)])
def test_bad_rank_or_dropout_is_refused(rank, dropout):
    with pytest.raises(ConfigError, match="LoRA rank"):
        apply_lora(_vlm(), LoraSettings(rank=rank, dropout=dropout))


@pytest.mark.parametrize(("rank", "dropout"), [(1, 0.0), (2, 0.99)])
def test_smallest_rank_and_largest_dropout_are_accepted(rank, dropout):
    assert apply_lora(_vlm(), LoraSettings(rank=rank, dropout=dropout, target_modules="q_proj"))


def test_merge_folds_b_a_times_alpha_over_rank_into_the_base_weight():
    vlm = _vlm()
    apply_lora(vlm, LoraSettings(rank=2, alpha=6.0, target_modules="q_proj"))
    layer = vlm.llm_backbone.llm.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    base = layer.base_layer.weight.detach().clone()
    a, b = layer.lora_A["default"].weight.detach().clone(), layer.lora_B["default"].weight.detach().clone()
    assert has_lora(vlm)
    merged = merge_lora(vlm)
    assert not has_lora(merged) and type(merged.llm_backbone.llm.q_proj) is nn.Linear
    torch.testing.assert_close(
        merged.llm_backbone.llm.q_proj.weight, base + (b @ a) * 6.0 / 2, rtol=1e-6, atol=1e-6
    )
    assert not hasattr(merged, "lora_settings")


def test_targets_and_rank_from_a_state_dict():
    state = {
        "projector.0.base_layer.weight": torch.zeros(4, 4),
        "projector.0.lora_A.default.weight": torch.zeros(3, 4),
        "projector.0.lora_B.default.weight": torch.zeros(4, 3),
        "llm_backbone.llm.q_proj.lora_A.default.weight": torch.zeros(3, 4),
    }
    assert lora_targets_in_state_dict(state) == (["projector.0", "llm_backbone.llm.q_proj"], 3)
    assert lora_targets_in_state_dict({"projector.0.weight": torch.zeros(1)}) == ([], 0)
    assert lora_targets_in_state_dict({"projector.0.lora_A.default.weight": torch.zeros(5, 4)}) == (
        ["projector.0"],
        5,
    )


def test_merging_a_broken_nan_adapter_is_refused():
    """A NaN adapter would silently turn the merged weights into NaN: merging refuses it instead."""
    vlm = _vlm()
    apply_lora(vlm, LoraSettings(rank=2, target_modules="q_proj"))
    with torch.no_grad():
        vlm.llm_backbone.llm.q_proj.lora_B["default"].weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        merge_lora(vlm)
