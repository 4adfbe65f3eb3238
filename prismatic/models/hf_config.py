"""The `config.json` of an HF OpenVLA folder, both ways: our VLM's spec written as OpenVLA's `OpenVLAConfig` fields,
and such a config read back into the architecture to build (`hf_architecture`).

Reading: the ViTs are the ones `timm_model_ids` / `image_sizes` / `timm_override_act_layers` name, as OpenVLA's
modeling code builds them. A `vision_backbone_id` registered here must agree with them (else a `ConfigError` before
anything is built); one not registered here is built from them alone. `timm_arch_overrides` is this tool's
extension (other timm kwargs, for the tiny presets); OpenVLA's code ignores it.

Writing: `auto_map` names OpenVLA's modeling code on the Hub by default, in the `repo--module.Class` form that
transformers' `get_class_from_dynamic_module` fetches from that repo (`openvla/openvla-7b--modeling_prismatic.py`'s
`OpenVLAForActionPrediction`), so `AutoModelForVision2Seq.from_pretrained(folder, trust_remote_code=True)` needs
no source tree, only the Hub (or its cache); with `code_repo=None` it names modules beside the weights
(`--hf_code_dir`).
Keys are written for every transformers from 4.40 (OpenVLA's pin) to today: 5.x's `dtype` and `rope_parameters`
with 4.x's `torch_dtype` and flat `rope_theta` / `partial_rotary_factor` beside them (4.40 ignores
`rope_parameters` and would fall back to its defaults, e.g. rope_theta 10000 for Qwen2.5's 1e6).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoConfig

from prismatic.models.backbones.vision.registry import (
    VISION_BACKBONES,
    FusedViTSpec,
    VisionBackboneSpec,
    ViTSpec,
    describe_vits,
    timm_architecture,
    vision_spec_from_vits,
    vits_match,
    vits_of,
)
from prismatic.models.materialize import VLMArchitecture
from prismatic.models.registry import BaseVLMSpec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.run_layout import HF_CONFIG_FILE
from prismatic.util.errors import ConfigError, did_you_mean

logger = logging.getLogger(__name__)

HF_MODEL_TYPES = ("openvla", "prismatic")
# The Hub repository holding OpenVLA's HF code (configuration_ / modeling_ / processing_prismatic.py), which the
# `auto_map` of fine-tuned OpenVLA checkpoints names as well.
DEFAULT_HF_CODE_REPO = "openvla/openvla-7b"
# RoPE fields transformers 5 keeps only inside `rope_parameters`; 4.x reads them flat (4.40's defaults: rope_theta
# 10000.0 for Llama / Qwen2 / Mistral, partial_rotary_factor 0.5 for Phi).
FLAT_ROPE_FIELDS = ("rope_theta", "partial_rotary_factor")
# This tool's extension of OpenVLA's config: timm kwargs beyond `act_layer`, one dict per ViT (tiny presets).
ARCH_OVERRIDES_FIELD = "timm_arch_overrides"


def code_reference(module_class: str, code_repo: str | None) -> str:
    """An `auto_map` entry: `module.Class` (a module beside the weights) or `repo--module.Class` (transformers
    fetches the module from that Hub repository)."""
    return module_class if code_repo is None else f"{code_repo}--{module_class}"


def readable_text_config(text_config: dict[str, Any], dtype: str) -> dict[str, Any]:
    """`text_config` as every transformers from 4.40 to today reads it: `dtype` and `torch_dtype`, and the RoPE
    fields 4.x reads flat copied out of 5.x's `rope_parameters` (both spellings: 5.x reads the dict first)."""
    out = {**text_config, "dtype": dtype, "torch_dtype": dtype}
    rope = text_config.get("rope_parameters")
    if isinstance(rope, Mapping):
        for field in FLAT_ROPE_FIELDS:
            if rope.get(field) is not None:
                out[field] = rope[field]
        if rope.get("rope_type", "default") != "default":
            logger.warning(
                "The LLM's RoPE type is '%s': transformers before 5.0 read RoPE scaling from `rope_scaling`, which "
                "this export does not write, so they build the model with plain RoPE.",
                rope["rope_type"],
            )
    return out


def hf_config_dict(
    vlm: PrismaticVLM,
    spec: BaseVLMSpec,
    norm_stats: Mapping[str, Any] | None,
    dtype: str,
    code_repo: str | None = DEFAULT_HF_CODE_REPO,
) -> dict:
    """`config.json` for the HF OpenVLA layout (OpenVLAConfig's fields, as OpenVLA's converter writes them).

    `code_repo`: the Hub repository `auto_map` names for OpenVLA's code; None names modules beside the weights.
    """
    vision_spec = vlm.vision_backbone.spec
    vits = vits_of(vision_spec)
    llm = vlm.llm_backbone
    text_config = readable_text_config(llm.llm.config.to_dict(), dtype)
    text_config.update(use_cache=True, pad_token_id=llm.tokenizer.pad_token_id)
    extra_overrides = [{k: v for k, v in vit.arch_overrides.items() if k != "act_layer"} for vit in vits]
    config = {
        "model_type": "openvla",
        "architectures": ["OpenVLAForActionPrediction"],
        "auto_map": {
            "AutoConfig": code_reference("configuration_prismatic.OpenVLAConfig", code_repo),
            "AutoModelForVision2Seq": code_reference(
                "modeling_prismatic.OpenVLAForActionPrediction", code_repo
            ),
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
        "dtype": dtype,
        "torch_dtype": dtype,
        "transformers_version": transformers.__version__,
    }
    if any(extra_overrides):  # only the tiny presets: real backbones write exactly OpenVLA's fields
        config[ARCH_OVERRIDES_FIELD] = extra_overrides
    return config


def is_hf_openvla_dir(path: Path) -> bool:
    """A folder whose config.json says `model_type` "openvla" / "prismatic"."""
    config = path / HF_CONFIG_FILE
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") in HF_MODEL_TYPES
    except (json.JSONDecodeError, AttributeError):
        return False


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
    import timm  # lazy: timm takes ~2 s to import; only a config that names ViTs needs it

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
        raw = json.loads((folder / HF_CONFIG_FILE).read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"'{folder / HF_CONFIG_FILE}' is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"'{folder / HF_CONFIG_FILE}' is not a JSON object.")
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
    raw = _read_config(folder)
    where = folder / HF_CONFIG_FILE
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
