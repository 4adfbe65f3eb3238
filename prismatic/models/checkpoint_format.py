"""What a checkpoint of this tool is on disk, and how to read its model weights without any distributed set-up.

Two formats are read:

- **Sharded (written since format 2)**: a folder `<run_dir>/checkpoints/step-000040-epoch-01/` written with
  `torch.distributed.checkpoint` (DCP) by every rank at once (`prismatic/training/checkpointing.py` writes it):

      .metadata, __<rank>_<n>.distcp   DCP: "model.*" (parameter name -> tensor, FSDP shards reassembled on read),
                                        "optimizer.*", "lr_scheduler.*", "trainer.*", "rng.rank<r>.*"
      data/                             each rank's data-stream snapshot (resuming without replaying the data)
      train_state.json                  step, epoch, frames consumed, world size, the run's identity (readable)

  It becomes visible only once complete: it is written as `.tmp-step-...` and renamed; `checkpoints/latest` (a
  text file holding the folder's name) is replaced atomically after the rename.
- **Model only**: `checkpoints/model.safetensors` of a folder `export_hf.py --format safetensors` wrote (with
  `config.json` and `dataset_statistics.json` beside `checkpoints/`): the consolidated weights, nothing to resume.
- **Single file (format 1, older runs)**: `checkpoints/step-000040-epoch-01-loss=1.2345.pt`, one `torch.save`
  dict `{"model": {"vision_backbone": {...}, "projector": {...}, "llm_backbone": {...}}, "optimizer",
  "lr_scheduler", "train_state"}`; Prismatic's `latest-checkpoint.pt` has the same `model` layout.

`load_checkpoint_file` returns the single-file layout for either, so loading, export and LoRA merging read both.
"""

from __future__ import annotations

import json
import logging
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prismatic.run_layout import (
    CHECKPOINT_DIR,
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    DCP_METADATA,
    LATEST_POINTER,
    LEGACY_LATEST,
    MODEL_SAFETENSORS,
    TMP_PREFIX,
    TRAIN_STATE_FILE,
)
from prismatic.util.errors import ConfigError

if TYPE_CHECKING:  # annotations only: torch loads where tensors are read
    import torch

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
MODULE_KEYS = ("vision_backbone", "projector", "llm_backbone")


def is_sharded_checkpoint(path: Path) -> bool:
    """A complete sharded checkpoint folder: DCP's metadata and our train state are both there."""
    path = Path(path)
    return path.is_dir() and (path / DCP_METADATA).is_file() and (path / TRAIN_STATE_FILE).is_file()


def complete_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """The complete sharded checkpoints in `checkpoints_dir`, oldest step first (temporary folders excluded)."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.is_dir():
        return []
    found = [
        p for p in checkpoints_dir.iterdir() if CHECKPOINT_DIR.match(p.name) and is_sharded_checkpoint(p)
    ]
    return sorted(found, key=lambda p: int(CHECKPOINT_DIR.match(p.name)["step"]))


def newest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The checkpoint `latest` names when it is complete, else the highest-step complete one; None if none.

    The pointer is only a shortcut: a crash between a checkpoint's rename and the pointer's update leaves the
    pointer one behind, so the folders themselves decide when they disagree.
    """
    checkpoints_dir = Path(checkpoints_dir)
    complete = complete_checkpoints(checkpoints_dir)
    pointer = checkpoints_dir / LATEST_POINTER
    if pointer.is_file():
        named = checkpoints_dir / pointer.read_text().strip()
        if named in complete and named == complete[-1]:
            return named
    return complete[-1] if complete else None


def run_folder_of(checkpoint: Path) -> Path:
    """The run folder of a checkpoint (`<run>/checkpoints/step-*` folder or `.pt` file); any other path itself."""
    checkpoint = Path(checkpoint)
    inside = checkpoint.is_file() or is_sharded_checkpoint(checkpoint)
    return checkpoint.parent.parent if inside and checkpoint.parent.name == CHECKPOINTS_DIR else checkpoint


def read_train_state(checkpoint: Path) -> dict[str, Any]:
    """A sharded checkpoint's `train_state.json` (step, epoch, frames, world size, the run's identity)."""
    path = Path(checkpoint) / TRAIN_STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"Cannot read '{path}' ({e}): the checkpoint is incomplete or damaged.") from e


