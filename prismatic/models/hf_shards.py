"""Reading the safetensors shards of an HF OpenVLA folder: headers first, then one shard at a time.

`hf_weight_shapes` reads only the headers (a checkpoint that does not fit fails before any data is read);
`iter_hf_shards` yields one shard's tensors at a time, so a loader never holds more than the model plus one shard.
`prismatic.models.hf_openvla` writes these files.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from prismatic.run_layout import MODEL_SAFETENSORS
from prismatic.util.errors import ConfigError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = MODEL_SAFETENSORS


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
