"""The public read API, for people checking their data: standardised trajectories and statistics of a dataset.

    from prismatic.vla.datasets.rlds.reading import read_trajectories, compute_dataset_statistics

    for traj in read_trajectories("data/rlds", "my_robot", split="train"):
        print(traj["episode_id"], traj["timestep"][-1] + 1, traj["action"].mean(0))
    stats = compute_dataset_statistics("data/rlds", "my_robot")  # what training normalises with

Trajectories are what the training pipeline reads before normalisation: the dataset's standardisation function
applied, proprio built from the config's state keys, no filtering. Statistics are the very cache training reads
(`DataOptions` choose the split and the handling of NaN / inf), so both tools agree with training by construction:
this module also holds the statistics pass itself (`dataset_statistics`, `mixture_statistics`), which the
pipeline (`interleave.py`) and `vla_scripts/train.py` call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig, get_dataset_config
from prismatic.vla.datasets.rlds.discovery import (
    find_dataset_dir,
    load_builder,
    resolve_mixture_dirs,
    split_name,
    tfrecord_errors,
)
from prismatic.vla.datasets.rlds.statistics import (
    COUNTS_FIELD,
    compute_statistics,
    data_files_fingerprint,
    load_or_compute_statistics,
    statistics_cache_key,
    with_action_mask,
)
from prismatic.vla.datasets.rlds.trajectories import graph_only, trajectory_dataset
from prismatic.vla.datasets.rlds.transforms import get_standardize_fn

logger = logging.getLogger(__name__)

__all__ = [
    "compute_dataset_statistics",
    "dataset_statistics",
    "mixture_statistics",
    "read_trajectories",
]


def _resolve_split(builder: Any, split: str) -> str:
    """ "train" / "val" as the pipeline reads them (without a val split: train[:95%] / train[95%:]), "all", or any
    split the dataset has (tfds slicing syntax allowed)."""
    if split in ("train", "val"):
        return split_name(builder, train=split == "train")
    if split == "all":
        return "all"
    base = split.split("[", 1)[0]
    if base not in builder.info.splits:
        raise ConfigError(
            f"Split '{split}' is not a split of this dataset: valid choices are train, val, all, or one of "
            f"{', '.join(sorted(builder.info.splits))} (tfds slices such as train[:10] allowed)."
        )
    return split


def read_trajectories(
    data_root_dir: str | Path, name: str, split: str = "train", *, options: DataOptions | None = None
) -> Iterator[dict[str, Any]]:
    """Standardised, un-normalised trajectories of dataset `name`, one NumPy dict per episode, in file order.

    Each holds `episode_id` (str: tfds' record id, "<file>__<index>"), `timestep` (int32[T]), `action`
    (float32[T, A]), `proprio` (float32[T, P]: the config's state keys, one zero per None), `language_instruction`
    (list of T str), `image_primary` (T encoded images, bytes; b"" where the dataset has no such camera).

    Raises:
        ConfigError: unknown dataset or split, missing or damaged data (naming the file).
    """
    import_tensorflow()
    config = get_dataset_config(name)
    dataset_dir = find_dataset_dir(Path(data_root_dir), name)
    builder = load_builder(dataset_dir)
    options = dataclasses.replace(options or DataOptions(), load_proprio=True)
    trajectories = trajectory_dataset(
        builder, _resolve_split(builder, split), config, options, openvla_order=True, with_ids=True
    )
    with tfrecord_errors([dataset_dir]):
        for traj in trajectories.as_numpy_iterator():
            yield {
                "episode_id": traj["episode_id"][0].decode() if len(traj["episode_id"]) else "",
                "timestep": traj["observation"]["timestep"],
                "action": traj["action"],
                "proprio": traj["observation"]["proprio"],
                "language_instruction": [s.decode() for s in traj["task"]["language_instruction"]],
                "image_primary": list(traj["observation"]["image_primary"]),
            }


def compute_dataset_statistics(
    data_root_dir: str | Path, name: str, *, options: DataOptions | None = None, recompute: bool = False
) -> dict[str, Any]:
    """Statistics of dataset `name` in OpenVLA's layout (`action` with `mask`, `proprio`, `num_transitions`,
    `num_trajectories`): read from the cache training uses, or computed and cached (`recompute`: always)."""
    import_tensorflow()
    config = get_dataset_config(name)
    dataset_dir = find_dataset_dir(Path(data_root_dir), name)
    builder = load_builder(dataset_dir)
    stats = dataset_statistics(builder, dataset_dir, config, options or DataOptions(), recompute=recompute)
    return with_action_mask(stats, config)


def _statistics_split(builder: Any, options: DataOptions) -> str:
    return "all" if options.statistics_split == "all" else split_name(builder, train=True)


def dataset_statistics(
    builder: Any,
    dataset_dir: Path,
    config: RLDSDatasetConfig,
    options: DataOptions,
    *,
    recompute: bool = False,
) -> dict[str, Any]:
    """Cached statistics of one dataset (over `options.statistics_split`, all of it, not a rank's share).

    Returns the cache's content: OpenVLA's layout plus our bookkeeping (`_counts`, `_cache_key`), which
    `with_action_mask` drops.
    """
    split = _statistics_split(builder, options)
    fn = get_standardize_fn(config.standardize_fn)
    try:
        source_hash = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):  # defined interactively: the qualified name has to do
        source_hash = ""
    cache_key = statistics_cache_key(
        config,
        version=str(builder.info.version),
        standardize_fn={
            "id": config.standardize_fn,
            "function": f"{fn.__module__}.{fn.__qualname__}",
            "source_sha256": source_hash,
        },
        data_files=data_files_fingerprint(dataset_dir),
        options={**options.statistics_key(), "split": split},
    )

    def compute() -> dict[str, Any]:
        trajectories = trajectory_dataset(
            builder, split, config, options, openvla_order=True, with_ids=True
        ).map(
            graph_only(
                lambda traj: {
                    "action": traj["action"],
                    **({"proprio": traj["observation"]["proprio"]} if options.load_proprio else {}),
                    "episode_id": traj["episode_id"][:1],  # [1] (or [0] for an empty episode)
                    "language_instruction": traj["task"]["language_instruction"],
                }
            )
        )
        with tfrecord_errors([dataset_dir]):
            return compute_statistics(
                trajectories.as_numpy_iterator(),
                dataset_name=config.name,
                split=split,
                nonfinite=options.nonfinite,
            )

    statistics, _ = load_or_compute_statistics(
        dataset_dir, cache_key, compute, recompute=recompute, dataset_name=config.name
    )
    counts = statistics.get(COUNTS_FIELD, {})
    if counts.get("unlabeled_trajectories") and options.skip_unlabeled:
        logger.info(
            "Dataset '%s': %d of %d trajectories of split '%s' (the statistics split) have only empty "
            "instructions; training and validation skip them (--data.skip_unlabeled false keeps them).",
            config.name,
            counts["unlabeled_trajectories"],
            statistics["num_trajectories"],
            split,
        )
    if counts.get("nonfinite_frames_dropped"):
        logger.warning(
            "Dataset '%s': %d frames hold NaN or inf in action / proprio (split '%s'); left out of statistics "
            "and training (--data.nonfinite drop).",
            config.name,
            counts["nonfinite_frames_dropped"],
            split,
        )
    return statistics


def mixture_statistics(
    data_root_dir: Path,
    data_mix: str,
    *,
    skip_missing_datasets: bool = False,
    num_workers: int | None = None,
    options: DataOptions | None = None,
    recompute: bool = False,
) -> dict[str, dict[str, Any]]:
    """{dataset_name: statistics with `action.mask`} of every dataset of `data_mix`, in the layout of a run's
    `dataset_statistics.json`: read from each dataset's cache, or computed (and cached) as `options` say
    (`recompute`: ignore existing caches).

    Datasets are processed in `num_workers` threads (default: one per CPU core, at most one per dataset);
    TensorFlow releases the GIL, and each dataset's read already decodes in parallel inside tf.data.
    """
    import_tensorflow()
    options = options or DataOptions()
    members = resolve_mixture_dirs(data_root_dir, data_mix, skip_missing_datasets=skip_missing_datasets)

    # Builders are made here, in this thread: tensorflow_datasets imports its modules lazily on first use, and two
    # threads doing that at once deadlock on Python's import locks.
    builders = [load_builder(dataset_dir) for _, _, dataset_dir in members]

    def one(index: int) -> tuple[str, dict[str, Any]]:
        config, _, dataset_dir = members[index]
        stats = dataset_statistics(builders[index], dataset_dir, config, options, recompute=recompute)
        return config.name, with_action_mask(stats, config)

    workers = max(1, min(len(members), num_workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, range(len(members))))
