"""Offline evaluation of a policy on a held-out RLDS split: metric sums and the evaluation loop.

    summary = evaluate(policy, EvalSpec(data_root_dir, "toy", split="val"), rank=rank, world_size=world_size)
    print(format_summary(summary))

Metrics, per dataset of the mixture and overall (`vla_scripts/evaluate.py` is the command line):
- action-token accuracy: the predicted token ids against `action_tokenizer.encode_to_ids` of the ground-truth
  action normalised with the data's statistics, exactly the labels training uses;
- L1 and MSE per action dimension in robot units: un-normalised predictions against the frame's *raw*
  (standardised, not normalised) action, and their means over dimensions;
- gripper accuracy: the last action dimension, read as open when > 0.5 and closed otherwise. This is OpenVLA's
  convention after standardisation (gripper in [0, 1], 1 = open; its LIBERO / real-robot scripts binarise at 0.5);
- the number of frames.
For a policy with a chunk head (`l1-chunk`), every frame's prediction is a chunk of K actions compared with the
frame's next K raw actions (the pipeline's future window, as in training): L1 / MSE / gripper accuracy pool all K
positions, and `l1_per_chunk_position` gives the L1 (mean over dimensions) at each position 0..K-1 (how error grows
with the horizon); action-token accuracy is None (no tokens).
For a head whose answers can fail to decode (`fast`: ids that are not a chunk give zeros, `HeadPrediction.valid`),
`invalid_chunks` counts the frames answered by such a stand-in (their zeros are scored like any prediction); the key
is absent for heads whose answers always decode.

Under torchrun every rank decodes a disjoint shard of the split (the pipeline splits trajectories by rank), keeps
its own sums, and one `all_reduce` at the end adds them up: no collective per batch, so ranks with unequal shards
never wait on each other mid-way.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.stream_spec import StreamSpec

if TYPE_CHECKING:
    import torch

    from prismatic.inference.policy import VLAPolicy
    from prismatic.vla.datasets import RLDSDataset

logger = logging.getLogger(__name__)

GRIPPER_OPEN_THRESHOLD = 0.5  # gripper in [0, 1], 1 = open (OpenVLA's standardised convention)
SPLITS = ("val", "train")
# `--split train` samples the training stream (shuffled, infinite): a small buffer is enough for a sample.
TRAIN_SAMPLE_SHUFFLE_BUFFER = 1000
_METRIC_KEYS = (
    "action_token_accuracy",
    "gripper_accuracy",
    "l1_mean",
    "mse_mean",
    "l1_per_dim",
    "mse_per_dim",
    "l1_per_chunk_position",
)


@dataclass(frozen=True)
class EvalSpec:
    """What to evaluate on and how (the data flags of `vla_scripts/evaluate.py`).

    Attributes:
        data_root_dir, data_mix: the RLDS datasets, as for training.
        split: "val" (one pass over the held-out split) or "train" (a sample of the training stream; needs
            `max_frames`).
        batch_size: frames decoded together.
        max_frames: frames of *this rank* at most (None: the whole split).
        unnorm_key: one dataset's statistics un-normalise every frame (None: each frame's own dataset's).
        options: the data options (statistics, filtering, proprio), the run's own normally.
        seed: the stream's seed (the order of `--split train` frames).
    """

    data_root_dir: Path
    data_mix: str
    split: str = "val"
    batch_size: int = 32
    max_frames: int | None = None
    unnorm_key: str | None = None
    options: DataOptions = field(default_factory=DataOptions)
    seed: int = 7


class EvalMetrics:
    """Sums (float64) per dataset: frames, correct action tokens, correct gripper states, |error| and error^2
    per action dimension. Means are taken only in `summary()`, so sums from any number of batches and ranks
    combine exactly.
    """

    def __init__(
        self,
        dataset_names: Sequence[str],
        action_dim: int,
        gripper_threshold: float = GRIPPER_OPEN_THRESHOLD,
        chunk_size: int = 1,
        has_tokens: bool = True,
    ) -> None:
        if len(set(dataset_names)) != len(dataset_names) or not dataset_names:
            raise ValueError(f"dataset_names must be unique and non-empty, got {list(dataset_names)}.")
        if action_dim < 1:
            raise ValueError(f"action_dim must be >= 1, got {action_dim}.")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        self.dataset_names = list(dataset_names)
        self.index = {name: i for i, name in enumerate(self.dataset_names)}
        self.action_dim, self.chunk_size, self.has_tokens = action_dim, chunk_size, has_tokens
        self.gripper_threshold = gripper_threshold
        num = len(self.dataset_names)
        self.frames = np.zeros(num, np.float64)
        self.correct_tokens = np.zeros(num, np.float64)
        self.correct_gripper = np.zeros(num, np.float64)
        self.abs_error = np.zeros((num, chunk_size, action_dim), np.float64)
        self.sq_error = np.zeros((num, chunk_size, action_dim), np.float64)
        # Frames whose validity the head reported, and those of them that did not decode (`HeadPrediction.valid`).
        self.checked = np.zeros(num, np.float64)
        self.invalid = np.zeros(num, np.float64)

    def update(
        self,
        dataset_names: Sequence[str],
        pred_token_ids: np.ndarray | None,
        true_token_ids: np.ndarray | None,
        pred_actions: np.ndarray,
        true_actions: np.ndarray,
        valid: np.ndarray | None = None,
    ) -> None:
        """Add a batch of B frames.

        Args:
            dataset_names: B dataset names (each one of `self.dataset_names`).
            pred_token_ids, true_token_ids: int `[B, A]` action token ids (None for a policy without tokens).
            pred_actions, true_actions: `[B, A]` (`[B, K, A]` with chunks) actions in robot units (un-normalised).
            valid: bool `[B]`, whether each prediction decoded (`DecodedActions.valid`; None: not reported).
        """
        pred = np.asarray(pred_actions, np.float64).reshape(
            len(dataset_names), -1, np.shape(pred_actions)[-1]
        )
        true = np.asarray(true_actions, np.float64).reshape(
            len(dataset_names), -1, np.shape(true_actions)[-1]
        )
        shape = (len(dataset_names), self.chunk_size, self.action_dim)
        arrays = [("pred_actions", pred), ("true_actions", true)]
        if self.has_tokens:
            pred_ids, true_ids = np.asarray(pred_token_ids), np.asarray(true_token_ids)
            arrays += [("pred_token_ids", pred_ids[:, None]), ("true_token_ids", true_ids[:, None])]
        for name, array in arrays:
            if array.shape != shape:
                raise ValueError(
                    f"{name} has shape {array.shape}, expected {shape} (frames, chunk positions, action dims)."
                )
        unknown = sorted(set(dataset_names) - set(self.index))
        if unknown:
            raise ValueError(f"Frames of datasets {unknown} not among {self.dataset_names}.")
        if valid is not None and np.shape(valid) != (len(dataset_names),):
            raise ValueError(f"valid has shape {np.shape(valid)}, expected ({len(dataset_names)},) (frames).")
        rows = np.array([self.index[name] for name in dataset_names], np.int64)
        error = pred - true
        gripper_open = pred[..., -1] > self.gripper_threshold
        np.add.at(self.frames, rows, 1.0)
        if self.has_tokens:
            np.add.at(self.correct_tokens, rows, (pred_ids == true_ids).sum(axis=1))
        np.add.at(
            self.correct_gripper, rows, (gripper_open == (true[..., -1] > self.gripper_threshold)).sum(axis=1)
        )
        np.add.at(self.abs_error, rows, np.abs(error))
        np.add.at(self.sq_error, rows, error**2)
        if valid is not None:
            np.add.at(self.checked, rows, 1.0)
            np.add.at(self.invalid, rows, (~np.asarray(valid, bool)).astype(np.float64))

    def _packed(self) -> np.ndarray:
        return np.concatenate(
            [
                self.frames,
                self.correct_tokens,
                self.correct_gripper,
                self.abs_error.ravel(),
                self.sq_error.ravel(),
                self.checked,
                self.invalid,
            ]
        )

    def _unpack(self, packed: np.ndarray) -> None:
        num, dims = len(self.dataset_names), self.chunk_size * self.action_dim
        shape = (num, self.chunk_size, self.action_dim)
        parts = np.split(packed, np.cumsum([num, num, num, num * dims, num * dims, num]))
        self.frames, self.correct_tokens, self.correct_gripper = parts[0], parts[1], parts[2]
        self.abs_error, self.sq_error = parts[3].reshape(shape), parts[4].reshape(shape)
        self.checked, self.invalid = parts[5], parts[6]

    def all_reduce(self, device: torch.device | str = "cpu") -> None:
        """Sum every rank's counts and errors (one `all_reduce`, SUM) so that `summary()` covers all ranks.

        Collective: call it on every rank, once, after the last `update`. `device` is where the reduction runs
        (CUDA for NCCL, CPU for gloo). A no-op without an initialised process group.
        """
        # lazy: keeps this module (and evaluate.py's --help) torch-free
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        packed = torch.from_numpy(self._packed()).to(device)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        self._unpack(packed.cpu().numpy().astype(np.float64))

    def _group(
        self, frames: float, tokens: float, gripper: float, abs_err: np.ndarray, sq_err: np.ndarray
    ) -> dict[str, Any]:
        if frames == 0:  # nothing to average: report the count, not a made-up 0
            return {"num_frames": 0, **dict.fromkeys(_METRIC_KEYS)}
        l1, mse = abs_err / frames, sq_err / frames  # [K, A]
        return {
            "num_frames": int(frames),
            "action_token_accuracy": float(tokens / (frames * self.action_dim)) if self.has_tokens else None,
            "gripper_accuracy": float(gripper / (frames * self.chunk_size)),
            "l1_mean": float(l1.mean()),
            "mse_mean": float(mse.mean()),
            "l1_per_dim": [float(v) for v in l1.mean(axis=0)],
            "mse_per_dim": [float(v) for v in mse.mean(axis=0)],
            "l1_per_chunk_position": [float(v) for v in l1.mean(axis=1)],
        }

    def summary(self) -> dict[str, Any]:
        """`{"overall": metrics, "datasets": {name: metrics}}`; metrics as in the module docstring (None where a
        dataset has no frames), with `invalid_chunks` in every group once any frame's validity was reported."""
        datasets = {
            name: self._group(
                self.frames[i],
                self.correct_tokens[i],
                self.correct_gripper[i],
                self.abs_error[i],
                self.sq_error[i],
            )
            for i, name in enumerate(self.dataset_names)
        }
        overall = self._group(
            self.frames.sum(),
            self.correct_tokens.sum(),
            self.correct_gripper.sum(),
            self.abs_error.sum(axis=0),
            self.sq_error.sum(axis=0),
        )
        if self.checked.sum() > 0:
            overall["invalid_chunks"] = int(self.invalid.sum())
            for i, name in enumerate(self.dataset_names):
                datasets[name]["invalid_chunks"] = int(self.invalid[i])
        return {"overall": overall, "datasets": datasets}


