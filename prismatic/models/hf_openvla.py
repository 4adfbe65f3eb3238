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

Loading such a folder with `transformers` and `trust_remote_code=True` also needs OpenVLA's three modeling
files beside the weights: `export_hf_openvla(..., hf_code_dir=...)` copies them from an OpenVLA checkout.
This module never runs remote code and reads weights only through safetensors.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from prismatic.models.backbones.vision.registry import FusedViTSpec, get_vision_backbone_spec
from prismatic.models.registry import BaseVLMSpec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

HF_MODEL_TYPES = ("openvla", "prismatic")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HF_CODE_FILES = ("configuration_prismatic.py", "modeling_prismatic.py", "processing_prismatic.py")
_PROJECTOR_TO_HF = {"0": "fc1", "2": "fc2", "4": "fc3"}
_PROJECTOR_FROM_HF = {v: k for k, v in _PROJECTOR_TO_HF.items()}
# HF transformers renames parameters called `gamma` on load, so OpenVLA's HF code renames timm's LayerScale.
_LS_GAMMA = re.compile(r"\.(ls[12])\.gamma$")
_LS_SCALE = re.compile(r"\.(ls[12])\.scale_factor$")


def _vision_parts(vision_backbone_id: str) -> list[str]:
    """Our sub-module prefixes in HF order: `featurizer` / `fused_featurizer`."""
    spec = get_vision_backbone_spec(vision_backbone_id)
    if not isinstance(spec, FusedViTSpec):
        return ["featurizer"]
    if len(spec.parts) != 2:
        raise ConfigError(
            f"Vision backbone '{vision_backbone_id}' fuses {len(spec.parts)} ViTs; the HF OpenVLA layout holds "
            "at most two (featurizer, fused_featurizer)."
        )
    return [f"{name}_featurizer" for name in spec.parts]


def to_hf_state_dict(vlm: PrismaticVLM, vision_backbone_id: str) -> dict[str, torch.Tensor]:
    """Our `vision_backbone.* / projector.* / llm_backbone.*` parameters under OpenVLA's HF names."""
    parts = dict(zip(_vision_parts(vision_backbone_id), ("featurizer", "fused_featurizer"), strict=False))
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
        else:
            raise ValueError(f"Unexpected parameter '{name}' outside the three VLM modules.")
    return out


def from_hf_state_dict(hf: Mapping[str, torch.Tensor], vision_backbone_id: str) -> dict[str, torch.Tensor]:
    """The inverse of `to_hf_state_dict`: HF OpenVLA names -> our flat `PrismaticVLM` state-dict names."""
    parts = dict(zip(("featurizer", "fused_featurizer"), _vision_parts(vision_backbone_id), strict=False))
    out: dict[str, torch.Tensor] = {}
    for name, tensor in hf.items():
        if name.startswith("vision_backbone."):
            part, _, key = name.removeprefix("vision_backbone.").partition(".")
            if part not in parts:
                raise ConfigError(
                    f"HF checkpoint key '{name}' does not fit vision backbone '{vision_backbone_id}'."
                )
            key = _LS_SCALE.sub(r".\1.gamma", key)
            out[f"vision_backbone.{parts[part]}.{key}"] = tensor
        elif name.startswith("projector."):
            layer, _, suffix = name.removeprefix("projector.").partition(".")
            if layer not in _PROJECTOR_FROM_HF:
                raise ConfigError(f"HF checkpoint key '{name}' is not a projector layer (fc1, fc2, fc3).")
            out[f"projector.projector.{_PROJECTOR_FROM_HF[layer]}.{suffix}"] = tensor
        elif name.startswith("language_model."):
            out[f"llm_backbone.llm.{name.removeprefix('language_model.')}"] = tensor
        else:
            raise ConfigError(f"HF checkpoint key '{name}' belongs to no VLM module.")
    return out


def hf_config_dict(
    vlm: PrismaticVLM, spec: BaseVLMSpec, norm_stats: Mapping[str, Any] | None, dtype: str
) -> dict:
    """`config.json` for the HF OpenVLA layout (OpenVLAConfig's fields, as OpenVLA's converter writes them)."""
    vision_spec = get_vision_backbone_spec(spec.vision_backbone_id)
    vits = list(vision_spec.parts.values()) if isinstance(vision_spec, FusedViTSpec) else [vision_spec.vit]
    llm = vlm.llm_backbone
    text_config = llm.llm.config.to_dict()
    text_config.update(use_cache=True, torch_dtype=dtype, pad_token_id=llm.tokenizer.pad_token_id)
    text_config.pop("dtype", None)
    return {
        "model_type": "openvla",
        "architectures": ["OpenVLAForActionPrediction"],
        "auto_map": {
            "AutoConfig": "configuration_prismatic.OpenVLAConfig",
            "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction",
        },
        "vision_backbone_id": spec.vision_backbone_id,
        "llm_backbone_id": spec.llm_backbone_id,
        "arch_specifier": spec.arch_specifier,
        "use_fused_vision_backbone": isinstance(vision_spec, FusedViTSpec),
        "image_resize_strategy": spec.image_resize_strategy,
        # As OpenVLA's config names them: SigLIP without its pretrained tag, the others with theirs.
        "timm_model_ids": [vit.timm_id.removesuffix(".webli") for vit in vits],
        "timm_override_act_layers": [vit.arch_overrides.get("act_layer") for vit in vits],
        "image_sizes": [vit.image_size for vit in vits],
        "hf_llm_id": llm.spec.hf_hub_id,
        "llm_max_length": llm.tokenizer.model_max_length,
        "pad_token_id": llm.tokenizer.pad_token_id,
        "pad_to_multiple_of": 64,
        "output_projector_states": False,
        "text_config": text_config,
        "norm_stats": dict(norm_stats) if norm_stats is not None else None,
        "n_action_bins": 256,
        "torch_dtype": dtype,
    }


