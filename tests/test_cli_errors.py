"""The catalogue of bad command lines: every script answers each with exit code 2, one paragraph naming the bad
value and what to do, and no traceback.

Each case runs the real script as a subprocess (what a user sees: exit code, stderr); they run in parallel, and
nearly all fail while parsing, before torch or TensorFlow load (`-X importtime` lists what each imported, and the
few that need torch are named), so the whole catalogue takes seconds. Nothing here is timed: a loaded machine is
slow, not wrong, and timing belongs in benchmarks.
`docs/common_errors.md` is checked against it: every phrase it quotes from a message is a key phrase of a case
here. The flag grammar itself is unit-tested in `tests/util/test_cli.py`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "vla_scripts"
DOC = REPO / "docs" / "common_errors.md"

# The tiny preset as one process: `--vla.type tiny+mx-toy` alone expects 2 processes.
TINY = ("--vla.type", "tiny+mx-toy")
ONE_PROCESS = (*TINY, "--vla.expected_world_size", "1", "--vla.global_batch_size", "8")


@dataclass(frozen=True)
class Case:
    """One bad command line. `{tmp}` in an argument is the catalogue's scratch folder (see `scratch`)."""

    id: str
    script: str
    args: tuple[str, ...]
    key_words: tuple[str, ...]  # each must appear in the message
    absent: tuple[str, ...] = ()  # none of these may appear in the message
    # The W&B set-up it runs with: WANDB_MODE (None: unset), and whether HOME, WANDB_DIR and WANDB_CONFIG_DIR point
    # at an empty folder (no `wandb login` anywhere) instead of the user's own.
    wandb_mode: str | None = "disabled"
    no_wandb_login: bool = False


