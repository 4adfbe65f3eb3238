"""HF / OpenVLA interop traps, each pinned on tiny checkpoints these tests build:

- a config's `timm_model_ids` decide the ViTs (an unregistered `vision_backbone_id` builds from them; a registered
  one that disagrees is a ConfigError before anything is built);
- tokenizers load with `trust_remote_code=False`, never prompt, never run a folder's code, and are exported under a
  class name transformers 4.40 (OpenVLA's pin) knows;
- a run fine-tuned from an HF checkpoint (local folder or cached Hub id) loads and exports offline, its LLM config and
  tokenizer taken from that checkpoint, never from the base LLM's Hub repo;
- HF shards stream into a model built on the meta device, in FP32 or BF16, tied embeddings kept tied, with peak
  memory about one model plus one shard.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from openvla_tables import OPENVLA_VISION_TABLE
from scripts import import_script

from prismatic.models import LLM_BACKBONES, build_vlm, load_vla
from prismatic.models.hf_openvla import export_hf_openvla
from prismatic.models.hf_shards import read_hf_state_dict
from prismatic.models.loading import spec_of
from prismatic.util.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
NORM_STATS = {"toy": {"action": {"q01": [0.0] * 7, "q99": [1.0] * 7, "mask": [True] * 7}}}


@pytest.fixture(scope="module", params=["tiny-vit+tiny-llama", "tiny-dinosiglip+tiny-llama"])
def vlm(request):
    torch.manual_seed(3)
    return build_vlm(request.param).eval()


def _logits(model, batch) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(batch["input_ids"], batch["attention_mask"], batch["pixel_values"]).logits


def _export(model, folder: Path, **kwargs) -> Path:
    kwargs = {"norm_stats": NORM_STATS, "dtype": "float32", "max_shard_size": 200_000, **kwargs}
    return export_hf_openvla(model, spec_of(model), folder, **kwargs)


def _edit_json(path: Path, **changes) -> dict:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return data


# === Item 10: timm_model_ids ======================================================================================


def test_unregistered_vision_id_builds_from_timm_ids(vlm, make_batch, tmp_path: Path) -> None:
    out = _export(vlm, tmp_path / "hf")
    config = _edit_json(out / "config.json", vision_backbone_id="my-lab-vit")
    loaded = load_vla(out).vlm
    vits = loaded.vision_backbone.spec
    vits = list(vits.parts.values()) if hasattr(vits, "parts") else [vits.vit]
    assert [v.timm_id for v in vits] == config["timm_model_ids"]
    assert [v.image_size for v in vits] == config["image_sizes"]
    assert torch.equal(_logits(loaded, make_batch(vlm)), _logits(vlm, make_batch(vlm)))

    # It exports again under its own id and timm fields, and that folder loads the same.
    again = _export(loaded, tmp_path / "again")
    config_again = json.loads((again / "config.json").read_text())
    for key in ("vision_backbone_id", "timm_model_ids", "image_sizes", "timm_override_act_layers"):
        assert config_again[key] == config[key], key
    assert torch.equal(_logits(load_vla(again).vlm, make_batch(vlm)), _logits(vlm, make_batch(vlm)))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"image_sizes": [96]},
            r"registered here as vit_base_patch16_224 at 64px.*describe vit_base_patch16_224 at 96px",
        ),
        (
            {"timm_model_ids": ["vit_small_patch16_224"]},
            r"registered here as vit_base_patch16_224.*vit_small_patch16_224",
        ),
        ({"timm_override_act_layers": ["quick_gelu"]}, r"'act_layer': 'quick_gelu'"),
        (
            {"use_fused_vision_backbone": True},
            r"use_fused_vision_backbone is True but timm_model_ids names 1",
        ),
        ({"image_sizes": [64, 64]}, r"image_sizes must be a list with one entry per ViT \(1"),
        (
            {"timm_model_ids": ["vit_nonexistent_patch16_224"]},
            r"'vit_nonexistent_patch16_224', which timm .* not know",
        ),
        (
            {"vision_backbone_id": "my-lab-vit", "timm_model_ids": None},
            r"not registered here .* no timm_model_ids",
        ),
    ],
)
def test_bad_timm_fields_fail_before_anything_is_built(changes, message, tmp_path: Path, monkeypatch) -> None:
    import prismatic.models.materialize as materialize

    torch.manual_seed(0)
    out = _export(build_vlm("tiny-vit+tiny-llama"), tmp_path / "hf")
    _edit_json(out / "config.json", **changes)

    def built(*args, **kwargs):
        raise AssertionError("the model was built before the config was checked")

    monkeypatch.setattr(materialize, "build_vlm_from_spec", built)
    with pytest.raises(ConfigError, match=message):
        load_vla(out)


@pytest.mark.parametrize("vision_id", sorted(OPENVLA_VISION_TABLE))
def test_openvla_configs_resolve_to_our_registered_backbones(vision_id: str, tmp_path: Path) -> None:
    from prismatic.models import VISION_BACKBONES
    from prismatic.models.hf_config import hf_vision_spec

    ids, sizes, acts = OPENVLA_VISION_TABLE[vision_id]
    raw = {
        "vision_backbone_id": vision_id,
        "timm_model_ids": ids,
        "image_sizes": sizes,
        "timm_override_act_layers": acts,
        "use_fused_vision_backbone": len(ids) == 2,
    }
    assert hf_vision_spec(raw, tmp_path / "config.json") is VISION_BACKBONES[vision_id]
    # The same ViTs without CLIP's QuickGELU are other weights' architecture: refused, naming both.
    if "quick_gelu" in acts:
        raw["timm_override_act_layers"] = [None] * len(ids)
        with pytest.raises(ConfigError, match="quick_gelu"):
            hf_vision_spec(raw, tmp_path / "config.json")


# === Item 11: tokenizers ==========================================================================================


def test_exported_tokenizer_names_a_class_openvla_transformers_loads(vlm, tmp_path: Path) -> None:
    out = _export(vlm, tmp_path / "hf")
    config = json.loads((out / "tokenizer_config.json").read_text())
    # transformers 5 writes "TokenizersBackend", which transformers 4.40 (OpenVLA's pin) cannot import.
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    text = "In: What action should the robot take to pick up the can?\nOut: "
    loaded = load_vla(out).vlm.llm_backbone.tokenizer
    assert loaded(text).input_ids == vlm.llm_backbone.tokenizer(text).input_ids
    assert loaded.pad_token == "<PAD>" and len(loaded) == len(vlm.llm_backbone.tokenizer)
    # tokenizers < 0.20 (transformers 4.40's) reads BPE merges only as "a b" strings; [a, b] pairs, which newer
    # tokenizers write, fail there with "data did not match any variant of untagged enum ModelWrapper" (checked
    # by hand with transformers 4.40.2 / tokenizers 0.19.1 on an export of the demo run).
    model = json.loads((out / "tokenizer.json").read_text())["model"]
    assert model["type"] == "BPE" and model["merges"]
    assert all(isinstance(m, str) and len(m.split(" ")) == 2 for m in model["merges"])


def test_merges_with_spaces_keep_the_pair_format() -> None:
    from prismatic.models.hf_openvla import legacy_bpe_merges

    pairs = {"model": {"type": "BPE", "merges": [["a", "b"], ["ab", "c"]]}}
    assert legacy_bpe_merges(pairs) and pairs["model"]["merges"] == ["a b", "ab c"]
    spaced = {"model": {"type": "BPE", "merges": [["a b", "c"]]}}
    assert not legacy_bpe_merges(spaced) and spaced["model"]["merges"] == [["a b", "c"]]
    assert not legacy_bpe_merges({"model": {"type": "Unigram"}})


def test_llama_tokenizer_is_exported_as_llama_tokenizer_fast(tmp_path: Path) -> None:
    from transformers import LlamaTokenizer

    from prismatic.models.backbones.llm.hf_causal import load_tokenizer_dir
    from prismatic.models.hf_openvla import save_tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, "a": 4, "b": 5, "c": 6, "▁a": 7, "ab": 8}
    tokenizer = LlamaTokenizer(vocab=vocab, merges=[("▁", "a"), ("a", "b")])
    save_tokenizer(tokenizer, tmp_path)
    assert (
        json.loads((tmp_path / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "LlamaTokenizerFast"
    )
    assert load_tokenizer_dir(tmp_path)("ab ca").input_ids == tokenizer("ab ca").input_ids


EVIL_CODE = textwrap.dedent(
    """
    from pathlib import Path
    Path(__file__).with_name("EXECUTED").write_text("remote code ran")
    from transformers import PreTrainedTokenizerFast
    class EvilTokenizer(PreTrainedTokenizerFast):
        pass
    """
)


def test_loading_never_prompts_or_runs_the_folders_code(vlm, tmp_path: Path, monkeypatch) -> None:
    out = _export(vlm, tmp_path / "hf")
    (out / "tokenization_evil.py").write_text(EVIL_CODE)
    prompts: list[tuple] = []

    def prompt(*args, **kwargs) -> str:
        # transformers asks "Do you wish to run the custom code? [y/N]" through input() (and swallows errors).
        prompts.append(args)
        return "n"

    monkeypatch.setattr(builtins, "input", prompt)
    text = "pick up the can"
    expected = vlm.llm_backbone.tokenizer(text).input_ids
    # Our own export: config.json's auto_map names OpenVLA's remote code, which AutoTokenizer looks at first.
    assert load_vla(out).vlm.llm_backbone.tokenizer(text).input_ids == expected
    assert not prompts, prompts
    # A tokenizer auto_map without tokenizer_class: tokenizer.json is read as it is, the code is not run.
    auto_map = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    _edit_json(out / "tokenizer_config.json", tokenizer_class=None, auto_map=auto_map)
    assert load_vla(out).vlm.llm_backbone.tokenizer(text).input_ids == expected
    # A class only the folder's code defines: refused in one message, neither asked about nor run.
    _edit_json(out / "tokenizer_config.json", tokenizer_class="EvilTokenizer")
    with pytest.raises(ConfigError, match="never runs code shipped with a checkpoint"):
        load_vla(out)
    assert not prompts, prompts
    assert not (out / "EXECUTED").exists()


def test_every_auto_class_call_passes_trust_remote_code_false(monkeypatch) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    import prismatic.models.backbones.llm.hf_causal as hf_causal
    from prismatic.models.backbones.llm.registry import build_llm_backbone
    from prismatic.models.backbones.llm.tiny_tokenizer import load_tiny_tokenizer

    tiny = LLM_BACKBONES["tiny-llama"]
    monkeypatch.setitem(
        LLM_BACKBONES,
        "hub-llama",
        dataclasses.replace(tiny, hf_hub_id="test-org/llama", tokenizer_source="hub"),
    )
    calls: list[tuple[str, dict]] = []

    class Tokenizers:
        @staticmethod
        def from_pretrained(name, **kwargs):
            calls.append(("AutoTokenizer.from_pretrained", kwargs))
            return load_tiny_tokenizer()

    class Configs:
        @staticmethod
        def from_pretrained(name, **kwargs):
            calls.append(("AutoConfig.from_pretrained", kwargs))
            return AutoConfig.for_model("llama", vocab_size=1024, **tiny.config)

        for_model = staticmethod(AutoConfig.for_model)

    class Models:
        @staticmethod
        def from_config(config, **kwargs):
            calls.append(("AutoModelForCausalLM.from_config", kwargs))
            return AutoModelForCausalLM.from_config(config, **kwargs)

        @staticmethod
        def from_pretrained(name, **kwargs):
            calls.append(("AutoModelForCausalLM.from_pretrained", kwargs))
            config = AutoConfig.for_model("llama", vocab_size=1024, **tiny.config)
            kwargs.pop("token", None)
            return AutoModelForCausalLM.from_config(config, **kwargs)

    monkeypatch.setattr(hf_causal, "AutoTokenizer", Tokenizers)
    monkeypatch.setattr(hf_causal, "AutoConfig", Configs)
    monkeypatch.setattr(hf_causal, "AutoModelForCausalLM", Models)
    build_llm_backbone("hub-llama", pretrained=True)
    build_llm_backbone("hub-llama", pretrained=False)
    assert {name for name, _ in calls} == {
        "AutoTokenizer.from_pretrained",
        "AutoConfig.from_pretrained",
        "AutoModelForCausalLM.from_config",
        "AutoModelForCausalLM.from_pretrained",
    }
    assert all(kwargs.get("trust_remote_code") is False for _, kwargs in calls), calls


# === Item 12: fine-tune from an HF checkpoint, export offline ======================================================


@pytest.mark.parametrize(
    ("source_kind", "frozen_vision"), [("folder", False), ("hub_id", False), ("hub_id", True)]
)
def test_fine_tune_from_hf_checkpoint_then_export_offline(
    source_kind: str, frozen_vision: bool, tmp_path: Path, monkeypatch
) -> None:
    import huggingface_hub
    import huggingface_hub.constants

    # The base checkpoint's LLM id names a Hub repo that is unreachable (offline): anything that tried to fetch the
    # base LLM's config or tokenizer, instead of reading the checkpoint's, would fail.
    gated = dataclasses.replace(
        LLM_BACKBONES["tiny-llama"], hf_hub_id="test-org/gated-llama", tokenizer_source="hub"
    )
    monkeypatch.setitem(LLM_BACKBONES, "tiny-llama-gated", gated)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    torch.manual_seed(5)
    original = build_vlm("tiny-dinosiglip+tiny-llama")
    if source_kind == "folder":
        base_folder = tmp_path / "openvla-tiny"
        source = str(base_folder)
    else:  # a Hub id already in the local cache, as a previous online run would have left it
        cache = tmp_path / "hub"
        commit = "0123456789abcdef0123456789abcdef01234567"
        repo = cache / "models--test-org--openvla-tiny"
        base_folder = repo / "snapshots" / commit
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(commit)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        source = "test-org/openvla-tiny"
    _export(original, base_folder)
    base_config = _edit_json(base_folder / "config.json", llm_backbone_id="tiny-llama-gated")

    patterns: list[list[str]] = []
    real_snapshot_download = huggingface_hub.snapshot_download

    def snapshot_download(repo_id, **kwargs):
        patterns.append(list(kwargs.get("allow_patterns") or ["*"]))
        return real_snapshot_download(repo_id, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)

    # Fine-tune (what train.py does with --vla.base_vlm <source>): load, change the weights, save a checkpoint.
    base = load_vla(source).vlm
    with torch.no_grad():
        for param in base.parameters():
            param.add_(0.01)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": source}}))
    (run / "dataset_statistics.json").write_text(json.dumps(NORM_STATS))
    modules = (
        ("projector", "llm_backbone") if frozen_vision else ("vision_backbone", "projector", "llm_backbone")
    )
    ckpt = run / "checkpoints" / "step-000002-epoch-00-loss=1.0000.pt"
    torch.save({"model": {m: getattr(base, m).state_dict() for m in modules}}, ckpt)
    patterns.clear()

    script = import_script("export_hf")
    out = script.export(script.ExportConfig(checkpoint=ckpt, out_dir=tmp_path / "export", dtype="float32"))

    config = json.loads((out / "config.json").read_text())
    assert config["llm_backbone_id"] == "tiny-llama-gated" and config["norm_stats"] == NORM_STATS
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "model_type"):
        assert config["text_config"][key] == base_config["text_config"][key], key
    exported = load_vla(out).vlm.state_dict()
    for name, value in base.state_dict().items():
        if frozen_vision and name.startswith("vision_backbone."):  # not in the checkpoint: the base's weights
            assert torch.equal(exported[name], original.state_dict()[name]), name
        else:
            assert torch.equal(exported[name], value), name
    if source_kind == "hub_id":
        assert patterns, "the Hub id was not resolved through the cache"
        # Describing the base needs its config and tokenizer only; its weights only for a frozen vision backbone.
        assert frozen_vision == any("*.safetensors" in p for p in patterns), patterns
    assert load_vla(run).norm_stats == NORM_STATS  # load_policy's path takes the run folder too


# === Item 13: streaming, dtype, tied weights, memory ==============================================================


def test_shards_stream_one_at_a_time_into_bf16(vlm, tmp_path: Path, monkeypatch) -> None:
    import prismatic.models.hf_shards as hf_openvla

    out = _export(vlm, tmp_path / "hf", max_shard_size=50_000)
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) >= 3
    num_tensors = len(read_hf_state_dict(out))
    alive: list[weakref.ref] = []
    real_open = hf_openvla._open_shard

    class Recorded:
        def __init__(self, path):
            self.handle = real_open(path)

        def __enter__(self):
            self.inner = self.handle.__enter__()
            return self

        def __exit__(self, *exc):
            return self.handle.__exit__(*exc)

        def keys(self):
            return self.inner.keys()

        def get_slice(self, name):
            return self.inner.get_slice(name)

        def get_tensor(self, name):
            tensor = self.inner.get_tensor(name)
            alive.append(weakref.ref(tensor))
            return tensor

    def open_shard(path):
        # When a shard is opened, no tensor read from an earlier one may still exist (they became the model's).
        assert all(ref() is None for ref in alive), (
            f"{sum(r() is not None for r in alive)} tensors still alive"
        )
        return Recorded(path)

    monkeypatch.setattr(hf_openvla, "_open_shard", open_shard)
    loaded = load_vla(out, dtype=torch.bfloat16).vlm
    assert len(alive) == num_tensors
    reference = vlm.state_dict()
    for name, param in loaded.named_parameters():
        assert param.dtype == torch.bfloat16 and param.device.type == "cpu", name
        assert torch.equal(param, reference[name].to(torch.bfloat16)), name
    # Rotary frequencies are computed, not loaded: they stay FP32 as transformers makes them.
    assert all(b.dtype == torch.float32 for n, b in loaded.named_buffers() if "inv_freq" in n)
    assert load_vla(out, dtype="float16").vlm.projector.projector[0].weight.dtype == torch.float16
    with pytest.raises(ConfigError, match="Unknown dtype 'int8'"):
        load_vla(out, dtype="int8")


def test_tied_embeddings_stay_tied(make_batch, tmp_path: Path, monkeypatch) -> None:
    from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
    from prismatic.models.registry import BaseVLMSpec

    tiny = LLM_BACKBONES["tiny-llama"]
    tied = dataclasses.replace(tiny, model_type="qwen2", config={**tiny.config, "tie_word_embeddings": True})
    monkeypatch.setitem(LLM_BACKBONES, "tiny-qwen2-tied", tied)
    torch.manual_seed(2)
    model = build_vlm_from_spec(
        VLMArchitecture("tied", BaseVLMSpec("tiny-vit-64px", "tiny-qwen2-tied", "gelu-mlp", "resize-naive"))
    )
    llm = model.llm_backbone.llm
    assert llm.lm_head.weight is llm.get_input_embeddings().weight
    out = _export(model, tmp_path / "hf")
    for dtype in (torch.float32, torch.bfloat16):
        loaded = load_vla(out, dtype=dtype).vlm
        loaded_llm = loaded.llm_backbone.llm
        assert loaded_llm.lm_head.weight is loaded_llm.get_input_embeddings().weight
        assert len(list(loaded.parameters())) == len(list(model.parameters()))
    assert torch.equal(_logits(load_vla(out).vlm, make_batch(model)), _logits(model, make_batch(model)))


PEAK_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    import transformers.models.llama.modeling_llama
    import prismatic.models.hf_openvla, prismatic.models.lora
    from prismatic.models.loading import load_vla

    def status(field):
        line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    load_vla(sys.argv[3], dtype=getattr(torch, sys.argv[2]))  # a tiny load first: lazy imports are not weights
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark to the current RSS
    floor = status("VmRSS")
    vlm = load_vla(sys.argv[1], dtype=getattr(torch, sys.argv[2])).vlm
    print(json.dumps({"peak": status("VmHWM") - floor}))
    """
)


