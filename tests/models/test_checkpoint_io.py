"""Checkpoint interop: Prismatic run folders in, HF OpenVLA folders out and in (identical logits), Hub ids through
the same code with a local cache, and clear errors for missing files, wrong shapes and pickled objects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prismatic.models import BASE_VLMS, build_vlm, load, load_vla
from prismatic.models.hf_openvla import export_hf_openvla
from prismatic.models.hf_shards import INDEX_FILE, read_hf_state_dict
from prismatic.util.errors import ConfigError

NORM_STATS = {
    "toy": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7, "mask": [True] * 7}, "num_transitions": 5}
}


@pytest.fixture(scope="module", params=["tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama"])
def vlm(request):
    torch.manual_seed(1)
    model = build_vlm(request.param)
    model.eval()
    return model


def _logits(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits


def _write_prismatic_run(vlm, folder: Path, modules=("vision_backbone", "projector", "llm_backbone")) -> Path:
    """TRI-ML's layout: config.json with a `model` block, checkpoints/latest-checkpoint.pt with module dicts."""
    spec = BASE_VLMS[vlm.model_id]
    (folder / "checkpoints").mkdir(parents=True)
    model_block = {
        "model_id": vlm.model_id,
        "vision_backbone_id": spec.vision_backbone_id,
        "llm_backbone_id": spec.llm_backbone_id,
        "arch_specifier": spec.arch_specifier,
        "image_resize_strategy": spec.image_resize_strategy,
        "llm_max_length": 256,
    }
    (folder / "config.json").write_text(json.dumps({"model": model_block, "run_id": "x"}))
    weights = {m: getattr(vlm, m).state_dict() for m in modules}
    torch.save({"model": weights}, folder / "checkpoints" / "latest-checkpoint.pt")
    return folder


def test_prismatic_run_folder_loads_identically(vlm, make_batch, tmp_path: Path) -> None:
    run = _write_prismatic_run(vlm, tmp_path / "run")
    (run / "dataset_statistics.json").write_text(json.dumps(NORM_STATS))
    loaded = load_vla(run)
    assert loaded.norm_stats == NORM_STATS
    batch = make_batch(vlm)
    assert torch.equal(_logits(loaded.vlm, batch), _logits(vlm, batch))
    assert all(p.dtype == torch.float32 for p in loaded.vlm.parameters())


def test_prismatic_run_without_vision_weights_keeps_the_backbone_it_builds(vlm, tmp_path: Path) -> None:
    run = _write_prismatic_run(vlm, tmp_path / "run", modules=("projector", "llm_backbone"))
    loaded = load(run)
    for name, tensor in vlm.projector.state_dict().items():
        assert torch.equal(loaded.projector.state_dict()[name], tensor)