def group_by_module(flat: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{"llm_backbone.llm.model...": t} -> {"llm_backbone": {"llm.model...": t}, ...}."""
    grouped: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MODULE_KEYS}
    for name, tensor in flat.items():
        module, _, rest = name.partition(".")
        grouped.setdefault(module, {})[rest] = tensor
    return grouped


def flatten_modules(grouped: Mapping[str, Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{module}.{name}": t for module, sd in grouped.items() for name, t in sd.items()}


def _not_ours(path: Path, detail: str) -> ConfigError:
    return ConfigError(
        f"Cannot read checkpoint '{path}': it is not a checkpoint written by this tool, or it is truncated or "
        f"damaged ({detail}). Checkpoints are the step-* folders (or older step-*.pt files) in "
        "<run_dir>/checkpoints/; if this one was cut short by a full disk or an interrupted copy, use an earlier one."
    )


def read_sharded_model_weights(checkpoint: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full model weights of a sharded checkpoint, parameter name -> tensor, in one process (no process group).

    Every rank's shards are reassembled by DCP from the metadata; only "model.*" entries are read. Frozen weights
    that training kept in bf16 are returned in `dtype` (None: FP32).
    """
    # lazy: the config layer reads checkpoint folders with this module before torch loads
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    checkpoint = Path(checkpoint)
    try:
        metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata()
    except Exception as e:  # noqa: BLE001 (any unreadable metadata is the same user error)
        raise _not_ours(checkpoint, f"its DCP metadata cannot be read: {type(e).__name__}") from e
    weights = {
        key.removeprefix("model."): torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)
    }
    if not weights:
        raise _not_ours(checkpoint, "it holds no model weights")
    try:
        dcp.load({"model": weights}, checkpoint_id=str(checkpoint), no_dist=True)
    except Exception as e:  # noqa: BLE001
        raise _not_ours(checkpoint, f"its shards cannot be read: {type(e).__name__}: {e}") from e
    dtype = dtype or torch.float32
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """A checkpoint's contents in the single-file layout: `{"model": {module: {name: tensor}}, ...}`.

    A sharded checkpoint folder gives its model weights (FP32) and `train_state`; a `.pt` file is loaded safely
    (`weights_only=True`, memory-mapped) with everything it holds.

    Raises:
        ConfigError: `path` is missing, or not a checkpoint of this tool (random bytes, a truncated copy, a pickle
            of arbitrary objects, a file without `model`). The message never quotes torch's zip / pickle internals.
    """
    import torch  # lazy: the config layer uses this module before torch loads

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Checkpoint '{path}' does not exist.")
    if path.is_dir():
        if not is_sharded_checkpoint(path):
            if path.name.startswith(TMP_PREFIX):
                raise _not_ours(path, "it is a checkpoint that was still being written (a crash left it)")
            raise _not_ours(path, f"a folder without DCP's {DCP_METADATA} and {TRAIN_STATE_FILE}")
        return {
            "model": group_by_module(read_sharded_model_weights(path)),
            "train_state": read_train_state(path),
        }
    if path.suffix == ".safetensors":
        # lazy: safetensors.torch imports torch, which the config layer must not load
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return {"model": group_by_module(load_file(path))}
        except (SafetensorError, OSError) as e:
            raise _not_ours(path, f"its safetensors cannot be read: {e}") from e
    size = path.stat().st_size
    if size == 0:
        raise _not_ours(path, "the file is empty (0 bytes)")
    if not zipfile.is_zipfile(path):
        raise _not_ours(
            path, f"its {size} bytes are not a torch.save archive (or the archive's end is missing)"
        )
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise _not_ours(
            path,
            "it holds Python objects other than tensors and plain containers (refused: unpickling them could run "
            "code)",
        ) from e
    except Exception as e:  # noqa: BLE001 (any unreadable archive is the same user error)
        raise _not_ours(path, "its archive cannot be read") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise _not_ours(path, "it holds no 'model' entry")
    return ckpt


def latest_checkpoint(folder: Path) -> Path:
    """A run folder's newest checkpoint: the newest complete sharded one, else `latest-checkpoint.pt`, else the
    highest-step `step-*.pt`."""
    checkpoints = Path(folder) / CHECKPOINTS_DIR
    sharded = newest_checkpoint(checkpoints)
    if sharded is not None:
        return sharded
    for name in (MODEL_SAFETENSORS, LEGACY_LATEST):
        if (checkpoints / name).is_file():
            return checkpoints / name
    # By step number, not by name: "step-1000000-..." sorts before "step-999999-..." as text.
    files = sorted(
        (f for f in checkpoints.glob("step-*.pt") if CHECKPOINT_FILE.match(f.name)),
        key=lambda f: int(CHECKPOINT_FILE.match(f.name)["step"]),
    )
    if not files:
        raise ConfigError(
            f"Run folder '{folder}' has no complete checkpoint: no step-* folder with {DCP_METADATA} and "
            f"{TRAIN_STATE_FILE}, no {LEGACY_LATEST} and no step-*.pt in '{checkpoints}'."
        )
    return files[-1]
