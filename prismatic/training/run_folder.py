"""The run folder's owner: new run or resume, what a resume continues, and the files a run writes beside its logs.

Every decision about `<run_root_dir>/<run_id>/` is taken here, once, before the model and data load, and handed
to the rooms that need it by name (`Resume`): the checkpoint to restore, the step / epoch / frames it ends at,
each rank's data position and snapshot folder, and the step trackers continue from. The file names are those of
`prismatic/run_layout.py`.

- A new run over a folder with checkpoints is refused (add `--resume`); logs of an attempt that crashed before
  its first checkpoint are moved aside so the same command starts it over.
- A resume must continue the same experiment (`IDENTITY`): another seed, experiment, mixture, base model, head,
  head option or data option is refused unless `--allow_config_change`.
- The resolved config is written as `config.yaml` / `config.json`; a resume writes its own copy beside them
  (`config.resume-<checkpoint>.*`) and never overwrites the original.

Import-light (no torch): `vla_scripts/train.py` checks the folder before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from prismatic.conf.data import DataOptions
from prismatic.conf.train import LATEST, TrainConfig
from prismatic.models.action_heads.options import options_group_name
from prismatic.models.checkpoint_format import (
    complete_checkpoints,
    is_sharded_checkpoint,
    load_checkpoint_file,
    newest_checkpoint,
    read_train_state,
)
from prismatic.run_layout import (
    ACTION_MODEL_FILE,
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    CONFIG_STEM,
    DATA_SNAPSHOT_DIR,
    METRICS_FILE,
    SPEED_PLAN_FILE,
    WANDB_ID_FILE,
    checkpoint_dir_name,
)
from prismatic.util.errors import ConfigError
from prismatic.util.files import make_dirs, write_json_atomic, write_text_atomic
from prismatic.util.redact import redact_config

logger = logging.getLogger(__name__)

# The run's identity: train_state.json key -> (flag, TrainConfig attribute). Resuming with another value would
# continue a different experiment under the same name, logs and W&B run.
IDENTITY: dict[str, tuple[str, str]] = {
    "vla_id": ("--vla.type", "vla.vla_id"),
    "seed": ("--seed", "seed"),
    "data_mix": ("--vla.data_mix", "vla.data_mix"),
    "base_vlm": ("--vla.base_vlm", "vla.base_vlm"),
    # The action side decides the model's modules and the frames' layout.
    "action_head": ("--vla.action_head", "vla.action_head"),
    "chunk_size": ("--vla.chunk_size", "vla.chunk_size"),
    "use_proprio": ("--vla.use_proprio", "vla.use_proprio"),
    "num_images": ("--vla.num_images", "vla.num_images"),
    # The data options decide the statistics and the frames (prismatic/conf/data.py).
    **{f"data.{name}": (f"--data.{name}", f"data.{name}") for name in DataOptions().to_dict()},
}


def run_identity(cfg: TrainConfig) -> dict[str, Any]:
    """What makes a run the same experiment: the value of every `IDENTITY` attribute of `cfg`, then each option of
    the chosen head (`head.<group>.<option>`: they decide its modules, like the head itself)."""
    identity = {}
    for key, (_, attribute) in IDENTITY.items():
        value: Any = cfg
        for part in attribute.split("."):
            value = getattr(value, part)
        identity[key] = value
    group = options_group_name(cfg.vla.action_head)
    for name, value in cfg.vla.head_options().items():
        identity[f"head.{group}.{name}"] = value
    return identity


def _identity_flag(key: str) -> str:
    """The flag that sets identity key `key` (a head option's is `--vla.head.<group>.<option>`)."""
    return IDENTITY[key][0] if key in IDENTITY else f"--vla.{key}"


def check_resume_compatible(
    saved: Mapping[str, Any], current: Mapping[str, Any], *, path: Path, allow_config_change: bool
) -> list[str]:
    """Refuse to resume a run as a different experiment: another vla type, seed, data mixture or base model.

    Either would silently continue the old run's name, logs and W&B run with another recipe, data or model. Keys
    missing from an older checkpoint's train state are not checked.

    Returns:
        the differences found (logged as a warning) when `allow_config_change` is set; [] when there are none.
    Raises:
        ConfigError: naming each difference and the flags that continue the run as it was.
    """
    differences, fixes = [], []
    for key in dict.fromkeys([*IDENTITY, *current]):
        flag = _identity_flag(key)
        if key in saved and key in current and saved[key] != current[key]:
            differences.append(f"{flag} {current[key]} (the checkpoint's run used {saved[key]})")
            fixes.append(f"{flag} {saved[key]}")
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
        "name, logs and W&B run as a different experiment (another recipe, data or model). Pass "
        f"{' '.join(fixes)} to continue it as it was, start a new run from its weights with --pretrained_checkpoint "
        f"{path} --is_resume false and another --run_id, or pass --allow_config_change true to resume with the new "
        "values anyway."
    )


