"""`BatchPrefetcher` (`--vla.speed.prefetch_batches`): the loader's batches made ahead on a thread, resume kept exact.

Expected batches always come from a plain `DataLoader` over an uninterrupted stream (no thread, no snapshot),
never from the code under test. Each stream's thread is made to run ahead (its queue full) before a snapshot.
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from prismatic.conf.speed import SpeedConfig
from prismatic.conf.vla import VLAConfig
from prismatic.models.backbones.llm.prompting.base_prompter import PurePromptBuilder
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets import PaddedCollatorForActionPrediction, RLDSBatchTransform, RLDSDataset
from prismatic.vla.datasets.prefetch import BatchPrefetcher, prefetched
from prismatic.vla.datasets.stream_spec import StreamSpec

# Two-dataset mixture ("toy"), shuffled, image augmentation on (tf.data's seeded RNG); 16 frames per fetch.
STREAM = {"resize_resolution": (32, 32), "shuffle_buffer_size": 64, "seed": 7, "image_aug": True}
DEPTH = 3


def _to_tensor(image: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).float() / 255


@functools.cache
def _dataset(root: Path, role: str, tokenizer: Any) -> RLDSDataset:
    """One dataset per role: a "writer" iterates and saves, a "reader" resumes (never the same object)."""
    transform = RLDSBatchTransform(ActionTokenizer(tokenizer), tokenizer, _to_tensor, PurePromptBuilder)
    return RLDSDataset(StreamSpec(root, "toy", **STREAM), transform)


def _loader(dataset: RLDSDataset, batch_size: int, tokenizer: Any, collate: Any = None) -> DataLoader:
    collator = collate or PaddedCollatorForActionPrediction(64, tokenizer.pad_token_id)
    return DataLoader(dataset, batch_size=batch_size, collate_fn=collator, num_workers=0)


@functools.cache
def _expected(root: Path, tokenizer: Any, batch_size: int) -> list[dict[str, Any]]:
    """The first 16 batches of the uninterrupted stream, through a plain loader on this thread."""
    return list(
        itertools.islice(iter(_loader(_dataset(root, "reference", tokenizer), batch_size, tokenizer)), 16)
    )


def _assert_same_batches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(got) == len(expected)
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        assert mine.keys() == theirs.keys(), index
        for key, value in theirs.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(mine[key], value), (index, key)
            else:
                assert mine[key] == value, (index, key)


def _wait_until_ahead(batches: BatchPrefetcher) -> None:
    deadline = time.monotonic() + 600  # a hang guard: the thread is slow on a loaded machine, not wrong
    while batches.ready < DEPTH:
        assert time.monotonic() < deadline, "the prefetch thread did not fill its queue"
        time.sleep(0.01)


def test_prefetched_batches_are_the_loader_s(toy_data_root: Path, tiny_tokenizer: Any) -> None:
    writer = _dataset(toy_data_root, "writer", tiny_tokenizer)
    for depth in (1, DEPTH):
        with BatchPrefetcher(_loader(writer, 6, tiny_tokenizer), depth) as batches:
            _assert_same_batches(
                list(itertools.islice(batches, 16)), _expected(toy_data_root, tiny_tokenizer, 6)
            )
            assert writer.frames_consumed == 16 * 6
        assert not batches.thread.is_alive()


@pytest.mark.parametrize(
    ("batch_size", "taken", "write_ahead", "read_ahead"),
    [(4, 4, True, False), (6, 3, True, True), (4, 3, False, True)],
    ids=["group-end-on-to-off", "mid-group-on-to-on", "mid-group-off-to-on"],
)
def test_a_snapshot_records_the_batches_taken_not_the_thread_s(
    toy_data_root: Path,
    tiny_tokenizer: Any,
    tmp_path: Path,
    batch_size: int,
    taken: int,
    write_ahead: bool,
    read_ahead: bool,
) -> None:
    expected = _expected(toy_data_root, tiny_tokenizer, batch_size)
    writer = _dataset(toy_data_root, "writer", tiny_tokenizer)
    loader = _loader(writer, batch_size, tiny_tokenizer)
    with BatchPrefetcher(loader, DEPTH) if write_ahead else prefetched(loader, 0) as live:
        _assert_same_batches([next(live) for _ in range(taken)], expected[:taken])
        if write_ahead:
            _wait_until_ahead(live)
        assert writer.frames_consumed == taken * batch_size
        writer.save_stream_state(tmp_path)
        # The save did not disturb the live stream.
        _assert_same_batches([next(live) for _ in range(4)], expected[taken : taken + 4])

    meta = json.loads((tmp_path / "data-rank00000.json").read_text())
    assert meta["frames_consumed"] == taken * batch_size
    assert meta["group_frames_yielded"] == taken * batch_size % 16
    reader = _dataset(toy_data_root, "reader", tiny_tokenizer)
    assert reader.resume_from(taken * batch_size, tmp_path) == "snapshot"
    with prefetched(_loader(reader, batch_size, tiny_tokenizer), DEPTH if read_ahead else 0) as resumed:
        _assert_same_batches(list(itertools.islice(resumed, 6)), expected[taken : taken + 6])
    assert reader.frames_consumed == (taken + 6) * batch_size


class _Broken(Exception):
    """Raised by the collator on its third batch."""


def test_an_error_reaches_the_consumer_in_order_and_close_stops_the_thread(
    toy_data_root: Path, tiny_tokenizer: Any
) -> None:
    writer = _dataset(toy_data_root, "writer", tiny_tokenizer)
    collator = PaddedCollatorForActionPrediction(64, tiny_tokenizer.pad_token_id)
    calls = itertools.count()
    error = _Broken("batch 2 has a damaged frame")

    def collate(instances: list[dict[str, Any]]) -> dict[str, Any]:
        if next(calls) == 2:
            raise error
        return collator(instances)

    batches = BatchPrefetcher(_loader(writer, 4, tiny_tokenizer, collate), DEPTH)
    _assert_same_batches([next(batches), next(batches)], _expected(toy_data_root, tiny_tokenizer, 4)[:2])
    with pytest.raises(_Broken, match="^batch 2 has a damaged frame$") as raised:
        next(batches)
    assert raised.value is error
    assert not batches.thread.is_alive()
    with pytest.raises(StopIteration):
        next(batches)

    # Closed while ahead: the thread ends; a fresh one restarts the stream.
    batches = BatchPrefetcher(_loader(writer, 4, tiny_tokenizer), DEPTH)
    next(batches)
    _wait_until_ahead(batches)
    batches.close()
    assert not batches.thread.is_alive()
    assert writer.frames_consumed == 4
    fresh = BatchPrefetcher(_loader(writer, 4, tiny_tokenizer), DEPTH)
    _assert_same_batches([next(fresh)], _expected(toy_data_root, tiny_tokenizer, 4)[:1])
    # Leaving `prefetched` on an interrupt (Ctrl-C, a preemption) stops its thread.
    with (
        pytest.raises(KeyboardInterrupt),
        prefetched(_loader(writer, 4, tiny_tokenizer), DEPTH) as interrupted,
    ):
        next(interrupted)
        raise KeyboardInterrupt
    assert not interrupted.thread.is_alive()
    # Dropped without close(): collected, and its thread ends.
    thread = fresh.thread
    del fresh
    gc.collect()
    thread.join(timeout=600)  # returns as soon as the thread ends; the bound only stops a hang
    assert not thread.is_alive()


def test_a_finite_loader_ends_with_stop_iteration() -> None:
    batches = BatchPrefetcher(DataLoader(list(range(10)), batch_size=3), 2)
    assert [b.tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert not batches.thread.is_alive()
    with prefetched(DataLoader(list(range(4)), batch_size=3), 0) as plain:
        assert not isinstance(plain, BatchPrefetcher)
        assert [b.tolist() for b in plain] == [[0, 1, 2], [3]]


def test_a_negative_prefetch_depth_is_a_config_error() -> None:
    assert VLAConfig().speed.prefetch_batches == 0
    with pytest.raises(
        ConfigError, match=r"^--vla.speed.prefetch_batches=-1 is out of range: it must be an integer >= 0"
    ):
        VLAConfig(speed=SpeedConfig(prefetch_batches=-1))
