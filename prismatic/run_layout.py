"""The names of everything in a run folder, a checkpoint folder and a model folder: spelled here, nowhere else.

Writers (training, export, LoRA merge) and readers (loading, the policy, evaluation) import these names; what
each file holds is documented in the README ("What a run writes"). Pure constants: importing this module loads
nothing else, so the config layer and `--help` can use it before torch.

    runs/<run_id>/
      config.yaml, config.json            CONFIG_STEM (+ ".resume-<checkpoint>" for a resume's own copy)
      speed_plan.json                     SPEED_PLAN_FILE (what every `auto` speed flag became; the last start's)
      dataset_statistics.json             DATASET_STATISTICS_FILE (also in HF exports and LoRA adapters)
      action_model.json                   ACTION_MODEL_FILE
      fast_tokenizer.json, fast_tokenizer_settings.json   FAST_TOKENIZER_FILE, FAST_SETTINGS_FILE (the FAST head's
                                          vocabulary; also in exports and LoRA adapters of a FAST model)
      metrics.jsonl                       METRICS_FILE
      profile/                            PROFILE_DIR (--profile.start_step)
        rank00000-steps-000010-000011.trace.json, .summary.json   profile_stem(rank, first, last) + suffixes
      wandb_run_id.txt                    WANDB_ID_FILE
      eval_<benchmark>/<suite>/           sim_eval_dir(benchmark) (vla_scripts/eval_sim.py, eval_libero.py)
        results.json, metrics.jsonl       SIM_RESULTS_FILE, METRICS_FILE
        videos/*.mp4                      SIM_VIDEOS_DIR
      checkpoints/                        CHECKPOINTS_DIR
        latest                            LATEST_POINTER
        step-000040-epoch-01/             CHECKPOINT_DIR (checkpoint_dir_name)
          .metadata, __<r>_0.distcp       DCP_METADATA, DCP's shards
          data/                           DATA_SNAPSHOT_DIR
            data-rank00000.json, .tfdata.npz  data_snapshot_stem(rank) + DATA_SNAPSHOT_META / _STATE
          train_state.json                TRAIN_STATE_FILE
"""

from __future__ import annotations

import re

CONFIG_STEM = "config"  # config.yaml / config.json: the resolved TrainConfig
RUN_CONFIG_FILE = f"{CONFIG_STEM}.json"  # a run (or model) folder's resolved config, read back by the loaders
DATASET_STATISTICS_FILE = (
    "dataset_statistics.json"  # OpenVLA's per-dataset statistics (un-normalising actions)
)
SPEED_PLAN_FILE = "speed_plan.json"  # what every `auto` became (`prismatic.training.speed_plan`)
ACTION_MODEL_FILE = "action_model.json"  # the model's `ActionSpec` (absent: OpenVLA's tokens head)
FAST_TOKENIZER_FILE = "fast_tokenizer.json"  # the FAST head's BPE, in the `tokenizers` library's own JSON
FAST_SETTINGS_FILE = "fast_tokenizer_settings.json"  # its scale, min_token and fitted chunk shape
METRICS_FILE = "metrics.jsonl"  # one JSON object per optimiser step
WANDB_ID_FILE = "wandb_run_id.txt"  # the W&B run a resume continues
PROFILE_DIR = "profile"  # `--profile.*`: each rank's trace and summary of a window of steps
PROFILE_TRACE = ".trace.json"  # a Chrome trace (Perfetto opens it)
PROFILE_SUMMARY = ".summary.json"  # where the window's time went (`prismatic.util.kernel_profile.summarize`)
SIM_RESULTS_FILE = (
    "results.json"  # a simulator evaluation's report: per-task and overall success, protocol, episodes
)
SIM_VIDEOS_DIR = "videos"  # its mp4s (--save_videos)


def sim_eval_dir(benchmark: str) -> str:
    """A benchmark's evaluation folder in a run: <run>/eval_<benchmark>/<suite>/ (eval_libero, eval_metaworld)."""
    return f"eval_{benchmark}"


HF_CONFIG_FILE = "config.json"  # an HF model folder's config (export_hf.py, OpenVLA's published checkpoints)

CHECKPOINTS_DIR = "checkpoints"
LATEST_POINTER = "latest"  # text file in checkpoints/: the name of the newest complete checkpoint folder
LEGACY_LATEST = "latest-checkpoint.pt"  # Prismatic's name
MODEL_SAFETENSORS = "model.safetensors"  # a model-only export (`export_hf.py --format safetensors`)
TMP_PREFIX = ".tmp-"  # a checkpoint being written; removed at start-up if a crash left it
TRAIN_STATE_FILE = "train_state.json"
DCP_METADATA = ".metadata"
DATA_SNAPSHOT_DIR = "data"  # each rank's data-stream snapshot inside a checkpoint folder
DATA_SNAPSHOT_META = ".json"  # its metadata (fingerprint, frames consumed, file sizes), written last
DATA_SNAPSHOT_STATE = ".tfdata.npz"  # the tf.data iterator's symbolic state
CHECKPOINT_DIR = re.compile(r"^step-(?P<step>\d{6,})-epoch-(?P<epoch>\d{2,})$")
CHECKPOINT_FILE = re.compile(
    r"^step-(?P<step>\d{6,})-epoch-(?P<epoch>\d{2,})-loss=(?P<loss>[-+0-9.einfa]+)\.pt$"
)


def data_snapshot_stem(rank: int) -> str:
    """`data-rank00003`: the stem of rank 3's data-stream snapshot files in DATA_SNAPSHOT_DIR (their suffixes:
    DATA_SNAPSHOT_META, DATA_SNAPSHOT_STATE)."""
    return f"data-rank{rank:05d}"


def profile_stem(rank: int, first: int, last: int) -> str:
    """`rank00000-steps-000010-000011`: the stem of rank 0's profile of steps 10 to 11 in PROFILE_DIR (suffixes:
    PROFILE_TRACE, PROFILE_SUMMARY)."""
    return f"rank{rank:05d}-steps-{first:06d}-{last:06d}"


def checkpoint_dir_name(step: int, epoch: int) -> str:
    """`step-000040-epoch-01`: the folder name of the checkpoint after `step` optimiser steps."""
    return f"step-{step:06d}-epoch-{epoch:02d}"
