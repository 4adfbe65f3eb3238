"""The root `TrainConfig` that `vla_scripts/train.py` parses with draccus (CLI flags and/or `--config_path`).

It nests the chosen `VLAConfig` experiment (`--vla.type <id>`) and adds what is specific to one run: where the
data and run folders are, what to start or resume from, seeds and trackers. Field names follow OpenVLA's
`vla-scripts/train.py` so its users can carry their command lines over.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from prismatic.conf.vla import DEFAULT_VLA_ID, VLAConfig
from prismatic.util.errors import ConfigError

TRACKERS = ("jsonl", "wandb")
CHECKPOINT_NAME = re.compile(
    r"^step-(?P<step>\d{6,})-epoch-(?P<epoch>\d{2,})-loss=(?P<loss>[-+0-9.einfa]+)\.pt$"
)


@dataclass
class TrainConfig:
    """One training run."""

    # The experiment: base VLM, data mixture, freezing and optimisation (see prismatic/conf/vla.py).
    vla: VLAConfig = field(default_factory=VLAConfig.get_choice_class(DEFAULT_VLA_ID))

    # Folders
    data_root_dir: Path = Path("datasets/open-x-embodiment")  # holds <dataset>/<version>/ RLDS folders
    run_root_dir: Path = Path("runs")  # runs are written to <run_root_dir>/<run_id>/

    # Start from / resume
    pretrained_checkpoint: Path | None = None  # a step-*.pt checkpoint of this tool
    is_resume: bool = True  # with pretrained_checkpoint: continue that run (optimizer, schedule, data, logs)
    resume_step: int | None = None  # must match the checkpoint's file name when resuming
    resume_epoch: int | None = None  # must match the checkpoint's file name when resuming

    # Run
    run_id: str | None = None  # default: <vla_id>+n<nodes>+b<per_device_batch>+x<seed>[--<note>]
    run_id_note: str | None = None  # appended to the default run id
    save_interval: int = 2500  # optimiser steps between checkpoints (one is always written at the end)
    image_aug: bool = False  # image augmentation in the data pipeline
    seed: int = 7  # model init, data order and shuffling

    # Hugging Face token for gated weights: the token itself, or the name of an environment variable holding it.
    hf_token: str | None = None

    # Tracking
    trackers: tuple[str, ...] = ("jsonl", "wandb")
    wandb_project: str = "openvla"
    wandb_entity: str | None = None  # your W&B entity (team or user); W&B's default when unset

    def validate(self, world_size: int) -> None:
        """Check the whole config for this world size; raise `ConfigError` naming the bad value."""
        self.vla.validate(world_size)
        bad = [t for t in self.trackers if t not in TRACKERS]
        if bad:
            raise ConfigError(f"Unknown tracker(s) {bad}. Valid choices: {', '.join(TRACKERS)}.")
        if self.save_interval < 1:
            raise ConfigError(f"save_interval={self.save_interval} must be at least 1.")
        if not self.data_root_dir.is_dir():
            raise ConfigError(
                f"data_root_dir '{self.data_root_dir}' does not exist or is not a folder. Point --data_root_dir "
                "at the folder holding your RLDS datasets (<data_root_dir>/<dataset>/<version>/)."
            )
        if self.pretrained_checkpoint is not None:
            self.resume_point()

    def resume_point(self) -> tuple[int, int] | None:
        """(step, epoch) to resume from, validated against the checkpoint's file name; None when not resuming."""
        ckpt = self.pretrained_checkpoint
        if ckpt is None:
            if self.resume_step is not None or self.resume_epoch is not None:
                raise ConfigError(
                    f"resume_step={self.resume_step} / resume_epoch={self.resume_epoch} given without "
                    "--pretrained_checkpoint; pass the checkpoint file to resume from."
                )
            return None
        if not ckpt.is_file():
            raise ConfigError(f"pretrained_checkpoint '{ckpt}' does not exist or is not a file.")
        if not self.is_resume:
            return None
        match = CHECKPOINT_NAME.match(ckpt.name)
        if match is None:
            raise ConfigError(
                f"Cannot resume from '{ckpt.name}': resuming needs a checkpoint named "
                "step-<step>-epoch-<epoch>-loss=<loss>.pt as this tool writes them (or pass --is_resume false "
                "to only load its weights)."
            )
        step, epoch = int(match["step"]), int(match["epoch"])
        if self.resume_step != step or self.resume_epoch != epoch:
            raise ConfigError(
                f"--resume_step {self.resume_step} --resume_epoch {self.resume_epoch} do not match checkpoint "
                f"'{ckpt.name}' (step {step}, epoch {epoch}). Pass --resume_step {step} --resume_epoch {epoch}."
            )
        return step, epoch

    def resolve_run_id(self, num_nodes: int) -> str:
        """The run id: explicit, or the run being resumed, or OpenVLA's default naming."""
        if self.run_id is not None:
            return self.run_id
        if (
            self.pretrained_checkpoint is not None
            and self.is_resume
            and self.pretrained_checkpoint.parent.name == "checkpoints"
        ):
            return self.pretrained_checkpoint.resolve().parent.parent.name
        run_id = f"{self.vla.vla_id}+n{num_nodes}+b{self.vla.per_device_batch_size}+x{self.seed}"
        return f"{run_id}--{self.run_id_note}" if self.run_id_note else run_id

    def resolve_hf_token(self) -> str | None:
        """The token itself, or the value of the environment variable it names (HF_TOKEN when unset)."""
        if self.hf_token is None:
            return os.environ.get("HF_TOKEN")
        return os.environ.get(self.hf_token, self.hf_token)