CASES = [
    # --- train.py: types and flags -----------------------------------------------------------------------------
    Case(
        "wrong-type", "train", (*TINY, "--vla.max_steps", "abc"), ("--vla.max_steps got 'abc'", "an integer")
    ),
    Case("float-for-int", "train", (*TINY, "--seed", "1.5"), ("--seed got '1.5'", "an integer")),
    Case(
        "not-a-bool", "train", (*TINY, "--image_aug", "maybe"), ("--image_aug got 'maybe'", "true or false")
    ),
    Case("null-for-int", "train", (*TINY, "--seed", "null"), ("--seed got 'null'", "null is not allowed")),
    Case(
        "speed-flag-by-its-old-name",
        "train",
        (*TINY, "--vla.compile", "on"),
        ("--vla.compile is now --vla.speed.compile", "--vla.speed.compile"),
    ),
    Case(
        "list-for-scalar",
        "train",
        (*TINY, "--vla.learning_rate", "[1e-4, 2e-4]"),
        ("--vla.learning_rate got", "not a list"),
    ),
    Case("two-values", "train", (*TINY, "--seed", "1", "2"), ("--seed takes one value but got 2",)),
    Case(
        "unknown-flag",
        "train",
        (*TINY, "--vla.learning_rat", "1e-4"),
        ("Unknown flag --vla.learning_rat", "Did you mean '--vla.learning_rate'?"),
    ),
    Case(
        "flag-outside-its-group",
        "train",
        (*TINY, "--max_steps", "10"),
        ("Unknown flag --max_steps", "Did you mean '--vla.max_steps'?"),
    ),
    Case(
        "unknown-preset",
        "train",
        ("--vla.type", "tiny+mx-tyo"),
        ("Unknown --vla.type 'tiny+mx-tyo'. Did you mean 'tiny+mx-toy'?",),
    ),
    Case(
        "missing-value",
        "train",
        (*TINY, "--data_root_dir"),
        ("--data_root_dir needs a value", "a single path"),
    ),
    Case("positional", "train", ("tiny+mx-toy",), ("Unexpected argument 'tiny+mx-toy'", "--name value")),
    Case("single-dash", "train", (*TINY, "-lr", "3e-4"), ("Unexpected argument '-lr'", "two dashes")),
    Case(
        "missing-plugin",
        "train",
        ("--plugins", "no_such_plugin_module", *TINY),
        ("Plugin module 'no_such_plugin_module'", "cannot be imported"),
    ),
    # --- train.py: --config_path --------------------------------------------------------------------------------
    Case(
        "config-missing", "train", ("--config_path", "{tmp}/nope.yaml"), ("--config_path", "does not exist")
    ),
    Case("config-is-folder", "train", ("--config_path", "{tmp}"), ("is a folder, not a file",)),
    Case(
        "config-malformed",
        "train",
        ("--config_path", "{tmp}/malformed.yaml"),
        ("is not valid YAML at line 5", "while parsing a flow sequence started at line 4"),
    ),
    Case(
        "config-not-a-mapping",
        "train",
        ("--config_path", "{tmp}/a_list.yaml"),
        ("holds a list", "mapping of field names to values"),
    ),
    Case(
        "config-list-for-scalar",
        "train",
        ("--config_path", "{tmp}/list_value.yaml"),
        ("'seed' got '[1, 2]' in config file", "not a list"),
    ),
    Case(
        "config-unknown-field",
        "train",
        ("--config_path", "{tmp}/unknown_field.yaml"),
        ("Unknown field 'vla.learning_rat' in config file", "Did you mean 'vla.learning_rate'?"),
    ),
    Case(
        "config-group-not-a-mapping",
        "train",
        ("--config_path", "{tmp}/vla_scalar.yaml"),
        ("'vla' in config file", "must be a mapping"),
    ),
    Case(
        "config-unknown-preset",
        "train",
        ("--config_path", "{tmp}/unknown_preset.yaml"),
        ("Unknown --vla.type 'tiny+mx-tyo'", "in config file"),
    ),
    # --- train.py: values out of range (negative numbers are values, then rejected with the valid range) ------
    Case(
        "negative-lr",
        "train",
        (*TINY, "--vla.learning_rate", "-1e-4"),
        ("--vla.learning_rate=-0.0001 is out of range", "> 0"),
    ),
    Case(
        "nan-lr", "train", (*TINY, "--vla.learning_rate", "nan"), ("--vla.learning_rate=nan is out of range",)
    ),
    Case(
        "zero-batch",
        "train",
        (*TINY, "--vla.per_device_batch_size", "0"),
        ("--vla.per_device_batch_size=0 is out of range", ">= 1"),
    ),
    Case(
        "negative-global-batch",
        "train",
        (*TINY, "--vla.global_batch_size", "-16"),
        ("--vla.global_batch_size=-16 is out of range",),
    ),
    Case("zero-steps", "train", (*TINY, "--vla.max_steps", "0"), ("--vla.max_steps=0 is out of range",)),
    Case(
        "negative-weight-decay",
        "train",
        (*TINY, "--vla.weight_decay", "-0.1"),
        ("--vla.weight_decay=-0.1 is out of range", ">= 0"),
    ),
    Case("warmup-range", "train", (*TINY, "--vla.warmup_ratio", "1.5"), ("--vla.warmup_ratio=1.5", "[0, 1)")),
    Case(
        "checkpointing-policy",
        "train",
        (*TINY, "--vla.speed.checkpointing_policy", "every-0"),
        ("Unknown checkpointing_policy 'every-0'", "auto, full, selective-ops, every-N (N >= 1)"),
    ),
    Case(
        "negative-prefetch",
        "train",
        (*TINY, "--vla.speed.prefetch_batches", "-1"),
        ("--vla.speed.prefetch_batches=-1 is out of range", ">= 0"),
    ),
    Case(
        "unknown-scheduler",
        "train",
        (*TINY, "--vla.lr_scheduler_type", "cosine"),
        ("Unknown lr_scheduler_type 'cosine'", "constant, linear-warmup+cosine-decay"),
    ),
    Case(
        "unknown-strategy",
        "train",
        (*TINY, "--vla.train_strategy", "fsdp2"),
        ("Unknown train_strategy 'fsdp2'", "fsdp-full-shard, fsdp-shard-grad-op, ddp"),
    ),
    Case(
        "unknown-action-head",
        "train",
        (*TINY, "--vla.action_head", "l1_chunk"),
        ("Unknown action_head 'l1_chunk'", "tokens, l1-chunk"),
    ),
    Case(
        "chunk-with-tokens-head",
        "train",
        (*TINY, "--vla.chunk_size", "8"),
        ("--vla.chunk_size=8 needs a chunk head", "--vla.action_head l1-chunk"),
    ),
    Case(
        "unknown-tracker",
        "train",
        (*TINY, "--trackers", "jsnol"),
        ("Unknown tracker 'jsnol'", "Did you mean 'jsonl'?"),
    ),
    Case(
        "tracker-is-a-word",  # `--trackers jsonl,...` once became the characters j, s, o, n, l
        "train",
        (*TINY, "--trackers", "jsonl,tensorboard"),
        ("Unknown tracker 'tensorboard'",),
        absent=("'j'",),
    ),
    Case("save-interval", "train", (*TINY, "--save_interval", "0"), ("--save_interval=0 is out of range",)),
    Case("negative-seed", "train", (*TINY, "--seed", "-1"), ("--seed=-1 is out of range",)),
    # --- train.py: checks against the world size and the file system (still before the model loads) ----------
    Case("world-size", "train", TINY, ("expected_world_size=2", "world_size=1", "--nproc-per-node 2")),
    Case(
        "data-root-missing",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/nope"),
        ("data_root_dir '{tmp}/nope' does not exist",),
    ),
    Case(
        "data-root-is-file",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/a_file.txt"),
        ("is not a folder",),
    ),
    Case(
        "resume-without-checkpoint",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--resume_step", "5"),
        ("without --pretrained_checkpoint or --resume",),
    ),
    Case(
        "resume-nothing-saved-yet",
        "train",
        (
            *ONE_PROCESS,
            "--data_root_dir",
            "{tmp}/empty",
            "--run_root_dir",
            "{tmp}/runs",
            "--run_id",
            "new",
            "--resume",
        ),
        ("--resume found no complete checkpoint of run", "without --resume"),
    ),
    Case(
        "new-run-over-checkpoints",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--run_root_dir", "{tmp}/runs", "--run_id", "done"),
        ("already holds a run with checkpoints", "plus --resume"),
    ),
    Case(
        "resume-another-seed",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--run_root_dir", "{tmp}/runs", "--run_id", "done")
        + ("--resume", "--seed", "8"),
        ("Refusing to resume", "--seed 8 (the checkpoint's run used 7)"),
    ),
    Case(
        "checkpoint-missing",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--pretrained_checkpoint", "{tmp}/nope.pt"),
        ("pretrained_checkpoint '{tmp}/nope.pt' does not exist",),
    ),
    Case(
        "unknown-mixture",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--vla.data_mix", "tyo"),
        ("Unknown dataset mixture 'tyo'", "Did you mean 'toy'?"),
    ),
    Case(  # assumes no CUDA device, like the whole suite (with one, it fails later, at the empty data root)
        "cpu-offload-without-cuda",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--vla.speed.cpu_offload", "true"),
        ("--vla.speed.cpu_offload true needs CUDA GPUs", "Run without it"),
    ),
    Case(  # also before the model and data load; on CPU `auto` is FSDP2 (on one GPU it would be DDP)
        "cuda-graphs-under-fsdp",
        "train",
        (
            *ONE_PROCESS,
            "--data_root_dir",
            "{tmp}/empty",
            "--vla.speed.compile",
            "on",
            "--vla.speed.compile_mode",
            "reduce-overhead",
        ),
        ("--vla.speed.compile_mode reduce-overhead", "needs DDP", "the strategy is fsdp-full-shard"),
    ),
    # --- W&B without a login (the default --trackers jsonl wandb), refused before the model loads --------------
    Case(
        "wandb-no-login",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--run_root_dir", "{tmp}/runs"),
        (
            "--trackers includes wandb, but W&B has no login here",
            "{tmp}/no_login/.netrc",
            "`wandb login`",
            "WANDB_MODE=offline",
            "--trackers jsonl",
        ),
        wandb_mode=None,
        no_wandb_login=True,
    ),
    Case(  # offline needs no login: the run gets as far as the next mistake, the empty data root
        "wandb-offline-no-login",
        "train",
        (*ONE_PROCESS, "--data_root_dir", "{tmp}/empty", "--run_root_dir", "{tmp}/runs"),
        ("Mixture 'toy'", "not found under data_root_dir"),
        absent=("wandb login",),
        wandb_mode="offline",
        no_wandb_login=True,
    ),
    Case(  # nor does a run without W&B
        "jsonl-only-no-login",
        "train",
        (
            *ONE_PROCESS,
            "--data_root_dir",
            "{tmp}/empty",
            "--run_root_dir",
            "{tmp}/runs",
            "--trackers",
            "jsonl",
        ),
        ("Mixture 'toy'", "not found under data_root_dir"),
        absent=("wandb login",),
        wandb_mode=None,
        no_wandb_login=True,
    ),
    # --- export_hf.py / merge_lora.py ---------------------------------------------------------------------------
    Case(
        "export-missing-required",
        "export_hf",
        (),
        ("Missing required flags: --checkpoint", "--out_dir (the folder to write)"),
    ),
    Case(
        "export-checkpoint-missing",
        "export_hf",
        ("--checkpoint", "{tmp}/nope", "--out_dir", "{tmp}/out"),
        ("--checkpoint '{tmp}/nope' does not exist",),
    ),
    Case(
        "export-dtype",
        "export_hf",
        ("--checkpoint", "{tmp}/a_file.txt", "--out_dir", "{tmp}/out", "--dtype", "float8"),
        ("Unknown --dtype 'float8'", "bfloat16, float32, float16"),
    ),
    Case(
        "export-shard-size",
        "export_hf",
        ("--checkpoint", "{tmp}/a_file.txt", "--out_dir", "{tmp}/out", "--max_shard_size", "5GiB"),
        ("--max_shard_size '5GiB' is not a size",),
    ),
    Case(
        "export-out-is-file",
        "export_hf",
        ("--checkpoint", "{tmp}/a_file.txt", "--out_dir", "{tmp}/a_file.txt"),
        ("--out_dir '{tmp}/a_file.txt' is a file",),
    ),
    Case(
        "merge-missing-out",
        "merge_lora",
        ("--checkpoint", "{tmp}/a_file.txt"),
        ("Pass --out_dir (the merged run folder to write) and/or --adapter_out",),
    ),
    Case(
        "merge-checkpoint-and-adapter",
        "merge_lora",
        ("--checkpoint", "{tmp}/a_file.txt", "--adapter", "{tmp}/a_file.txt", "--out_dir", "{tmp}/out"),
        ("Pass exactly one of --checkpoint", "--adapter (an adapter folder)"),
    ),
    Case(
        "merge-dtype",
        "merge_lora",
        ("--checkpoint", "{tmp}/a_file.txt", "--out_dir", "{tmp}/out", "--hf_dtype", "fp8"),
        ("Unknown --hf_dtype 'fp8'",),
    ),
    # --- dataset_stats.py / convert_to_rlds.py / build_toy_dataset.py ------------------------------------------
    Case(
        "stats-missing-mix",
        "dataset_stats",
        ("--data_root_dir", "{tmp}/empty"),
        ("Missing required flag: --data_mix",),
    ),
    Case(
        "stats-workers-text",
        "dataset_stats",
        ("--data_root_dir", "{tmp}/empty", "--data_mix", "toy", "--num_workers", "many"),
        ("--num_workers got 'many'", "an integer"),
    ),
    Case(
        "stats-workers-zero",
        "dataset_stats",
        ("--data_root_dir", "{tmp}/empty", "--data_mix", "toy", "--num_workers", "0"),
        ("--num_workers=0 is out of range",),
    ),
    Case(
        "stats-root-missing",
        "dataset_stats",
        ("--data_root_dir", "{tmp}/nope", "--data_mix", "toy"),
        ("--data_root_dir '{tmp}/nope' does not exist",),
    ),
    Case(
        "plugin-file-missing",
        "dataset_stats",
        ("--plugins", "{tmp}/no_such_plugin.py", "--data_root_dir", "{tmp}/empty", "--data_mix", "toy"),
        ("Plugin file", "{tmp}/no_such_plugin.py", "does not exist"),
    ),
    Case(
        "plugin-file-missing-evaluate",
        "evaluate",
        (
            "--plugins",
            "{tmp}/no_such_plugin.py",
            "--checkpoint",
            "{tmp}/runs/done",
            "--data_root_dir",
            "{tmp}/empty",
        ),
        ("Plugin file", "{tmp}/no_such_plugin.py", "does not exist"),
    ),
    Case(
        "data-option-choice",
        "dataset_stats",
        ("--data_root_dir", "{tmp}/empty", "--data_mix", "toy", "--data.statistics_split", "val"),
        ("--data.statistics_split 'val' is not one of the valid choices: all, train",),
    ),
    Case(
        "convert-no-source",
        "convert_to_rlds",
        ("--data_root_dir", "{tmp}/out", "--name", "my_robot"),
        ("Pass exactly one of --episodes_dir",),
    ),
    Case(
        "convert-lerobot-version",
        "convert_to_rlds",
        ("--lerobot_dir", "{tmp}/lerobot_v20", "--data_root_dir", "{tmp}/out", "--name", "my_robot"),
        ('has codebase_version "v2.0"', "v2.1 or v3.0"),
    ),
    Case(
        "convert-name",
        "convert_to_rlds",
        ("--episodes_dir", "{tmp}/empty", "--data_root_dir", "{tmp}/out", "--name", "My Robot"),
        ("--name 'My Robot' is not a dataset name",),
    ),
    Case(
        "convert-version-stays-text",  # read as YAML, 1.0 would have become the number 1.0
        "convert_to_rlds",
        (
            "--episodes_dir",
            "{tmp}/empty",
            "--data_root_dir",
            "{tmp}/out",
            "--name",
            "my_robot",
            "--version",
            "1.0",
        ),
        ("--version '1.0' is not major.minor.patch",),
    ),
    Case(
        "convert-val-fraction",
        "convert_to_rlds",
        (
            "--episodes_dir",
            "{tmp}/empty",
            "--data_root_dir",
            "{tmp}/out",
            "--name",
            "r",
            "--val_fraction",
            "1.5",
        ),
        ("--val_fraction", "[0, 1)"),
    ),
    Case(
        "convert-episodes-missing",
        "convert_to_rlds",
        ("--episodes_dir", "{tmp}/nope", "--data_root_dir", "{tmp}/out", "--name", "my_robot"),
        ("--episodes_dir '{tmp}/nope'",),
    ),
    Case("toy-missing-root", "build_toy_dataset", (), ("Missing required flag: --data_root_dir",)),
    Case(
        "toy-seed-text",
        "build_toy_dataset",
        ("--data_root_dir", "{tmp}/out", "--seed", "abc"),
        ("--seed got 'abc'", "an integer"),
    ),
    # --- evaluate.py / serve.py ---------------------------------------------------------------------------------
    Case(
        "evaluate-checkpoint-missing",
        "evaluate",
        ("--checkpoint", "{tmp}/nope/checkpoints/step-1.pt", "--data_root_dir", "{tmp}/empty"),
        ("does not exist",),
    ),
    Case(
        "evaluate-split",
        "evaluate",
        ("--checkpoint", "{tmp}", "--data_root_dir", "{tmp}/empty", "--split", "test"),
        ("Unknown --split 'test'",),
    ),
    Case(
        "evaluate-batch",
        "evaluate",
        ("--checkpoint", "{tmp}", "--data_root_dir", "{tmp}/empty", "--batch_size", "0"),
        ("--batch_size must be >= 1",),
    ),
    Case(
        "serve-port", "serve", ("--checkpoint", "{tmp}", "--port", "70000"), ("--port must be in 1..65535",)
    ),
    Case(
        "serve-checkpoint-missing",
        "serve",
        ("--checkpoint", "{tmp}/nope/run"),
        ("--checkpoint '{tmp}/nope/run' does not exist",),
    ),
    Case(
        "serve-negative-wait",
        "serve",
        ("--checkpoint", "{tmp}", "--max_wait_ms", "-5"),
        ("--max_wait_ms must be >= 0",),
    ),
    Case(
        "serve-compile-scope",
        "serve",
        ("--checkpoint", "{tmp}", "--compile_decoding", "true", "--compile_scope", "wholee"),
        ("--compile_scope 'wholee' is not a scope", "Did you mean 'whole'?", "'layers' (the default"),
    ),
    # --- eval_libero.py (caught before the simulator or the policy loads) ---------------------------------------
    Case(
        "eval-libero-suite",
        "eval_libero",
        ("--checkpoint", "{tmp}", "--task_suite", "libero_spatail"),
        ("Unknown LIBERO task suite 'libero_spatail'", "Did you mean 'libero_spatial'?", "libero_90"),
    ),
    Case(
        "eval-libero-task",
        "eval_libero",
        ("--checkpoint", "{tmp}", "--tasks", "0,12"),
        ("--tasks: '12' is not a task id of this suite", "valid ids are 0..9"),
    ),
    Case(
        "eval-libero-source",
        "eval_libero",
        ("--task_suite", "libero_goal"),
        ("Give exactly one of --checkpoint (load the policy here) and --policy_url",),
    ),
    Case(
        "eval-libero-envs",
        "eval_libero",
        ("--checkpoint", "{tmp}", "--num_envs", "0"),
        ("--num_envs must be >= 1, got 0",),
    ),
    Case(
        "eval-libero-compile-remote",
        "eval_libero",
        ("--policy_url", "http://localhost:8000", "--compile_decoding", "true"),
        ("--compile_decoding applies to a policy loaded here", "serve.py --compile_decoding true"),
    ),
    Case(
        "eval-libero-compile-scope-alone",
        "eval_libero",
        ("--checkpoint", "{tmp}", "--compile_scope", "whole"),
        ("--compile_scope whole says what --compile_decoding compiles", "Add --compile_decoding true"),
    ),
    Case(
        "eval-sim-wandb-no-login",
        "eval_sim",
        ("--benchmark", "metaworld", "--checkpoint", "{tmp}", "--trackers", "jsonl", "wandb"),
        ("--trackers includes wandb, but W&B has no login here", "`wandb login`", "--trackers jsonl"),
        wandb_mode=None,
        no_wandb_login=True,
    ),
    Case(
        "eval-libero-wandb-no-login",
        "eval_libero",
        ("--checkpoint", "{tmp}", "--trackers", "jsonl", "wandb"),
        ("--trackers includes wandb, but W&B has no login here", "`wandb login`", "--trackers jsonl"),
        wandb_mode=None,
        no_wandb_login=True,
    ),
    Case(
        "eval-libero-trials",  # LIBERO has 50 initial states per task: refused before the first episode
        "eval_libero",
        ("--checkpoint", "{tmp}", "--num_trials_per_task", "51"),
        ("--num_trials_per_task 51 is more than LIBERO has", "initial states 0-49", "at most 50"),
    ),
    # --- eval_sim.py (caught before the simulator or the policy loads) ------------------------------------------
    Case(
        "eval-sim-benchmark",
        "eval_sim",
        ("--benchmark", "metawrld", "--checkpoint", "{tmp}"),
        ("Unknown benchmark 'metawrld'", "Did you mean 'metaworld'?", "libero, metaworld"),
    ),
    Case(
        "eval-sim-metaworld-suite",
        "eval_sim",
        ("--benchmark", "metaworld", "--checkpoint", "{tmp}", "--task_suite", "MT5"),
        ("Unknown Meta-World task suite 'MT5'", "Did you mean 'MT50'?", "MT10"),
    ),
    Case(
        "eval-sim-metaworld-task",
        "eval_sim",
        ("--benchmark", "metaworld", "--checkpoint", "{tmp}", "--tasks", "reachh-v3"),
        ("--tasks: 'reachh-v3' is not a task id of this suite", "Did you mean 'reach-v3'?"),
    ),
    Case(
        "eval-sim-libero-suite",
        "eval_sim",
        ("--benchmark", "libero", "--checkpoint", "{tmp}", "--task_suite", "libero_spatail"),
        ("Unknown LIBERO task suite 'libero_spatail'", "Did you mean 'libero_spatial'?"),
    ),
    Case(
        "eval-sim-libero-task",
        "eval_sim",
        ("--benchmark", "libero", "--checkpoint", "{tmp}", "--tasks", "tsak3"),
        ("--tasks: 'tsak3' is not a task id of this suite", "Did you mean 'task3'?", "valid ids are 0..9"),
    ),
    Case(
        "eval-sim-libero-trials",
        "eval_sim",
        ("--benchmark", "libero", "--policy_url", "http://localhost:8000", "--num_trials_per_task", "51"),
        ("--num_trials_per_task 51 is more than LIBERO has", "at most 50"),
    ),
    # --- collect_demos.py ---------------------------------------------------------------------------------------
    Case(
        "collect-demos-task",
        "collect_demos",
        ("--data_root_dir", "{tmp}/out", "--task_suite", "MT10", "--tasks", "reachh-v3"),
        ("--tasks: 'reachh-v3' is not a task id of this suite", "Did you mean 'reach-v3'?"),
    ),
]
SCRIPT_NAMES = sorted(p.stem for p in SCRIPTS.glob("*.py"))
# The cases that need torch by design before they can refuse: CUDA and the strategy are torch's to say.
NEED_TORCH = {"cpu-offload-without-cuda", "cuda-graphs-under-fsdp"}
HEAVY = ("torch", "tensorflow")
# Only against a hang (a subprocess that never returns would stall the suite): minutes on a loaded machine are fine.
HANG_GUARD_S = 900


