"""`RLDSDataset`: the torch `IterableDataset` over one rank's tf.data pipeline (`rlds/`), with resumable position.

Built from one `StreamSpec` (`stream_spec.py`), which names everything that defines the stream. Iterate it with a
`DataLoader` with `num_workers=0` (the pipeline parallelises internally, and copies in worker
processes would repeat one stream). Each frame goes through a batch transform (`batch_transform.py`).

Resume: `frames_consumed` counts the frames the current iterator has yielded. `save_stream_state(dir)` writes the
rank's position without disturbing the live stream: positions, not frames. The pipeline runs under tf.data's
symbolic checkpointing and its shuffle is a window shuffle of a fixed order (`rlds/shuffle.py`), so the iterator's
state is cursors (the readers' files and offsets, the mixing RNG, the window being emitted and the index in it),
tens of KB whatever the buffer size. Frames leave tf.data in groups of `FRAMES_PER_FETCH`: the state saved is the
one from before the group being yielded, with the count of its frames already yielded. All is keyed by a
fingerprint of everything that defines the stream. `resume_from(n, dir)` restores that snapshot when it matches
(re-reading one shuffle window: time set by the buffer size, independent of n), and otherwise falls back to
skipping n frames (time linear in n). A prefetch thread (`prefetch.py`) runs the iterator ahead of the training
loop: it takes a `StreamMark` after each batch (`position_marker`) and the loop hands back the mark of each batch
it takes (`mark_consumed`), so `frames_consumed` and a snapshot are where the loop is, not where the thread is.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from prismatic.run_layout import DATA_SNAPSHOT_META, DATA_SNAPSHOT_STATE, data_snapshot_stem
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, write_text_atomic
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.discovery import tfrecord_errors
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec

logger = logging.getLogger(__name__)

FRAMES_PER_FETCH = 16
# Bump when the snapshot layout changes: older snapshots then resume by skipping. 1: a tf.data iterator checkpoint
# holding the shuffle buffer's frames; 2: the symbolic state (cursors) of the window-shuffled stream.
STREAM_STATE_FORMAT = 2


def _frame_at(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Frame `index` of a batched group of frames (nested dicts of arrays), as views."""
    return {k: _frame_at(v, index) if isinstance(v, Mapping) else v[index] for k, v in group.items()}


class _SnapshotUnusable(Exception):
    """Why a saved stream state cannot be resumed from (logged, then the stream resumes by skipping)."""


# The tf.data iterator's state is captured with the iterator's resource handle (`OwnedIterator._iterator_resource`,
# what `tf.train.Checkpoint` uses too): the public API can only write the live state to files, and a snapshot needs
# the state from before the group being yielded, kept in memory (a cheap copy under symbolic checkpointing).
def _capture_state(iterator: Any) -> Any:
    """The iterator's state now, as a variant tensor (a copy: it does not follow the iterator)."""
    tf = import_tensorflow()
    return tf.raw_ops.SerializeIterator(
        resource_handle=iterator._iterator_resource,
        external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE.value,
    )


def _state_bytes(state: Any) -> dict[str, np.ndarray]:
    """A captured state as byte arrays (one per slice, as TensorFlow serializes it), for `np.savez_compressed`."""
    tf = import_tensorflow()
    return {
        f"slice{i:05d}": np.frombuffer(tf.io.serialize_tensor(part).numpy(), np.uint8)
        for i, part in enumerate(tf.unstack(state))
    }


def _restore_state(iterator: Any, path: Path) -> None:
    """Restore `iterator` (fresh, over the dataset the state was captured from) from a `_state_bytes` file."""
    tf = import_tensorflow()
    with np.load(path, allow_pickle=False) as npz:
        parts = [tf.io.parse_tensor(npz[name].tobytes(), tf.variant) for name in sorted(npz.files)]
    tf.raw_ops.DeserializeIterator(resource_handle=iterator._iterator_resource, serialized=tf.stack(parts))


@dataclass(frozen=True)
class StreamMark:
    """A stream's position after some frame, as a snapshot records it; immutable, so a prefetch thread can take it
    after each batch and hand it over with the batch (the captured state is a copy, not the live iterator)."""

    state: Any  # `_capture_state` from before the group of frames being yielded (or the next one)
    group_frames_yielded: int  # frames of that group already yielded: a resume fetches it again, drops them
    group_size: int  # frames in that group (0 when none of it was yielded yet)
    frames_consumed: int  # counted from the stream's start
    start_sample: int  # of the dataset the iterator runs over: a restored iterator needs the same one


