"""LoRA runs as peft adapter folders (prismatic/models/peft_adapters.py, merge_lora.py --adapter_out / --adapter):
the folder holds only the adapters, loads with peft onto the base, merges to the logits of the merged training
checkpoint, records the run's LoRA settings, and refuses a base with other weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from scripts import import_script

from prismatic.util.errors import ConfigError

BASE = "tiny-vit+tiny-llama"
RANK, ALPHA, DROPOUT = 4, 8.0, 0.05


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A base model folder and a LoRA run on it whose adapters are non-zero (as after training)."""
    import sys

    from prismatic.models import build_vlm
    from prismatic.models.lora import LoraSettings, apply_lora

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vla_scripts"))
    from export_hf import write_model_folder

    root = tmp_path_factory.mktemp("lora_adapters")
    torch.manual_seed(0)
    vlm = build_vlm(BASE)
    base_dir = write_model_folder(
        vlm, {"only": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7}}}, root / "base"
    )
    vlm.freeze_backbones("vla-full-train")
    apply_lora(vlm, LoraSettings(RANK, ALPHA, DROPOUT, "all-linear"))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in vlm.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    run = root / "run"
    (run / "checkpoints").mkdir(parents=True)
    vla = {"type": "tiny-lora+mx-toy", "base_vlm": str(base_dir), "use_lora": True, "lora_rank": RANK,
           "lora_alpha": ALPHA, "lora_dropout": DROPOUT}  # fmt: skip
    (run / "config.json").write_text(json.dumps({"vla": vla}))
    weights = {
        key: getattr(vlm, key).state_dict() for key in ("vision_backbone", "projector", "llm_backbone")
    }
    torch.save({"model": weights}, run / "checkpoints" / "step-000010-epoch-00-loss=1.0000.pt")
    return base_dir, run


def _logits(vlm, make_batch) -> torch.Tensor:
    batch = make_batch(vlm)
    with torch.no_grad():
        return vlm.eval()(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits


def test_adapter_folder_loads_with_peft_and_merges_like_the_checkpoint(
    lora_run, make_batch, tmp_path
) -> None:
    from peft import PeftModel
    from safetensors.torch import load_file

    from prismatic.models.loading import load_vla
    from prismatic.models.peft_adapters import export_adapter, load_adapter

    base_dir, run = lora_run
    folder = export_adapter(run, tmp_path / "adapter")
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert tensors and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in tensors)
    assert all(k.startswith("base_model.model.") for k in tensors)
    base_bytes = sum(t.numel() * 4 for t in load_vla(base_dir).vlm.parameters())
    assert (
        sum(t.numel() * t.element_size() for t in tensors.values()) < base_bytes / 5
    )  # adapters, not weights

    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (RANK, ALPHA, DROPOUT)
    assert config["base_model_name_or_path"] == str(base_dir)
    assert "llm_backbone.llm.model.layers.0.self_attn.q_proj" in config["target_modules"]

    merged_checkpoint = _logits(load_vla(run).vlm, make_batch)  # the training checkpoint, merged on load
    by_peft = PeftModel.from_pretrained(load_vla(base_dir).vlm, str(folder)).merge_and_unload()  # peft alone
    # Both fold W + B A alpha / r with peft's own merge: the same arithmetic, so the same logits exactly.
    assert torch.equal(_logits(by_peft, make_batch), merged_checkpoint)
    assert torch.equal(_logits(load_adapter(folder).vlm, make_batch), merged_checkpoint)


def test_a_base_with_other_weights_is_refused(lora_run, tmp_path) -> None:
    import sys

    from prismatic.models import build_vlm
    from prismatic.models.peft_adapters import export_adapter, load_adapter

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "vla_scripts"))
    from export_hf import write_model_folder

    _, run = lora_run
    folder = export_adapter(run, tmp_path / "adapter")
    torch.manual_seed(5)
    other = write_model_folder(build_vlm(BASE), None, tmp_path / "other")
    with pytest.raises(ConfigError, match="were trained on base model"):
        load_adapter(folder, base=str(other))


def test_a_plain_run_has_no_adapters(tmp_path) -> None:
    from prismatic.models import build_vlm
    from prismatic.models.peft_adapters import export_adapter

    vlm = build_vlm(BASE)
    run = tmp_path / "plain"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"vla": {"base_vlm": BASE}}))
    weights = {
        key: getattr(vlm, key).state_dict() for key in ("vision_backbone", "projector", "llm_backbone")
    }
    torch.save({"model": weights}, run / "checkpoints" / "step-000001-epoch-00-loss=1.0000.pt")
    with pytest.raises(ConfigError, match="holds no LoRA adapters"):
        export_adapter(run, tmp_path / "adapter")


def test_merge_lora_cli_writes_and_merges_adapters(lora_run, make_batch, tmp_path) -> None:
    """The commands of merge_lora.py's docstring: --adapter_out, then --adapter --out_dir; the merged run folder
    gives the merged checkpoint's logits."""
    from prismatic.models.loading import load_vla

    module = import_script("merge_lora")

    _, run = lora_run
    assert module.main(["--checkpoint", str(run), "--adapter_out", str(tmp_path / "adapter")]) == 0
    assert module.main(["--adapter", str(tmp_path / "adapter"), "--out_dir", str(tmp_path / "merged")]) == 0
    expected = _logits(load_vla(run).vlm, make_batch)
    assert torch.equal(_logits(load_vla(tmp_path / "merged").vlm, make_batch), expected)
    with pytest.raises(SystemExit) as exit_info:  # nothing to write: a one-paragraph error, exit code 2
        module.main(["--adapter", str(tmp_path / "adapter")])
    assert exit_info.value.code == 2


def test_fingerprint_accepts_a_base_stored_in_bf16_and_nothing_else() -> None:
    """A bf16 mixed-precision FSDP run stores its frozen base in bf16: that must match the FP32 base it came from;
    a change in any value that survives bf16 rounding must not."""
    from prismatic.models.peft_adapters import base_fingerprint

    generator = torch.Generator().manual_seed(0)
    fp32 = {
        "a.weight": torch.randn((8, 4), generator=generator),
        "b.bias": torch.randn(3, generator=generator),
    }
    stored = {k: v.to(torch.bfloat16) for k, v in fp32.items()}
    assert base_fingerprint(stored) == base_fingerprint(fp32)
    changed = {**fp32, "b.bias": fp32["b.bias"].clone()}
    changed["b.bias"][1] += 0.5
    assert base_fingerprint(changed) != base_fingerprint(fp32)
