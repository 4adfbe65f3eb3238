"""The data-stream snapshot holds positions, not frames (`rlds/shuffle.py`, `RLDSDataset.save_stream_state`).

Expected frames come from the uninterrupted stream of the plain tf.data pipeline (`RLDSDataset.dataset`); the
expected shuffle order is restated here from its definition (TensorFlow's `stateless_shuffle` of each window's
positions, seeded with (seed, window index)), never read from the code under test.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prismatic.vla.datasets import RLDSDataset
from prismatic.vla.datasets.datasets import STREAM_STATE_FORMAT
from prismatic.vla.datasets.rlds.shuffle import window_shuffle
from prismatic.vla.datasets.stream_spec import StreamSpec

LOGGER = "prismatic.vla.datasets.datasets"
STREAM = {"resize_resolution": (32, 32), "shuffle_buffer_size": 64, "seed": 5}


@functools.cache
def _dataset(root: Path, role: str, **kwargs: Any) -> RLDSDataset:
    """One dataset per (role, stream): a "writer" iterates and saves, a "reader" resumes (never the same object)."""
    return RLDSDataset(StreamSpec(root, "toy", **{**STREAM, **kwargs}), lambda frame: frame)


def _keys(frames: Any, count: int) -> list[bytes]:
    return [
        f["action"].tobytes() + f["observation"]["image_primary"].tobytes()
        for f in itertools.islice(frames, count)
    ]


def _expected(dataset: RLDSDataset, start: int, count: int) -> list[bytes]:
    return _keys(itertools.islice(dataset.dataset.as_numpy_iterator(), start, None), count)


def _shuffled(count: int, buffer_size: int, seed: int, start: int = 0) -> list[int]:
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    shuffled = window_shuffle(tf.data.Dataset.range(count), buffer_size, seed, start)
    pairs = list(shuffled.as_numpy_iterator())
    assert [int(index) for index, _ in pairs] == list(range(start, count))  # numbered as `enumerate()` would
    return [int(frame) for _, frame in pairs]


def _stateless_order(length: int, seed: int, window: int) -> np.ndarray:
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    return tf.random.experimental.stateless_shuffle(
        tf.range(length, dtype=tf.int64), seed=tf.constant([seed, window], tf.int64)
    ).numpy()


def test_each_window_of_half_the_buffer_leaves_in_an_order_of_its_seed_and_index() -> None:
    buffer_size, seed, count = 20, 123, 47  # windows of 10: four full ones and a last one of 7
    got = _shuffled(count, buffer_size, seed)
    expected = []
    for window, begin in enumerate(range(0, count, 10)):
        length = min(10, count - begin)
        expected += [begin + int(i) for i in _stateless_order(length, seed, window)]
    assert got == expected
    assert sorted(got[:10]) == list(range(10)) and got[:10] != list(range(10))
    assert _shuffled(count, buffer_size, seed) == got  # a function of the seed alone
    assert _shuffled(count, buffer_size, seed + 1) != got


@pytest.mark.parametrize("start", [1, 10, 23, 40, 47])
def test_a_start_drops_exactly_that_many_outputs(start: int) -> None:
    assert _shuffled(47, 20, 5, start) == _shuffled(47, 20, 5)[start:]


@pytest.mark.parametrize(("buffer_size", "window"), [(1, 1), (2, 1), (3, 1), (7, 3)])
def test_small_and_odd_buffers_hold_two_windows_at_most(buffer_size: int, window: int) -> None:
    got = _shuffled(24, buffer_size, seed=9)
    assert 2 * window <= max(buffer_size, 2)
    for begin in range(0, 24, window):
        assert sorted(got[begin : begin + window]) == list(range(begin, min(begin + window, 24)))
    if window == 1:
        assert got == list(range(24))


def test_the_snapshot_holds_no_frames_and_does_not_grow_with_the_buffer_or_the_frames(
    toy_data_root: Path, tmp_path: Path
) -> None:
    sizes = {}
    for buffer_size, frames in [(64, 40), (2048, 40), (64, 1500), (2048, 1500), (64, 4000)]:
        writer = RLDSDataset(
            StreamSpec(toy_data_root, "toy", **{**STREAM, "shuffle_buffer_size": buffer_size}), lambda f: f
        )
        _keys(iter(writer), frames)
        folder = tmp_path / f"{buffer_size}-{frames}"
        writer.save_stream_state(folder)
        assert sorted(p.name for p in folder.iterdir()) == [
            "data-rank00000.json",
            "data-rank00000.tfdata.npz",
        ]
        sizes[buffer_size, frames] = sum(p.stat().st_size for p in folder.iterdir())
    # A buffered toy frame is ~1.2 KB of JPEG: the 2048-frame buffer would be ~2.4 MB; cursors of the two
    # datasets' readers are ~35 KB (more once every reader has opened its files, then flat).
    assert max(sizes.values()) < 100_000, sizes
    for frames in (40, 1500):
        assert abs(sizes[2048, frames] - sizes[64, frames]) < 200, sizes
    assert abs(sizes[64, 4000] - sizes[64, 1500]) < 200, sizes


@pytest.mark.parametrize("num_frames", [96, 100, 1400], ids=["window-edge", "mid-group", "many-windows"])
def test_resume_continues_the_uninterrupted_stream(
    toy_data_root: Path, tmp_path: Path, num_frames: int
) -> None:
    writer = _dataset(toy_data_root, "writer")
    live = iter(writer)
    _keys(live, num_frames)
    writer.save_stream_state(tmp_path)
    meta = json.loads((tmp_path / "data-rank00000.json").read_text())
    assert meta["format"] == STREAM_STATE_FORMAT == 2
    assert meta["group_frames_yielded"] == num_frames % 16

    reader = _dataset(toy_data_root, "reader")
    expected = _expected(reader, num_frames, 40)
    assert reader.resume_from(num_frames, tmp_path) == "snapshot"
    assert _keys(iter(reader), 40) == expected
    assert _keys(live, 40) == expected  # the save left the live stream alone


def test_a_save_right_after_a_snapshot_resume_resumes_exactly(toy_data_root: Path, tmp_path: Path) -> None:
    writer = _dataset(toy_data_root, "writer")
    _keys(iter(writer), 37)
    writer.save_stream_state(tmp_path / "first")
    middle = _dataset(toy_data_root, "middle")
    assert middle.resume_from(37, tmp_path / "first") == "snapshot"
    middle.save_stream_state(tmp_path / "second")  # restored, not iterated yet

    reader = _dataset(toy_data_root, "reader")
    expected = _expected(reader, 37, 30)
    assert reader.resume_from(37, tmp_path / "second") == "snapshot"
    assert _keys(iter(reader), 30) == expected
    assert _keys(iter(middle), 30) == expected


def test_a_save_before_iterating_a_skipped_stream_resumes_exactly(
    toy_data_root: Path, tmp_path: Path
) -> None:
    """Resumed by skipping to frame 30, saved before a frame was taken (the skip has not run yet), resumed."""
    writer = _dataset(toy_data_root, "skipped-writer")
    assert writer.resume_from(30, None) == "skip"
    writer.save_stream_state(tmp_path)

    reader = _dataset(toy_data_root, "reader")
    expected = _expected(reader, 30, 20)
    assert reader.resume_from(30, tmp_path) == "snapshot"
    assert _keys(iter(reader), 20) == expected
    assert _keys(iter(writer), 20) == expected


def test_an_older_snapshot_format_resumes_by_skipping(
    toy_data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = _dataset(toy_data_root, "writer")
    _keys(iter(writer), 30)
    writer.save_stream_state(tmp_path)
    meta_path = tmp_path / "data-rank00000.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "format": 1}))
    caplog.set_level(logging.INFO, logger=LOGGER)

    reader = _dataset(toy_data_root, "reader")
    expected = _expected(reader, 30, 20)
    assert reader.resume_from(30, tmp_path) == "skip"
    assert "has format 1, this code reads 2" in caplog.text
    assert _keys(iter(reader), 20) == expected
