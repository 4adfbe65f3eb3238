"""What a checkpoint is, without its weights: the architecture (and action side) to build for a registry id, a
Prismatic run folder, an HF OpenVLA folder or a Hub id.

A run that started from a folder or Hub id (`vla.base_vlm`) is described by that checkpoint (a Hub id from the local
cache, config and tokenizer files only), so describing a run never downloads the base LLM again. The loaders
(`prismatic.models.loading`) build what this returns, then fill it from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prismatic.models.action_heads import ActionSpec
from prismatic.models.hf_config import hf_architecture, is_hf_openvla_dir
from prismatic.models.hub import HUB_CONFIG_PATTERNS, hub_snapshot, looks_like_hub_id
from prismatic.models.materialize import VLMArchitecture
from prismatic.models.registry import BASE_VLMS, BaseVLMSpec, get_base_vlm_spec
from prismatic.run_layout import ACTION_MODEL_FILE, RUN_CONFIG_FILE
from prismatic.util.errors import ConfigError

logger = logging.getLogger(__name__)


def architecture_of(source: str, hf_token: str | None = None) -> VLMArchitecture:
    """The architecture of a registry id, a local HF / run folder, or a Hub id (config and tokenizer files only).

    This is how a run's `vla.base_vlm` is resolved when its checkpoint is loaded or exported: offline, a Hub id
    is answered from the local cache, and no weights are read or downloaded. `base` of the result is `source`
    (except for registry ids, whose pretrained weights are the registry's).

    Raises:
        ConfigError: unknown id, a folder that is neither layout, or a Hub id neither cached nor reachable.
    """
    if source in BASE_VLMS:
        return VLMArchitecture(source, BASE_VLMS[source])
    path = Path(source).expanduser()
    if path.is_dir():
        folder, model_id = path, path.name
    elif looks_like_hub_id(source):
        folder, model_id = hub_snapshot(source, hf_token, HUB_CONFIG_PATTERNS), source
    else:
        get_base_vlm_spec(source)  # the did-you-mean ConfigError for registry-id typos
        raise AssertionError("unreachable")
    if is_hf_openvla_dir(folder):
        return dataclasses.replace(hf_architecture(folder, model_id), base=source)
    if (folder / RUN_CONFIG_FILE).is_file():
        return dataclasses.replace(run_architecture(folder, hf_token), base=source)
    raise ConfigError(
        f"Base '{source}' is neither an HF OpenVLA folder nor a Prismatic run folder (no config.json in '{folder}')."
    )


def _model_block_spec(model: Mapping[str, Any], config_path: Path) -> BaseVLMSpec:
    try:
        return BaseVLMSpec(
            model["vision_backbone_id"],
            model["llm_backbone_id"],
            model["arch_specifier"],
            model["image_resize_strategy"],
        )
    except KeyError as err:
        raise ConfigError(f"'{config_path}' model block lacks {err}.") from err


def run_architecture(folder: Path, hf_token: str | None = None) -> VLMArchitecture:
    """The architecture a run folder's checkpoint holds, from its `config.json`.

    A run that started from a folder or Hub id (`vla.base_vlm` not a registry id) is that checkpoint's
    architecture, LLM config and tokenizer included; else Prismatic's `model` block; else the registry's
    `vla.base_vlm`. `base` says where the weights of parts the checkpoint lacks come from.

    Raises:
        ConfigError: the config names neither, or its base cannot be resolved.
    """
    config_path = folder / RUN_CONFIG_FILE
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"'{config_path}' is not valid JSON: {err}") from err
    model = config.get("model") if isinstance(config, dict) else None
    vla = config.get("vla") if isinstance(config, dict) else None
    base_vlm = vla.get("base_vlm") if isinstance(vla, Mapping) else None
    if isinstance(base_vlm, str) and base_vlm not in BASE_VLMS:
        if Path(base_vlm).expanduser().resolve() == folder.resolve():
            raise ConfigError(f"'{config_path}' names its own folder as vla.base_vlm.")
        try:
            return architecture_of(base_vlm, hf_token)
        except ConfigError as err:
            if not isinstance(model, Mapping):
                raise ConfigError(
                    f"'{config_path}' says the run started from '{base_vlm}', whose architecture cannot be read "
                    f"(moved or not cached?): {err}"
                ) from err
            logger.warning("Base '%s' of %s unavailable (%s); using its 'model' block", base_vlm, folder, err)
    if isinstance(model, Mapping):
        return VLMArchitecture(model.get("model_id", folder.name), _model_block_spec(model, config_path))
    if isinstance(base_vlm, str):
        return VLMArchitecture(base_vlm, get_base_vlm_spec(base_vlm))
    raise ConfigError(
        f"'{config_path}' has neither a 'model' block (Prismatic) nor 'vla.base_vlm' (OpenVLA / this "
        "tool): cannot tell which architecture its checkpoint holds."
    )


def run_action_spec(folder: Path) -> ActionSpec:
    """The action side a run (or export) folder's model was trained with: its `action_model.json`; OpenVLA's
    tokens head when there is none (every run before action heads, and OpenVLA's own checkpoints)."""
    path = folder / ACTION_MODEL_FILE
    if not path.is_file():
        return ActionSpec()
    try:
        values = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"'{path}' cannot be read ({err}): the run folder is damaged.") from err
    return ActionSpec.from_dict(values, where=str(path))
