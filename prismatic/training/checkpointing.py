"""Checkpoints: when to save, how to write them atomically, and how to restore a run from one.

Layout: `<run_dir>/checkpoints/step-{step:06d}-epoch-{epoch:02d}-loss={loss:.4f}.pt`, one `torch.save` file:

    {"model":        {"vision_backbone": {...}, "projector": {...}, "llm_backbone": {...}},  # consolidated FP32
     "optimizer":    full (unsharded) optimizer state dict, keyed by parameter name,
     "lr_scheduler": the LR scheduler's state dict,
     "train_state":  {"step", "epoch", "samples_per_rank", "world_size", "vla_id", "seed", "format_version"}}

The model weights are the full, unsharded state dict grouped by module key (Prismatic's layout), so
`torch.load(path, weights_only=True)["model"]` loads them without any distributed set-up. Everything else is
what resuming needs. Files are written to a temporary name, fsynced and renamed into place
(`prismatic.util.files.atomic_write`): a crash, a Ctrl-C or a full disk never leaves a half-written file under a
checkpoint's name, and the file gets the umask's normal permissions (group-readable under 022).

Resuming keeps the experiment: `check_resume_compatible` refuses a different `--vla.type` or `--seed` than the
checkpoint's `train_state` unless `--allow_config_change true` is given.
"""

from __future__ import annotations

import logging
import math
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODULE_KEYS = ("vision_backbone", "projector", "llm_backbone")


def checkpoint_name(step: int, epoch: int, loss: float) -> str:
    loss_text = f"{loss:.4f}" if math.isfinite(loss) else "inf"
    return f"step-{step:06d}-epoch-{epoch:02d}-loss={loss_text}.pt"


def atomic_torch_save(obj: Any, path: Path, what: str = "checkpoint") -> None:
    """`torch.save` to `path` atomically (temporary file beside it, fsync, rename; see `atomic_write`).

    Raises:
        ConfigError: the file could not be written (full disk, read-only folder, ...); nothing is left behind.
    """
    with atomic_write(path, what) as f:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            # torch's zip writer hides a failed write (full disk) behind its own error while closing the archive.
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise


def group_by_module(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{"llm_backbone.llm.model...": t} -> {"llm_backbone": {"llm.model...": t}, ...}."""
    grouped: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MODULE_KEYS}
    for name, tensor in flat.items():
        module, _, rest = name.partition(".")
        grouped.setdefault(module, {})[rest] = tensor
    return grouped


def flatten_modules(grouped: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{module}.{name}": t for module, sd in grouped.items() for name, t in sd.items()}


def _not_ours(path: Path, detail: str) -> ConfigError:
    return ConfigError(
        f"Cannot read checkpoint '{path}': it is not a checkpoint written by this tool, or it is truncated or "
        f"damaged ({detail}). Checkpoints are the step-*.pt files in <run_dir>/checkpoints/; if this one was cut "
        "short by a full disk or an interrupted copy, use an earlier checkpoint."
    )


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely (`weights_only=True`, memory-mapped).

    Raises:
        ConfigError: `path` is missing, a folder, or not a checkpoint of this tool (random bytes, a truncated
            copy, a pickle of arbitrary objects, a file without `model`). The message never quotes torch's
            zip / pickle internals.
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"Checkpoint '{path}' does not exist.")
    if path.is_dir():
        raise ConfigError(
            f"Checkpoint '{path}' is a folder; pass one of its checkpoints/step-*.pt files (a run folder is "
            "accepted where a model is loaded, not where a run is resumed)."
        )
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
            "it holds Python objects other than tensors and plain containers (refused: unpickling them "
            "could run code)",
        ) from e
    except Exception as e:  # noqa: BLE001 (any unreadable archive is the same user error)
        raise _not_ours(path, "its archive cannot be read") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise _not_ours(path, "it holds no 'model' entry")
    return ckpt


def saved_train_state(ckpt: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The checkpoint's `train_state`, or a `ConfigError` saying that it cannot be resumed."""
    for key in ("optimizer", "lr_scheduler", "train_state"):
        if key not in ckpt:
            raise ConfigError(
                f"Checkpoint '{path}' holds no '{key}', so its run cannot be resumed; pass --is_resume false "
                "to start a new run from its weights."
            )
    return dict(ckpt["train_state"])


def check_resume_compatible(
    saved: Mapping[str, Any], *, vla_id: str, seed: int, path: Path, allow_config_change: bool
) -> list[str]:
    """Refuse to resume a run as a different experiment: another `--vla.type` or `--seed` than the checkpoint's.

    Either would silently continue the old run's name, logs and W&B run with another recipe or data order.
    Keys missing from an older checkpoint's `train_state` are not checked.

    Returns:
        the differences found (logged as a warning) when `allow_config_change` is set; [] when there are none.
    Raises:
        ConfigError: naming each difference and the flags that continue the run as it was.
    """
    differences, fixes = [], []
    if "vla_id" in saved and saved["vla_id"] != vla_id:
        differences.append(f"--vla.type {vla_id} (the checkpoint's run used {saved['vla_id']})")
        fixes.append(f"--vla.type {saved['vla_id']}")
    if "seed" in saved and saved["seed"] != seed:
        differences.append(f"--seed {seed} (the checkpoint's run used {saved['seed']})")
        fixes.append(f"--seed {saved['seed']}")
    if not differences:
        return []
    if allow_config_change:
        logger.warning(
            "Resuming from %s with %s, as --allow_config_change asks: the continued run is not the run that was "
            "checkpointed.",
            path,
            " and ".join(differences),
        )
        return differences
    raise ConfigError(
        f"Refusing to resume from '{path}' with {' and '.join(differences)}: the run would continue under the same "
        "name, logs and W&B run as a different experiment (another recipe or data order). Pass "
        f"{' '.join(fixes)} to continue it as it was, --is_resume false to start a new run from its weights, or "
        "--allow_config_change true to resume with the new values anyway."
    )


class Checkpointer:
    """Decides checkpoint cadence and saves / restores the full training state."""

    def __init__(self, run_dir: Path, save_interval: int, is_main: bool) -> None:
        self.dir = run_dir / "checkpoints"
        self.save_interval = save_interval
        self.is_main = is_main

    def should_save(self, step: int, is_last_step: bool) -> bool:
        return is_last_step or step % self.save_interval == 0

    def save(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
        train_state: dict[str, Any],
        loss: float,
    ) -> Path:
        """Gather the full state and write it on rank 0. Collective: call on every rank."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(model, options=options)
        # Frozen parameters may be stored in bf16 under FSDP mixed precision; checkpoints are always FP32.
        model_sd = {k: v.float() if v.is_floating_point() else v for k, v in model_sd.items()}
        optim_sd = get_optimizer_state_dict(model, optimizer, options=options)
        path = self.dir / checkpoint_name(train_state["step"], train_state["epoch"], loss)
        if self.is_main:
            payload = {
                "model": group_by_module(model_sd),
                "optimizer": optim_sd,
                "lr_scheduler": lr_scheduler.state_dict(),
                "train_state": {**train_state, "format_version": FORMAT_VERSION},
            }
            atomic_torch_save(payload, path)
            logger.info("Saved checkpoint %s", path)
        if dist.is_initialized():
            dist.barrier()
        return path

    @staticmethod
    def load_model_weights(model: torch.nn.Module, ckpt: dict[str, Any], path: Path) -> None:
        """Load consolidated weights into a (possibly sharded) model. Collective: call on every rank."""
        try:
            set_model_state_dict(
                model,
                flatten_modules(ckpt["model"]),
                options=StateDictOptions(full_state_dict=True, strict=True),
            )
        except (RuntimeError, KeyError, ValueError) as e:
            raise ConfigError(f"Checkpoint '{path}' does not fit this model (--vla.base_vlm?): {e}") from e

    @staticmethod
    def load_training_state(
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
        ckpt: dict[str, Any],
        path: Path,
    ) -> dict[str, Any]:
        """Restore optimizer and scheduler; return the saved train_state. Collective: call on every rank."""
        train_state = saved_train_state(ckpt, path)
        set_optimizer_state_dict(
            model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True)
        )
        lr_scheduler.load_state_dict(ckpt["lr_scheduler"])
        return train_state