def _env(wandb_mode: str | None = "disabled", no_login_home: Path | None = None) -> dict[str, str]:
    """The environment of a plain user shell: no torchrun variables, no plugins, W&B off (or as the case says)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "PRISMATIC_PLUGINS"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if no_login_home is not None:
        env = {k: v for k, v in env.items() if not k.startswith("WANDB_") and k != "NETRC"}
        env.update(HOME=str(no_login_home), WANDB_DIR=str(no_login_home), WANDB_CONFIG_DIR=str(no_login_home))
    env.pop("WANDB_MODE", None)
    if wandb_mode is not None:
        env["WANDB_MODE"] = wandb_mode
    return {**env, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class Outcome:
    """A script's run: the process (its stderr without `-X importtime`'s lines) and the top-level packages it
    imported."""

    proc: subprocess.CompletedProcess
    imported: frozenset[str]


def _run(script: str, args: list[str], env: dict[str, str] | None = None) -> Outcome:
    """`vla_scripts/<script>.py args` under `-X importtime`, which lists every module imported on stderr."""
    command = [sys.executable, "-X", "importtime", str(SCRIPTS / f"{script}.py"), *args]
    proc = subprocess.run(
        command, capture_output=True, text=True, env=env or _env(), cwd=REPO, timeout=HANG_GUARD_S
    )
    stderr, imported = [], set()
    for line in proc.stderr.splitlines(keepends=True):
        if line.startswith("import time:"):  # "import time: self [us] | cumulative | imported package"
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
        else:
            stderr.append(line)
    proc.stderr = "".join(stderr)
    return Outcome(proc, frozenset(imported))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files the cases point at: broken config files, a file where a folder is expected, an empty data root."""
    tmp = tmp_path_factory.mktemp("cli_errors")
    (tmp / "empty").mkdir()
    (tmp / "no_login").mkdir()  # a home without W&B credentials or settings
    (tmp / "a_file.txt").write_text("not a folder, not a checkpoint\n")
    (tmp / "malformed.yaml").write_text("vla:\n  type: tiny+mx-toy\nseed: 7\ntrackers: [jsonl\n")
    (tmp / "a_list.yaml").write_text("- seed\n- 7\n")
    (tmp / "list_value.yaml").write_text("vla:\n  type: tiny+mx-toy\nseed: [1, 2]\n")
    (tmp / "unknown_field.yaml").write_text("vla:\n  type: tiny+mx-toy\n  learning_rat: 0.001\n")
    (tmp / "vla_scalar.yaml").write_text("vla: tiny+mx-toy\n")
    (tmp / "unknown_preset.yaml").write_text("vla:\n  type: tiny+mx-tyo\n")
    (tmp / "lerobot_v20" / "meta").mkdir(parents=True)
    (tmp / "lerobot_v20" / "meta" / "info.json").write_text(
        json.dumps({"codebase_version": "v2.0", "fps": 10})
    )
    # A run with one (stand-in) complete checkpoint: DCP's metadata file and the train state.
    checkpoint = tmp / "runs" / "done" / "checkpoints" / "step-000002-epoch-00"
    checkpoint.mkdir(parents=True)
    (checkpoint / ".metadata").write_bytes(b"")
    identity = {"vla_id": "tiny+mx-toy", "seed": 7, "data_mix": "toy", "base_vlm": "tiny-vit+tiny-llama"}
    (checkpoint / "train_state.json").write_text(
        json.dumps({"step": 2, "epoch": 0, "frames": 16, **identity})
    )
    return tmp


