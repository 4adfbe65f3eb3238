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

Reading a folder (`hf_architecture`): the ViTs are the ones `timm_model_ids` / `image_sizes` /
`timm_override_act_layers` name, as OpenVLA's modeling code builds them. A `vision_backbone_id` registered here must
agree with them (else a `ConfigError` before anything is built); one not registered here is built from them alone.
`timm_arch_overrides` is this tool's extension (other timm kwargs, for the tiny presets); OpenVLA's code ignores it.
Weights stream one shard at a time (`hf_weight_shapes` reads only the headers, `iter_hf_shards` one shard's
tensors), so a loader never holds more than the model plus one shard.

Writing: shards are converted and written one at a time; `tokenizer_config.json` names a class that the
transformers OpenVLA pins (4.40.x) knows (`openvla_tokenizer_class`), not one only newer versions define.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from prismatic.models.backbones.vision.registry import (
    VISION_BACKBONES,
    FusedViTSpec,
    VisionBackboneSpec,
    ViTSpec,
    describe_vits,
    get_vision_backbone_spec,
    timm_architecture,
    vision_spec_from_vits,
    vits_match,
    vits_of,
)
from prismatic.models.materialize import VLMArchitecture
from prismatic.models.registry import BaseVLMSpec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.run_layout import ACTION_MODEL_FILE, DATASET_STATISTICS_FILE
from prismatic.util.errors import ConfigError, did_you_mean
from prismatic.util.files import normal_permissions, write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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
# This tool's extension of OpenVLA's config: timm kwargs beyond `act_layer`, one dict per ViT (tiny presets).
ARCH_OVERRIDES_FIELD = "timm_arch_overrides"
_HF_PARTS = ("featurizer", "fused_featurizer")
ACTION_MODULES = ("action_head", "proprio_projector")  # `PrismaticVLM.attach_action_modules`'s children
# Tokenizer classes transformers 4.40 (OpenVLA's pin) loads from tokenizer.json. 5.x writes "TokenizersBackend",
# which 4.40 cannot import, and "LlamaTokenizer", which is 4.40's sentencepiece class (needs tokenizer.model) unless
# AutoTokenizer happens to swap in the fast one.
LLAMA_TOKENIZER_CLASS = "LlamaTokenizerFast"
GENERIC_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
EXPORT_DTYPES = ("bfloat16", "float32", "float16")


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


def hf_config_dict(
    vlm: PrismaticVLM, spec: BaseVLMSpec, norm_stats: Mapping[str, Any] | None, dtype: str
) -> dict:
    """`config.json` for the HF OpenVLA layout (OpenVLAConfig's fields, as OpenVLA's converter writes them)."""
    vision_spec = vlm.vision_backbone.spec
    vits = vits_of(vision_spec)
    llm = vlm.llm_backbone
    text_config = llm.llm.config.to_dict()
    text_config.update(use_cache=True, torch_dtype=dtype, pad_token_id=llm.tokenizer.pad_token_id)
    text_config.pop("dtype", None)
    extra_overrides = [{k: v for k, v in vit.arch_overrides.items() if k != "act_layer"} for vit in vits]
    config = {
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
    if any(extra_overrides):  # only the tiny presets: real backbones write exactly OpenVLA's fields
        config[ARCH_OVERRIDES_FIELD] = extra_overrides
    return config


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


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    """`save_pretrained`, then make the files loadable by OpenVLA's transformers (4.40): a class it knows in
    `tokenizer_config.json`, and BPE merges in the format its tokenizers (0.19) reads."""
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
    config["tokenizer_class"] = openvla_tokenizer_class(tokenizer)
    write_text_atomic(
        config_path, json.dumps(config, indent=2, ensure_ascii=False) + "\n", "the tokenizer config"
    )


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

    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"Unknown export dtype '{dtype}'. Valid choices: {', '.join(EXPORT_DTYPES)}.")
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

    config = hf_config_dict(vlm, spec, norm_stats, dtype)
    if not vlm.action_spec.is_default:
        # OpenVLA's own HF code decodes tokens only; `prismatic.load_policy` reads the head from this file.
        config["action_model"] = vlm.action_spec.to_dict()
        write_json_atomic(
            out_dir / ACTION_MODEL_FILE, vlm.action_spec.to_dict(), "the HF export's action spec"
        )
    write_json_atomic(out_dir / "config.json", config, "the HF export's config")
    image_cfg, processor_cfg = _processor_configs(vlm, spec)
    write_json_atomic(
        out_dir / "preprocessor_config.json", image_cfg, "the HF export's image processor config"
    )
    write_json_atomic(out_dir / "processor_config.json", processor_cfg, "the HF export's processor config")
    if norm_stats is not None:
        write_json_atomic(out_dir / DATASET_STATISTICS_FILE, norm_stats, "the HF export's statistics")
    save_tokenizer(vlm.llm_backbone.tokenizer, out_dir)
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


