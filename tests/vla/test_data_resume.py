"""Resuming a rank's data stream: `RLDSDataset.save_stream_state` / `resume_from` / `frames_consumed`.

Expected frames always come from an uninterrupted stream of the plain tf.data pipeline (`RLDSDataset.dataset`,
the stream `make_interleaved_dataset` built), never from the resume code under test.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from prismatic.vla.datasets import RLDSDataset
from prismatic.vla.datasets.stream_spec import StreamSpec

# Two-dataset mixture ("toy"), shuffled; 16 frames per tf.data fetch, so 37 ends mid-group.
STREAM = {"resize_resolution": (32, 32), "shuffle_buffer_size": 64, "seed": 3}
LOGGER = "prismatic.vla.datasets.datasets"


@functools.cache
def _dataset(root: Path, role: str, **kwargs: Any) -> RLDSDataset:
    """One dataset per (role, stream), shared by the tests: building one costs seconds, iterating it little.

    A "writer" iterates and saves, a "reader" resumes: never the same object, as after a restart.
    """
    return RLDSDataset(StreamSpec(root, "toy", **{**STREAM, **kwargs}), lambda frame: frame)


def _expected(dataset: RLDSDataset, start: int, count: int) -> list[dict]:
    """Frames start..start+count of the uninterrupted stream of the plain tf.data pipeline."""
    return list(itertools.islice(dataset.dataset.as_numpy_iterator(), start, start + count))


def _assert_same_frames(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        where = f"frame {index}"
        assert np.array_equal(mine["observation"]["image_primary"], theirs["observation"]["image_primary"]), (
            where
        )
        assert np.array_equal(mine["observation"].get("proprio"), theirs["observation"].get("proprio")), where
        assert (mine["action"] == theirs["action"]).all(), where
        assert mine["task"]["language_instruction"] == theirs["task"]["language_instruction"], where
        assert mine["dataset_name"] == theirs["dataset_name"], where


def _take(iterator: Any, count: int) -> list[dict]:
    return list(itertools.islice(iterator, count))


@pytest.mark.parametrize(
    ("start_sample", "num_frames", "image_aug"),
    [(0, 37, True), (0, 48, False), (0, 1005, False), (20, 37, True)],
    ids=["mid-group-aug", "group-boundary", "past-an-epoch", "after-a-skip-start"],
)
def test_snapshot_resume_continues_the_uninterrupted_stream(
    toy_data_root: Path, tmp_path: Path, start_sample: int, num_frames: int, image_aug: bool
) -> None:
    reader = _dataset(toy_data_root, "reader", image_aug=image_aug)
    expected = _expected(reader, num_frames, 60)
    writer = _dataset(toy_data_root, "writer", image_aug=image_aug, start_sample=start_sample)
    live = iter(writer)
    _take(live, num_frames - start_sample)
    assert writer.frames_consumed == num_frames  # counted from the stream's start, offset included
    writer.save_stream_state(tmp_path)

    assert reader.resume_from(num_frames, tmp_path) == "snapshot"
    _assert_same_frames(_take(iter(reader), 60), expected)
    assert reader.frames_consumed == num_frames + 60

    # The save did not disturb the live iterator.
    _assert_same_frames(_take(live, 60), expected)
    assert writer.frames_consumed == num_frames + 60


def test_other_stream_or_frame_count_falls_back_to_skipping(
    toy_data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = _dataset(toy_data_root, "writer", image_aug=False, start_sample=0)
    _take(iter(writer), 37)
    writer.save_stream_state(tmp_path)
    caplog.set_level(logging.INFO, logger=LOGGER)

    cases = [
        ({"seed": 4}, 37, tmp_path, "seed 3 -> 4"),
        ({"rank": 0, "world_size": 2}, 37, tmp_path, "world_size 1 -> 2"),
        ({"image_aug": False}, 36, tmp_path, "saved at frame 37, not 36"),
        ({"image_aug": False}, 37, tmp_path / "missing", "does not exist"),
        ({"image_aug": False}, 37, None, "no checkpoint folder"),
    ]
    for kwargs, frames, directory, reason in cases:
        caplog.clear()
        reader = _dataset(toy_data_root, "reader", **kwargs)
        assert reader.resume_from(frames, directory) == "skip", reason
        assert reason in caplog.text
        _assert_same_frames(_take(iter(reader), 20), _expected(reader, frames, 20))


def test_ranks_write_and_restore_their_own_files(toy_data_root: Path, tmp_path: Path) -> None:
    ranks = {0: 21, 1: 24}  # frames consumed per rank
    for rank, num_frames in ranks.items():
        writer = _dataset(toy_data_root, "writer", rank=rank, world_size=2)
        # As the trainer pulls frames: a DataLoader with num_workers=0 takes exactly the frames it batches.
        batch_size = 7 if rank == 0 else 6
        loader = iter(DataLoader(writer, batch_size=batch_size, num_workers=0, collate_fn=list))
        for _ in range(num_frames // batch_size):
            next(loader)
        assert writer.frames_consumed == num_frames
        writer.save_stream_state(tmp_path)

    assert {p.name.split(".")[0] for p in tmp_path.iterdir()} == {"data-rank00000", "data-rank00001"}
    for rank, num_frames in ranks.items():
        reader = _dataset(toy_data_root, "reader", rank=rank, world_size=2)
        assert reader.resume_from(num_frames, tmp_path) == "snapshot"
        _assert_same_frames(_take(iter(reader), 30), _expected(reader, num_frames, 30))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _scramble(path: Path) -> None:
    """Same size, garbage content (a size check alone cannot tell)."""
    data = bytearray(path.read_bytes())
    start = len(data) // 4
    data[start:] = np.random.default_rng(0).integers(0, 256, len(data) - start, np.uint8).tobytes()
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def saved_state(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stream state saved at frame 37 (with 11 fetched frames not yet yielded: fetched again on resume)."""
    directory = tmp_path_factory.mktemp("stream_state")
    writer = _dataset(toy_data_root, "writer", image_aug=False, start_sample=0)
    _take(iter(writer), 37)
    writer.save_stream_state(directory)
    return directory


@pytest.mark.parametrize(
    ("suffix", "damage", "reason"),
    [
        (".tfdata.npz", _truncate, "does not have the"),
        (".tfdata.npz", _scramble, "cannot be restored"),
        (".json", _truncate, "cannot be read"),
    ],
    ids=["truncated-state", "scrambled-state", "truncated-json"],
)
def test_damaged_snapshot_falls_back_to_skipping(
    toy_data_root: Path,
    saved_state: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    suffix: str,
    damage: Any,
    reason: str,
) -> None:
    directory = tmp_path / "state"
    shutil.copytree(saved_state, directory)
    assert json.loads((directory / "data-rank00000.json").read_text())["leftover_frames"] == 11
    damage(directory / f"data-rank00000{suffix}")
    caplog.set_level(logging.INFO, logger=LOGGER)

    reader = _dataset(toy_data_root, "reader", image_aug=False)
    assert reader.resume_from(37, directory) == "skip"
    assert reason in caplog.text and "by skipping" in caplog.text
    _assert_same_frames(_take(iter(reader), 20), _expected(reader, 37, 20))