def test_hf_openvla_round_trip_identical_logits(vlm, make_batch, tmp_path: Path) -> None:
    spec = BASE_VLMS[vlm.model_id]
    out = export_hf_openvla(
        vlm, spec, tmp_path / "hf", norm_stats=NORM_STATS, dtype="float32", max_shard_size=200_000
    )
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "openvla" and config["norm_stats"] == NORM_STATS
    assert config["n_action_bins"] == 256 and config["vision_backbone_id"] == spec.vision_backbone_id
    assert config["use_fused_vision_backbone"] == ("dinosiglip" in spec.vision_backbone_id)
    assert config["text_config"]["model_type"] == "llama" and config["pad_token_id"] == 1024
    assert config["text_config"]["vocab_size"] == 1088
    index = json.loads((out / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    keys = set(read_hf_state_dict(out))
    assert "language_model.model.embed_tokens.weight" in keys and "language_model.lm_head.weight" in keys
    assert "projector.fc1.weight" in keys and not any(k.startswith("llm_backbone") for k in keys)
    assert any(k.startswith("vision_backbone.featurizer.blocks.0.") for k in keys)
    if config["use_fused_vision_backbone"]:
        assert any(k.startswith("vision_backbone.fused_featurizer.") for k in keys)
        assert "vision_backbone.featurizer.blocks.0.ls1.scale_factor" in keys  # DINOv2 LayerScale, HF-renamed
        assert "projector.fc3.weight" in keys
    assert not any(k.endswith(".gamma") for k in keys)

    loaded = load_vla(out)
    assert loaded.norm_stats == NORM_STATS
    batch = make_batch(vlm)
    assert torch.equal(_logits(loaded.vlm, batch), _logits(vlm, batch))
    for name, tensor in vlm.state_dict().items():
        assert torch.equal(loaded.vlm.state_dict()[name], tensor), name


def test_bf16_export_holds_bf16_tensors(vlm, tmp_path: Path) -> None:
    out = export_hf_openvla(vlm, BASE_VLMS[vlm.model_id], tmp_path / "hf", norm_stats=None)
    state = read_hf_state_dict(out)
    assert all(t.dtype == torch.bfloat16 for t in state.values() if t.is_floating_point())
    loaded = load(out)  # back to FP32 for training, values rounded through bf16
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    w = vlm.projector.state_dict()["projector.0.weight"]
    assert torch.equal(loaded.projector.state_dict()["projector.0.weight"], w.to(torch.bfloat16).float())


def test_hub_id_goes_through_snapshot_download(vlm, tmp_path: Path, monkeypatch) -> None:
    import huggingface_hub

    out = export_hf_openvla(vlm, BASE_VLMS[vlm.model_id], tmp_path / "cache" / "snap", norm_stats=NORM_STATS)
    calls = []

    def fake_snapshot_download(repo_id: str, token=None, allow_patterns=None, **_):
        calls.append((repo_id, token, allow_patterns))
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    loaded = load_vla("my-org/my-openvla", hf_token="hf_secret")
    assert calls and calls[0][:2] == ("my-org/my-openvla", "hf_secret")
    assert not any(p.endswith(".py") for p in calls[0][2])  # never fetches code
    assert loaded.norm_stats == NORM_STATS


def test_errors_name_the_problem(vlm, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'tiny-vit\\+tiny-llama'"):
        load("tiny-vit+tiny-lama")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="neither an HF OpenVLA folder"):
        load(empty)

    run = _write_prismatic_run(vlm, tmp_path / "run")
    ckpt_path = run / "checkpoints" / "latest-checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["model"]["projector"]["projector.0.weight"] = torch.zeros(3, 3)
    torch.save(ckpt, ckpt_path)
    with pytest.raises(ConfigError, match="'projector.projector.0.weight' has shape \\(3, 3\\)"):
        load(run)
    del ckpt["model"]["projector"]["projector.0.weight"]
    torch.save(ckpt, ckpt_path)
    with pytest.raises(ConfigError, match="missing key\\(s\\) \\['projector.projector.0.weight'\\]"):
        load(run)

    # A pickle carrying an arbitrary object is refused (weights_only), not executed.
    torch.save({"model": {"projector": {"x": Path("/")}}}, ckpt_path)
    with pytest.raises(ConfigError, match="Cannot read checkpoint"):
        load(run)
    ckpt_path.unlink()
    with pytest.raises(ConfigError, match=r"has no complete checkpoint: no step-\* folder"):
        load(run)

    hf = export_hf_openvla(
        vlm, BASE_VLMS[vlm.model_id], tmp_path / "hf", norm_stats=None, max_shard_size=200_000
    )
    shard = sorted(hf.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(ConfigError, match=f"missing shard '{shard.name}'"):
        load(hf)


def test_openvla_7b_vision_and_projector_keys_use_hf_names() -> None:
    """OpenVLA 7B's DINO-SigLIP backbone + fused projector (built on meta): the names OpenVLA's HF code expects."""
    from prismatic.models.backbones.vision import build_vision_backbone
    from prismatic.models.hf_openvla import from_hf_state_dict, to_hf_state_dict
    from prismatic.models.projectors import build_projector

    class Parts(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision_backbone = build_vision_backbone(
                "dinosiglip-vit-so-224px", "resize-naive", pretrained=False
            )
            self.projector = build_projector("no-align+fused-gelu-mlp", 2176, 4096)

    with torch.device("meta"):
        parts = Parts()
    hf = to_hf_state_dict(parts, "dinosiglip-vit-so-224px")
    assert "vision_backbone.featurizer.blocks.23.ls2.scale_factor" in hf
    assert "vision_backbone.featurizer.reg_token" in hf and "vision_backbone.featurizer.cls_token" in hf
    assert "vision_backbone.fused_featurizer.blocks.26.mlp.fc2.weight" in hf
    assert (
        "vision_backbone.fused_featurizer.attn_pool.latent" in hf
    )  # SigLIP's MAP head is kept, as OpenVLA's
    assert {k for k in hf if k.startswith("projector.")} == {
        f"projector.fc{i}.{p}" for i in (1, 2, 3) for p in ("weight", "bias")
    }
    assert tuple(hf["projector.fc1.weight"].shape) == (8704, 2176)
    assert set(from_hf_state_dict(hf, "dinosiglip-vit-so-224px")) == set(parts.state_dict())


def test_unknown_path_or_hub_id_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a local folder nor a base-VLM registry id"):
        load(str(tmp_path / "missing" / "run"))
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"")
    with pytest.raises(ConfigError, match="is a file"):
        load(ckpt)