# === The loop ===


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def eval_frame(frame: Mapping[str, Any]) -> dict[str, Any]:
    """One pipeline frame (with `raw_action`) -> what evaluation needs: image, instruction, dataset name,
    normalised and raw action. The `batch_transform` of the evaluation `RLDSDataset`."""
    observation = frame["observation"]
    # A chunked pipeline gives observations a leading window axis: the frame's own is last.
    images = {
        key.removeprefix("image_"): (value[-1] if np.ndim(value) == 4 else np.asarray(value))
        for key, value in observation.items()
        if key.startswith("image_")
    }
    out = {
        "image": images["primary"],
        "views": images,
        "instruction": _text(frame["task"]["language_instruction"]),
        "dataset_name": _text(frame["dataset_name"]),
        "action": np.asarray(frame["action"], np.float32),
        "raw_action": np.asarray(frame["raw_action"], np.float32),
    }
    if "proprio" in observation:
        proprio = np.asarray(observation["proprio"], np.float32)
        out["proprio"] = proprio[-1] if proprio.ndim == 2 else proprio
    return out


def _batches(frames: Iterable[dict[str, Any]], batch_size: int, max_frames: int | None) -> Iterator[list]:
    batch: list[dict[str, Any]] = []
    for count, frame in enumerate(frames):
        if max_frames is not None and count >= max_frames:
            break
        batch.append(frame)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def evaluate_frames(
    policy: VLAPolicy,
    frames: Iterable[dict[str, Any]],
    metrics: EvalMetrics,
    *,
    batch_size: int = 32,
    max_frames: int | None = None,
    unnorm_key: str | None = None,
) -> int:
    """Decode `frames` (as `eval_frame` makes them) in batches and add them to `metrics`; local, no collectives.

    Each frame's actions are un-normalised with the statistics of its own dataset, or of `unnorm_key` for all.
    Returns the number of frames evaluated (at most `max_frames`).
    """
    evaluated = 0
    for batch in _batches(frames, batch_size, max_frames):
        names = [f["dataset_name"] for f in batch]
        views = policy.views
        decoded = policy.decode_batch(
            [f["image"] if len(views) == 1 else [f["views"][v] for v in views] for f in batch],
            [f["instruction"] for f in batch],
            unnorm_key=unnorm_key if unnorm_key is not None else names,
            proprio=np.stack([f["proprio"] for f in batch]) if policy.action_spec.proprio_dim else None,
        )
        true_ids = (
            None
            if policy.is_chunked
            else policy.action_tokenizer.encode_to_ids(np.stack([f["action"] for f in batch]))
        )
        metrics.update(
            names,
            None if policy.is_chunked else decoded.token_ids,
            true_ids,
            decoded.actions,
            np.stack([f["raw_action"] for f in batch]),
            decoded.valid,
        )
        evaluated += len(batch)
    return evaluated


