"""LoRA: adapters injected in place train only themselves; merging gives a plain model with the adapter model's
logits; a LoRA run folder loads (merged) through `load_vla`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prismatic.models import build_vlm, load_vla
from prismatic.models.lora import LoraSettings, apply_lora, has_lora, merge_lora, resolve_target_modules
from prismatic.util.errors import ConfigError


def _train_a_little(vlm, batch, steps: int = 3) -> None:
    optimizer = torch.optim.AdamW([p for p in vlm.parameters() if p.requires_grad], lr=1e-2)
    vlm.train()
    for _ in range(steps):
        loss = vlm(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    vlm.eval()


def _logits(vlm, batch) -> torch.Tensor:
    with torch.no_grad():
        return vlm(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits


@pytest.mark.parametrize("base_vlm_id", ["tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama"])
def test_lora_trains_adapters_only_and_merges_to_the_adapter_logits(
    base_vlm_id: str, make_batch, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    vlm = build_vlm(base_vlm_id)
    plain_keys = set(vlm.state_dict())
    vlm.freeze_backbones("vla-full-train")
    before = {k: v.clone() for k, v in vlm.state_dict().items()}
    names = apply_lora(vlm, LoraSettings(rank=4, alpha=8.0))
    assert not any(n.endswith("lm_head") for n in names)
    assert any(n.startswith("vision_backbone.") for n in names) and any(
        n.startswith("projector.") for n in names
    )
    trainable = [n for n, p in vlm.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)

    batch = make_batch(vlm)
    _train_a_little(vlm, batch)
    for key, value in vlm.state_dict().items():  # base weights untouched
        plain = key.replace(".base_layer.", ".")
        if ".lora_" not in key:
            assert torch.equal(value, before[plain]), key
    adapter_logits = _logits(vlm, batch)

    merged = merge_lora(vlm)
    assert not has_lora(merged) and set(merged.state_dict()) == plain_keys
    # (W + s B A) x rounds differently from W x + s B (A x): equal to FP32 rounding (|logits| < 1, ~4e-7 seen).
    torch.testing.assert_close(_logits(merged, batch), adapter_logits, rtol=1e-6, atol=2e-6)
    assert not torch.allclose(_logits(merged, batch), _logits(_plain(base_vlm_id, before), batch))


def _plain(base_vlm_id: str, state: dict) -> torch.nn.Module:
    model = build_vlm(base_vlm_id)
    model.load_state_dict(state)
    return model.eval()


def test_lora_run_folder_loads_merged(make_batch, tmp_path: Path) -> None:
    torch.manual_seed(0)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-train")  # frozen vision backbone: no adapters there
    names = apply_lora(vlm, LoraSettings(rank=4, alpha=8.0, target_modules="q_proj,v_proj,projector.0"))
    assert names and not any(n.startswith("vision_backbone") for n in names)
    assert not vlm.vision_backbone_requires_grad
    batch = make_batch(vlm)
    _train_a_little(vlm, batch)
    adapter_logits = _logits(vlm, batch)

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(
        json.dumps({"vla": {"base_vlm": "tiny-vit+tiny-llama", "use_lora": True, "lora_alpha": 8.0}})
    )
    grouped: dict = {"vision_backbone": {}, "projector": {}, "llm_backbone": {}}
    for key, value in vlm.state_dict().items():
        module, _, rest = key.partition(".")
        grouped[module][rest] = value
    torch.save({"model": grouped}, run / "checkpoints" / "step-000003-epoch-00-loss=1.0000.pt")
    loaded = load_vla(run).vlm
    assert not has_lora(loaded)
    torch.testing.assert_close(_logits(loaded, batch), adapter_logits, rtol=1e-6, atol=2e-6)


def test_bad_lora_settings() -> None:
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-full-train")
    with pytest.raises(ConfigError, match="'qq_proj' matches no trainable nn.Linear"):
        resolve_target_modules(vlm, "qq_proj")
    with pytest.raises(ConfigError, match="rank=0"):
        apply_lora(vlm, LoraSettings(rank=0))