@pytest.fixture(scope="module")
def results(scratch: Path) -> dict[str, Outcome]:
    """Every case, run in parallel: id -> outcome."""

    def one(case: Case) -> tuple[str, Outcome]:
        env = _env(case.wandb_mode, scratch / "no_login" if case.no_wandb_login else None)
        return case.id, _run(case.script, [a.replace("{tmp}", str(scratch)) for a in case.args], env)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, CASES))


def test_the_catalogue_covers_every_script() -> None:
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)
    assert {case.script for case in CASES} == set(SCRIPT_NAMES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_paragraph_exit_2(case: Case, results: dict, scratch: Path) -> None:
    proc = results[case.id].proc
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]  # one paragraph, printed once
    message = errors[0]
    for word in case.key_words:
        assert word.replace("{tmp}", str(scratch)) in message, message
    for word in case.absent:
        assert word not in message, message


def test_cases_fail_before_heavy_imports(results: dict) -> None:
    """Parsing, range, file and login errors cost a Python start-up, not a torch / TensorFlow one: only the cases
    that ask torch about the device import it, and none imports TensorFlow."""
    assert NEED_TORCH <= set(results)
    heavy = {case_id: sorted(set(HEAVY) & outcome.imported) for case_id, outcome in results.items()}
    assert {case_id for case_id, names in heavy.items() if names} == NEED_TORCH, heavy
    assert all(names == ["torch"] for case_id, names in heavy.items() if case_id in NEED_TORCH), heavy