def eval_stream_spec(policy: VLAPolicy, spec: EvalSpec, *, rank: int = 0, world_size: int = 1) -> StreamSpec:
    """The `StreamSpec` of `spec.split` for this rank, at the policy's image size, with raw actions.

    `val`: one pass over the val split (or the last 5% of train for datasets without one), in a fixed order,
    ranks reading disjoint trajectories. `train`: the training stream (shuffled, endless, no augmentation), for
    a fit check on a sample of it; the caller bounds it with `max_frames`.
    """
    if spec.split not in SPLITS:
        raise ConfigError(f"Unknown split '{spec.split}'. Valid choices: {', '.join(SPLITS)}.")
    options = spec.options
    if policy.action_spec.proprio_dim and not options.load_proprio:
        options = dataclasses.replace(options, load_proprio=True)
    # Frames as the policy was trained on: its chunk (the future window) and its camera views.
    return StreamSpec(
        spec.data_root_dir,
        spec.data_mix,
        resize_resolution=tuple(policy.vlm.vision_backbone.default_image_resolution[1:]),
        shuffle_buffer_size=TRAIN_SAMPLE_SHUFFLE_BUFFER,
        options=options,
        image_views=tuple(policy.views) if len(policy.views) > 1 else ("primary",),
        future_action_window_size=policy.chunk_size - 1,
        keep_raw_action=True,
        seed=spec.seed,
        train=spec.split == "train",
        rank=rank,
        world_size=world_size,
    )


