"""The Hugging Face OpenVLA checkpoint layout, out and in: what `openvla/openvla-7b` on the Hub looks like.

A folder holds `config.json` (`model_type` "openvla", the fields of OpenVLA's `OpenVLAConfig` /
`PrismaticConfig` in its `prismatic/extern/hf/configuration_prismatic.py`, with `norm_stats` and
`n_action_bins`), safetensors shards plus `model.safetensors.index.json`, the tokenizer (with its `<PAD>`), and
`preprocessor_config.json` / `processor_config.json`. Parameter names are those of OpenVLA's HF modeling code
(`modeling_prismatic.py`, and its `convert_openvla_weights_to_hf.py`):

    vision_backbone.featurizer.*        the (first) ViT; timm LayerScale `gamma` is stored as `scale_factor`
    vision_backbone.fused_featurizer.*  the second ViT of a fused backbone (SigLIP / CLIP)
    projector.fc1|fc2|fc3.*             Prismatic's `projector.0|2|4.*`
    language_model.*                    the HF causal LM (`llm.*` in our `llm_backbone`)

Loading such a folder with `transformers` and `trust_remote_code=True` runs OpenVLA's three modeling files. By
default every `auto_map` (config, preprocessor, processor and tokenizer configs) names them in the Hub repository
`openvla/openvla-7b` (`openvla/openvla-7b--modeling_prismatic.OpenVLAForActionPrediction`, as OpenVLA's own
fine-tuned checkpoints do), which transformers fetches once and caches: no source tree needed.
`export_hf_openvla(..., hf_code_dir=...)` copies them from an OpenVLA checkout instead, for sites without the Hub,
and the `auto_map` entries then name those local modules. This module never runs remote code and reads weights
only through safetensors.

This module holds the name mapping and the writer. Reading is split by job: `prismatic.models.hf_config` turns
`config.json` into the architecture to build (`hf_architecture`), `prismatic.models.hf_shards` streams the weights
one shard at a time (`hf_weight_shapes` reads only the headers, `iter_hf_shards` one shard's tensors), so a loader
never holds more than the model plus one shard.

Writing: shards are converted and written one at a time; `tokenizer_config.json` names a class that the
transformers OpenVLA pins (4.40.x) knows (`openvla_tokenizer_class`), not one only newer versions define, and
holds no key only transformers 5 writes (`TRANSFORMERS5_TOKENIZER_KEYS`).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from prismatic.models.action_heads.registry import copy_head_files
from prismatic.models.backbones.vision.registry import (
    FusedViTSpec,
    VisionBackboneSpec,
    get_vision_backbone_spec,
)
from prismatic.models.hf_config import DEFAULT_HF_CODE_REPO, code_reference, hf_config_dict
from prismatic.models.hf_shards import INDEX_FILE
from prismatic.models.registry import BaseVLMSpec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.run_layout import ACTION_MODEL_FILE, DATASET_STATISTICS_FILE, HF_CONFIG_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.files import normal_permissions, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

HF_CODE_FILES = ("configuration_prismatic.py", "modeling_prismatic.py", "processing_prismatic.py")
_PROJECTOR_TO_HF = {"0": "fc1", "2": "fc2", "4": "fc3"}
_PROJECTOR_FROM_HF = {v: k for k, v in _PROJECTOR_TO_HF.items()}
# HF transformers renames parameters called `gamma` on load, so OpenVLA's HF code renames timm's LayerScale.
_LS_GAMMA = re.compile(r"\.(ls[12])\.gamma$")
_LS_SCALE = re.compile(r"\.(ls[12])\.scale_factor$")
_HF_PARTS = ("featurizer", "fused_featurizer")
ACTION_MODULES = ("action_head", "proprio_projector")  # `PrismaticVLM.attach_action_modules`'s children
# Tokenizer classes transformers 4.40 (OpenVLA's pin) loads from tokenizer.json. 5.x writes "TokenizersBackend",
# which 4.40 cannot import, and "LlamaTokenizer", which is 4.40's sentencepiece class (needs tokenizer.model) unless
# AutoTokenizer happens to swap in the fast one.
LLAMA_TOKENIZER_CLASS = "LlamaTokenizerFast"
GENERIC_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
EXPORT_DTYPES = ("bfloat16", "float32", "float16")
# tokenizer_config.json keys transformers 5 writes that no 4.x reads: load-time arguments saved back (`is_local`,
# `local_files_only`) and 5.x's tokenizer back-end choice (`backend`). 4.40 would hand them to the tokenizer's
# __init__ as unknown kwargs.
TRANSFORMERS5_TOKENIZER_KEYS = ("is_local", "local_files_only", "backend")
PROCESSOR_CLASS = "PrismaticProcessor"
PROCESSOR_MODULE_CLASS = "processing_prismatic.PrismaticProcessor"
IMAGE_PROCESSOR_MODULE_CLASS = "processing_prismatic.PrismaticImageProcessor"


def _vision_spec(vision: str | VisionBackboneSpec) -> VisionBackboneSpec:
    return get_vision_backbone_spec(vision) if isinstance(vision, str) else vision


def _vision_parts(vision: str | VisionBackboneSpec) -> list[str]:
    """Our sub-module prefixes in HF order: `featurizer` / `fused_featurizer`."""
    spec = _vision_spec(vision)
    if not isinstance(spec, FusedViTSpec):
        return ["featurizer"]
    if len(spec.parts) != 2:
        raise ConfigError(
            f"Vision backbone {vision if isinstance(vision, str) else list(spec.parts)} fuses {len(spec.parts)} "
            "ViTs; the HF OpenVLA layout holds at most two (featurizer, fused_featurizer)."
        )
    return [f"{name}_featurizer" for name in spec.parts]


def to_hf_state_dict(
    vlm: PrismaticVLM, vision: str | VisionBackboneSpec | None = None
) -> dict[str, torch.Tensor]:
    """Our `vision_backbone.* / projector.* / llm_backbone.*` tensors under OpenVLA's HF names (no copies).

    `vision` (an id or spec) defaults to the spec the VLM's vision backbone was built from.
    """
    vision = vision if vision is not None else vlm.vision_backbone.spec
    parts = dict(zip(_vision_parts(vision), _HF_PARTS, strict=False))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in vlm.state_dict().items():
        module, _, rest = name.partition(".")
        if module == "vision_backbone":
            part, _, key = rest.partition(".")
            key = _LS_GAMMA.sub(r".\1.scale_factor", key)
            out[f"vision_backbone.{parts[part]}.{key}"] = tensor
        elif module == "projector":
            index, _, suffix = rest.removeprefix("projector.").partition(".")
            out[f"projector.{_PROJECTOR_TO_HF[index]}.{suffix}"] = tensor
        elif module == "llm_backbone":
            out[f"language_model.{rest.removeprefix('llm.')}"] = tensor
        elif module in ACTION_MODULES:  # an action head's modules keep their names (OpenVLA has none)
            out[name] = tensor
        else:
            raise ValueError(f"Unexpected parameter '{name}' outside the three VLM modules.")
    return out


def _hf_to_ours_name(name: str, parts: Mapping[str, str]) -> str:
    """One HF OpenVLA parameter name -> ours; `parts` maps HF featurizer names to our sub-modules."""
    if name.startswith("vision_backbone."):
        part, _, key = name.removeprefix("vision_backbone.").partition(".")
        if part not in parts:
            raise ConfigError(
                f"HF checkpoint key '{name}' does not fit the vision backbone, whose parts are {list(parts)}."
            )
        key = _LS_SCALE.sub(r".\1.gamma", key)
        return f"vision_backbone.{parts[part]}.{key}"
    if name.startswith("projector."):
        layer, _, suffix = name.removeprefix("projector.").partition(".")
        if layer not in _PROJECTOR_FROM_HF:
            raise ConfigError(f"HF checkpoint key '{name}' is not a projector layer (fc1, fc2, fc3).")
        return f"projector.projector.{_PROJECTOR_FROM_HF[layer]}.{suffix}"
    if name.startswith("language_model."):
        return f"llm_backbone.llm.{name.removeprefix('language_model.')}"
    if name.partition(".")[0] in ACTION_MODULES:
        return name
    raise ConfigError(f"HF checkpoint key '{name}' belongs to no VLM module.")


def from_hf_names(names: Collection[str], vision: str | VisionBackboneSpec) -> dict[str, str]:
    """HF OpenVLA name -> our flat `PrismaticVLM` state-dict name, for every name given.

    Raises:
        ConfigError: a name that belongs to no module of this architecture.
    """
    parts = dict(zip(_HF_PARTS, _vision_parts(vision), strict=False))
    return {name: _hf_to_ours_name(name, parts) for name in names}


def from_hf_state_dict(
    hf: Mapping[str, torch.Tensor], vision: str | VisionBackboneSpec
) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_state_dict`: HF OpenVLA names -> our flat `PrismaticVLM` state-dict names."""
    names = from_hf_names(list(hf), vision)
    return {names[name]: tensor for name, tensor in hf.items()}