@dataclass
class _Stream:
    """One `iter()`'s position: the tf.data iterator over groups of frames, the group being yielded from (with the
    iterator's state from before it was fetched, and the index of its next frame), and the frames yielded so far
    counted from the stream's start."""

    groups: Any  # tf.data iterator over batches of FRAMES_PER_FETCH frames
    start_sample: int  # of the dataset `groups` iterates: a restored iterator needs the same one
    frames_consumed: int
    group: Mapping[str, Any] | None = None
    next_index: int = 0
    state_before_group: Any = None  # `_capture_state` before `group` was fetched (None: no group yet)

    def next_frame(self) -> dict[str, Any] | None:
        """The next raw frame, or None at the end of a finite (val) stream."""
        if self.group is None or self.next_index >= len(self.group["action"]):
            state = _capture_state(self.groups)
            group = next(self.groups, None)
            if group is None:
                return None
            # `_numpy()` as `as_numpy_iterator` does: views of the tensors' memory, no copy.
            self.group = import_tensorflow().nest.map_structure(lambda t: t._numpy(), group)
            self.next_index, self.state_before_group = 0, state
        frame = _frame_at(self.group, self.next_index)
        self.next_index += 1
        self.frames_consumed += 1
        return frame

    def mark(self) -> StreamMark:
        """Where a resume restarts now. Call from the thread iterating `groups` (at a group's end it reads the
        iterator's state: the one the next fetch would capture)."""
        if self.group is None or self.next_index >= len(self.group["action"]):
            return StreamMark(_capture_state(self.groups), 0, 0, self.frames_consumed, self.start_sample)
        group_size = len(self.group["action"])
        return StreamMark(
            self.state_before_group, self.next_index, group_size, self.frames_consumed, self.start_sample
        )