def eval_dataset(policy: VLAPolicy, spec: EvalSpec, *, rank: int = 0, world_size: int = 1) -> RLDSDataset:
    """The frames of `spec.split` for this rank (`eval_stream_spec`), each made by `eval_frame`."""
    from prismatic.vla.datasets.datasets import RLDSDataset  # lazy: torch; keeps --help torch-free

    return RLDSDataset(eval_stream_spec(policy, spec, rank=rank, world_size=world_size), eval_frame)


def check_unnorm_keys(
    policy: VLAPolicy,
    dataset_statistics: Mapping[str, Mapping[str, Any]],
    unnorm_key: str | None,
    *,
    data_mix: str,
) -> int:
    """Check that every dataset's frames can be un-normalised and have the policy's action size; return it.

    Raises:
        ConfigError: the policy has no statistics for a dataset (and no `unnorm_key` was given), `unnorm_key`
            is unknown, or the data's action size differs from the policy's.
    """
    if unnorm_key is not None:
        policy.resolve_unnorm_key(unnorm_key)  # PolicyInputError (a ConfigError) naming the valid keys
    else:
        known = list(policy.unnorm_keys)
        missing = [name for name in dataset_statistics if name not in known]
        if missing:
            have = ", ".join(known) if known else "none: it carries no dataset statistics"
            raise ConfigError(
                f"The policy has no action statistics for dataset(s) {', '.join(repr(m) for m in missing)} of "
                f"mixture '{data_mix}', so it cannot un-normalise its actions for them (statistics it has: "
                f"{have}). Evaluate on datasets it was trained on, or pass --unnorm_key <dataset> to "
                "un-normalise every frame with that dataset's statistics."
            )
    action_dim = 0  # the same for every dataset of a mixture (the pipeline checks)
    for name, stats in dataset_statistics.items():
        action_dim = len(stats["action"]["q01"])
        policy_dim = policy.action_dim(unnorm_key if unnorm_key is not None else name)
        if action_dim != policy_dim:
            raise ConfigError(
                f"Dataset '{name}' has {action_dim}-dim actions but the policy predicts {policy_dim} for it."
            )
    return action_dim