def _processor_configs(vlm: PrismaticVLM, spec: BaseVLMSpec) -> tuple[dict, dict]:
    backbone = vlm.vision_backbone
    data_cfgs = list(backbone.data_cfgs.values()) if hasattr(backbone, "data_cfgs") else [backbone.data_cfg]
    image = {
        "image_processor_type": "PrismaticImageProcessor",
        "processor_class": "PrismaticProcessor",
        "auto_map": {
            "AutoImageProcessor": "processing_prismatic.PrismaticImageProcessor",
            "AutoProcessor": "processing_prismatic.PrismaticProcessor",
        },
        "use_fused_vision_backbone": len(data_cfgs) > 1,
        "image_resize_strategy": spec.image_resize_strategy,
        "input_sizes": [list(cfg["input_size"]) for cfg in data_cfgs],
        "interpolations": [cfg["interpolation"] for cfg in data_cfgs],
        "means": [list(cfg["mean"]) for cfg in data_cfgs],
        "stds": [list(cfg["std"]) for cfg in data_cfgs],
    }
    processor = {
        "processor_class": "PrismaticProcessor",
        "auto_map": {"AutoProcessor": "processing_prismatic.PrismaticProcessor"},
    }
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
            `processing_prismatic.py`, copied beside the weights so `trust_remote_code` loading works.

    Returns:
        `out_dir`.
    """
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    if dtype not in ("bfloat16", "float32", "float16"):
        raise ConfigError(f"Unknown export dtype '{dtype}'. Valid choices: bfloat16, float32, float16.")
    torch_dtype = getattr(torch, dtype)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Shards must hold distinct storages (tied embeddings would be refused): clone every tensor.
    state = {
        k: v.detach().to("cpu", torch_dtype if v.is_floating_point() else v.dtype).clone().contiguous()
        for k, v in to_hf_state_dict(vlm, spec.vision_backbone_id).items()
    }
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size
    )
    for filename, names in split.filename_to_tensors.items():
        save_file({name: state[name] for name in names}, str(out_dir / filename), metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {**split.metadata}, "weight_map": split.tensor_to_filename}
        (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")

    config = hf_config_dict(vlm, spec, norm_stats, dtype)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    image_cfg, processor_cfg = _processor_configs(vlm, spec)
    (out_dir / "preprocessor_config.json").write_text(json.dumps(image_cfg, indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps(processor_cfg, indent=2) + "\n")
    if norm_stats is not None:
        (out_dir / "dataset_statistics.json").write_text(json.dumps(norm_stats, indent=2) + "\n")
    vlm.llm_backbone.tokenizer.save_pretrained(str(out_dir))
    if hf_code_dir is not None:
        for name in HF_CODE_FILES:
            if not (hf_code_dir / name).is_file():
                raise ConfigError(
                    f"hf_code_dir '{hf_code_dir}' has no '{name}' (OpenVLA's prismatic/extern/hf/)."
                )
            shutil.copyfile(hf_code_dir / name, out_dir / name)
    logger.info("Wrote HF OpenVLA checkpoint to %s (%d tensors, %s)", out_dir, len(state), dtype)
    return out_dir


def is_hf_openvla_dir(path: Path) -> bool:
    """A folder whose config.json says `model_type` "openvla" / "prismatic"."""
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") in HF_MODEL_TYPES
    except (json.JSONDecodeError, AttributeError):
        return False


def read_hf_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF folder's safetensors shard(s) (index file or a single `model.safetensors`).

    Raises:
        ConfigError: no weights, or a shard the index names is missing.
    """
    from safetensors.torch import load_file

    if (folder / INDEX_FILE).is_file():
        weight_map: dict[str, str] = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise ConfigError(f"HF checkpoint folder '{folder}' holds neither {INDEX_FILE} nor {SINGLE_FILE}.")
    state: dict[str, torch.Tensor] = {}
    for filename in files:
        if not (folder / filename).is_file():
            raise ConfigError(
                f"HF checkpoint folder '{folder}' is missing shard '{filename}' named by its index."
            )
        state.update(load_file(str(folder / filename)))
    return state


def hf_spec_and_llm_config(folder: Path) -> tuple[str, BaseVLMSpec, Any, dict[str, Any]]:
    """(model id, BaseVLMSpec, transformers text config, raw config) from an HF OpenVLA `config.json`."""
    from transformers import AutoConfig

    raw = json.loads((folder / "config.json").read_text())
    missing = [
        k for k in ("vision_backbone_id", "llm_backbone_id", "arch_specifier", "text_config") if k not in raw
    ]
    if missing:
        raise ConfigError(
            f"'{folder / 'config.json'}' lacks {missing}: not an HF OpenVLA / Prismatic config."
        )
    spec = BaseVLMSpec(
        raw["vision_backbone_id"],
        raw["llm_backbone_id"],
        raw["arch_specifier"],
        raw.get("image_resize_strategy", "letterbox"),
    )
    text = dict(raw["text_config"])
    for key in ("torch_dtype", "dtype", "transformers_version", "_name_or_path", "architectures"):
        text.pop(key, None)
    llm_config = AutoConfig.for_model(text.pop("model_type"), **text)
    return folder.name, spec, llm_config, raw