@pytest.mark.parametrize("script", SCRIPT_NAMES)
def test_help_has_an_example_and_every_flag(script: str) -> None:
    outcome = _run(script, ["--help"])
    proc = outcome.proc
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"usage: {script}.py")
    assert re.search(rf"(python|torchrun) .*vla_scripts/{script}\.py --", proc.stdout), "no example command"
    flags = re.findall(r"^  (--[\w.]+) ", proc.stdout, flags=re.MULTILINE)
    assert len(flags) == len(set(flags)) >= 2
    if script == "train":
        assert {"--vla.type", "--vla.learning_rate", "--data_root_dir", "--trackers"} <= set(flags)
    assert not set(HEAVY) & outcome.imported  # --help is instant: it needs neither torch nor TensorFlow


@pytest.mark.parametrize("mistake", ["range", "wandb-no-login"])
def test_under_torchrun_the_message_comes_first_once_and_in_the_summary(mistake: str, tmp_path: Path) -> None:
    """Every rank meets the same mistake: local rank 0 prints it, each rank records it, torchrun's failure
    summary shows it as the ranks' "traceback", and no rank prints a traceback of its own. W&B logs from rank 0
    alone, but every rank checks its login, so none is left waiting at start-up for a rank 0 that has stopped."""
    if mistake == "range":
        args, env, message = (
            ("--vla.learning_rate", "-1e-4"),
            _env(),
            "--vla.learning_rate=-0.0001 is out of range",
        )
    else:
        (tmp_path / "empty").mkdir()
        args = ("--data_root_dir", str(tmp_path / "empty"), "--run_root_dir", str(tmp_path / "runs"))
        env, message = _env(None, tmp_path), "--trackers includes wandb, but W&B has no login here"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "train.py"),
        *TINY,
        *args,
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=HANG_GUARD_S)
    printed = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(printed) == 1 and message in printed[0], proc.stderr[-3000:]
    summary = proc.stderr[proc.stderr.index("FAILED") :]
    assert proc.stderr.index(printed[0]) < proc.stderr.index("FAILED")  # ours first, then torchrun's summary
    assert f"traceback : error: {message}" in summary.split("Root Cause")[1]
    assert proc.stderr.count("Traceback (most recent call last)") <= 1  # at most torchrun's own launcher


def test_common_errors_doc_quotes_the_catalogue() -> None:
    """Each phrase that docs/common_errors.md quotes from a message (in "double quotes" in its Message column) is
    a key phrase of a catalogue case, so the doc cannot drift from what the tools print."""
    key_words = {word for case in CASES for word in case.key_words}
    rows = [line for line in DOC.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) >= 10
    for row in rows:
        quoted = re.findall(r'"([^"]+)"', row.split("|")[2])
        assert quoted, f"no quoted message in: {row}"
        for phrase in quoted:
            assert phrase in key_words, (
                f"docs/common_errors.md quotes {phrase!r}, which no catalogue case checks"
            )
