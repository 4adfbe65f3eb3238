"""Saving and restoring a training run: sharded checkpoints (torch.distributed.checkpoint), written by every rank.

A checkpoint is the folder `<run_dir>/checkpoints/step-000040-epoch-01/` (layout: `prismatic.models.checkpoint_format`).
Every rank writes its own FSDP shards of the model, the optimizer state and its RNG state; rank 0 writes what is
replicated (LR schedule, trainer counters, DDP's whole model once). Nothing is gathered on one rank. Saving:

1. every rank waits for the previous (async) save, then writes into `checkpoints/.tmp-step-.../` (its data-stream
   snapshot first, then DCP);
2. rank 0, once DCP's metadata says every rank is done, renames the folder to its final name, then replaces the
   `latest` pointer atomically, then deletes checkpoints beyond `keep_last` (oldest first, never the new one).

A crash or `kill -9` at any point leaves at most a `.tmp-*` folder (removed at the next start) and never touches
the last complete checkpoint. With `async_save` the DCP write runs in a background thread on its own gloo process
group (so it never interleaves with training's collectives); the loop stalls only while the state is copied to
host memory. Resuming reads the shards back with resharding (another world size works) and restores RNG states
when the world size is unchanged.

Older single-file `.pt` checkpoints still resume (`restore_from_file`) and load everywhere a model is loaded.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from prismatic.conf.train import TrainConfig
from prismatic.models.checkpoint_format import (
    FORMAT_VERSION,
    MODULE_KEYS,
    complete_checkpoints,
    flatten_modules,
    group_by_module,
    load_checkpoint_file,
    newest_checkpoint,
    read_train_state,
)
from prismatic.run_layout import (
    CHECKPOINT_DIR,
    CHECKPOINTS_DIR,
    DATA_SNAPSHOT_DIR,
    LATEST_POINTER,
    TMP_PREFIX,
    TRAIN_STATE_FILE,
    checkpoint_dir_name,
)
from prismatic.training.run_folder import (
    Resume,
    RunFolder,
    read_resume_state,
    run_identity,
    saved_train_state,
    start_counters,
)
from prismatic.training.strategies.base import TrainingStrategy
from prismatic.util.dist import call_and_agree
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, make_dirs, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "CheckpointManager",
    "MODULE_KEYS",
    "atomic_torch_save",
    "flatten_modules",
    "group_by_module",
    "load_checkpoint_file",
    "newest_checkpoint",
    "read_train_state",
    "read_resume_state",
    "restore_from_file",
    "saved_train_state",
]

# === Stateful entries ==============================================================================================


class ModelState:
    """The model's parameters as DCP entries: FSDP shards as DTensors (each rank writes its own), else tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState:
    """AdamW moments keyed by parameter name (sharded like the parameters), so another world size can load them."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


class CountersState:
    """The trainer's counters (step, epoch, frames consumed over all ranks): replicated, written once."""

    def __init__(self, counters: dict[str, int]) -> None:
        self.counters = counters

    def state_dict(self) -> dict[str, Any]:
        return {k: torch.tensor(v, dtype=torch.int64) for k, v in self.counters.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.counters.update({k: int(v) for k, v in state_dict.items()})


class RNGState:
    """This rank's Python, NumPy and torch (CPU, CUDA) generators, under a key of its own rank, as tensors."""

    def __init__(self, rank: int) -> None:
        self.key = f"rank{rank}"

    def state_dict(self) -> dict[str, Any]:
        version, mt, gauss = random.getstate()
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state = {
            "python_mt": torch.tensor(mt, dtype=torch.int64),
            "python_meta": torch.tensor(
                [version, gauss is not None, 0 if gauss is None else gauss], dtype=torch.float64
            ),
            "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
            "numpy_meta": torch.tensor([pos, has_gauss, cached], dtype=torch.float64),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return {self.key: state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict[self.key]
        version, has_gauss_py, gauss = state["python_meta"].tolist()
        random.setstate((int(version), tuple(state["python_mt"].tolist()), gauss if has_gauss_py else None))
        pos, has_gauss, cached = state["numpy_meta"].tolist()
        np.random.set_state(
            ("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(pos), int(has_gauss), cached)
        )
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"])


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    counters: dict[str, int],
) -> dict[str, Any]:
    """What a checkpoint holds besides the per-rank data snapshot and RNG: the DCP state dict of the run."""
    return {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "lr_scheduler": lr_scheduler,
        "trainer": CountersState(counters),
    }


# === The manager ===================================================================================================


@dataclass
class _PendingSave:
    future: Future
    tmp: Path
    final: Path
    started: float


class CheckpointManager:
    """When to save, how (blocking or async), which checkpoints to keep, and reading one back. Every method that
    saves or loads is collective: call it on every rank."""

    def __init__(
        self,
        run_dir: Path,
        *,
        save_interval: int,
        keep_last: int | None,
        async_save: bool,
        rank: int,
        dist_timeout: timedelta | None = None,
    ) -> None:
        self.dir = Path(run_dir) / CHECKPOINTS_DIR
        self.save_interval, self.keep_last, self.async_save = save_interval, keep_last, async_save
        self.rank, self.is_main = rank, rank == 0
        self._pending: _PendingSave | None = None
        # Async saves talk on their own gloo group: the default group is busy with training's collectives. Its
        # timeout is the run's (`--dist_timeout_s`), not gloo's default: ranks wait there for the slowest writer.
        self._group = (
            dist.new_group(backend="gloo", timeout=dist_timeout)
            if async_save and dist.is_initialized()
            else None
        )
        self.last_saved: Path | None = None

    # --- start-up -----------------------------------------------------------------------------------------------
    def remove_leftovers(self) -> list[Path]:
        """Delete `.tmp-*` folders a crash left mid-save (rank 0; the others wait at the next barrier)."""
        if not self.is_main or not self.dir.is_dir():
            return []
        leftovers = [p for p in self.dir.iterdir() if p.name.startswith(TMP_PREFIX)]
        for path in leftovers:
            logger.warning("Removing %s: a checkpoint that a crash left half-written.", path)
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        return leftovers

    def should_save(self, step: int, is_last_step: bool) -> bool:
        return is_last_step or step % self.save_interval == 0

    # --- saving -------------------------------------------------------------------------------------------------
    def save(
        self,
        state: dict[str, Any],
        train_state: dict[str, Any],
        write_rank_files: Callable[[Path], None] | None = None,
        *,
        blocking: bool = False,
    ) -> Path:
        """Write a checkpoint for `train_state["step"]` / `["epoch"]`; returns its final path.

        Args:
            state: the DCP state dict (`training_state(...)`); this rank's RNG state is added.
            train_state: JSON-able facts written by rank 0 to `train_state.json` (step, epoch, frames, identity).
            write_rank_files: writes this rank's own files (its data-stream snapshot) into the checkpoint folder.
            blocking: wait for the write even when saving asynchronously (the last save, a preemption save).
        """
        self.wait()
        name = checkpoint_dir_name(int(train_state["step"]), int(train_state["epoch"]))
        tmp, final = self.dir / f"{TMP_PREFIX}{name}", self.dir / name
        if self.is_main:
            if tmp.exists():
                shutil.rmtree(tmp)
            make_dirs(tmp, "checkpoint folder")
        _barrier(self._group)
        started = time.perf_counter()
        if write_rank_files is not None:
            write_rank_files(tmp)
        if self.is_main:
            write_json_atomic(
                tmp / TRAIN_STATE_FILE, {**train_state, "format_version": FORMAT_VERSION}, "train state"
            )
        full_state = {**state, "rng": RNGState(self.rank)}
        if self.async_save and not blocking:
            future = dcp.async_save(full_state, checkpoint_id=str(tmp), process_group=self._group)
            self._pending = _PendingSave(future, tmp, final, started)
            logger.info(
                "Saving %s in the background (loop stalled %.2f s)", final.name, time.perf_counter() - started
            )
        else:
            dcp.save(full_state, checkpoint_id=str(tmp))
            self._finish(tmp, final, started)
        return final

    def poll(self) -> None:
        """Finish a background save that has completed (no collective, cheap: call once per step)."""
        if self._pending is not None and self._pending.future.done():
            self._complete_pending()

    def wait(self) -> None:
        """Block until a background save is written and visible. Collective."""
        if self._pending is not None:
            self._complete_pending()
            # Waits for the slowest writer: on the gloo group (with --dist_timeout_s), not in an NCCL collective.
            _barrier(self._group)

    def _complete_pending(self) -> None:
        pending, self._pending = self._pending, None
        pending.future.result()  # re-raises a failed write
        self._finish(pending.tmp, pending.final, pending.started)

    def _finish(self, tmp: Path, final: Path, started: float) -> None:
        """Rank 0: make the written folder visible, move `latest`, apply keep_last."""
        self.last_saved = final
        if not self.is_main:
            return
        stale = None
        if final.exists():  # the same step saved again (a run resumed from an older checkpoint): replace it
            # While the old copy is moved aside, `latest` names the newest complete checkpoint of an earlier step
            # (the resumed run's lineage; or nothing), never a missing folder: a crash in between resumes there.
            step = int(CHECKPOINT_DIR.match(final.name)["step"])
            earlier = [
                c for c in complete_checkpoints(self.dir) if int(CHECKPOINT_DIR.match(c.name)["step"]) < step
            ]
            self._point_latest_at(earlier[-1] if earlier else None)
            stale = final.with_name(f"{TMP_PREFIX}replaced-{final.name}")
            final.rename(stale)
        tmp.rename(final)
        self._point_latest_at(final)
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
        logger.info("Saved checkpoint %s (%.2f s)", final, time.perf_counter() - started)
        if self.keep_last is not None:
            for old in complete_checkpoints(self.dir)[: -self.keep_last]:
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
                    logger.info("Deleted %s (--checkpoint.keep_last %d)", old.name, self.keep_last)

    def _point_latest_at(self, checkpoint: Path | None) -> None:
        """Replace the `latest` pointer atomically (None: remove it, so readers fall back to a scan)."""
        if checkpoint is None:
            (self.dir / LATEST_POINTER).unlink(missing_ok=True)
        else:
            write_text_atomic(self.dir / LATEST_POINTER, checkpoint.name + "\n", "latest-checkpoint pointer")

    # --- loading ------------------------------------------------------------------------------------------------
    def load(self, checkpoint: Path, state: dict[str, Any], *, same_world_size: bool) -> bool:
        """Restore `state` in place from `checkpoint` (resharding as needed); RNG states too when the world size
        is unchanged. Returns whether RNG states were restored. Collective."""
        try:
            dcp.load(state, checkpoint_id=str(checkpoint))
        except Exception as e:
            raise ConfigError(
                f"Cannot restore the run from '{checkpoint}': {type(e).__name__}: {e}. The checkpoint does not fit "
                "this model / optimizer (another --vla.base_vlm, --vla.type or LoRA setting?)."
            ) from e
        if not same_world_size:
            return False
        dcp.load(
            {"rng": RNGState(self.rank)},
            checkpoint_id=str(checkpoint),
            planner=DefaultLoadPlanner(allow_partial_load=True),
        )
        return True


class DataStream(Protocol):
    """What the checkpointer needs of a rank's data stream (`RLDSDataset`): save and restore its position."""

    def save_stream_state(self, directory: Path) -> None: ...

    def resume_from(self, frames: int, directory: Path | None) -> str: ...


class Checkpointer:
    """The one owner of everything a run's checkpoint holds: the DCP `Stateful`s (model, optimizer, LR schedule,
    counters; the manager adds RNG states), each rank's data-stream position, and the run's facts in
    `train_state.json` (counters, identity, world and batch sizes). The loop calls `save`; a resume calls
    `restore`. Saving and restoring are collective: call them on every rank."""

    def __init__(
        self,
        manager: CheckpointManager,
        state: dict[str, Any],
        counters: dict[str, int],
        facts: dict[str, Any],
        data: DataStream,
        snapshot_data: bool = True,
    ) -> None:
        self.manager, self.state, self.counters, self.facts = manager, state, counters, facts
        self.data, self.snapshot_data = data, snapshot_data

    @property
    def last_saved(self) -> Path | None:
        return self.manager.last_saved

    def should_save(self, step: int, is_last_step: bool) -> bool:
        return self.manager.should_save(step, is_last_step)

    def poll(self) -> None:
        self.manager.poll()

    def wait(self) -> None:
        self.manager.wait()

    def save(self, blocking: bool) -> Path:
        """A checkpoint of the current counters (`blocking`: wait for it even when saving asynchronously)."""
        data = self.data
        snapshot = (
            (lambda folder: data.save_stream_state(folder / DATA_SNAPSHOT_DIR))
            if self.snapshot_data
            else None
        )
        return self.manager.save(self.state, {**self.counters, **self.facts}, snapshot, blocking=blocking)

    def restore(self, resume: Resume | None, pretrained_checkpoint: Path | None) -> None:
        """Continue `resume` (the data stream at this rank's share of its frames, then model, optimizer, schedule,
        counters and, on the same world size, RNG states), or load `pretrained_checkpoint`'s weights only
        (`--is_resume false`), or nothing for a new run."""
        model = self.state["model"].model
        if resume is None:
            if pretrained_checkpoint is not None:
                load_pretrained_weights(model, pretrained_checkpoint)
            return
        how = self.data.resume_from(resume.rank_frames, resume.data_snapshot)
        logger.info(
            "Data stream of rank %d restored at frame %d (%s)", self.manager.rank, resume.rank_frames, how
        )
        path = resume.point.path
        if resume.point.sharded:
            rng = self.manager.load(path, self.state, same_world_size=resume.same_world_size)
            logger.info(
                "Restored model, optimizer, schedule%s from %s", " and RNG states" if rng else "", path
            )
        else:
            optimizer, lr_scheduler = self.state["optimizer"].optimizer, self.state["lr_scheduler"]
            restore_from_file(model, optimizer, lr_scheduler, load_checkpoint_file(path), path)


def build_checkpointer(
    cfg: TrainConfig,
    run: RunFolder,
    strategy: TrainingStrategy,
    data: DataStream,
    resume: Resume | None,
) -> Checkpointer:
    """The run's checkpointer: its manager (cadence, keep-K, async; `.tmp-*` leftovers of a crash removed), the
    strategy's model / optimizer / schedule, the loop's counters where `resume` says the run is, and the facts of
    `train_state.json`. Call on every rank."""
    counters = start_counters(resume)
    manager = CheckpointManager(
        run.path,
        save_interval=cfg.save_interval,
        keep_last=cfg.checkpoint.keep_last,
        async_save=cfg.checkpoint.async_save,
        rank=strategy.dist.rank,
        dist_timeout=timedelta(seconds=cfg.dist_timeout_s),
    )
    manager.remove_leftovers()
    facts = {
        **run_identity(cfg),
        "world_size": strategy.dist.world_size,
        "global_batch_size": cfg.vla.global_batch_size,
        "per_device_batch_size": cfg.vla.per_device_batch_size,
    }
    state = training_state(strategy.model, strategy.optimizer, strategy.lr_scheduler, counters)
    return Checkpointer(manager, state, counters, facts, data, cfg.checkpoint.data_snapshot)


def _barrier(group: Any = None) -> None:
    """A barrier on `group` (the background saves' gloo group when there is one; else the default group)."""
    if dist.is_initialized():
        dist.barrier(group=group)


# === Single-file (format 1) checkpoints ===========================================================================


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


def load_full_model_weights(
    model: torch.nn.Module, ckpt: Mapping[str, Any] | None, path: Path, *, from_rank0: bool = False
) -> None:
    """Load a checkpoint's consolidated weights (`load_checkpoint_file` layout) into a possibly sharded model.
    `from_rank0`: only rank 0 passes `ckpt` (the others None) and broadcasts it. Collective: call on every rank."""
    weights = flatten_modules(ckpt["model"]) if ckpt is not None else {}
    options = StateDictOptions(full_state_dict=True, strict=True, broadcast_from_rank0=from_rank0)
    try:
        set_model_state_dict(model, weights, options=options)
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(f"Checkpoint '{path}' does not fit this model (--vla.base_vlm?): {e}") from e


def load_pretrained_weights(model: torch.nn.Module, path: Path) -> None:
    """`--pretrained_checkpoint X --is_resume false`: `path`'s weights into the wrapped model, read by rank 0 alone.

    The other ranks receive them from rank 0 one tensor at a time (`broadcast_from_rank0`), each keeping its FSDP
    shard or DDP replica (host shards under CPU offload too: the broadcast runs on the group's device): a 7B FP32
    checkpoint is read once per job, not once per rank. Rank 0 first checks names and shapes, and every rank raises
    if that or the read fails (`call_and_agree`): none is left waiting in the broadcast. Collective.
    """
    from_rank0 = dist.is_initialized()
    shapes = {name: tuple(t.shape) for name, t in get_model_state_dict(model).items()}

    def read() -> dict[str, Any] | None:
        if from_rank0 and dist.get_rank() != 0:
            return None
        ckpt = load_checkpoint_file(path)
        weights = {name: tuple(t.shape) for name, t in flatten_modules(ckpt["model"]).items()}
        wrong = sorted(set(weights) ^ set(shapes)) or [n for n in sorted(shapes) if weights[n] != shapes[n]]
        if wrong:
            raise ConfigError(
                f"Checkpoint '{path}' does not fit this model (--vla.base_vlm?): names or shapes differ for "
                f"{len(wrong)} tensors, e.g. {', '.join(wrong[:3])}."
            )
        return ckpt

    load_full_model_weights(model, call_and_agree(read), path, from_rank0=from_rank0)


def restore_from_file(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    ckpt: Mapping[str, Any],
    path: Path,
) -> dict[str, Any]:
    """Resume from a single-file checkpoint: weights, full optimizer state, schedule; returns its train_state.
    Collective: call on every rank."""
    train_state = saved_train_state(ckpt, path)
    load_full_model_weights(model, ckpt, path)
    set_optimizer_state_dict(
        model, optimizer, ckpt["optimizer"], options=StateDictOptions(full_state_dict=True)
    )
    lr_scheduler.load_state_dict(ckpt["lr_scheduler"])
    return train_state
