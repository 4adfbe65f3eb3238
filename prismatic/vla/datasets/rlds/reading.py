"""The public read API, for people checking their data: standardised trajectories and statistics of a dataset.

    from prismatic.vla.datasets.rlds.reading import read_trajectories, compute_dataset_statistics

    for traj in read_trajectories("data/rlds", "my_robot", split="train"):
        print(traj["episode_id"], traj["timestep"][-1] + 1, traj["action"].mean(0))
    stats = compute_dataset_statistics("data/rlds", "my_robot")  # what training normalises with

Trajectories are what the training pipeline reads before normalisation: the dataset's standardisation function
applied, proprio built from the config's state keys, no filtering. Statistics are the very cache training reads
(`DataOptions` choose the split and the handling of NaN / inf), so both tools agree with training by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import get_dataset_config
from prismatic.vla.datasets.rlds.dataset import (
    _read_trajectories,
    _split_name,
    dataset_statistics,
    find_dataset_dir,
    load_builder,
    mixture_statistics,
    tfrecord_errors,
)
from prismatic.vla.datasets.rlds.statistics import with_action_mask

__all__ = ["compute_dataset_statistics", "mixture_statistics", "read_trajectories"]


def _resolve_split(builder: Any, split: str) -> str:
    """ "train" / "val" as the pipeline reads them (without a val split: train[:95%] / train[95%:]), "all", or any
    split the dataset has (tfds slicing syntax allowed)."""
    if split in ("train", "val"):
        return _split_name(builder, train=split == "train")
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
    trajectories = _read_trajectories(
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
