"""Every `config.json` / `preprocessor_config.json` field OpenVLA's HF code reads, checked by value on an export
of a tiny run made with `vla_scripts/export_hf.py`.

The fields are those read by `prismatic/extern/hf/` of openvla/openvla and moojink/openvla-oft (the same set):
`configuration_prismatic.py` (`PrismaticConfig.__init__`: vision_backbone_id, llm_backbone_id, arch_specifier,
use_fused_vision_backbone, image_resize_strategy, text_config, llm_max_length, pad_token_id, pad_to_multiple_of,
output_projector_states; `OpenVLAConfig`: norm_stats, n_action_bins), `modeling_prismatic.py`
(use_fused_vision_backbone, image_sizes, timm_model_ids, timm_override_act_layers, text_config.hidden_size /
vocab_size / initializer_range and the LLM fields `AutoModelForCausalLM.from_config(text_config)` builds from,
pad_token_id, norm_stats, n_action_bins, pad_to_multiple_of), `processing_prismatic.py` (use_fused_vision_backbone,
image_resize_strategy, input_sizes, interpolations, means, stds), and what transformers itself reads to find that
code (model_type, auto_map, architectures, torch_dtype). Expected values are written here by hand from the tiny
presets' definitions and OpenVLA's tables, never read back from our exporter."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers
from openvla_tables import OPENVLA_LLM_TABLE, OPENVLA_VISION_TABLE
from scripts import import_script

from prismatic.models import LLM_BACKBONES, VISION_BACKBONES, build_vlm
from prismatic.models.hf_config import hf_config_dict
from prismatic.models.registry import BaseVLMSpec

NORM_STATS = {
    "toy_dataset": {
        "action": {
            "q01": [-0.5, -0.25, 0.0, -1.0, -2.0, -3.0, 0.0],
            "q99": [0.5, 0.25, 1.0, 1.0, 2.0, 3.0, 1.0],
            "mask": [True, True, True, True, True, True, False],
            "mean": [0.0] * 7,
            "std": [1.0] * 7,
            "min": [-1.0] * 7,
            "max": [1.0] * 7,
        },
        "proprio": {"mean": [0.0] * 7, "std": [1.0] * 7},
        "num_transitions": 40,
        "num_trajectories": 4,
    }
}
# The tiny fused preset (prismatic/models/backbones/vision/registry.py "tiny-dinosiglip-64px" and llm/registry.py
# "tiny-llama"): its tokenizer has 1024 tokens plus <PAD> (id 1024); the embeddings are padded to 1088 = 17 * 64.
EXPECTED_CONFIG = {
    "model_type": "openvla",
    "architectures": ["OpenVLAForActionPrediction"],
    # OpenVLA's code in its Hub repo (issue 23: no OpenVLA checkout needed), as its fine-tuned checkpoints name it.
    "auto_map": {
        "AutoConfig": "openvla/openvla-7b--configuration_prismatic.OpenVLAConfig",
        "AutoModelForVision2Seq": "openvla/openvla-7b--modeling_prismatic.OpenVLAForActionPrediction",
    },
    "vision_backbone_id": "tiny-dinosiglip-64px",
    "llm_backbone_id": "tiny-llama",
    "arch_specifier": "fused-gelu-mlp",
    "use_fused_vision_backbone": True,
    "image_resize_strategy": "resize-naive",
    "timm_model_ids": ["vit_small_patch14_reg4_dinov2", "vit_base_patch16_siglip_224"],
    "image_sizes": [56, 64],
    "timm_override_act_layers": [None, None],
    "hf_llm_id": None,
    "llm_max_length": 256,
    "pad_token_id": 1024,
    "pad_to_multiple_of": 64,
    "output_projector_states": False,
    "norm_stats": NORM_STATS,
    "n_action_bins": 256,
    "torch_dtype": "bfloat16",
    # transformers 5's spelling beside 4.x's, and the writer's version (issue 23: read from 4.40 to today).
    "dtype": "bfloat16",
    "transformers_version": transformers.__version__,
    # This tool's extension (OpenVLA's code ignores it): the tiny ViTs' shrunk widths.
    "timm_arch_overrides": [
        {"embed_dim": 48, "depth": 3, "num_heads": 3},
        {"embed_dim": 64, "depth": 3, "num_heads": 4},
    ],
}
EXPECTED_TEXT_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "vocab_size": 1088,
    "initializer_range": 0.02,
    "pad_token_id": 1024,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # The export's dtype in both spellings: transformers 5 reads `dtype`, 4.x `torch_dtype`; never the dtype the
    # LLM's config had in memory (the export converts the weights, float32 in the checkpoint, to bfloat16).
    "dtype": "bfloat16",
    "torch_dtype": "bfloat16",
    "use_cache": True,
}
# timm's data configs: DINOv2 normalises with ImageNet's mean / std, SigLIP with 0.5; both bicubic.
EXPECTED_PREPROCESSOR = {
    "image_processor_type": "PrismaticImageProcessor",
    "processor_class": "PrismaticProcessor",
    "auto_map": {
        "AutoImageProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticImageProcessor",
        "AutoProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticProcessor",
    },
    "use_fused_vision_backbone": True,
    "image_resize_strategy": "resize-naive",
    "input_sizes": [[3, 56, 56], [3, 64, 64]],
    "interpolations": ["bicubic", "bicubic"],
    "means": [[0.485, 0.456, 0.406], [0.5, 0.5, 0.5]],
    "stds": [[0.229, 0.224, 0.225], [0.5, 0.5, 0.5]],
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A tiny fused-backbone run (one checkpoint, its dataset statistics) exported as `export_hf.py` does."""
    tmp = tmp_path_factory.mktemp("hf_fields")
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.manual_seed(4)
    vlm = build_vlm("tiny-dinosiglip+tiny-llama")
    modules = ("vision_backbone", "projector", "llm_backbone")
    torch.save(
        {"model": {m: getattr(vlm, m).state_dict() for m in modules}},
        run / "checkpoints" / "step-000004-epoch-00-loss=1.0000.pt",
    )
    vla = {"type": "tiny-dinosiglip+mx-toy", "base_vlm": "tiny-dinosiglip+tiny-llama"}
    (run / "config.json").write_text(json.dumps({"vla": vla}))
    (run / "dataset_statistics.json").write_text(json.dumps(NORM_STATS))
    script = import_script("export_hf")
    return script.export(script.ExportConfig(checkpoint=run, out_dir=tmp / "hf"))


