"""The shuffle buffer's memory: its RAM budget, the bytes one buffered frame takes, and the check that it fits.

Frames are shuffled while their images are still encoded (a buffer of JPEG bytes is ~50x smaller than one of
decoded images), so a large buffer is cheap; a buffer that would not fit its budget is refused before training
starts instead of being killed by the OOM killer hours later. The shuffle (`shuffle.py`) holds at most two windows
of `shuffle_buffer_size // 2` frames (the one being emitted and the next, being read), so its peak is
`shuffle_buffer_size` buffered frames, the figure checked here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig
from prismatic.vla.datasets.rlds.discovery import tfrecord_errors
from prismatic.vla.datasets.rlds.trajectories import trajectory_dataset

SHUFFLE_BUFFER_RAM_ENV = (
    "PRISMATIC_SHUFFLE_BUFFER_GB"  # overrides the default RAM budget of the shuffle buffer
)
DEFAULT_RAM_FRACTION = 0.5  # of physical RAM, shared by the ranks of one node (LOCAL_WORLD_SIZE)
# What tf.data keeps per buffered frame beyond the payload bytes: ~6 tensors (handles, shapes, allocations).
FRAME_OVERHEAD_BYTES = 1024
# RSS per buffered byte, from malloc's bookkeeping and fragmentation: measured 39-47 KB of RSS per 38 KB frame on
# Bridge-like data with the arena cap of `prismatic/util/malloc.py` (75 KB without it).
ALLOCATOR_OVERHEAD = 1.15


def default_shuffle_buffer_ram_gb() -> float:
    """RAM budget (GiB) of one rank's shuffle buffer: `$PRISMATIC_SHUFFLE_BUFFER_GB` if set, else half the
    machine's physical RAM divided among the node's ranks (`$LOCAL_WORLD_SIZE`, set by torchrun)."""
    value = os.environ.get(SHUFFLE_BUFFER_RAM_ENV)
    if value:
        try:
            budget = float(value)
        except ValueError:
            raise ConfigError(f"${SHUFFLE_BUFFER_RAM_ENV} must be a number of GiB, got '{value}'.") from None
        if budget <= 0:
            raise ConfigError(f"${SHUFFLE_BUFFER_RAM_ENV} must be > 0, got {budget}.")
        return budget
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return DEFAULT_RAM_FRACTION * physical / local_ranks / 2**30


def estimate_frame_bytes(
    builder: Any,
    split: str,
    config: RLDSDatasetConfig,
    num_trajectories: int = 2,
    options: DataOptions | None = None,
    image_views: Sequence[str] = ("primary",),
) -> float:
    """Mean bytes one frame occupies in the shuffle buffer, measured on the first trajectories of `split`.

    Buffered frames hold the *encoded* images of `image_views`, the instruction, the dataset name, action and
    proprio (everything else was dropped by `restructure`), plus `FRAME_OVERHEAD_BYTES` of tf.data bookkeeping,
    times the `ALLOCATOR_OVERHEAD` measured for those allocations.
    """
    total, count = 0, 0
    trajectories = trajectory_dataset(
        builder, split, config, options or DataOptions(), image_views=image_views
    ).take(num_trajectories)
    with tfrecord_errors([Path(builder.data_dir)]):
        for traj in trajectories.as_numpy_iterator():
            num_steps = len(traj["action"])
            for view in image_views:
                total += sum(len(b) for b in traj["observation"][f"image_{view}"])
            total += sum(len(b) for b in traj["task"]["language_instruction"]) + num_steps * len(config.name)
            total += traj["action"].nbytes + traj["observation"].get("proprio", traj["action"][:, :0]).nbytes
            count += num_steps
    return (total / max(count, 1) + FRAME_OVERHEAD_BYTES) * ALLOCATOR_OVERHEAD


def check_shuffle_buffer_fits(
    shuffle_buffer_size: int, frame_bytes: float, budget_gb: float, *, budget_source: str
) -> None:
    """Refuse a shuffle buffer whose estimated size exceeds `budget_gb` GiB.

    Raises:
        ConfigError: naming the estimate, the budget (and where it came from) and the largest size that fits.
    """
    need_gb = shuffle_buffer_size * frame_bytes / 2**30
    if need_gb > budget_gb:
        largest = int(budget_gb * 2**30 // frame_bytes)
        raise ConfigError(
            f"shuffle_buffer_size={shuffle_buffer_size} would hold about {need_gb:.2f} GiB of frames "
            f"(~{frame_bytes / 1024:.1f} KiB each, images still encoded), more than the shuffle buffer's RAM budget "
            f"of {budget_gb:.2f} GiB ({budget_source}). The largest shuffle_buffer_size that fits is {largest}; "
            f"lower it, or raise the budget with shuffle_buffer_ram_gb=... or ${SHUFFLE_BUFFER_RAM_ENV}."
        )


def shuffle_buffer_budget(shuffle_buffer_ram_gb: float | None) -> tuple[float, str]:
    """(budget in GiB, where it came from): the argument when given, else `default_shuffle_buffer_ram_gb()`."""
    if shuffle_buffer_ram_gb is not None:
        return shuffle_buffer_ram_gb, "shuffle_buffer_ram_gb argument"
    budget = default_shuffle_buffer_ram_gb()
    if os.environ.get(SHUFFLE_BUFFER_RAM_ENV):
        return budget, f"${SHUFFLE_BUFFER_RAM_ENV}"
    return budget, f"default: {DEFAULT_RAM_FRACTION:.0%} of physical RAM / local ranks"
