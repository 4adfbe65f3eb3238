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
from prismatic.util.errors import ConfigError, did_you_mean

TRACKERS = ("jsonl", "wandb")
CHECKPOINT_NAME = re.compile(
    r"^step-(?P<step>\d{6,})-epoch-(?P<epoch>\d{2,})-loss=(?P<loss>[-+0-9.einfa]+)\.pt$"
)


@dataclass
class TrainConfig:
    """One training run."""

    # The experiment: base VLM, data mixture, freezing and optimisation (see prismatic/conf/vla.py)
    vla: VLAConfig = field(default_factory=VLAConfig.get_choice_class(DEFAULT_VLA_ID))  # experiment preset

    # Folders
    data_root_dir: Path = Path("datasets/open-x-embodiment")  # holds <dataset>/<version>/ RLDS folders
    run_root_dir: Path = Path("runs")  # runs are written to <run_root_dir>/<run_id>/

    # Start from / resume
    pretrained_checkpoint: Path | None = None  # a step-*.pt checkpoint of this tool
    is_resume: bool = True  # with pretrained_checkpoint: continue that run (optimizer, schedule, data, logs)
    resume_step: int | None = None  # must match the checkpoint's file name when resuming
    resume_epoch: int | None = None  # must match the checkpoint's file name when resuming
    allow_config_change: bool = False  # resume although --seed / --vla.type differ from the checkpoint's run

    # Run
    run_id: str | None = None  # run folder; default <vla_id>+n<nodes>+b<per_device_batch>+x<seed>[--<note>]
    run_id_note: str | None = None  # appended to the default run id
    save_interval: int = 2500  # optimiser steps between checkpoints, >= 1 (one is always written at the end)
    image_aug: bool = False  # image augmentation in the data pipeline
    seed: int = 7  # model init, data order and shuffling, in [0, 2**32 - 1]

    # Hugging Face token for gated weights. Unset: $HF_TOKEN, else the token `huggingface-cli login` stored.
    # Never written to config.yaml / config.json / W&B; prefer an environment variable's name over the token.
    hf_token: str | None = None  # HF token, or the name of an env variable holding it (default $HF_TOKEN)

    # Tracking
    trackers: tuple[str, ...] = ("jsonl", "wandb")  # any of jsonl, wandb; --trackers [] for none
    wandb_project: str = "openvla"  # W&B project the run is logged to
    wandb_entity: str | None = None  # your W&B entity (team or user); W&B's default when unset

    def __post_init__(self) -> None:
        # Checked on construction, so a bad flag fails while parsing, before torch loads.
        self.check_values()

    def check_values(self) -> None:
        """Check the ranges and names of this run's own fields (the experiment checks its own); raise
        `ConfigError` with the bad value and the valid range."""
        for tracker in self.trackers:
            if tracker not in TRACKERS:
                raise ConfigError(
                    f"Unknown tracker '{tracker}' in --trackers.{did_you_mean(tracker, TRACKERS)} Valid choices: "
                    f"{', '.join(TRACKERS)} (several as --trackers jsonl wandb, none as --trackers [])."
                )
        if self.save_interval < 1:
            raise ConfigError(
                f"--save_interval={self.save_interval} is out of range: it must be an integer >= 1."
            )
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"--seed={self.seed} is out of range: it must be an integer in [0, 2**32 - 1].")
        for name in ("resume_step", "resume_epoch"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name}={value} is out of range: it must be an integer >= 0.")

    def validate(self, world_size: int) -> None:
        """Check the whole config for this world size; raise `ConfigError` naming the bad value."""
        self.vla.validate(world_size)
        self.check_values()
        if not self.data_root_dir.is_dir():
            raise ConfigError(
                f"data_root_dir '{self.data_root_dir}' does not exist or is not a folder. Point --data_root_dir "
                "at the folder holding your RLDS datasets (<data_root_dir>/<dataset>/<version>/)."
            )
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
        """The Hugging Face token: `hf_token` (the token, or the name of an environment variable holding it), else
        huggingface_hub's own lookup ($HF_TOKEN, then the token `huggingface-cli login` stored), else None."""
        if self.hf_token is not None:
            return os.environ.get(self.hf_token, self.hf_token)
        from huggingface_hub import get_token

        return get_token()