@dataclass(frozen=True)
class ResumePoint:
    """A checkpoint to continue: a sharded folder (or an older .pt file) and the step / epoch it ends at."""

    path: Path
    step: int
    epoch: int

    @property
    def sharded(self) -> bool:
        return self.path.is_dir()


def resume_point(cfg: TrainConfig, run_dir: Path | None = None) -> ResumePoint | None:
    """The checkpoint `cfg` continues, with its step and epoch; None for a new run.

    `--resume` alone needs `run_dir` (this run's folder): its newest complete checkpoint. A folder comes with
    `train_state.json`; an older `.pt` file's step and epoch are read from its name. `--resume_step` /
    `--resume_epoch`, when given (OpenVLA's flags), must match.
    """
    source = cfg.resume_source()
    if source is None:
        return None
    if source == LATEST:
        if run_dir is None:
            return None
        path = newest_checkpoint(run_dir / CHECKPOINTS_DIR)
        if path is None:
            where = (
                f"'{run_dir / CHECKPOINTS_DIR}'" if (run_dir / CHECKPOINTS_DIR).is_dir() else f"'{run_dir}'"
            )
            raise ConfigError(
                f"--resume found no complete checkpoint of run '{run_dir.name}' in {where}: the run has not "
                "saved one yet (or this is not its --run_id / --run_root_dir). Run the same command without "
                "--resume to start it over, or pass --resume <checkpoint folder>."
            )
    else:
        path = Path(source)
    flag = "--resume" if cfg.resume is not None else "--pretrained_checkpoint"
    if not path.exists():
        raise ConfigError(f"{flag} '{path}' does not exist.")
    step, epoch = _checkpoint_position(cfg, path, flag)
    for given, actual in ((cfg.resume_step, step), (cfg.resume_epoch, epoch)):
        if given is not None and given != actual:
            raise ConfigError(
                f"--resume_step {cfg.resume_step} --resume_epoch {cfg.resume_epoch} do not match checkpoint "
                f"'{path.name}' (step {step}, epoch {epoch}). Pass --resume_step {step} --resume_epoch {epoch}, "
                "or leave both out: the checkpoint says where it is."
            )
    return ResumePoint(path, step, epoch)


def _checkpoint_position(cfg: TrainConfig, path: Path, flag: str) -> tuple[int, int]:
    """(step, epoch) of a checkpoint folder (its train state) or of an older `.pt` file (its name)."""
    if path.is_dir():
        if not is_sharded_checkpoint(path):
            raise ConfigError(
                f"{flag} '{path}' is not a complete checkpoint folder (no .metadata / train_state.json): pass a "
                f"<run_dir>/{CHECKPOINTS_DIR}/step-* folder, or --resume alone for the run's newest one."
            )
        state = read_train_state(path)
        return int(state["step"]), int(state["epoch"])
    match = CHECKPOINT_FILE.match(path.name)
    if match is None:
        raise ConfigError(
            f"Cannot resume from '{path.name}': resuming needs a checkpoint folder step-<step>-epoch-<epoch> "
            "or an older file step-<step>-epoch-<epoch>-loss=<loss>.pt as this tool writes them (or pass "
            "--is_resume false to only load its weights)."
        )
    step, epoch = int(match["step"]), int(match["epoch"])
    if cfg.resume is None and (cfg.resume_step is None or cfg.resume_epoch is None):
        raise ConfigError(
            f"Resuming from the file '{path.name}' needs --resume_step {step} --resume_epoch {epoch} (or "
            f"pass --resume {path})."
        )
    return step, epoch


