"""Load a VLM / VLA from wherever it lives: a registry id, a Prismatic run folder, an HF OpenVLA folder, or the
Hugging Face Hub.

    load(model_id_or_path, hf_token=None) -> PrismaticVLM
    load_vla(model_id_or_path, hf_token=None) -> LoadedVLA(vlm, norm_stats, source)

Sources, tried in this order:
- an existing folder with an HF OpenVLA `config.json` (`model_type` "openvla" / "prismatic"): weights from its
  safetensors shards, LLM config and tokenizer from the folder;
- an existing folder with `config.json` and `checkpoints/` (TRI-ML's Prismatic layout, OpenVLA's run folders and
  ours): the architecture from `config.json` (`{"model": {...}}` or `{"vla": {"base_vlm": ...}}`), weights from
  `checkpoints/latest-checkpoint.pt` (else the newest `step-*.pt`); parts the checkpoint does not hold (a frozen
  vision backbone) keep their pretrained weights; a LoRA run's adapters are merged into plain weights;
- a `<run folder>/checkpoints/*.pt` file: that checkpoint of the run, as above;
- a base-VLM registry id: `build_vlm` (pretrained backbones);
- otherwise a Hub repo id ("openvla/openvla-7b", or "org/repo/subfolder" for a run folder inside a repo), fetched
  with `huggingface_hub.snapshot_download` into the local cache (`hf_token` passed along) and loaded as above.

Weights are read with `torch.load(weights_only=True)` or safetensors: never unpickling arbitrary objects, never
remote code. A missing file, a missing / unexpected key or a shape mismatch is a `ConfigError` naming it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from prismatic.models.registry import BASE_VLMS, BaseVLMSpec, get_base_vlm_spec
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)

LATEST_CHECKPOINT = "latest-checkpoint.pt"
# What a Hub snapshot needs: configs, weights, tokenizer files, statistics (never code).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.pt", "*.model", "tokenizer*", "checkpoints/*"]


@dataclass
class LoadedVLA:
    """A loaded VLA: the model, its action statistics (OpenVLA's `norm_stats` layout) and where it came from."""

    vlm: PrismaticVLM
    norm_stats: dict[str, Any] | None
    source: str


def load(model_id_or_path: str | Path, hf_token: str | None = None) -> PrismaticVLM:
    """A `PrismaticVLM` in FP32 from a registry id, a local folder or the Hub (see the module docstring).

    Raises:
        ConfigError: unknown id / path, missing files, or weights that do not fit the architecture.
    """
    return load_vla(model_id_or_path, hf_token=hf_token).vlm


def load_vla(model_id_or_path: str | Path, hf_token: str | None = None) -> LoadedVLA:
    """Like `load`, also returning the action statistics the checkpoint carries (None for a plain VLM)."""
    source = str(model_id_or_path)
    path = Path(model_id_or_path).expanduser()
    if path.is_dir():
        return _load_folder(path, hf_token)
    if source in BASE_VLMS:
        from prismatic.models.materialize import build_vlm

        return LoadedVLA(build_vlm(source, hf_token=hf_token), None, source)
    if path.is_file() and path.suffix == ".pt" and path.parent.name == "checkpoints":
        return _load_prismatic_run(path.parent.parent, hf_token, source, checkpoint=path)
    if path.exists():
        raise ConfigError(
            f"'{source}' is a file; pass the run folder (holding config.json and checkpoints/), one of its "
            "checkpoints/*.pt, or an HF OpenVLA folder instead."
        )
    if _looks_like_hub_id(source):
        return _load_folder(_hub_snapshot(source, hf_token), hf_token, source=source)
    if "/" in source or source.startswith((".", "~")):
        raise ConfigError(
            f"'{source}' is neither a local folder nor a base-VLM registry id. Pass a Prismatic run folder, an HF "
            "OpenVLA folder, a Hub repo id ('org/name') or a registry id (see prismatic.models.BASE_VLMS)."
        )
    get_base_vlm_spec(source)  # raises the did-you-mean ConfigError listing registry ids
    raise AssertionError("unreachable")


def is_model_path(model_id_or_path: str | Path) -> bool:
    """True when the argument names a local folder (rather than a registry id)."""
    return Path(model_id_or_path).expanduser().is_dir()


def _looks_like_hub_id(source: str) -> bool:
    parts = source.split("/")
    return 2 <= len(parts) <= 3 and all(parts) and not source.startswith((".", "~"))


def _hub_snapshot(source: str, hf_token: str | None) -> Path:
    """Download (or find in the local cache) a Hub repo, or one subfolder of it, and return the local folder."""
    from huggingface_hub import snapshot_download

    owner, name, *rest = source.split("/")
    repo_id, subfolder = f"{owner}/{name}", "/".join(rest)
    patterns = [f"{subfolder}/{p}" for p in _HUB_PATTERNS] if subfolder else _HUB_PATTERNS
    try:
        root = snapshot_download(repo_id, token=hf_token, allow_patterns=patterns)
    except Exception as err:  # noqa: BLE001 (offline, gated, unknown repo: all the same user error)
        raise ConfigError(
            f"'{source}' is neither a local folder nor a base-VLM registry id, and the Hugging Face Hub repo "
            f"'{repo_id}' could not be fetched or found in the local cache (offline? gated repos need "
            f"hf_token). Cause: {err}"
        ) from err
    folder = Path(root) / subfolder if subfolder else Path(root)
    if not folder.is_dir():
        raise ConfigError(f"Hub repo '{repo_id}' has no folder '{subfolder}'.")
    return folder


def _load_folder(folder: Path, hf_token: str | None, source: str | None = None) -> LoadedVLA:
    from prismatic.models.hf_openvla import is_hf_openvla_dir

    source = source or str(folder)
    if is_hf_openvla_dir(folder):
        return _load_hf_openvla(folder, hf_token, source)
    if (folder / "config.json").is_file() and (folder / "checkpoints").is_dir():
        return _load_prismatic_run(folder, hf_token, source)
    raise ConfigError(
        f"'{folder}' is neither an HF OpenVLA folder (config.json with model_type 'openvla') nor a Prismatic run "
        "folder (config.json and checkpoints/latest-checkpoint.pt)."
    )


def _load_hf_openvla(folder: Path, hf_token: str | None, source: str) -> LoadedVLA:
    from prismatic.models.hf_openvla import from_hf_state_dict, hf_spec_and_llm_config, read_hf_state_dict
    from prismatic.models.materialize import build_vlm_from_spec

    model_id, spec, llm_config, raw = hf_spec_and_llm_config(folder)
    has_tokenizer = (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file()
    vlm = build_vlm_from_spec(
        model_id,
        spec,
        hf_token=hf_token,
        pretrained_vision=False,
        pretrained_llm=False,
        llm_config=llm_config,
        tokenizer_dir=folder if has_tokenizer else None,
    )
    state = from_hf_state_dict(read_hf_state_dict(folder), spec.vision_backbone_id)
    load_weights(vlm, state, source=str(folder), strict=True)
    logger.info("Loaded HF OpenVLA checkpoint %s (%s)", folder, spec)
    return LoadedVLA(vlm, raw.get("norm_stats"), source)


def run_folder_spec(folder: Path) -> tuple[str, BaseVLMSpec]:
    """(model id, BaseVLMSpec) from a run folder's `config.json`: Prismatic's `model` block or a VLA's base VLM.

    Raises:
        ConfigError: the config names neither.
    """
    config = json.loads((folder / "config.json").read_text())
    if "model" in config and isinstance(config["model"], Mapping):
        model = config["model"]
        try:
            spec = BaseVLMSpec(
                model["vision_backbone_id"],
                model["llm_backbone_id"],
                model["arch_specifier"],
                model["image_resize_strategy"],
            )
        except KeyError as err:
            raise ConfigError(f"'{folder / 'config.json'}' model block lacks {err}.") from err
        return model.get("model_id", folder.name), spec
    if "vla" in config and isinstance(config["vla"], Mapping) and "base_vlm" in config["vla"]:
        base_vlm = config["vla"]["base_vlm"]
        if is_model_path(base_vlm):  # a run started from another folder: its architecture is that one's
            return run_folder_spec(Path(base_vlm)) if not _is_hf(Path(base_vlm)) else _hf_spec(Path(base_vlm))
        return base_vlm, get_base_vlm_spec(base_vlm)
    raise ConfigError(
        f"'{folder / 'config.json'}' has neither a 'model' block (Prismatic) nor 'vla.base_vlm' (OpenVLA / this "
        "tool): cannot tell which architecture its checkpoint holds."
    )


def _is_hf(folder: Path) -> bool:
    from prismatic.models.hf_openvla import is_hf_openvla_dir

    return is_hf_openvla_dir(folder)


def _hf_spec(folder: Path) -> tuple[str, BaseVLMSpec]:
    from prismatic.models.hf_openvla import hf_spec_and_llm_config

    model_id, spec, _, _ = hf_spec_and_llm_config(folder)
    return model_id, spec


def latest_checkpoint(folder: Path) -> Path:
    """`checkpoints/latest-checkpoint.pt`, else the highest-step `checkpoints/step-*.pt`."""
    checkpoints = folder / "checkpoints"
    if (checkpoints / LATEST_CHECKPOINT).is_file():
        return checkpoints / LATEST_CHECKPOINT
    steps = sorted(checkpoints.glob("step-*.pt"))
    if not steps:
        raise ConfigError(f"Run folder '{folder}' has no checkpoints/{LATEST_CHECKPOINT} and no step-*.pt.")
    return steps[-1]


def _load_prismatic_run(
    folder: Path, hf_token: str | None, source: str, checkpoint: Path | None = None
) -> LoadedVLA:
    from prismatic.models.lora import LoraSettings, apply_lora, lora_targets_in_state_dict, merge_lora
    from prismatic.models.materialize import build_vlm_from_spec
    from prismatic.training.checkpointing import load_checkpoint_file

    model_id, spec = run_folder_spec(folder)
    path = checkpoint if checkpoint is not None else latest_checkpoint(folder)
    weights = load_checkpoint_file(path)["model"]
    has_vision = bool(weights.get("vision_backbone"))
    # As Prismatic's loader: the LLM is built from its config only (the checkpoint holds it); the vision backbone
    # keeps its pretrained weights when the checkpoint does not hold it (it was frozen).
    vlm = build_vlm_from_spec(
        model_id,
        spec,
        hf_token=hf_token,
        pretrained_vision=None if not has_vision else False,
        pretrained_llm=False,
    )
    flat = {f"{module}.{k}": v for module, sd in weights.items() for k, v in sd.items()}
    for module in ("projector", "llm_backbone"):
        if not weights.get(module):
            raise ConfigError(f"Checkpoint '{path}' holds no '{module}' weights.")
    lora_names, lora_rank = lora_targets_in_state_dict(flat)
    if lora_names:  # re-create the adapters the run trained, load, then fold them into plain weights
        vla_cfg = json.loads((folder / "config.json").read_text()).get("vla", {})
        apply_lora(
            vlm, LoraSettings(rank=lora_rank, alpha=vla_cfg.get("lora_alpha")), target_names=lora_names
        )
    load_weights(
        vlm,
        flat,
        source=str(path),
        strict=True,
        allow_missing_prefixes=() if has_vision else ("vision_backbone.",),
    )
    if lora_names:
        merge_lora(vlm)
    norm_stats = None
    if (folder / "dataset_statistics.json").is_file():
        norm_stats = json.loads((folder / "dataset_statistics.json").read_text())
    logger.info("Loaded Prismatic run %s from %s", model_id, path)
    return LoadedVLA(vlm, norm_stats, source)


def load_weights(
    vlm: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: str,
    strict: bool = True,
    allow_missing_prefixes: tuple[str, ...] = (),
) -> None:
    """Copy `state` (flat names) into `vlm`, checking names and shapes first so that errors name the key.

    Raises:
        ConfigError: a key missing from `state` (unless under `allow_missing_prefixes`), an unexpected key, or a
            shape mismatch.
    """
    expected = vlm.state_dict()
    missing = [k for k in expected if k not in state and not k.startswith(allow_missing_prefixes)]
    unexpected = [k for k in state if k not in expected]
    if strict and (missing or unexpected):
        raise ConfigError(
            f"Checkpoint '{source}' does not fit this architecture: "
            + (f"missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}" if missing else "")
            + ("; " if missing and unexpected else "")
            + (
                f"unexpected key(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
                if unexpected
                else ""
            )
            + "."
        )
    for key, tensor in state.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            raise ConfigError(
                f"Checkpoint '{source}': key '{key}' has shape {tuple(tensor.shape)} but the model expects "
                f"{tuple(expected[key].shape)} (a different vocabulary / width / resolution?)."
            )
    vlm.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)


def spec_of(vlm: PrismaticVLM) -> BaseVLMSpec:
    """The `BaseVLMSpec` a built VLM was made from (what a checkpoint's config records)."""
    return BaseVLMSpec(
        vlm.vision_backbone.identifier,
        vlm.llm_backbone.identifier,
        vlm.arch_specifier,
        vlm.vision_backbone.image_resize_strategy,
    )
