"""A LoRA run's adapters as a standard peft adapter folder: a few MB per run, merged onto the base on demand.

    python vla_scripts/merge_lora.py --checkpoint runs/<lora run> --adapter_out adapters/<name>   # write
    python vla_scripts/merge_lora.py --adapter adapters/<name> --out_dir runs/<name>-merged        # merge

The folder (`export_adapter`):
    adapter_config.json          peft's `LoraConfig` (r, lora_alpha, lora_dropout, the adapted modules' full names,
                                 `base_model_name_or_path` = the run's `vla.base_vlm`)
    adapter_model.safetensors    the lora_A / lora_B tensors only, under peft's names, so
                                 `peft.PeftModel.from_pretrained(base_vlm, folder)` loads them onto a plain VLM
    prismatic_adapter.json       the base id and a fingerprint of the base weights the adapters were trained on,
                                 the model's action spec and the LoRA settings
    action_modules.safetensors   an action head's modules (they train in full, not as adapters), when the run has one
    action_model.json, dataset_statistics.json   as in a run folder

`load_adapter` checks the base before merging: the base named at load (default: the recorded id) must carry the
same weights as the base the run trained on (the fingerprint), otherwise the adapters would silently land on
other weights. A registry id with random initialisation (the `tiny-*` presets) is not a base anyone can rebuild:
pass the base as a model folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel
from safetensors.torch import load_file, save_file

from prismatic.models.action_heads import ACTION_HEADS, ActionSpec
from prismatic.models.checkpoint_format import (
    latest_checkpoint,
    load_checkpoint_file,
    run_folder_of,
)
from prismatic.models.loading import LoadedVLA, load_vla
from prismatic.models.lora import ADAPTER_NAME, lora_targets_in_state_dict
from prismatic.run_layout import ACTION_MODEL_FILE, DATASET_STATISTICS_FILE, RUN_CONFIG_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.files import normal_permissions, write_json_atomic

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SIDECAR = "prismatic_adapter.json"
ACTION_WEIGHTS = "action_modules.safetensors"
ACTION_MODULES = ("action_head", "proprio_projector")
PEFT_PREFIX = "base_model.model."  # how a PeftModel's state dict names the wrapped model's parameters


def base_fingerprint(weights: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 of the base weights: every tensor's name, shape and every value rounded to bf16. The rounding makes
    a base stored in bf16 (frozen weights of a bf16 mixed-precision FSDP run) match the FP32 model it came from; no
    floating-point reduction enters, so the hash is the same on every machine."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().to("cpu")
        digest.update(f"{name}:{tuple(tensor.shape)}".encode())
        if tensor.is_floating_point():
            tensor = tensor.to(torch.bfloat16).view(torch.int16)
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def _split(flat: Mapping[str, torch.Tensor]) -> tuple[dict, dict, dict]:
    """A LoRA checkpoint's flat weights -> (base weights under plain names, adapter tensors, action modules)."""
    base, adapters, action = {}, {}, {}
    for name, tensor in flat.items():
        if ".lora_" in name:
            adapters[name] = tensor
        elif name.partition(".")[0] in ACTION_MODULES:
            action[name] = tensor
        else:
            base[name.replace(".base_layer.", ".")] = tensor
    return base, adapters, action


