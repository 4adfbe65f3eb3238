"""The root `TrainConfig` that `vla_scripts/train.py` parses with draccus (CLI flags and/or `--config_path`).

It nests the chosen `VLAConfig` experiment (`--vla.type <id>`) and adds what is specific to one run: where the
data and run folders are, what to start or resume from, seeds and trackers. Field names follow OpenVLA's
`vla-scripts/train.py` so its users can carry their command lines over.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from prismatic.conf.data import DataOptions
from prismatic.conf.registries import TRACKERS
from prismatic.conf.speed import MOVED_FLAGS
from prismatic.conf.vla import DEFAULT_VLA_ID, VLAConfig
from prismatic.run_layout import CHECKPOINTS_DIR
from prismatic.util.errors import ConfigError, did_you_mean

GRAD_SYNC = ("auto", "micro-batch", "step")
SHARDING = ("auto", "full", "hybrid")
LATEST = "latest"


@dataclass
class CheckpointConfig:
    """How checkpoints are written (where and when: --run_root_dir, --save_interval)."""

    keep_last: int | None = (
        None  # keep only the newest K checkpoints, deleting older ones after a save; null: all
    )
    async_save: bool = (
        False  # write checkpoints in the background (DCP async save); training goes on meanwhile
    )
    export_final: bool = False  # after training, also write the HF OpenVLA export to <run_dir>/hf/
    # Each rank's data-stream snapshot (its reader positions, ~35 KB at any shuffle buffer) makes resuming the data
    # position take bounded time; without it a resume skips the consumed frames (time linear in them).
    data_snapshot: bool = True  # save each rank's data-stream snapshot with every checkpoint


@dataclass
class EvalConfig:
    """Teacher-forced evaluation on the held-out split of every dataset of the mixture, logged under val/."""

    interval: int | None = None  # evaluate every N optimiser steps and at the end; null: never
    num_batches: int = 4  # batches per dataset per rank at each evaluation (the same frames every time)


@dataclass
class ProfileConfig:
    """A window of training steps profiled on every rank (`torch.profiler`): each rank writes its Chrome trace and
    a summary of where the time went (device busy / idle, kernels by kind) to <run_dir>/profile/."""

    start_step: int | None = None  # the first optimiser step profiled, >= 1; null: no profiling
    num_steps: int = 2  # optimiser steps in the window, >= 1


@dataclass
class TrainConfig:
    """One training run."""

    # Fields that moved (old dotted name -> new): `--config_path` reads a run folder's config.yaml from before the
    # move under the old names (prismatic.util.cli). Not a flag.
    MOVED_FLAGS: ClassVar[dict[str, str]] = MOVED_FLAGS

    # The experiment: base VLM, data mixture, freezing and optimisation (see prismatic/conf/vla.py)
    vla: VLAConfig = field(default_factory=VLAConfig.get_choice_class(DEFAULT_VLA_ID))  # experiment preset

    # Folders
    data_root_dir: Path = Path("datasets/open-x-embodiment")  # holds <dataset>/<version>/ RLDS folders
    run_root_dir: Path = Path("runs")  # runs are written to <run_root_dir>/<run_id>/

    # Start from / resume
    resume: str | None = field(
        default=None, metadata={"bare": LATEST}
    )  # --resume: newest checkpoint; or a folder
    pretrained_checkpoint: Path | None = (
        None  # a checkpoint of this tool (step-* folder or older step-*.pt file)
    )
    is_resume: bool = True  # with pretrained_checkpoint: continue that run (optimizer, schedule, data, logs)
    resume_step: int | None = None  # optional check: must match the checkpoint's step when resuming
    resume_epoch: int | None = None  # optional check: must match the checkpoint's epoch when resuming
    allow_config_change: bool = (
        False  # resume although seed / vla type / mixture / base VLM differ from the run's
    )

    # Run
    run_id: str | None = None  # run folder; default <vla_id>+n<nodes>+b<per_device_batch>+x<seed>[--<note>]
    run_id_note: str | None = None  # appended to the default run id
    save_interval: int = 2500  # optimiser steps between checkpoints, >= 1 (one is always written at the end)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    # Gradient reduction with accumulation: once per step (unsharded FP32 gradients kept between micro-batches) or
    # reduce-scattered after every micro-batch (sharded gradients only); auto picks by the memory they would need
    # (FSDP), or after every micro-batch under CUDA graphs (DDP replaying them: --vla.speed.compile_mode).
    grad_sync: str = "auto"  # auto, micro-batch or step
    sharding: str = (
        "auto"  # FSDP: full (shard over all ranks), hybrid (shard in a node, replicate across), auto
    )
    # How long a rank waits in a collective for the others, e.g. while a slow rank writes its checkpoint shards
    # (torch's default, 10 minutes for NCCL, is short for a 7B save through slow storage).
    dist_timeout_s: int = 3600  # seconds a rank waits for the others in a collective, >= 60
    # Image augmentation in the data pipeline: unset, the experiment's `vla.image_aug` (the LIBERO presets: on);
    # `--image_aug true/false` overrides it. Resolved on construction, so config.yaml records what the run did.
    image_aug: bool | None = None  # augment training images; null: the preset's vla.image_aug
    # Statistics, filtering, proprio and chunking choices (defaults as OpenVLA; docs/data_pipeline.md)
    data: DataOptions = field(default_factory=DataOptions)
    recompute_stats: bool = False  # compute dataset statistics again, ignoring (and overwriting) their caches
    seed: int = 7  # model init, data order and shuffling, in [0, 2**32 - 1]

    # Hugging Face token for gated weights. Unset: $HF_TOKEN, else the token `huggingface-cli login` stored.
    # Never written to config.yaml / config.json / W&B; prefer an environment variable's name over the token.
    hf_token: str | None = None  # HF token, or the name of an env variable holding it (default $HF_TOKEN)

    # Tracking
    trackers: tuple[str, ...] = ("jsonl", "wandb")  # any of jsonl, wandb; --trackers [] for none
    wandb_project: str = "openvla"  # W&B project the run is logged to
    wandb_entity: str | None = None  # your W&B entity (team or user); W&B's default when unset

    def __post_init__(self) -> None:
        # A model that reads proprio needs the pipeline to load it (and its statistics to be computed).
        if self.vla.use_proprio and not self.data.load_proprio:
            self.data = dataclasses.replace(self.data, load_proprio=True)
        if self.image_aug is None:
            self.image_aug = self.vla.image_aug
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
        if self.dist_timeout_s < 60:
            raise ConfigError(
                f"--dist_timeout_s={self.dist_timeout_s} is out of range: it must be an integer >= 60 (seconds a rank "
                "waits for the others in a collective; a 7B checkpoint write can take minutes)."
            )
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"--seed={self.seed} is out of range: it must be an integer in [0, 2**32 - 1].")
        for name in ("resume_step", "resume_epoch"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"--{name}={value} is out of range: it must be an integer >= 0.")
        for flag, value in (
            ("checkpoint.keep_last", self.checkpoint.keep_last),
            ("eval.interval", self.eval.interval),
            ("eval.num_batches", self.eval.num_batches),
            ("profile.start_step", self.profile.start_step),
            ("profile.num_steps", self.profile.num_steps),
        ):
            if value is not None and value < 1:
                raise ConfigError(f"--{flag}={value} is out of range: it must be an integer >= 1 (or null).")
        for flag, value, choices in (
            ("grad_sync", self.grad_sync, GRAD_SYNC),
            ("sharding", self.sharding, SHARDING),
        ):
            if value not in choices:
                raise ConfigError(
                    f"--{flag}={value} is not a valid choice.{did_you_mean(value, choices)} Valid choices: "
                    f"{', '.join(choices)}."
                )
        if self.resume is not None and self.pretrained_checkpoint is not None:
            raise ConfigError(
                f"--resume {self.resume} and --pretrained_checkpoint {self.pretrained_checkpoint} both name what to "
                "start from: pass --resume (this run's newest checkpoint, or a checkpoint folder) to continue a run, "
                "or --pretrained_checkpoint with --is_resume false to start a new run from a checkpoint's weights."
            )

    def validate(self, world_size: int) -> None:
        """Check the whole config for this world size; raise `ConfigError` naming the bad value."""
        self.vla.validate(world_size)
        self.check_values()
        if not self.data_root_dir.is_dir():
            raise ConfigError(
                f"data_root_dir '{self.data_root_dir}' does not exist or is not a folder. Point --data_root_dir "
                "at the folder holding your RLDS datasets (<data_root_dir>/<dataset>/<version>/)."
            )
        if self.pretrained_checkpoint is not None and not self.pretrained_checkpoint.exists():
            raise ConfigError(f"pretrained_checkpoint '{self.pretrained_checkpoint}' does not exist.")
        self.resume_source()  # refuses --resume_step / --resume_epoch without a checkpoint

    def resume_source(self) -> Path | str | None:
        """What to continue: LATEST (this run's newest checkpoint), a checkpoint path, or None (a new run)."""
        if self.resume is not None:
            return LATEST if self.resume == LATEST else Path(self.resume)
        if self.pretrained_checkpoint is not None and self.is_resume:
            return self.pretrained_checkpoint
        if self.pretrained_checkpoint is None and (
            self.resume_step is not None or self.resume_epoch is not None
        ):
            raise ConfigError(
                f"resume_step={self.resume_step} / resume_epoch={self.resume_epoch} given without "
                "--pretrained_checkpoint or --resume; pass --resume to continue the run."
            )
        return None

    def resolve_run_id(self, num_nodes: int) -> str:
        """The run id: explicit, or the run being resumed (a checkpoint inside <run>/checkpoints/), or OpenVLA's
        default naming."""
        if self.run_id is not None:
            return self.run_id
        source = self.resume_source()
        if isinstance(source, Path) and source.parent.name == CHECKPOINTS_DIR:
            return source.resolve().parent.parent.name
        run_id = f"{self.vla.vla_id}+n{num_nodes}+b{self.vla.per_device_batch_size}+x{self.seed}"
        return f"{run_id}--{self.run_id_note}" if self.run_id_note else run_id

    def resolve_run_dir(self, num_nodes: int) -> Path:
        """The run folder: the one holding the checkpoint being resumed (unless --run_id says otherwise), else
        <run_root_dir>/<run id>."""
        source = self.resume_source()
        if self.run_id is None and isinstance(source, Path) and source.parent.name == CHECKPOINTS_DIR:
            return source.resolve().parent.parent
        return self.run_root_dir / self.resolve_run_id(num_nodes)

    def resolve_hf_token(self) -> str | None:
        """The Hugging Face token: `hf_token` (the token, or the name of an environment variable holding it), else
        huggingface_hub's own lookup ($HF_TOKEN, then the token `huggingface-cli login` stored), else None."""
        if self.hf_token is not None:
            return os.environ.get(self.hf_token, self.hf_token)
        from huggingface_hub import get_token  # lazy: keeps the config layer (and --help) light

        return get_token()
