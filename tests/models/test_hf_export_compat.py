"""An HF export loads wherever OpenVLA users load it: what `auto_map` names, and the keys every transformers from
4.40 (OpenVLA's pin) to today reads, pinned on tiny exports.

- By default `auto_map` names OpenVLA's code in the Hub repo `openvla/openvla-7b` (`repo--module.Class`, the form
  transformers' `get_class_from_dynamic_module` fetches from that repo), so
  `AutoModelForVision2Seq.from_pretrained(folder, trust_remote_code=True)` needs no OpenVLA checkout; with
  `--hf_code_dir` the files are copied in and `auto_map` names the local modules.
- `config.json` / `text_config` carry 5.x's `dtype` / `rope_parameters` and 4.x's `torch_dtype` / flat
  `rope_theta`, and `transformers_version`; `tokenizer_config.json` only keys 4.40 knows. Both dtype keys, at
  both levels, are the export's dtype, also when the model in memory has another.
- A Qwen2.5-family LLM (rope base 1e6) keeps its rope base when the files are read as transformers 4.40's
  `Qwen2Config.__init__` reads them (restated below: no old transformers is installed), and under ours.
- `export_hf.py --dataset_statistics FILE` writes that file as `norm_stats` and `dataset_statistics.json`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import transformers
from scripts import import_script

from prismatic.models import LLM_BACKBONES, build_vlm, load_vla
from prismatic.models.hf_config import DEFAULT_HF_CODE_REPO
from prismatic.models.hf_openvla import HF_CODE_FILES, TRANSFORMERS5_TOKENIZER_KEYS, export_hf_openvla
from prismatic.models.loading import spec_of
from prismatic.util.errors import ConfigError

NORM_STATS = {"toy": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7, "mask": [True] * 7}}}
HUB = "openvla/openvla-7b"
# What OpenVLA's fine-tuned checkpoints on the Hub (e.g. openvla/openvla-7b-finetuned-libero-spatial) write.
HUB_CONFIG_AUTO_MAP = {
    "AutoConfig": "openvla/openvla-7b--configuration_prismatic.OpenVLAConfig",
    "AutoModelForVision2Seq": "openvla/openvla-7b--modeling_prismatic.OpenVLAForActionPrediction",
}
HUB_PREPROCESSOR_AUTO_MAP = {
    "AutoImageProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticImageProcessor",
    "AutoProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticProcessor",
}
HUB_PROCESSOR_AUTO_MAP = {"AutoProcessor": "openvla/openvla-7b--processing_prismatic.PrismaticProcessor"}

# transformers 4.40's `Qwen2Config.__init__` / `LlamaConfig.__init__` arguments and their defaults (what it reads
# of text_config; anything else is kept as an attribute and never used). 4.40 has no `rope_parameters`.
QWEN2_440 = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
}
LLAMA_440 = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "pretraining_tp": 1,
    "use_cache": True,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": None,  # 4.40 accepts only None or {"type": "linear" | "dynamic", "factor": f}
    "attention_bias": False,
    "attention_dropout": 0.0,
}
# tokenizer_config.json keys transformers 4.40 writes or reads for the fast tokenizers we export (`LlamaTokenizerFast`
# / `PreTrainedTokenizerFast` __init__ arguments, `PreTrainedTokenizerBase.__init__`'s, and what its
# `save_pretrained` adds), and the processor entries OpenVLA's published tokenizer config has.
TOKENIZER_KEYS_440 = {
    "add_bos_token",
    "add_eos_token",
    "add_prefix_space",
    "added_tokens_decoder",
    "additional_special_tokens",
    "auto_map",
    "bos_token",
    "chat_template",
    "clean_up_tokenization_spaces",
    "cls_token",
    "eos_token",
    "legacy",
    "mask_token",
    "model_input_names",
    "model_max_length",
    "pad_token",
    "padding_side",
    "processor_class",
    "sep_token",
    "split_special_tokens",
    "sp_model_kwargs",
    "tokenizer_class",
    "tokenizer_file",
    "truncation_side",
    "unk_token",
    "use_default_system_prompt",
    "vocab_file",
}


def read_as_440(text_config: dict, defaults: dict) -> dict:
    """What transformers 4.40's config class holds for each argument of its __init__: the key's value, else the
    default (`num_key_value_heads` None falls back to the number of heads, as 4.40 does)."""
    read = {key: text_config.get(key, default) for key, default in defaults.items()}
    if read.get("num_key_value_heads") is None:
        read["num_key_value_heads"] = read["num_attention_heads"]
    return read


def _export(model, folder: Path, **kwargs) -> Path:
    kwargs = {"norm_stats": NORM_STATS, "dtype": "float32", **kwargs}
    return export_hf_openvla(model, spec_of(model), folder, **kwargs)


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def llama_vlm():
    torch.manual_seed(5)
    return build_vlm("tiny-vit+tiny-llama").eval()


@pytest.fixture(scope="module")
def exported(llama_vlm, tmp_path_factory) -> Path:
    return _export(llama_vlm, tmp_path_factory.mktemp("hub") / "hf")


def test_auto_map_names_openvlas_hub_code_by_default(exported: Path, monkeypatch) -> None:
    assert DEFAULT_HF_CODE_REPO == HUB
    assert _json(exported / "config.json")["auto_map"] == HUB_CONFIG_AUTO_MAP
    preprocessor = _json(exported / "preprocessor_config.json")
    assert preprocessor["auto_map"] == HUB_PREPROCESSOR_AUTO_MAP
    assert _json(exported / "processor_config.json") == {
        "processor_class": "PrismaticProcessor",
        "auto_map": HUB_PROCESSOR_AUTO_MAP,
    }
    tokenizer_config = _json(exported / "tokenizer_config.json")
    assert tokenizer_config["auto_map"] == HUB_PROCESSOR_AUTO_MAP
    assert tokenizer_config["processor_class"] == "PrismaticProcessor"
    assert not any((exported / name).exists() for name in HF_CODE_FILES)

    # transformers resolves `repo--module.Class` to that module of the Hub repo, not of the folder.
    import transformers.dynamic_module_utils as dynamic

    fetched = []

    def cached_module_file(repo_id, module_file, **kwargs):
        fetched.append((repo_id, module_file))
        return module_file

    monkeypatch.setattr(dynamic, "get_cached_module_file", cached_module_file)
    monkeypatch.setattr(dynamic, "get_class_in_module", lambda name, module, **kwargs: (module, name))
    model_ref = HUB_CONFIG_AUTO_MAP["AutoModelForVision2Seq"]
    assert dynamic.get_class_from_dynamic_module(model_ref, str(exported)) == (
        "modeling_prismatic.py",
        "OpenVLAForActionPrediction",
    )
    assert fetched == [(HUB, "modeling_prismatic.py")]


def test_hf_code_dir_copies_the_files_and_names_them_locally(llama_vlm, tmp_path: Path) -> None:
    code = tmp_path / "openvla" / "prismatic" / "extern" / "hf"
    code.mkdir(parents=True)
    for name in HF_CODE_FILES:
        (code / name).write_text(f"# {name}\n")
    out = _export(llama_vlm, tmp_path / "hf", hf_code_dir=code)
    assert _json(out / "config.json")["auto_map"] == {
        "AutoConfig": "configuration_prismatic.OpenVLAConfig",
        "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction",
    }
    assert _json(out / "preprocessor_config.json")["auto_map"] == {
        "AutoImageProcessor": "processing_prismatic.PrismaticImageProcessor",
        "AutoProcessor": "processing_prismatic.PrismaticProcessor",
    }
    local_processor = {"AutoProcessor": "processing_prismatic.PrismaticProcessor"}
    assert _json(out / "processor_config.json")["auto_map"] == local_processor
    assert _json(out / "tokenizer_config.json")["auto_map"] == local_processor
    assert all((out / name).read_text() == f"# {name}\n" for name in HF_CODE_FILES)

    # Another code repo; a folder lacking a file is refused before anything is written.
    other = _export(llama_vlm, tmp_path / "other", hf_code_repo="my-lab/openvla-fork")
    assert _json(other / "config.json")["auto_map"]["AutoConfig"] == (
        "my-lab/openvla-fork--configuration_prismatic.OpenVLAConfig"
    )
    (code / "modeling_prismatic.py").unlink()
    with pytest.raises(ConfigError, match="has no 'modeling_prismatic.py'"):
        _export(llama_vlm, tmp_path / "refused", hf_code_dir=code)
    assert not (tmp_path / "refused").exists()


def test_configs_carry_keys_for_old_and_new_readers(exported: Path) -> None:
    config = _json(exported / "config.json")
    assert config["transformers_version"] == transformers.__version__
    assert (config["dtype"], config["torch_dtype"]) == ("float32", "float32")
    text = config["text_config"]
    assert (text["dtype"], text["torch_dtype"]) == ("float32", "float32")
    assert text["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    assert text["rope_theta"] == 10000.0
    assert read_as_440(text, LLAMA_440)["rope_scaling"] is None
    # Every value 4.40's LlamaConfig reads is the model's (the tiny preset: width 64, 2 layers, 4 heads, 2 KV heads).
    llama = read_as_440(text, LLAMA_440)
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["num_attention_heads"]) == (64, 2, 4)
    assert (llama["num_key_value_heads"], llama["vocab_size"], llama["rope_theta"]) == (2, 1088, 10000.0)

    tokenizer_config = _json(exported / "tokenizer_config.json")
    assert not set(TRANSFORMERS5_TOKENIZER_KEYS) & set(tokenizer_config)
    assert set(tokenizer_config) <= TOKENIZER_KEYS_440, set(tokenizer_config) - TOKENIZER_KEYS_440


def test_a_bfloat16_export_of_a_float32_model_says_bfloat16_everywhere(llama_vlm, tmp_path: Path) -> None:
    """The model in memory is float32 and so is its LLM config; the export writes bfloat16 weights and must say
    so in all four keys: transformers 5 builds the LLM in `text_config.dtype`, 4.x reads `torch_dtype`."""
    assert llama_vlm.llm_backbone.llm.dtype == torch.float32
    out = _export(llama_vlm, tmp_path / "hf", dtype="bfloat16")
    config = _json(out / "config.json")
    assert (config["dtype"], config["torch_dtype"]) == ("bfloat16", "bfloat16")
    text = config["text_config"]
    assert (text["dtype"], text["torch_dtype"]) == ("bfloat16", "bfloat16")
    # The weights as stored (each safetensors file opens with an 8-byte length and its JSON header of tensors).
    stored = set()
    for shard in out.glob("*.safetensors"):
        with shard.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        stored |= {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    assert "BF16" in stored and not {"F32", "F16", "F64"} & stored, stored


def test_qwen25_keeps_its_rope_base_for_old_and_new_readers(make_batch, tmp_path: Path, monkeypatch) -> None:
    from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
    from prismatic.models.registry import BaseVLMSpec

    rope_theta = LLM_BACKBONES["qwen25-0_5b-pure"].arch["rope_theta"]  # the registered Qwen2.5 family's base
    assert rope_theta == 1_000_000.0
    tiny = LLM_BACKBONES["tiny-llama"]
    qwen = dataclasses.replace(tiny, model_type="qwen2", config={**tiny.config, "rope_theta": rope_theta})
    monkeypatch.setitem(LLM_BACKBONES, "tiny-qwen25", qwen)
    torch.manual_seed(6)
    model = build_vlm_from_spec(
        VLMArchitecture("q", BaseVLMSpec("tiny-vit-64px", "tiny-qwen25", "gelu-mlp", "resize-naive"))
    ).eval()
    assert model.llm_backbone.llm.config.rope_parameters["rope_theta"] == rope_theta
    out = _export(model, tmp_path / "hf")
    text = _json(out / "config.json")["text_config"]
    assert text["model_type"] == "qwen2"

    old = read_as_440(text, QWEN2_440)
    assert old["rope_theta"] == rope_theta
    assert (old["hidden_size"], old["num_hidden_layers"], old["num_key_value_heads"]) == (64, 2, 2)
    # Without the flat key, 4.40 would silently build RoPE with base 10000 (what this export used to give it).
    assert (
        read_as_440({k: v for k, v in text.items() if k != "rope_theta"}, QWEN2_440)["rope_theta"] == 10000.0
    )

    loaded = load_vla(out).vlm
    assert loaded.llm_backbone.llm.config.rope_parameters["rope_theta"] == rope_theta
    batch = make_batch(model)
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits
        back = loaded(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits
    assert torch.equal(back, ours)


def test_dataset_statistics_flag_is_what_the_export_holds(llama_vlm, tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    modules = ("vision_backbone", "projector", "llm_backbone")
    torch.save(
        {"model": {m: getattr(llama_vlm, m).state_dict() for m in modules}},
        run / "checkpoints" / "step-000002-epoch-00-loss=1.0000.pt",
    )
    (run / "config.json").write_text(
        json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": "tiny-vit+tiny-llama"}})
    )
    (run / "dataset_statistics.json").write_text(json.dumps(NORM_STATS))
    given = {
        "my_robot": {
            "action": {"q01": [-2.0] * 7, "q99": [3.0] * 7, "mask": [True] * 6 + [False]},
            "proprio": {"mean": [0.5] * 7, "std": [1.5] * 7},
            "num_transitions": 12,
            "num_trajectories": 2,
        }
    }
    stats_file = tmp_path / "other_statistics.json"
    stats_file.write_text(json.dumps(given))
    script = import_script("export_hf")
    out = script.export(
        script.ExportConfig(
            checkpoint=run, out_dir=tmp_path / "hf", dataset_statistics=stats_file, dtype="float32"
        )
    )
    assert _json(out / "config.json")["norm_stats"] == given
    assert _json(out / "dataset_statistics.json") == given
    assert script.ExportConfig.hf_code_repo == DEFAULT_HF_CODE_REPO
    with pytest.raises(ConfigError, match="--hf_code_repo 'a--b/c' is not a Hub repository id"):
        script.ExportConfig(checkpoint=run, out_dir=tmp_path / "x", hf_code_repo="a--b/c")