def export_adapter(checkpoint: Path, out_dir: Path) -> Path:
    """Write the adapter folder (module docstring) of a LoRA run's checkpoint (or run folder: its newest).

    Raises:
        ConfigError: the checkpoint has no LoRA adapters, or its run folder no config.json.
    """
    checkpoint = Path(checkpoint)
    run_dir = checkpoint if (checkpoint / RUN_CONFIG_FILE).is_file() else run_folder_of(checkpoint)
    path = latest_checkpoint(checkpoint) if checkpoint == run_dir else checkpoint
    weights = load_checkpoint_file(path)["model"]
    flat = {f"{module}.{k}": v for module, sd in weights.items() for k, v in sd.items()}
    names, rank = lora_targets_in_state_dict(flat)
    if not names:
        raise ConfigError(
            f"Checkpoint '{path}' holds no LoRA adapters: --adapter_out needs a run trained with --vla.use_lora true."
        )
    vla = json.loads((run_dir / RUN_CONFIG_FILE).read_text()).get("vla", {})
    alpha = vla.get("lora_alpha") or float(min(rank, 16))
    base, adapters, action = _split(flat)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=float(vla.get("lora_dropout", 0.0)),
        target_modules=names,
        base_model_name_or_path=str(vla.get("base_vlm")),
    )
    config.save_pretrained(str(out_dir))
    peft_names = {
        f"{PEFT_PREFIX}{k.replace(f'.{ADAPTER_NAME}.', '.')}": v.contiguous() for k, v in adapters.items()
    }
    save_file(peft_names, str(out_dir / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    # safetensors writes 0600; shared lab folders need the umask's permissions.
    normal_permissions(out_dir / ADAPTER_WEIGHTS)
    if action:
        save_file({k: v.contiguous() for k, v in action.items()}, str(out_dir / ACTION_WEIGHTS))
        normal_permissions(out_dir / ACTION_WEIGHTS)
    # Every head's own files the run kept beside its statistics (FAST's vocabulary).
    head_files = {f for head in ACTION_HEADS for f in ACTION_HEADS.fact(head, "files", ())}
    for name in (ACTION_MODEL_FILE, DATASET_STATISTICS_FILE, *sorted(head_files)):
        if (run_dir / name).is_file():
            (out_dir / name).write_bytes((run_dir / name).read_bytes())
    sidecar = {
        "base_vlm": vla.get("base_vlm"),
        "base_fingerprint": base_fingerprint(base),
        "lora": {
            "rank": rank,
            "alpha": alpha,
            "dropout": vla.get("lora_dropout", 0.0),
            "target_modules": names,
        },
        "checkpoint": str(path),
    }
    write_json_atomic(out_dir / SIDECAR, sidecar, "the adapter's base record")
    size = sum(t.numel() * t.element_size() for t in adapters.values())
    logger.info("Wrote %d adapters (%.2f MB) of %s to %s", len(names), size / 2**20, path, out_dir)
    return out_dir


def read_sidecar(adapter_dir: Path) -> dict[str, Any]:
    path = Path(adapter_dir) / SIDECAR
    if not path.is_file():
        raise ConfigError(
            f"'{adapter_dir}' is not an adapter folder written by merge_lora.py --adapter_out (no {SIDECAR})."
        )
    return json.loads(path.read_text())


def load_adapter(adapter_dir: Path, base: str | None = None, hf_token: str | None = None) -> LoadedVLA:
    """The base VLM with the adapters loaded by peft and merged (a plain model), as `LoadedVLA`.

    Args:
        adapter_dir: a folder `export_adapter` wrote.
        base: the base model (anything `load_vla` takes); default: the id the adapter records.

    Raises:
        ConfigError: not an adapter folder, or the base's weights are not the ones the adapters were trained on
            (naming the recorded base and the one given).
    """
    adapter_dir = Path(adapter_dir)
    sidecar = read_sidecar(adapter_dir)
    recorded = sidecar.get("base_vlm")
    base = base if base is not None else recorded
    if base is None:
        raise ConfigError(
            f"'{adapter_dir}' records no base model: pass --base <the model the run started from>."
        )
    loaded = load_vla(base, hf_token=hf_token, dtype=torch.float32)
    found = base_fingerprint(loaded.vlm.state_dict())
    if found != sidecar["base_fingerprint"]:
        raise ConfigError(
            f"The adapters in '{adapter_dir}' were trained on base model '{recorded}', but the base given, '{base}', "
            "holds other weights (fingerprints differ), so merging would give a model nobody trained. Pass the "
            "exact base the run started from with --base (a registry id with random initialisation cannot be "
            "rebuilt: use the base's model folder)."
        )
    merged = PeftModel.from_pretrained(loaded.vlm, str(adapter_dir)).merge_and_unload()
    spec_path = adapter_dir / ACTION_MODEL_FILE
    if spec_path.is_file():
        spec = ActionSpec.from_dict(json.loads(spec_path.read_text()), where=str(spec_path))
        merged.attach_action_modules(spec)
        # The head's files came with the adapters (`ActionHead.load_files`).
        merged.run_files_dir = adapter_dir
        action = (
            load_file(str(adapter_dir / ACTION_WEIGHTS)) if (adapter_dir / ACTION_WEIGHTS).is_file() else {}
        )
        for module in ACTION_MODULES:
            if hasattr(
                merged, module
            ):  # strict: a missing or misshapen tensor is an error, not a random weight
                prefix = f"{module}."
                getattr(merged, module).load_state_dict(
                    {k.removeprefix(prefix): v for k, v in action.items() if k.startswith(prefix)}
                )
    stats_path = adapter_dir / DATASET_STATISTICS_FILE
    norm_stats = json.loads(stats_path.read_text()) if stats_path.is_file() else loaded.norm_stats
    logger.info("Merged the adapters of %s onto %s", adapter_dir, base)
    return LoadedVLA(merged, norm_stats, str(adapter_dir))