def _warn_if_statistics_differ(
    policy: VLAPolicy, dataset_statistics: Mapping[str, Mapping[str, Any]], unnorm_key: str | None
) -> None:
    """Token labels use the data's statistics, predictions the policy's: say so when they disagree."""
    norm_stats = policy.norm_stats or {}
    for name, stats in dataset_statistics.items():
        key = unnorm_key if unnorm_key is not None else name
        ours = norm_stats.get(key, {}).get("action", {})
        if not all(
            q in ours and np.allclose(ours[q], stats["action"][q], rtol=1e-5, atol=1e-6)
            for q in ("q01", "q99")
        ):
            logger.warning(
                "The action statistics of '%s' under the data root differ from the policy's ('%s'): token "
                "accuracy compares against labels normalised with the data's statistics; L1 / MSE (robot units) "
                "are unaffected.",
                name,
                key,
            )


def evaluate(
    policy: VLAPolicy,
    spec: EvalSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    reduce_device: torch.device | str = "cpu",
) -> dict[str, Any]:
    """Evaluate `policy` on this rank's shard of `spec.split` of `spec.data_mix`, then combine all ranks.

    Collective when `world_size > 1`: call on every rank; every rank returns the same global summary
    (`EvalMetrics.summary()`). `spec.max_frames` caps the frames of *this rank*; `reduce_device` is where the one
    `all_reduce` runs (the rank's CUDA device with NCCL).

    Raises:
        ConfigError: bad mixture / data / split / unnorm key (see `check_unnorm_keys`), `--split train` without
            `max_frames`, or no frames at all in the split.
    """
    split, max_frames, unnorm_key, data_mix = spec.split, spec.max_frames, spec.unnorm_key, spec.data_mix
    if spec.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {spec.batch_size}.")
    if max_frames is not None and max_frames < 1:
        raise ConfigError(f"max_frames must be >= 1, got {max_frames}.")
    if split == "train" and max_frames is None:
        raise ConfigError("--split train streams training frames without end: bound it with --max_frames N.")
    dataset = eval_dataset(policy, spec, rank=rank, world_size=world_size)
    statistics = dataset.dataset_statistics
    action_dim = check_unnorm_keys(policy, statistics, unnorm_key, data_mix=data_mix)
    if rank == 0:
        _warn_if_statistics_differ(policy, statistics, unnorm_key)
    metrics = EvalMetrics(
        sorted(statistics), action_dim, chunk_size=policy.chunk_size, has_tokens=not policy.is_chunked
    )
    evaluated = evaluate_frames(
        policy, dataset, metrics, batch_size=spec.batch_size, max_frames=max_frames, unnorm_key=unnorm_key
    )
    logger.info("Rank %d evaluated %d frames", rank, evaluated)
    metrics.all_reduce(reduce_device)
    summary = metrics.summary()
    if summary["overall"]["num_frames"] == 0:
        raise ConfigError(
            f"Split '{split}' of mixture '{data_mix}' under '{spec.data_root_dir}' holds no frames to evaluate."
        )
    return summary