@dataclass(frozen=True)
class Resume:
    """What a resume continues, decided once (`RunFolder.start`) and read by name by every room."""

    point: ResumePoint
    saved: dict[str, Any]  # the checkpoint's train state (train_state.json, or a .pt file's train_state)
    world_size: int  # this run's

    @property
    def saved_world_size(self) -> int:
        """The world size the checkpoint was written at (older checkpoints without one: this run's)."""
        return int(self.saved.get("world_size", self.world_size))

    @property
    def frames(self) -> int:
        """Frames consumed over all ranks when the checkpoint was written (older single-file checkpoints counted
        samples per rank)."""
        samples_per_rank = int(self.saved.get("samples_per_rank", 0))
        return int(self.saved.get("frames", samples_per_rank * self.saved_world_size))

    @property
    def same_world_size(self) -> bool:
        return self.saved.get("world_size") == self.world_size

    @property
    def rank_frames(self) -> int:
        """Every rank continues its own stream at the same share of the frames consumed so far."""
        return self.frames // self.world_size

    @property
    def data_snapshot(self) -> Path | None:
        """This checkpoint's folder of data-stream snapshots (older single-file checkpoints have none)."""
        return self.point.path / DATA_SNAPSHOT_DIR if self.point.sharded else None

    @property
    def checkpoint_name(self) -> str:
        return checkpoint_dir_name(self.point.step, self.point.epoch)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config as plain JSON values, with the experiment id under `vla.type` and secrets (`hf_token`)
    blanked: it is what config.yaml / config.json and W&B get, and a run folder must never hold a token."""
    out = _jsonable(dataclasses.asdict(cfg))
    out["vla"] = {"type": cfg.vla.vla_id, **out["vla"]}
    return redact_config(out)


class RunFolder:
    """`<run_root_dir>/<run_id>/`: its paths, and whether this command starts it or resumes it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS_DIR
        self.metrics = self.path / METRICS_FILE
        self.wandb_id = self.path / WANDB_ID_FILE
        self.action_model = self.path / ACTION_MODEL_FILE
        self.speed_plan = self.path / SPEED_PLAN_FILE

    @classmethod
    def of(cls, cfg: TrainConfig, num_nodes: int) -> RunFolder:
        return cls(cfg.resolve_run_dir(num_nodes))

    @property
    def run_id(self) -> str:
        return self.path.name

    def check(self, cfg: TrainConfig) -> ResumePoint | None:
        """What this command continues, checked before anything loads (read-only, every rank): the checkpoint to
        resume (refused when it is another experiment), or None for a new run (refused over a run with
        checkpoints)."""
        checked = self._check(cfg)
        return None if checked is None else checked[0]

    def _check(self, cfg: TrainConfig) -> tuple[ResumePoint, dict[str, Any]] | None:
        point = resume_point(cfg, self.path)
        if point is not None:
            saved = read_resume_state(point.path)
            check_resume_compatible(
                saved, run_identity(cfg), path=point.path, allow_config_change=cfg.allow_config_change
            )
            return point, saved
        found = complete_checkpoints(self.checkpoints) or sorted(self.checkpoints.glob("step-*.pt"))
        if found:
            raise ConfigError(
                f"Run folder '{self.path}' already holds a run with checkpoints (newest: '{found[-1]}'). Continue it "
                "with the same command plus --resume, or start a new run with another --run_id or --run_id_note."
            )
        return None

    def start(self, cfg: TrainConfig, world_size: int, is_main: bool) -> Resume | None:
        """Check the folder and decide: a new run (None; rank 0 moves an earlier attempt's logs aside) or the
        `Resume` to continue (its train state read once here). Call on every rank; no collective."""
        checked = self._check(cfg)
        if checked is None:
            if is_main:
                self.move_aside_logs_without_checkpoint()
            return None
        point, saved = checked
        resume = Resume(point, saved, world_size)
        frames = resume.frames
        changed = [
            f"{what} {before} -> {now}"
            for what, before, now in (
                ("world size", resume.saved_world_size, world_size),
                (
                    "global batch size",
                    saved.get("global_batch_size", cfg.vla.global_batch_size),
                    cfg.vla.global_batch_size,
                ),
            )
            if before != now
        ]
        logger.info(
            "Resuming %s at step %d, epoch %d, after %d frames%s",
            point.path,
            point.step,
            point.epoch,
            frames,
            f" ({'; '.join(changed)}: the data stream continues at the same frame of the mixture)"
            if changed
            else "",
        )
        if frames % world_size:
            logger.info(
                "%d frames consumed do not split evenly over %d ranks: each continues after %d.",
                frames,
                world_size,
                resume.rank_frames,
            )
        return resume

    def move_aside_logs_without_checkpoint(self) -> None:
        """Logs of an attempt that crashed before its first checkpoint are moved aside (named in a warning), so
        re-running the same command just works. Rank 0 only."""
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        for path in (self.metrics, self.wandb_id):
            if path.exists():
                aside = path.with_name(f"{path.name}.no-checkpoint-{stamp}")
                path.rename(aside)
                logger.warning(
                    "'%s' is from an earlier attempt that saved no checkpoint; moved to '%s', starting over.",
                    path,
                    aside,
                )

    def write_config(self, cfg: TrainConfig, resume: Resume | None) -> None:
        """`config.json` and a `config.yaml` that `--config_path` accepts to repeat the run (each written
        atomically; `ConfigError` naming the file when the folder cannot be written). A resume never overwrites
        them: it writes `config.resume-<checkpoint>.json/.yaml` beside them."""
        resolved = config_to_dict(cfg)
        stem = CONFIG_STEM if resume is None else f"{CONFIG_STEM}.resume-{resume.checkpoint_name}"
        write_text_atomic(self.path / f"{stem}.json", json.dumps(resolved, indent=2) + "\n", "run config")
        write_text_atomic(self.path / f"{stem}.yaml", yaml.safe_dump(resolved, sort_keys=False), "run config")

    def write_run_files(
        self,
        cfg: TrainConfig,
        resume: Resume | None,
        action_spec: dict[str, Any],
        speed_plan: Mapping[str, Any] | None = None,
    ) -> None:
        """Rank 0: the folder, the resolved config, the model's action spec and the speed plan (what every `auto`
        became on this start's devices; a resume writes its own) (the statistics are the data layer's
        `save_dataset_statistics`)."""
        make_dirs(self.path, "run folder")
        self.write_config(cfg, resume)
        write_json_atomic(self.action_model, action_spec, "the model's action spec")
        if speed_plan is not None:
            write_json_atomic(self.speed_plan, dict(speed_plan), "the run's speed plan")


