"""Load a VLM / VLA from wherever it lives: a registry id, a Prismatic run folder, an HF OpenVLA folder, or the
Hugging Face Hub.

    load(model_id_or_path, hf_token=None, dtype=None, device=None) -> PrismaticVLM
    load_vla(model_id_or_path, hf_token=None, dtype=None, device=None) -> LoadedVLA(vlm, norm_stats, source)

Sources, tried in this order:
- an existing folder with an HF OpenVLA `config.json` (`model_type` "openvla" / "prismatic"): the architecture from
  its config (ViTs from `timm_model_ids`, LLM from `text_config`, tokenizer from the folder), weights from its
  safetensors shards;
- an existing folder with `config.json` and `checkpoints/` (TRI-ML's Prismatic layout, OpenVLA's run folders and
  ours): the architecture from `config.json` (`{"model": {...}}` or `{"vla": {"base_vlm": ...}}`), weights from
  its newest complete sharded checkpoint `checkpoints/step-*/` (else `checkpoints/latest-checkpoint.pt`, else the
  newest `step-*.pt`). A run that started from a folder or Hub id
  (`vla.base_vlm`) takes its architecture, LLM config and tokenizer from that checkpoint (a Hub id from the local
  cache, config and tokenizer files only): the base LLM is never downloaded again. Parts the checkpoint does not hold
  (a frozen vision backbone) keep the weights of the model the run started from; a LoRA run's adapters are merged;
- a `<run folder>/checkpoints/step-*` folder or `*.pt` file: that checkpoint of the run, as above;
- a base-VLM registry id: `build_vlm` (pretrained backbones);
- otherwise a Hub repo id ("openvla/openvla-7b", or "org/repo/subfolder" for a run folder inside a repo), fetched
  with `huggingface_hub.snapshot_download` into the local cache (`hf_token` passed along; offline, the cache) and
  loaded as above.

Memory: the parts a checkpoint fills are built with their parameters on the meta device and each tensor is assigned
as it is read (HF folders: one safetensors shard at a time), converted to `dtype` on the way. Peak host memory is
about one copy of the model in `dtype` plus one shard, never a random-init copy plus the whole state dict.
`dtype=torch.bfloat16` halves it; the default is FP32 (what training wants).

`device="meta"` builds the same model (architecture, tokenizer, prompt builder, `dtype`) with every parameter and
buffer on the meta device and reads no weight file (a Hub id fetches config and tokenizer files only): what the
ranks other than 0 hold before `prismatic.models.distributed_init` fills their shards from rank 0.

Weights are read with `torch.load(weights_only=True)` or safetensors: never unpickling arbitrary objects, never
remote code. A missing file, a missing / unexpected key or a shape mismatch is a `ConfigError` naming it, raised
before any tensor data is read.

This module picks the source and runs the load; its parts live beside it: `architecture` (what to build),
`hub` (Hub snapshots), `hf_config` / `hf_shards` (HF OpenVLA folders), `weights` (tensors into the model).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prismatic.models.architecture import run_action_spec, run_architecture
from prismatic.models.checkpoint_format import (
    is_sharded_checkpoint,
    latest_checkpoint,
    load_checkpoint_file,
)
from prismatic.models.hf_config import hf_architecture, is_hf_openvla_dir
from prismatic.models.hf_openvla import from_hf_names
from prismatic.models.hf_shards import hf_weight_shapes, iter_hf_shards
from prismatic.models.hub import HUB_CONFIG_PATTERNS, HUB_PATTERNS, hub_snapshot, looks_like_hub_id
from prismatic.models.lora import LoraSettings, apply_lora, lora_targets_in_state_dict, merge_lora
from prismatic.models.materialize import (
    VLM_PARTS,
    VLMArchitecture,
    build_vlm,
    build_vlm_from_architecture,
    cast_floating_parameters,
)
from prismatic.models.registry import BASE_VLMS, BaseVLMSpec, get_base_vlm_spec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.models.weights import assign_weights, renamed
from prismatic.run_layout import CHECKPOINTS_DIR, DATASET_STATISTICS_FILE, HF_CONFIG_FILE, RUN_CONFIG_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.statistics_file import read_statistics_file

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class LoadedVLA:
    """A loaded VLA: the model, its action statistics (OpenVLA's `norm_stats` layout) and where it came from."""

    vlm: PrismaticVLM
    norm_stats: dict[str, Any] | None
    source: str


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """None -> float32; "bfloat16" / torch.bfloat16 -> torch.bfloat16 (likewise float32, float16).

    Raises:
        ConfigError: any other value.
    """
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ConfigError(f"Unknown dtype {dtype!r} to load weights in. Valid choices: {', '.join(DTYPES)}.")


def load(
    model_id_or_path: str | Path,
    hf_token: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> PrismaticVLM:
    """A `PrismaticVLM` (FP32 unless `dtype` says otherwise) from a registry id, a local folder or the Hub (see the
    module docstring); `device="meta"` gives its architecture only, no weights read.

    Raises:
        ConfigError: unknown id / path / dtype / device, missing files, or weights that do not fit the architecture.
    """
    return load_vla(model_id_or_path, hf_token=hf_token, dtype=dtype, device=device).vlm


def load_vla(
    model_id_or_path: str | Path,
    hf_token: str | None = None,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> LoadedVLA:
    """Like `load`, also returning the action statistics the checkpoint carries (None for a plain VLM).

    Args:
        model_id_or_path: a registry id, a run folder, a `<run>/checkpoints/*.pt`, an HF OpenVLA folder or a Hub id.
        hf_token: for gated Hub repos.
        dtype: parameter dtype ("float32" default, "bfloat16", "float16"); checkpoints stream into it.
        device: None / "cpu" (weights in host memory), or "meta": the same model with every parameter and buffer
            on the meta device, built without reading (or downloading) any weight file.
    """
    target = resolve_dtype(dtype)
    on_meta = _resolve_on_meta(device)
    source = str(model_id_or_path)
    path = Path(model_id_or_path).expanduser()
    if is_sharded_checkpoint(path) and path.parent.name == CHECKPOINTS_DIR:  # <run>/checkpoints/step-*/
        return _load_prismatic_run(
            path.parent.parent, hf_token, source, target, checkpoint=path, on_meta=on_meta
        )
    if path.is_dir():
        return _load_folder(path, hf_token, target, on_meta=on_meta)
    if source in BASE_VLMS:
        if on_meta:  # as `build_vlm` builds it, minus pretrained weights and random init
            vlm = build_vlm_from_architecture(VLMArchitecture(source, BASE_VLMS[source]), hf_token=hf_token)
        else:
            vlm = build_vlm(source, hf_token=hf_token)
        cast_floating_parameters(vlm, target)
        return LoadedVLA(_buffers_on_meta(vlm) if on_meta else vlm, None, source)
    if path.is_file() and path.suffix == ".pt" and path.parent.name == CHECKPOINTS_DIR:
        return _load_prismatic_run(
            path.parent.parent, hf_token, source, target, checkpoint=path, on_meta=on_meta
        )
    if path.exists():
        raise ConfigError(
            f"'{source}' is a file; pass the run folder (holding config.json and checkpoints/), one of its "
            "checkpoints/*.pt, or an HF OpenVLA folder instead."
        )
    if looks_like_hub_id(source):
        patterns = HUB_CONFIG_PATTERNS if on_meta else HUB_PATTERNS
        return _load_folder(
            hub_snapshot(source, hf_token, patterns), hf_token, target, source=source, on_meta=on_meta
        )
    if "/" in source or source.startswith((".", "~")):
        raise ConfigError(
            f"'{source}' is neither a local folder nor a base-VLM registry id. Pass a Prismatic run folder, an HF "
            "OpenVLA folder, a Hub repo id ('org/name') or a registry id (see prismatic.models.BASE_VLMS)."
        )
    get_base_vlm_spec(source)  # raises the did-you-mean ConfigError listing registry ids
    raise AssertionError("unreachable")


def _resolve_on_meta(device: str | torch.device | None) -> bool:
    """True for "meta"; False for None / "cpu" (weights are read into host memory; the caller moves them)."""
    try:
        kind = torch.device(device).type if device is not None else "cpu"
    except RuntimeError:
        kind = str(device)
    if kind not in ("cpu", "meta"):
        raise ConfigError(
            f"Cannot load onto device {device!r}: pass None / 'cpu' (then move the model) or 'meta' (architecture "
            "only, no weights)."
        )
    return kind == "meta"


def _buffers_on_meta(vlm: PrismaticVLM) -> PrismaticVLM:
    """Move every buffer to the meta device (parameters already are): nothing of the model holds memory."""
    for module in vlm.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and not buffer.is_meta:
                module._buffers[name] = buffer.to("meta")
    return vlm


def _is_run(folder: Path) -> bool:
    return (folder / RUN_CONFIG_FILE).is_file() and (folder / CHECKPOINTS_DIR).is_dir()


def _load_folder(
    folder: Path, hf_token: str | None, dtype: torch.dtype, source: str | None = None, on_meta: bool = False
) -> LoadedVLA:
    source = source or str(folder)
    if is_hf_openvla_dir(folder):
        return _load_hf_openvla(folder, hf_token, source, dtype, on_meta=on_meta)
    # On meta a run folder's checkpoints are never opened, so a Hub snapshot of its config files is enough.
    if _is_run(folder) or (on_meta and (folder / RUN_CONFIG_FILE).is_file()):
        return _load_prismatic_run(folder, hf_token, source, dtype, on_meta=on_meta)
    raise ConfigError(
        f"'{folder}' is neither an HF OpenVLA folder (config.json with model_type 'openvla') nor a Prismatic run "
        "folder (config.json and checkpoints/ with step-* checkpoints or latest-checkpoint.pt)."
    )


# === Loading ======================================================================================================


def _load_hf_openvla(
    folder: Path, hf_token: str | None, source: str, dtype: torch.dtype, on_meta: bool = False
) -> LoadedVLA:
    model_id = source if not Path(source).expanduser().is_dir() else folder.name
    arch = hf_architecture(folder, model_id)
    raw = json.loads((folder / HF_CONFIG_FILE).read_text())
    spec = run_action_spec(folder)
    if on_meta:  # not even the shard headers: rank 0 checks the weights fit
        vlm = build_vlm_from_architecture(arch, hf_token=hf_token)
        vlm.attach_action_modules(spec)
        vlm.run_files_dir = folder  # the head's files beside the statistics (`ActionHead.load_files`)
        cast_floating_parameters(vlm, dtype)
        return LoadedVLA(_buffers_on_meta(vlm), raw.get("norm_stats"), source)
    # Names and shapes from the shard headers: a checkpoint that does not fit fails here, before any data is read.
    hf_shapes = hf_weight_shapes(folder)
    names = from_hf_names(list(hf_shapes), arch.vision_spec)
    shapes = {names[name]: shape for name, shape in hf_shapes.items()}
    vlm = build_vlm_from_architecture(arch, hf_token=hf_token)
    vlm.attach_action_modules(spec)
    vlm.run_files_dir = folder  # the head's files beside the statistics (`ActionHead.load_files`)
    assign_weights(vlm, shapes, renamed(iter_hf_shards(folder), names), source=str(folder), dtype=dtype)
    logger.info("Loaded HF OpenVLA checkpoint %s (%s, %s)", folder, arch.spec, dtype)
    return LoadedVLA(vlm, raw.get("norm_stats"), source)


def _base_vision_weights(
    base: str, hf_token: str | None, arch: VLMArchitecture
) -> dict[str, torch.Tensor] | None:
    """The vision-backbone weights of the model a run started from (flat names); None: the registry's pretrained."""
    if base in BASE_VLMS:
        return None
    path = Path(base).expanduser()
    folder = path if path.is_dir() else hub_snapshot(base, hf_token)
    if is_hf_openvla_dir(folder):
        names = from_hf_names(
            [n for n in hf_weight_shapes(folder) if n.startswith("vision_backbone.")], arch.vision_spec
        )
        return {names[k]: v for shard in iter_hf_shards(folder, set(names)) for k, v in shard.items()}
    weights = load_checkpoint_file(latest_checkpoint(folder))["model"]
    if weights.get("vision_backbone"):
        return {f"vision_backbone.{k}": v for k, v in weights["vision_backbone"].items()}
    parent = run_architecture(folder, hf_token).base
    return _base_vision_weights(parent, hf_token, arch) if parent is not None else None


def _load_prismatic_run(
    folder: Path,
    hf_token: str | None,
    source: str,
    dtype: torch.dtype,
    checkpoint: Path | None = None,
    on_meta: bool = False,
) -> LoadedVLA:
    arch = run_architecture(folder, hf_token)
    spec = run_action_spec(folder)
    if on_meta:  # a LoRA run's adapters are merged on load, so its architecture is the plain one
        vlm = build_vlm_from_architecture(arch, hf_token=hf_token)
        vlm.attach_action_modules(spec)
        vlm.run_files_dir = folder  # the head's files beside the statistics (`ActionHead.load_files`)
        cast_floating_parameters(vlm, dtype)
        return LoadedVLA(_buffers_on_meta(vlm), _run_norm_stats(folder), source)
    path = checkpoint if checkpoint is not None else latest_checkpoint(folder)
    weights = load_checkpoint_file(path)["model"]
    for module in ("projector", "llm_backbone"):
        if not weights.get(module):
            raise ConfigError(f"Checkpoint '{path}' holds no '{module}' weights.")
    flat = {f"{module}.{k}": v for module, sd in weights.items() for k, v in sd.items()}
    # As Prismatic's loader: a vision backbone the checkpoint does not hold (it was frozen) keeps the weights of
    # the model the run started from: the registry's pretrained ones, or the base checkpoint's.
    base_vision = None
    if not weights.get("vision_backbone") and arch.base is not None:
        base_vision = _base_vision_weights(arch.base, hf_token, arch)
    vision_loaded = bool(weights.get("vision_backbone")) or base_vision is not None
    vlm = build_vlm_from_architecture(
        arch,
        hf_token=hf_token,
        pretrained_vision=None,
        on_meta=VLM_PARTS if vision_loaded else ("projector", "llm_backbone"),
    )
    vlm.attach_action_modules(spec)  # on the LLM's device: meta, filled from the checkpoint below
    vlm.run_files_dir = folder  # the head's files beside the statistics (`ActionHead.load_files`)
    lora_names, lora_rank = lora_targets_in_state_dict(flat)
    if lora_names:  # re-create the adapters the run trained, load, then fold them into plain weights
        vla_cfg = json.loads((folder / RUN_CONFIG_FILE).read_text()).get("vla", {})
        apply_lora(
            vlm, LoraSettings(rank=lora_rank, alpha=vla_cfg.get("lora_alpha")), target_names=lora_names
        )
    chunks = [flat] if base_vision is None else [flat, base_vision]
    shapes = {k: tuple(v.shape) for chunk in chunks for k, v in chunk.items()}
    # LoRA merges in FP32 (as the run trained), then casts: the merged weights do not depend on `dtype`.
    assign_weights(
        vlm,
        shapes,
        chunks,
        source=str(path),
        dtype=torch.float32 if lora_names else dtype,
        allow_missing_prefixes=() if vision_loaded else ("vision_backbone.",),
    )
    if lora_names:
        merge_lora(vlm)
        cast_floating_parameters(vlm, dtype)
    logger.info("Loaded Prismatic run %s from %s (%s)", arch.model_id, path, dtype)
    return LoadedVLA(vlm, _run_norm_stats(folder), source)


def _run_norm_stats(folder: Path) -> dict[str, Any] | None:
    """A run folder's `dataset_statistics.json`, if it has one."""
    if not (folder / DATASET_STATISTICS_FILE).is_file():
        return None
    return read_statistics_file(
        folder / DATASET_STATISTICS_FILE, "run's dataset_statistics.json", per_dataset=True
    )


def spec_of(vlm: PrismaticVLM) -> BaseVLMSpec:
    """The `BaseVLMSpec` a built VLM was made from (what a checkpoint's config records)."""
    return BaseVLMSpec(
        vlm.vision_backbone.identifier,
        vlm.llm_backbone.identifier,
        vlm.arch_specifier,
        vlm.vision_backbone.image_resize_strategy,
    )


def model_config(vlm: PrismaticVLM) -> dict[str, Any]:
    """The `{"model": {...}}` block a model folder's config.json records (Prismatic's keys; `run_architecture`
    reads it back)."""
    spec = spec_of(vlm)
    return {
        "model": {
            "model_id": vlm.model_id,
            "vision_backbone_id": spec.vision_backbone_id,
            "llm_backbone_id": spec.llm_backbone_id,
            "arch_specifier": spec.arch_specifier,
            "image_resize_strategy": spec.image_resize_strategy,
            "llm_max_length": vlm.llm_backbone.tokenizer.model_max_length,
        }
    }