def openvla_tokenizer_class(tokenizer: PreTrainedTokenizerBase) -> str:
    """The `tokenizer_class` to write for `tokenizer`: one transformers 4.40.x (OpenVLA's pin) can load.

    Llama tokenizers (Llama-2, Vicuna, Mistral) are `LlamaTokenizerFast` there; every other tokenizer is written
    as the generic `PreTrainedTokenizerFast`, which takes `tokenizer.json` (with its BOS post-processor) as is.
    """
    name = type(tokenizer).__name__
    return (
        LLAMA_TOKENIZER_CLASS if name in ("LlamaTokenizer", "LlamaTokenizerFast") else GENERIC_TOKENIZER_CLASS
    )


def legacy_bpe_merges(tokenizer_json: dict[str, Any]) -> bool:
    """Write a BPE model's merges as "a b" strings, the only form tokenizers < 0.20 parses (transformers 4.40,
    OpenVLA's pin, fails with "data did not match any variant of untagged enum ModelWrapper" on the [a, b] pairs
    that tokenizers >= 0.20 writes). Kept as pairs when a part holds a space (not expressible the old way).
    Returns whether `tokenizer_json` changed."""
    model = tokenizer_json.get("model", {})
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not all(isinstance(m, list) for m in merges):
        return False
    if any(" " in part for merge in merges for part in merge):
        logger.warning("Tokenizer merges contain spaces: tokenizer.json keeps tokenizers >= 0.20's format.")
        return False
    model["merges"] = [" ".join(merge) for merge in merges]
    return True