# === Loading under torchrun ===


def load_policy_from_rank0(
    checkpoint: str,
    comm_device: torch.device,
    *,
    device: str | torch.device,
    dtype: str | torch.dtype | None = None,
    hf_token: str | None = None,
    constrained: bool = True,
) -> VLAPolicy:
    """`load_policy` for a job whose ranks each evaluate with a whole replica, reading the weights once per job.

    Rank 0 alone reads the checkpoint (a 7B model is 28 GB of FP32); the others build the same architecture on the
    meta device, reading no weight file, and receive rank 0's values one tensor at a time by broadcast over
    `comm_device`, the process group's device (CUDA for NCCL): `materialize_from_rank0`. A load that fails on any
    rank stops every rank (`call_and_agree`). Without a group of several ranks it is `load_policy`. Collective.
    """
    # lazy: torch and the model code; this module stays torch-free for evaluate.py's --help
    import torch.distributed as dist

    from prismatic.inference.policy import VLAPolicy, load_policy, resolve_device_dtype
    from prismatic.models.distributed_init import materialize_from_rank0
    from prismatic.models.loading import load_vla
    from prismatic.util.dist import call_and_agree

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return load_policy(checkpoint, device=device, dtype=dtype, hf_token=hf_token, constrained=constrained)
    device, dtype = resolve_device_dtype(device, dtype)
    where = None if dist.get_rank() == 0 else "meta"
    loaded = call_and_agree(lambda: load_vla(checkpoint, hf_token=hf_token, dtype=dtype, device=where))
    loaded.vlm.requires_grad_(False)  # inference: the ranks' layouts agree whatever the loader left trainable
    materialize_from_rank0(loaded.vlm, None, comm_device, sync_rng=False)
    return VLAPolicy(loaded.vlm, loaded.norm_stats, loaded.source, device, dtype, constrained=constrained)


# === Report ===


def _fmt(value: float | None, width: int, spec: str = "#.4g") -> str:
    return f"{'-' if value is None else format(value, spec):>{width}}"


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as text tables: one row per dataset and overall (and the invalid chunks, where the head counts
    them), then L1 and MSE per action dimension."""
    rows = [*summary["datasets"].items(), ("overall", summary["overall"])]
    width = max(12, *(len(name) for name, _ in rows))
    counts_invalid = "invalid_chunks" in summary["overall"]
    header = (
        f"{'dataset':<{width}}  {'frames':>8}  {'token_acc':>9}  {'gripper_acc':>11}  {'L1':>9}  {'MSE':>9}"
        + (f"  {'invalid':>8}" if counts_invalid else "")
    )
    lines = [header, "-" * len(header)]
    for name, m in rows:
        lines.append(
            f"{name:<{width}}  {m['num_frames']:>8d}  {_fmt(m['action_token_accuracy'], 9, '.4f')}  "
            f"{_fmt(m['gripper_accuracy'], 11, '.4f')}  {_fmt(m['l1_mean'], 9)}  {_fmt(m['mse_mean'], 9)}"
            + (f"  {m['invalid_chunks']:>8d}" if counts_invalid else "")
        )
    tables = [
        ("L1 per action dimension (robot units; last = gripper)", "l1_per_dim"),
        ("MSE per action dimension (squared robot units; last = gripper)", "mse_per_dim"),
    ]
    if len(summary["overall"].get("l1_per_chunk_position") or []) > 1:
        tables.append(
            (
                "L1 per chunk position (robot units, mean over dimensions; 0 = current)",
                "l1_per_chunk_position",
            )
        )
    for title, key in tables:
        columns = len(summary["overall"][key] or [])
        lines += ["", title]
        lines.append(f"{'dataset':<{width}}" + "".join(f"  {d:>9d}" for d in range(columns)))
        for name, m in rows:
            values = m[key] or [None] * columns
            lines.append(f"{name:<{width}}" + "".join(f"  {_fmt(v, 9)}" for v in values))
    return "\n".join(lines)