class RLDSDataset(IterableDataset):
    """Infinite (train) or single-pass (val) stream of transformed frames for one rank.

    Deterministic for `spec` (seed, rank, world_size, ...): every `iter()` restarts the same stream at
    `spec.start_sample` (or at the frame given to `resume_from`). `len()` is OpenVLA's dataset length, one mixture
    epoch across all ranks (`RLDSPipeline.dataset_length`: the summed transitions when every weight is 1.0).
    `dataset_statistics` holds every dataset's statistics in OpenVLA's layout (save it with
    `save_dataset_statistics`; inference needs it to un-normalise actions).

    Args:
        spec: everything that defines the stream (`StreamSpec`); kept as `self.spec`.
        batch_transform: raw frame -> what the loader yields (`RLDSBatchTransform` for training).
    """

    def __init__(self, spec: StreamSpec, batch_transform: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.spec, self.batch_transform = spec, batch_transform
        self.data_root_dir, self.data_mix, self.options = spec.data_root_dir, spec.data_mix, spec.options
        self.train, self.seed, self.rank, self.world_size = spec.train, spec.seed, spec.rank, spec.world_size
        pipeline = make_interleaved_dataset(spec)
        self.dataset = pipeline.dataset
        self.dataset_statistics = pipeline.dataset_statistics
        self.sample_weights = pipeline.sample_weights
        self.num_transitions = pipeline.num_transitions
        self.dataset_length = pipeline.dataset_length
        self.shuffle_buffer_gb = pipeline.shuffle_buffer_gb
        self.dataset_dirs = pipeline.dataset_dirs
        self._from_sample = pipeline.from_sample
        self._start_sample = spec.start_sample
        self._datasets = {spec.start_sample: pipeline.dataset}
        # The latest iterator's position, kept (with its tf.data iterator) after its consumer drops it, so that a
        # trainer whose loop has ended can still save it.
        self._stream: _Stream | None = None
        self._restored: _Stream | None = None  # what the next `iter()` continues, after a snapshot resume
        # Where the consumer of a prefetching loader stands (`mark_consumed`), behind the live iterator.
        self._consumed: StreamMark | None = None
        # Everything that defines this rank's stream (not where it started: a snapshot records that itself).
        self._fingerprint = json.loads(
            json.dumps(
                {
                    "data_mix": spec.data_mix,
                    "datasets": [f"{d.parent.name}/{d.name}" for d in pipeline.dataset_dirs],
                    "num_transitions": pipeline.num_transitions,
                    "seed": spec.seed,
                    "rank": spec.rank,
                    "world_size": spec.world_size,
                    "train": spec.train,
                    "shuffle_buffer_size": spec.shuffle_buffer_size if spec.train else None,
                    "resize_resolution": list(spec.resize_resolution),
                    "image_aug": bool(spec.image_aug and spec.train),
                    "window_size": spec.window_size,
                    "future_action_window_size": spec.future_action_window_size,
                    "data_options": spec.options.to_dict(),
                    "keep_raw_action": spec.keep_raw_action,
                    "image_views": list(pipeline.image_views),
                    "frames_per_fetch": FRAMES_PER_FETCH,
                }
            )
        )

    # === Iteration ===

    def _dataset_at(self, start_sample: int) -> Any:
        if start_sample not in self._datasets:
            self._datasets[start_sample] = self._from_sample(start_sample)
        return self._datasets[start_sample]

    def _open_stream(self, start_sample: int) -> _Stream:
        # Frames leave tf.data in groups: one NumPy conversion per group instead of per frame (~15% more frames/s
        # on 2 cores); each frame is then a view into its group's arrays.
        groups = iter(self._dataset_at(start_sample).batch(FRAMES_PER_FETCH))
        return _Stream(groups, start_sample, frames_consumed=start_sample)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "RLDSDataset must be loaded with num_workers=0: each worker would repeat the stream."
            )
        stream, self._restored = self._restored or self._open_stream(self._start_sample), None
        self._stream, self._consumed = stream, None
        return self._transformed(stream)

    def _transformed(self, stream: _Stream) -> Iterator[dict[str, Any]]:
        with tfrecord_errors(self.dataset_dirs):  # a damaged TFRecord is named, not a TensorFlow traceback
            while (frame := stream.next_frame()) is not None:
                yield self.batch_transform(frame)

    @property
    def frames_consumed(self) -> int:
        """Frames the current iterator has yielded (its consumer has taken, under `mark_consumed`), counted from the
        stream's start (any start offset included)."""
        if self._consumed is not None:
            return self._consumed.frames_consumed
        stream = self._stream or self._restored
        return stream.frames_consumed if stream is not None else self._start_sample

    def position_marker(self) -> Callable[[], StreamMark]:
        """A function giving the latest iterator's position each time it is called, bound to that iterator (a
        later `iter()` does not move it). Call it only from the thread iterating it (a prefetch thread: after each
        batch it made), or before anything iterates it: at a group's end it reads the tf.data iterator's state."""
        return (self._stream or self._restored or self._open_stream(self._start_sample)).mark

    def mark_consumed(self, mark: StreamMark) -> None:
        """Record that the consumer has taken every frame up to `mark` (one of the latest iterator's
        `position_marker` marks): `frames_consumed` and `save_stream_state` then report it, not the iterator
        running ahead, and read no state of that iterator. The next `iter()` or `resume_from` forgets it."""
        self._consumed = mark

    # === Resume ===

    def save_stream_state(self, directory: Path) -> None:
        """Write this rank's stream position into `directory` (created if needed), as `data-rankNNNNN.*`.

        Call between frames; the live iterator continues unchanged. After `mark_consumed`, it writes the marked
        position, and may be called while another thread iterates. Files: `.tfdata.npz` (the tf.data iterator's
        symbolic state from before the group of frames being yielded: cursors, no frames) and `.json`
        (fingerprint, `frames_consumed`, the frames of that group already yielded, file sizes), written last, so
        a crash mid-save leaves no state that loads. Per rank, not collective: every rank writes its own files
        into the same folder.
        """
        tf = import_tensorflow()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        mark = self._consumed or self.position_marker()()
        stem = data_snapshot_stem(self.rank)
        meta_path = directory / f"{stem}{DATA_SNAPSHOT_META}"
        # The .json goes first: the files below stop matching an older one as soon as they are rewritten.
        meta_path.unlink(missing_ok=True)
        for old in directory.glob(f"{stem}.*"):
            old.unlink()

        with atomic_write(directory / f"{stem}{DATA_SNAPSHOT_STATE}", "data stream state") as f:
            np.savez_compressed(f, **_state_bytes(mark.state))
        skip = mark.group_frames_yielded
        meta = {
            "format": STREAM_STATE_FORMAT,
            "fingerprint": self._fingerprint,
            "frames_consumed": mark.frames_consumed,
            "start_sample": mark.start_sample,
            "group_frames_yielded": skip,
            "leftover_frames": mark.group_size - skip if skip else 0,
            "files": {
                p.name: p.stat().st_size for p in sorted(directory.glob(f"{stem}.*")) if p != meta_path
            },
            "tensorflow": tf.__version__,
        }
        write_text_atomic(meta_path, json.dumps(meta, indent=1), "data stream state")

    def resume_from(self, frames: int, directory: Path | None) -> str:
        """Make the next `iter()` start at frame `frames` of this rank's stream; call before iterating.

        Returns "snapshot" when `directory` holds this rank's state with the same fingerprint at exactly `frames`
        (restored now: time independent of `frames`), else "skip": the stream will skip `frames` frames (time
        linear in `frames`; the reason the snapshot was not used is logged at INFO). Later `iter()` calls restart
        at `frames` by skipping.

        Raises:
            ConfigError: `frames` is negative.
        """
        if frames < 0:
            raise ConfigError(f"Cannot resume the data stream at frame {frames}: it must be >= 0.")
        self._stream = self._restored = self._consumed = None
        self._start_sample = frames
        try:
            if directory is None:
                raise _SnapshotUnusable("no checkpoint folder was given")
            self._restored = self._load_stream_state(Path(directory), frames)
        except _SnapshotUnusable as e:
            logger.info(
                "Data stream of rank %d resumes at frame %d by skipping (time linear in the frame count): the "
                "saved stream state was not used because %s.",
                self.rank,
                frames,
                e,
            )
            return "skip"
        logger.info("Data stream of rank %d resumes at frame %d from its saved state.", self.rank, frames)
        return "snapshot"

    def _load_stream_state(self, directory: Path, frames: int) -> _Stream:
        """The stream restored from `directory`.

        Raises:
            _SnapshotUnusable: saying why (missing, unreadable, other stream, other frame, damaged).
        """
        stem = data_snapshot_stem(self.rank)
        meta_path = directory / f"{stem}{DATA_SNAPSHOT_META}"
        if not meta_path.is_file():
            raise _SnapshotUnusable(f"'{meta_path}' does not exist")
        try:
            meta = json.loads(meta_path.read_text())
            fmt, saved_fingerprint = meta["format"], dict(meta["fingerprint"])
            saved_frames, start_sample = int(meta["frames_consumed"]), int(meta["start_sample"])
            skip, files = (
                int(meta["group_frames_yielded"]),
                {str(k): int(v) for k, v in meta["files"].items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise _SnapshotUnusable(f"'{meta_path}' cannot be read ({type(e).__name__}: {e})") from e
        if fmt != STREAM_STATE_FORMAT:
            raise _SnapshotUnusable(
                f"'{meta_path}' has format {fmt!r}, this code reads {STREAM_STATE_FORMAT}"
            )
        changed = [
            f"{key} {saved_fingerprint.get(key)!r} -> {self._fingerprint.get(key)!r}"
            for key in sorted(set(saved_fingerprint) | set(self._fingerprint))
            if saved_fingerprint.get(key) != self._fingerprint.get(key)
        ]
        if changed:
            raise _SnapshotUnusable(f"it was saved for another stream ({'; '.join(changed)})")
        if saved_frames != frames:
            raise _SnapshotUnusable(f"it was saved at frame {saved_frames}, not {frames}")
        for name, size in files.items():
            path = directory / name
            if not path.is_file() or path.stat().st_size != size:
                raise _SnapshotUnusable(
                    f"'{path}' is missing or does not have the {size} bytes it was saved with"
                )

        groups = iter(self._dataset_at(start_sample).batch(FRAMES_PER_FETCH))
        stream = _Stream(groups, start_sample, frames_consumed=frames - skip)
        try:
            _restore_state(groups, directory / f"{stem}{DATA_SNAPSHOT_STATE}")
            # Back to where the save was: the group being yielded then is fetched again, its first frames dropped.
            for _ in range(skip):
                if stream.next_frame() is None:
                    raise _SnapshotUnusable(f"the stream ended within the {skip} frames it was saved after")
        except _SnapshotUnusable:
            raise
        except Exception as e:  # noqa: BLE001 (tf, numpy and zip errors alike: a damaged snapshot)
            reason = " ".join(str(e).split())[:300]
            raise _SnapshotUnusable(f"it cannot be restored ({type(e).__name__}: {reason})") from e
        return stream

    def __len__(self) -> int:
        return self.dataset_length

    def __getitem__(self, index: int) -> Any:
        raise TypeError("RLDSDataset is an IterableDataset; iterate over it instead of indexing.")