def test_every_config_field_openvla_reads_has_its_value(exported):
    config = json.loads((exported / "config.json").read_text())
    text_config = config.pop("text_config")
    assert config == EXPECTED_CONFIG
    for key, value in EXPECTED_TEXT_CONFIG.items():
        assert text_config[key] == value, key
    # OpenVLA's predict_action decodes token t as bin `vocab - t`, with vocab = text_config.vocab_size -
    # pad_to_multiple_of: that must be the tokenizer's 1024 tokens (without <PAD>), where our actions live.
    assert text_config["vocab_size"] - config["pad_to_multiple_of"] == 1024


def test_preprocessor_fields_openvla_reads_have_their_values(exported):
    assert json.loads((exported / "preprocessor_config.json").read_text()) == EXPECTED_PREPROCESSOR
    assert json.loads((exported / "processor_config.json").read_text()) == {
        "processor_class": "PrismaticProcessor",
        "auto_map": {"AutoProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticProcessor"},
    }
    assert json.loads((exported / "dataset_statistics.json").read_text()) == NORM_STATS


def test_openvla_decodes_our_action_tokens_to_our_actions(exported):
    """OpenVLA's `predict_action` (bins from n_action_bins, vocab from text_config.vocab_size - pad_to_multiple_of,
    un-normalisation from norm_stats' q01 / q99 / mask) re-implemented here on the exported config, applied to
    the token ids our action tokenizer gives to hand-picked actions: the actions come back (to a bin's width)."""
    from prismatic.models import load_vla
    from prismatic.vla.action_tokenizer import ActionTokenizer

    config = json.loads((exported / "config.json").read_text())
    tokenizer = load_vla(exported).vlm.llm_backbone.tokenizer
    normalized = np.array([-1.0, -0.6, -0.01, 0.0, 0.3, 0.99, 1.0])
    token_ids = ActionTokenizer(tokenizer).encode_to_ids(normalized)

    bins = np.linspace(-1, 1, config["n_action_bins"])
    bin_centers = (bins[:-1] + bins[1:]) / 2.0
    vocab = config["text_config"]["vocab_size"] - config["pad_to_multiple_of"]
    decoded = bin_centers[np.clip(vocab - token_ids - 1, 0, bin_centers.shape[0] - 1)]
    assert np.all(np.abs(decoded - normalized) <= 2 / 255 + 1e-12)
    stats = config["norm_stats"]["toy_dataset"]["action"]
    low, high, mask = np.array(stats["q01"]), np.array(stats["q99"]), np.array(stats["mask"])
    actions = np.where(mask, 0.5 * (decoded + 1) * (high - low) + low, decoded)
    # By hand: -1 is bin 0, centred at -1 + 1/255, so q01 + (q99 - q01) / 510 = -0.5 + 1/510; the gripper
    # (mask False) is left normalised: 1 is the last bin, centred at 1 - 1/255.
    assert actions[0] == pytest.approx(-0.5 + 1 / 510, rel=0, abs=1e-12)
    assert actions[6] == pytest.approx(1 - 1 / 255, rel=0, abs=1e-12)