def test_peak_memory_is_about_one_model_plus_one_shard(tmp_path: Path) -> None:
    """A ~100 MB model in 20 MB shards: the all-at-once loader peaked at about twice the model; streaming must stay
    within the model plus a shard (plus allocator slack), in FP32 and in BF16."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("needs Linux /proc/self/clear_refs to measure peak RSS")
    from transformers import LlamaConfig

    from prismatic.models.materialize import VLMArchitecture, build_vlm_from_spec
    from prismatic.models.registry import BaseVLMSpec

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=512,
        intermediate_size=1344,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        vocab_size=1024,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
    )
    spec = BaseVLMSpec("tiny-vit-64px", "tiny-llama", "gelu-mlp", "resize-naive")
    model = build_vlm_from_spec(VLMArchitecture("peak", spec, llm_config=config))
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    shard_bytes = 20 * 10**6
    out = _export(model, tmp_path / "hf", max_shard_size=shard_bytes)
    warmup = _export(build_vlm("tiny-vit+tiny-llama"), tmp_path / "warmup")
    del model
    for dtype, scale in (("float32", 1.0), ("bfloat16", 0.5)):
        proc = subprocess.run(
            [sys.executable, "-c", PEAK_CHILD, str(out), dtype, str(warmup)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak"]
        # The old loader's peak was a random-init FP32 model plus the whole state dict: twice the model.
        bound = scale * model_bytes + 1.5 * shard_bytes
        assert peak < bound, f"{dtype}: peak {peak / 2**20:.0f} MiB above floor > {bound / 2**20:.0f} MiB"