def start_counters(resume: Resume | None) -> dict[str, int]:
    """The loop's counters at the start: zeros for a new run, the checkpoint's step, epoch and frames (over all
    ranks) for a resume."""
    if resume is None:
        return {"step": 0, "epoch": 0, "frames": 0}
    return {"step": resume.point.step, "epoch": resume.point.epoch, "frames": resume.frames}


def check_resume_before_end(resume: Resume | None, num_training_steps: int) -> None:
    """Refuse to resume a run at or past its last step (nothing would train, yet the folder would be rewritten)."""
    if resume is not None and resume.point.step >= num_training_steps:
        raise ConfigError(
            f"Resuming at step {resume.point.step} but the run ends at step {num_training_steps}: raise "
            f"--vla.max_steps (or --vla.epochs) above {resume.point.step}."
        )


def saved_train_state(ckpt: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """A single-file checkpoint's `train_state`, or a `ConfigError` saying that it cannot be resumed."""
    for key in ("optimizer", "lr_scheduler", "train_state"):
        if key not in ckpt:
            raise ConfigError(
                f"Checkpoint '{path}' holds no '{key}', so its run cannot be resumed; pass --is_resume false "
                "to start a new run from its weights."
            )
    return dict(ckpt["train_state"])


def read_resume_state(path: Path) -> dict[str, Any]:
    """The train state of a checkpoint to resume: `train_state.json` of a folder, `train_state` of a `.pt` file
    (torch loads only then: `load_checkpoint_file` imports it when called, so a new run's refusals stay fast)."""
    path = Path(path)
    if path.is_dir():
        return read_train_state(path)
    return saved_train_state(load_checkpoint_file(path), path)