def save_tokenizer(
    tokenizer: PreTrainedTokenizerBase, out_dir: Path, code_repo: str | None = DEFAULT_HF_CODE_REPO
) -> None:
    """`save_pretrained`, then make the files loadable by OpenVLA's transformers (4.40): a class it knows in
    `tokenizer_config.json`, no transformers-5-only keys, BPE merges in the format its tokenizers (0.19) reads, and
    the processor entries OpenVLA's published tokenizer config has (`code_repo` as in `hf_config_dict`)."""
    tokenizer.save_pretrained(str(out_dir))
    tokenizer_path = out_dir / "tokenizer.json"
    if tokenizer_path.is_file():
        tokenizer_json = json.loads(tokenizer_path.read_text())
        if legacy_bpe_merges(tokenizer_json):
            write_text_atomic(
                tokenizer_path,
                json.dumps(tokenizer_json, indent=2, ensure_ascii=False) + "\n",
                "the tokenizer",
            )
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    for key in TRANSFORMERS5_TOKENIZER_KEYS:
        config.pop(key, None)
    config["tokenizer_class"] = openvla_tokenizer_class(tokenizer)
    config["processor_class"] = PROCESSOR_CLASS
    config["auto_map"] = {"AutoProcessor": code_reference(PROCESSOR_MODULE_CLASS, code_repo)}
    write_text_atomic(
        config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n", "the tokenizer config"
    )


def _processor_configs(vlm: PrismaticVLM, spec: BaseVLMSpec, code_repo: str | None) -> tuple[dict, dict]:
    backbone = vlm.vision_backbone
    data_cfgs = list(backbone.data_cfgs.values()) if hasattr(backbone, "data_cfgs") else [backbone.data_cfg]
    processor_ref = code_reference(PROCESSOR_MODULE_CLASS, code_repo)
    image = {
        "image_processor_type": "PrismaticImageProcessor",
        "processor_class": PROCESSOR_CLASS,
        "auto_map": {
            "AutoImageProcessor": code_reference(IMAGE_PROCESSOR_MODULE_CLASS, code_repo),
            "AutoProcessor": processor_ref,
        },
        "use_fused_vision_backbone": len(data_cfgs) > 1,
        "image_resize_strategy": spec.image_resize_strategy,
        "input_sizes": [list(cfg["input_size"]) for cfg in data_cfgs],
        "interpolations": [cfg["interpolation"] for cfg in data_cfgs],
        "means": [list(cfg["mean"]) for cfg in data_cfgs],
        "stds": [list(cfg["std"]) for cfg in data_cfgs],
    }
    processor = {"processor_class": PROCESSOR_CLASS, "auto_map": {"AutoProcessor": processor_ref}}
    return image, processor