def _shard_files(folder: Path) -> list[Path]:
    """The safetensors files of an HF folder (index file or a single `model.safetensors`).

    Raises:
        ConfigError: no weights, or a shard the index names is missing.
    """
    if (folder / INDEX_FILE).is_file():
        try:
            weight_map: dict[str, str] = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(f"'{folder / INDEX_FILE}' is not a safetensors index (no weight_map).") from err
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        raise ConfigError(f"HF checkpoint folder '{folder}' holds neither {INDEX_FILE} nor {SINGLE_FILE}.")
    for filename in files:
        if not (folder / filename).is_file():
            raise ConfigError(
                f"HF checkpoint folder '{folder}' is missing shard '{filename}' named by its index."
            )
    return [folder / filename for filename in files]


def _open_shard(path: Path) -> Any:
    from safetensors import SafetensorError, safe_open

    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as err:
        raise ConfigError(f"'{path}' is not a readable safetensors file: {err}") from err


def hf_weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's HF name and shape, from the shards' headers only (no tensor data is read).

    Raises:
        ConfigError: no weights, a missing shard, or a file that is not safetensors.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    for path in _shard_files(folder):
        with _open_shard(path) as shard:
            for name in shard.keys():
                shapes[name] = tuple(shard.get_slice(name).get_shape())
    return shapes


