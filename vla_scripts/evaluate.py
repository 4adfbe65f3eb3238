r"""Offline evaluation: how well a trained policy predicts the actions of a held-out RLDS split.

    python vla_scripts/evaluate.py --checkpoint runs/first/checkpoints/step-000300-epoch-04 \
        --data_root_dir data/toy [--data_mix toy] [--split val] [--batch_size 32] [--max_frames 1000]

    torchrun --standalone --nnodes 1 --nproc-per-node 8 vla_scripts/evaluate.py --checkpoint runs/<run_id> \
        --data_root_dir /data/oxe --data_mix bridge

Reports per dataset and overall (definitions in `prismatic/inference/evaluation.py`): action-token accuracy, L1
and MSE of un-normalised actions per dimension and their means, gripper accuracy (last dimension, open when
> 0.5: OpenVLA's convention, gripper in [0, 1] with 1 = open), the number of frames and, for a head whose
answers can fail to decode (fast), the chunks that did not (`invalid_chunks`). Prints a table and
writes JSON: beside a `checkpoints/*.pt` file as `<checkpoint name>.eval-<split>.json`, inside a folder as
`eval-<split>.json`, in the current folder for a Hub id; `--out` overrides.

`--checkpoint` takes a run folder (its newest checkpoint), one of its `checkpoints/*.pt`, an HF OpenVLA folder
or a Hub id. `--data_mix` defaults to the run's own mixture (`vla.data_mix` of its config.json). `--split val`
is the val split, or the last 5% of train for datasets without one; `--split train` samples the training
stream (needs `--max_frames`). Each frame is un-normalised with its own dataset's statistics from the
checkpoint; `--unnorm_key` uses one dataset's for all (a dataset the policy was not trained on). Under torchrun
each rank evaluates a disjoint shard (`--max_frames` caps each rank) and rank 0 reports; rank 0 alone reads the
weights and broadcasts them to the others.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prismatic.conf.data import DataOptions
from prismatic.inference.evaluation import SPLITS, EvalSpec, evaluate, format_summary, load_policy_from_rank0
from prismatic.models.checkpoint_format import run_folder_of
from prismatic.run_layout import CHECKPOINTS_DIR, CONFIG_STEM
from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError
from prismatic.util.files import looks_like_local_path, write_json_atomic
from prismatic.util.logging import setup_logging

logger = logging.getLogger("vla_scripts.evaluate")


@dataclass
class EvaluateConfig:
    """Flags of vla_scripts/evaluate.py (examples above)."""

    checkpoint: str  # a run folder, <run>/checkpoints/step-*, an HF OpenVLA folder, or a Hub id
    data_root_dir: Path  # folder holding the RLDS datasets (<name>/<version>/)
    data_mix: str | None = None  # mixture or dataset name; default: the run's own (config.json vla.data_mix)
    split: str = "val"  # val (held-out) or train (a sample of the training stream; needs --max_frames)
    unnorm_key: str | None = None  # one dataset's statistics for every frame (default: each frame's own)
    batch_size: int = 32  # frames decoded together
    max_frames: int | None = None  # per rank; default: the whole split
    out: Path | None = None  # JSON report path (default: next to the checkpoint, see module docstring)
    device: str | None = None  # default: this rank's GPU, else cpu
    dtype: str | None = None  # float32 / bfloat16 / float16; default bf16 on GPU, fp32 on CPU
    constrained: bool = True  # decode action-token ids only (false: OpenVLA's unconstrained greedy decoding)
    hf_token: str | None = None  # for gated Hub repos
    # Statistics / filtering / proprio choices; default: the run's own (config.json "data"), else OpenVLA's
    data: DataOptions = field(default_factory=DataOptions)


def _local_checkpoint(checkpoint: str) -> Path | None:
    """The checkpoint as a local path when it names one (else it is a Hub / registry id)."""
    path = Path(checkpoint).expanduser()
    return path if path.exists() else None


def run_config(checkpoint: Path) -> dict[str, Any]:
    """The run folder's config.json as a dict ({} when there is none or it is not a JSON object)."""
    try:
        config = json.loads((run_folder_of(checkpoint) / f"{CONFIG_STEM}.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def run_data_mix(checkpoint: Path) -> str | None:
    """The mixture the run was trained on (`vla.data_mix` of its config.json), if it says."""
    vla = run_config(checkpoint).get("vla")
    data_mix = vla.get("data_mix") if isinstance(vla, dict) else None
    return data_mix if isinstance(data_mix, str) else None


def resolve_data_options(cfg: EvaluateConfig, given: frozenset[str] = frozenset()) -> DataOptions:
    """The run's own data options (config.json "data"), with the `--data.*` flags given on the command line
    (`given`: their field names) laid over them; the defaults (OpenVLA's) where the run does not say."""
    local = _local_checkpoint(cfg.checkpoint)
    saved = run_config(local).get("data") if local is not None else None
    if not isinstance(saved, dict):
        return cfg.data
    fields = DataOptions().to_dict()
    merged = {k: v for k, v in saved.items() if k in fields}
    merged.update({k: getattr(cfg.data, k) for k in given})
    try:
        return DataOptions(**merged)
    except ConfigError:
        logger.warning("The run's data options %s are not understood; using the flags and defaults.", saved)
        return cfg.data


def given_data_flags(argv: list[str]) -> frozenset[str]:
    """Field names of the `--data.*` flags on a command line."""
    return frozenset(a[len("--data.") :].split("=", 1)[0] for a in argv if a.startswith("--data."))


def default_out_path(checkpoint: str, split: str) -> Path:
    """Where the JSON report goes without `--out` (see module docstring)."""
    local = _local_checkpoint(checkpoint)
    if local is None:
        return Path(f"{checkpoint.replace('/', '--')}.eval-{split}.json")
    if local.is_file():
        return local.with_name(f"{local.stem}.eval-{split}.json")
    if local.parent.name == CHECKPOINTS_DIR and local.name.startswith(
        "step-"
    ):  # a checkpoint folder: beside it
        return local.with_name(f"{local.name}.eval-{split}.json")
    return local / f"eval-{split}.json"


def resolve_data_mix(cfg: EvaluateConfig) -> str:
    """`--data_mix`, else the run's own mixture."""
    if cfg.data_mix is not None:
        return cfg.data_mix
    local = _local_checkpoint(cfg.checkpoint)
    data_mix = run_data_mix(local) if local is not None else None
    if local is None:
        raise ConfigError(
            f"--checkpoint '{cfg.checkpoint}' is no local file or folder. Pass a run folder, one of its "
            "checkpoints/*.pt or an HF OpenVLA folder; for a Hub id, also pass --data_mix <mixture or dataset>."
        )
    if data_mix is None:
        raise ConfigError(
            f"--checkpoint '{cfg.checkpoint}' does not say which mixture it was trained on (no run folder "
            "config.json with vla.data_mix): pass --data_mix <mixture or dataset>."
        )
    return data_mix


def check_config(cfg: EvaluateConfig) -> None:
    """Reject bad flags before anything heavy loads."""
    if _local_checkpoint(cfg.checkpoint) is None and looks_like_local_path(cfg.checkpoint):
        raise ConfigError(f"--checkpoint '{cfg.checkpoint}' does not exist.")
    if cfg.split not in SPLITS:
        raise ConfigError(f"Unknown --split '{cfg.split}'. Valid choices: {', '.join(SPLITS)}.")
    if cfg.split == "train" and cfg.max_frames is None:
        raise ConfigError("--split train streams training frames without end: bound it with --max_frames N.")
    if cfg.batch_size < 1:
        raise ConfigError(f"--batch_size must be >= 1, got {cfg.batch_size}.")
    if cfg.max_frames is not None and cfg.max_frames < 1:
        raise ConfigError(f"--max_frames must be >= 1, got {cfg.max_frames}.")


def evaluate_checkpoint(cfg: EvaluateConfig, data_flags: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Load, evaluate this rank's shard, combine ranks; rank 0 prints the table and writes the JSON.

    Collective under torchrun (every rank calls it). Returns the report (on every rank).
    """
    check_config(cfg)  # before the heavy imports: a typo costs no model or TensorFlow start-up
    data_mix = resolve_data_mix(cfg)

    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds import mixture_statistics, resolve_mixture_dirs

    # An unknown mixture or missing datasets fail here, before the model loads.
    resolve_mixture_dirs(cfg.data_root_dir, data_mix)

    from prismatic.util.dist import destroy_distributed, init_distributed, run_once_per_node  # lazy: torch

    dist_info = init_distributed()
    try:
        setup_logging(dist_info.rank)
        policy = load_policy_from_rank0(  # rank 0 reads the weights, the other ranks receive them
            cfg.checkpoint,
            dist_info.device,
            device=cfg.device or dist_info.device,
            dtype=cfg.dtype,
            hf_token=cfg.hf_token,
            constrained=cfg.constrained,
        )
        logger.info(
            "Policy %s on %s (%s); evaluating on '%s' split %s",
            cfg.checkpoint,
            policy.device,
            policy.dtype,
            data_mix,
            cfg.split,
        )
        # Statistics (needed to normalise labels) are computed once per node if not cached yet.
        options = resolve_data_options(cfg, data_flags)
        run_once_per_node(lambda: mixture_statistics(cfg.data_root_dir, data_mix, options=options), dist_info)
        spec = EvalSpec(
            cfg.data_root_dir,
            data_mix,
            split=cfg.split,
            batch_size=cfg.batch_size,
            max_frames=cfg.max_frames,
            unnorm_key=cfg.unnorm_key,
            options=options,
        )
        summary = evaluate(
            policy, spec, rank=dist_info.rank, world_size=dist_info.world_size, reduce_device=dist_info.device
        )
        report = {
            "checkpoint": cfg.checkpoint,
            "data_root_dir": str(cfg.data_root_dir),
            "data_mix": data_mix,
            "split": cfg.split,
            "unnorm_key": cfg.unnorm_key,
            "world_size": dist_info.world_size,
            "max_frames_per_rank": cfg.max_frames,
            "constrained": cfg.constrained,
            "dtype": str(policy.dtype).removeprefix("torch."),
            **summary,
        }
        if dist_info.is_main:
            out = cfg.out or default_out_path(cfg.checkpoint, cfg.split)
            write_json_atomic(out, report, "evaluation report")
            print(f"\nEvaluation of {cfg.checkpoint} on '{data_mix}' (split {cfg.split})\n", flush=True)
            print(format_summary(summary), flush=True)
            print(f"\nWrote {out}", flush=True)
    finally:
        destroy_distributed()
    return report


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them) and evaluate; a mistake exits 2 in one paragraph, once per node."""
    cfg = parse_config(EvaluateConfig, argv, doc=__doc__)
    evaluate_checkpoint(cfg, given_data_flags(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