def export_hf_openvla(
    vlm: PrismaticVLM,
    spec: BaseVLMSpec,
    out_dir: Path,
    *,
    norm_stats: Mapping[str, Any] | None,
    dtype: str = "bfloat16",
    max_shard_size: str | int = "5GB",
    hf_code_dir: Path | None = None,
    hf_code_repo: str = DEFAULT_HF_CODE_REPO,
) -> Path:
    """Write `vlm` as an HF OpenVLA folder (see the module docstring for the layout).

    Args:
        vlm: the model (weights in any dtype; written as `dtype`).
        spec: its vision backbone / LLM / projector / resize ids (written into config.json).
        out_dir: created if missing; existing files of the same names are replaced.
        norm_stats: OpenVLA's `dataset_statistics.json` content (`config.norm_stats`, for un-normalising actions).
        dtype: "bfloat16" (OpenVLA's release dtype) or "float32" (exact round trips).
        max_shard_size: largest safetensors shard ("5GB", or bytes).
        hf_code_dir: a folder holding OpenVLA's `configuration_prismatic.py`, `modeling_prismatic.py`,
            `processing_prismatic.py`, copied beside the weights; `auto_map` then names those local modules, so
            `trust_remote_code` loading works without the Hub.
        hf_code_repo: without `hf_code_dir`, the Hub repository `auto_map` names for that code (transformers
            fetches it on the first `trust_remote_code` load).

    Returns:
        `out_dir`.
    """
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"Unknown export dtype '{dtype}'. Valid choices: {', '.join(EXPORT_DTYPES)}.")
    if hf_code_dir is not None:
        missing = [name for name in HF_CODE_FILES if not (hf_code_dir / name).is_file()]
        if missing:  # before any weight is written
            raise ConfigError(
                f"hf_code_dir '{hf_code_dir}' has no '{missing[0]}' (OpenVLA's prismatic/extern/hf/)."
            )
    code_repo = None if hf_code_dir is not None else hf_code_repo
    torch_dtype = getattr(torch, dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = to_hf_state_dict(vlm)  # the model's own tensors: nothing is copied yet

    def target(t: torch.Tensor) -> torch.dtype:
        return torch_dtype if t.is_floating_point() else t.dtype

    # Plan shards by the size each tensor will have on disk (meta tensors: no memory), then convert and write one
    # shard at a time: peak memory is the model plus one shard. Every tensor is copied, so a shard never holds two
    # views of one storage (tied embeddings), which safetensors refuses.
    planned = {k: torch.empty(v.shape, dtype=target(v), device="meta") for k, v in state.items()}
    split = split_torch_state_dict_into_shards(
        planned, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    for filename, names in split.filename_to_tensors.items():
        shard = {
            name: state[name].detach().to("cpu", target(state[name]), copy=True).contiguous()
            for name in names
        }
        save_file(shard, str(out_dir / filename), metadata={"format": "pt"})
        normal_permissions(out_dir / filename)  # safetensors writes 0600; shared lab folders need the umask's
        del shard
    if split.is_sharded:
        index = {"metadata": {**split.metadata}, "weight_map": split.tensor_to_filename}
        write_json_atomic(out_dir / INDEX_FILE, index, "the HF export's shard index")

    config = hf_config_dict(vlm, spec, norm_stats, dtype, code_repo)
    if not vlm.action_spec.is_default:
        # OpenVLA's own HF code decodes tokens only; `prismatic.load_policy` reads the head from this file.
        config["action_model"] = vlm.action_spec.to_dict()
        write_json_atomic(
            out_dir / ACTION_MODEL_FILE, vlm.action_spec.to_dict(), "the HF export's action spec"
        )
        # The head's own files (FAST's vocabulary), from the folder the model was loaded from.
        copy_head_files(vlm.action_spec.head, getattr(vlm, "run_files_dir", None), out_dir)
    write_json_atomic(out_dir / HF_CONFIG_FILE, config, "the HF export's config")
    image_cfg, processor_cfg = _processor_configs(vlm, spec, code_repo)
    write_json_atomic(
        out_dir / "preprocessor_config.json", image_cfg, "the HF export's image processor config"
    )
    write_json_atomic(out_dir / "processor_config.json", processor_cfg, "the HF export's processor config")
    if norm_stats is not None:
        write_json_atomic(out_dir / DATASET_STATISTICS_FILE, norm_stats, "the HF export's statistics")
    save_tokenizer(vlm.llm_backbone.tokenizer, out_dir, code_repo)
    if hf_code_dir is not None:
        for name in HF_CODE_FILES:
            shutil.copyfile(hf_code_dir / name, out_dir / name)
    logger.info("Wrote HF OpenVLA checkpoint to %s (%d tensors, %s)", out_dir, len(state), dtype)
    return out_dir