def _stub_vlm(vision_id: str, llm_id: str):
    """What `hf_config_dict` reads of a VLM, for a real backbone pair (their weights are not needed)."""
    from transformers import LlamaConfig

    llm = SimpleNamespace(
        llm=SimpleNamespace(config=LlamaConfig(vocab_size=32064)),
        tokenizer=SimpleNamespace(pad_token_id=32000, model_max_length=2048),
        spec=LLM_BACKBONES[llm_id],
    )
    return SimpleNamespace(
        vision_backbone=SimpleNamespace(spec=VISION_BACKBONES[vision_id]), llm_backbone=llm
    )


@pytest.mark.parametrize("vision_id", sorted(OPENVLA_VISION_TABLE))
def test_real_vision_backbones_export_openvlas_table_values(vision_id):
    """OpenVLA's config class rebuilds these fields from its tables by `vision_backbone_id`, and its modeling code
    creates the ViTs from them: an export must carry the same values (and no extension field)."""
    spec = BaseVLMSpec(vision_id, "llama2-7b-pure", "no-align+fused-gelu-mlp", "resize-naive")
    config = hf_config_dict(_stub_vlm(vision_id, "llama2-7b-pure"), spec, None, "bfloat16")
    ids, sizes, acts = OPENVLA_VISION_TABLE[vision_id]
    assert config["vision_backbone_id"] == vision_id
    assert config["timm_model_ids"] == ids
    assert config["image_sizes"] == sizes
    assert config["timm_override_act_layers"] == acts
    assert config["use_fused_vision_backbone"] is (len(ids) == 2)
    assert "timm_arch_overrides" not in config


@pytest.mark.parametrize("llm_id", sorted(OPENVLA_LLM_TABLE))
def test_real_llms_export_openvlas_hub_ids(llm_id):
    hf_path, metaclass = OPENVLA_LLM_TABLE[llm_id]
    spec = BaseVLMSpec("siglip-vit-so400m", llm_id, "no-align+gelu-mlp", "letterbox")
    config = hf_config_dict(_stub_vlm("siglip-vit-so400m", llm_id), spec, None, "bfloat16")
    assert (config["llm_backbone_id"], config["hf_llm_id"]) == (llm_id, hf_path)
    # OpenVLA builds text_config with this family's config class; our registry builds the same family.
    assert LLM_BACKBONES[llm_id].arch["model_type"] == metaclass