def iter_hf_shards(folder: Path, names: Collection[str] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """The tensors of an HF folder, one shard (file) at a time, optionally only those in `names`.

    Each dict is the caller's to consume and drop before the next is read: that is what keeps a load at one
    model plus one shard.
    """
    for path in _shard_files(folder):
        with _open_shard(path) as shard:
            wanted = [n for n in shard.keys() if names is None or n in names]
            if wanted:
                yield {name: shard.get_tensor(name) for name in wanted}


def read_hf_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF folder's safetensors shard(s), all at once (small models, tests).

    Raises:
        ConfigError: no weights, or a shard the index names is missing.
    """
    state: dict[str, torch.Tensor] = {}
    for shard in iter_hf_shards(folder):
        state.update(shard)
    return state


def _same_length_list(raw: Mapping[str, Any], field: str, length: int, where: Path) -> list[Any]:
    value = raw[field]
    if not isinstance(value, list) or len(value) != length:
        raise ConfigError(
            f"'{where}': {field} must be a list with one entry per ViT ({length}, as timm_model_ids), got "
            f"{value!r}."
        )
    return value


def _vits_from_config(raw: Mapping[str, Any], where: Path) -> list[ViTSpec]:
    """The ViTs an HF OpenVLA config describes (`timm_model_ids`, `image_sizes`, `timm_override_act_layers`)."""
    import timm

    ids = raw["timm_model_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= 2 or not all(isinstance(i, str) and i for i in ids):
        raise ConfigError(f"'{where}': timm_model_ids must list one or two timm model names, got {ids!r}.")
    if "image_sizes" not in raw:
        raise ConfigError(
            f"'{where}' names timm_model_ids {ids} but no image_sizes (one resolution per ViT)."
        )
    sizes = _same_length_list(raw, "image_sizes", len(ids), where)
    if not all(isinstance(size, int) and size > 0 for size in sizes):
        raise ConfigError(f"'{where}': image_sizes must be positive integers, got {sizes!r}.")
    acts = (
        _same_length_list(raw, "timm_override_act_layers", len(ids), where)
        if raw.get("timm_override_act_layers") is not None
        else [None] * len(ids)
    )
    extras = (
        _same_length_list(raw, ARCH_OVERRIDES_FIELD, len(ids), where)
        if raw.get(ARCH_OVERRIDES_FIELD) is not None
        else [{}] * len(ids)
    )
    fused = raw.get("use_fused_vision_backbone")
    if fused is not None and bool(fused) != (len(ids) == 2):
        raise ConfigError(
            f"'{where}': use_fused_vision_backbone is {fused} but timm_model_ids names {len(ids)} ViT(s) "
            "(a fused backbone has exactly two)."
        )
    vits = []
    for timm_id, size, act, extra in zip(ids, sizes, acts, extras, strict=True):
        if not timm.is_model(timm_architecture(timm_id)):
            raise ConfigError(
                f"'{where}': timm_model_ids names '{timm_id}', which timm {timm.__version__} does not know."
                f"{did_you_mean(timm_architecture(timm_id), timm.list_models())}"
            )
        if not isinstance(extra, Mapping) or not (act is None or isinstance(act, str)):
            raise ConfigError(
                f"'{where}': timm_override_act_layers entries must be names or null and {ARCH_OVERRIDES_FIELD} "
                f"entries objects, got {act!r} / {extra!r}."
            )
        vits.append(ViTSpec(timm_id, size, {**extra, **({"act_layer": act} if act else {})}))
    return vits


def hf_vision_spec(raw: Mapping[str, Any], where: Path) -> VisionBackboneSpec:
    """The vision backbone an HF OpenVLA config describes, checked against our registry.

    With `timm_model_ids`, those ViTs are what the weights were written for (OpenVLA's modeling code builds them):
    a registered `vision_backbone_id` must describe the same ViTs (timm architecture, any pretrained tag;
    resolution; act layer); an id not registered here is built from them alone. Without them (older configs),
    the id must be registered.

    Raises:
        ConfigError: the config and the registry disagree, the timm fields are malformed or unknown to timm, or
            the id is unknown and no timm ids are given.
    """
    vision_id = raw["vision_backbone_id"]
    registered = VISION_BACKBONES.get(vision_id)
    if raw.get("timm_model_ids") is None:
        if registered is None:
            raise ConfigError(
                f"'{where}': vision_backbone_id '{vision_id}' is not registered here and the config names no "
                f"timm_model_ids to build it from.{did_you_mean(vision_id, VISION_BACKBONES)} Add timm_model_ids "
                "and image_sizes (OpenVLA's config fields), or register the backbone (docs/adding_a_model.md)."
            )
        return registered
    vits = _vits_from_config(raw, where)
    if registered is None:
        logger.info(
            "Vision backbone '%s' is not registered: built from config.json (%s)",
            vision_id,
            describe_vits(vits),
        )
        return vision_spec_from_vits(vits)
    if not vits_match(vits_of(registered), vits, compare_overrides=ARCH_OVERRIDES_FIELD in raw):
        raise ConfigError(
            f"'{where}': vision_backbone_id '{vision_id}' is registered here as {describe_vits(vits_of(registered))}, "
            f"but the config's timm_model_ids / image_sizes / timm_override_act_layers describe "
            f"{describe_vits(vits)}, and the weights follow those. Correct the timm fields, or give "
            "vision_backbone_id a name not registered here so the backbone is built from the timm fields alone."
        )
    return registered


def _read_config(folder: Path) -> dict[str, Any]:
    try:
        raw = json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"'{folder / 'config.json'}' is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"'{folder / 'config.json'}' is not a JSON object.")
    return raw


def hf_architecture(folder: Path, model_id: str | None = None) -> VLMArchitecture:
    """What an HF OpenVLA folder's `config.json` (and tokenizer files) say the VLM is; reads no weights.

    Args:
        folder: the HF OpenVLA folder.
        model_id: the name the VLM carries (default: the folder's name).

    Raises:
        ConfigError: missing fields, an unknown LLM `model_type`, or a vision description that disagrees with
            the registry (see `hf_vision_spec`).
    """
    from transformers import AutoConfig

    raw = _read_config(folder)
    where = folder / "config.json"
    missing = [
        k for k in ("vision_backbone_id", "llm_backbone_id", "arch_specifier", "text_config") if k not in raw
    ]
    if missing:
        raise ConfigError(f"'{where}' lacks {missing}: not an HF OpenVLA / Prismatic config.")
    spec = BaseVLMSpec(
        raw["vision_backbone_id"],
        raw["llm_backbone_id"],
        raw["arch_specifier"],
        raw.get("image_resize_strategy", "letterbox"),
    )
    vision_spec = hf_vision_spec(raw, where)
    text = dict(raw["text_config"])
    for key in ("torch_dtype", "dtype", "transformers_version", "_name_or_path", "architectures"):
        text.pop(key, None)
    model_type = text.pop("model_type", None)
    try:
        llm_config = AutoConfig.for_model(model_type, **text)
    except (ValueError, KeyError) as err:
        raise ConfigError(
            f"'{where}': text_config has model_type {model_type!r}, which transformers cannot build: {err}"
        ) from err
    has_tokenizer = (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()
    return VLMArchitecture(
        model_id or folder.name,
        spec,
        vision_spec=vision_spec,
        llm_config=llm_config,
        tokenizer_dir=folder if has_tokenizer else None,
        base=str(folder),
    )
