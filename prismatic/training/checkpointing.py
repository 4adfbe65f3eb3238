"""Checkpoints: when to save, how to write them atomically, and how to restore a run from one.

Layout: `<run_dir>/checkpoints/step-{step:06d}-epoch-{epoch:02d}-loss={loss:.4f}.pt`, one `torch.save` file:

    {"model":        {"vision_backbone": {...}, "projector": {...}, "llm_backbone": {...}},  # consolidated FP32
     "optimizer":    full (unsharded) optimizer state dict, keyed by parameter name,
     "lr_scheduler": the LR scheduler's state dict,
     "train_state":  {"step", "epoch", "samples_per_rank", "world_size", "vla_id", "seed", "format_version"}}

The model weights are the full, unsharded state dict grouped by module key (Prismatic's layout), so
`torch.load(path, weights_only=True)["model"]` loads them without any distributed set-up. Everything else is
what resuming needs. Files are written to a temporary name, fsynced and renamed into place: a crash or Ctrl-C
never leaves a half-written file under a checkpoint's name.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
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

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MODULE_KEYS = ("vision_backbone", "projector", "llm_backbone")


def checkpoint_name(step: int, epoch: int, loss: float) -> str:
    loss_text = f"{loss:.4f}" if math.isfinite(loss) else "inf"
    return f"step-{step:06d}-epoch-{epoch:02d}-loss={loss_text}.pt"


def atomic_torch_save(obj: Any, path: Path) -> None:
    """`torch.save` to `path` via a temporary file in the same folder, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def group_by_module(flat: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """{"llm_backbone.llm.model...": t} -> {"llm_backbone": {"llm.model...": t}, ...}."""
    grouped: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MODULE_KEYS}
    for name, tensor in flat.items():
        module, _, rest = name.partition(".")
        grouped.setdefault(module, {})[rest] = tensor
    return grouped


def flatten_modules(grouped: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {f"{module}.{name}": t for module, sd in grouped.items() for name, t in sd.items()}


def load_checkpoint_file(path: Path) -> dict[str, Any]:
    """Load a checkpoint safely (`weights_only=True`, memory-mapped); a clear error if it is not ours."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 (any unreadable file is the same user error)
        raise ConfigError(f"Cannot read checkpoint '{path}': {e}") from e
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise ConfigError(f"'{path}' is not a checkpoint of this tool (no 'model' entry).")
    return ckpt


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
        for key in ("optimizer", "lr_scheduler", "train_state"):
            if key not in ckpt:
                raise ConfigError(
                    f"Checkpoint '{path}' holds no '{key}', so its run cannot be resumed; pass --is_resume false "
                    "to start a new run from its weights."
                )
        set_optimizer_state_dict(
            model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True)
        )
        lr_scheduler.load_state_dict(ckpt["lr_scheduler"])
        return dict(ckpt["train_state"])
