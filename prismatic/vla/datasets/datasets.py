"""`RLDSDataset`: the torch `IterableDataset` over one rank's tf.data pipeline (`rlds/`), with resumable position.

Built from one `StreamSpec` (`stream_spec.py`), which names everything that defines the stream. Iterate it with a
`DataLoader` with `num_workers=0` (the pipeline parallelises internally, and copies in worker
processes would repeat one stream). Each frame goes through a batch transform (`batch_transform.py`).

Resume: `frames_consumed` counts the frames the current iterator has yielded. `save_stream_state(dir)` writes the
rank's position without disturbing the live stream: a checkpoint of the tf.data iterator (readers' positions,
shuffle buffer, in-flight frames; see `rlds/interleave.py`) plus the frames of the last fetched group not yet
yielded (frames leave tf.data in groups of `FRAMES_PER_FETCH`), keyed by a fingerprint of everything that
defines the stream. `resume_from(n, dir)` restores that snapshot when it matches (time independent of n), and
otherwise falls back to skipping n frames (time linear in n).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, write_text_atomic
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.discovery import tfrecord_errors
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec

logger = logging.getLogger(__name__)

FRAMES_PER_FETCH = 16
STREAM_STATE_FORMAT = 1  # bump when the snapshot layout changes: older snapshots then resume by skipping


def _frame_at(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Frame `index` of a batched group of frames (nested dicts of arrays), as views."""
    return {k: _frame_at(v, index) if isinstance(v, Mapping) else v[index] for k, v in group.items()}


class _SnapshotUnusable(Exception):
    """Why a saved stream state cannot be resumed from (logged, then the stream resumes by skipping)."""


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, np.ndarray]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _save_frames(file: IO[bytes], group: Mapping[str, Any], start: int) -> None:
    """Write frames `start:` of a fetched group to `file` (.npz, no pickle); strings as bytes + lengths."""
    arrays = {}
    for key, value in _flatten(group).items():
        rest = np.asarray(value[start:])
        if rest.dtype == object:  # tf.string leaves arrive as object arrays of bytes
            items = [bytes(b) for b in rest.ravel()]
            arrays[f"{key}:bytes"] = np.frombuffer(b"".join(items), np.uint8)
            arrays[f"{key}:lengths"] = np.array([len(b) for b in items], np.int64).reshape(rest.shape)
        else:
            arrays[key] = rest
    np.savez(file, **arrays)


def _load_frames(path: Path) -> dict[str, Any]:
    """Inverse of `_save_frames`: the nested group of frames, strings back as object arrays of bytes."""
    group: dict[str, Any] = {}
    with np.load(path, allow_pickle=False) as npz:
        for name in npz.files:
            if name.endswith(":lengths"):
                continue
            if name.endswith(":bytes"):
                key = name.removesuffix(":bytes")
                data, lengths = npz[name].tobytes(), npz[f"{key}:lengths"]
                ends = np.cumsum(lengths.ravel())
                items = [data[end - n : end] for end, n in zip(ends, lengths.ravel(), strict=True)]
                value = np.empty(len(items), object)
                value[:] = items
                value = value.reshape(lengths.shape)
            else:
                key, value = name, npz[name]
            *parents, leaf = key.split(".")
            node = group
            for parent in parents:
                node = node.setdefault(parent, {})
            node[leaf] = value
    return group


@dataclass
class _Stream:
    """One `iter()`'s position: the tf.data iterator over groups of frames, the group being yielded from (and the
    index of its next frame), and the frames yielded so far counted from the stream's start."""

    groups: Any  # tf.data NumPy iterator over batches of FRAMES_PER_FETCH frames
    start_sample: int  # of the dataset `groups` iterates: a restored iterator needs the same one
    frames_consumed: int
    group: Mapping[str, Any] | None = None
    next_index: int = 0

    def next_frame(self) -> dict[str, Any] | None:
        """The next raw frame, or None at the end of a finite (val) stream."""
        if self.group is None or self.next_index >= len(self.group["action"]):
            group = next(self.groups, None)
            if group is None:
                return None
            self.group, self.next_index = group, 0
        frame = _frame_at(self.group, self.next_index)
        self.next_index += 1
        self.frames_consumed += 1
        return frame


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
        groups = self._dataset_at(start_sample).batch(FRAMES_PER_FETCH).as_numpy_iterator()
        return _Stream(groups, start_sample, frames_consumed=start_sample)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "RLDSDataset must be loaded with num_workers=0: each worker would repeat the stream."
            )
        stream, self._restored = self._restored or self._open_stream(self._start_sample), None
        self._stream = stream
        return self._transformed(stream)

    def _transformed(self, stream: _Stream) -> Iterator[dict[str, Any]]:
        with tfrecord_errors(self.dataset_dirs):  # a damaged TFRecord is named, not a TensorFlow traceback
            while (frame := stream.next_frame()) is not None:
                yield self.batch_transform(frame)

    @property
    def frames_consumed(self) -> int:
        """Frames the current iterator has yielded, counted from the stream's start (any start offset included)."""
        stream = self._stream or self._restored
        return stream.frames_consumed if stream is not None else self._start_sample

    # === Resume ===

    def _state_stem(self) -> str:
        return f"data-rank{self.rank:05d}"

    def save_stream_state(self, directory: Path) -> None:
        """Write this rank's stream position into `directory` (created if needed), as `data-rankNNNNN.*`.

        Call between frames; the live iterator continues unchanged. Files: `.tfdata.index` / `.tfdata.data-*`
        (the tf.data iterator checkpoint), `.frames.npz` (fetched frames not yet yielded, if any) and `.json`
        (fingerprint, `frames_consumed`, file sizes), written last, so a crash mid-save leaves no state that
        loads. Per rank, not collective: every rank writes its own files into the same folder.
        """
        tf = import_tensorflow()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stream = self._stream or self._restored or self._open_stream(self._start_sample)
        stem = self._state_stem()
        meta_path = directory / f"{stem}.json"
        # The .json goes first: the files below stop matching an older one as soon as they are rewritten.
        meta_path.unlink(missing_ok=True)
        for old in directory.glob(f"{stem}.*"):
            old.unlink()

        tf.train.Checkpoint(iterator=stream.groups).write(str(directory / f"{stem}.tfdata"))
        leftover = 0
        if stream.group is not None and stream.next_index < len(stream.group["action"]):
            leftover = len(stream.group["action"]) - stream.next_index
            with atomic_write(directory / f"{stem}.frames.npz", "data stream state") as f:
                _save_frames(f, stream.group, stream.next_index)
        meta = {
            "format": STREAM_STATE_FORMAT,
            "fingerprint": self._fingerprint,
            "frames_consumed": stream.frames_consumed,
            "start_sample": stream.start_sample,
            "leftover_frames": leftover,
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
        self._stream = self._restored = None
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
        tf = import_tensorflow()
        stem = self._state_stem()
        meta_path = directory / f"{stem}.json"
        if not meta_path.is_file():
            raise _SnapshotUnusable(f"'{meta_path}' does not exist")
        try:
            meta = json.loads(meta_path.read_text())
            fmt, saved_fingerprint = meta["format"], dict(meta["fingerprint"])
            saved_frames, start_sample = int(meta["frames_consumed"]), int(meta["start_sample"])
            leftover, files = int(meta["leftover_frames"]), {str(k): int(v) for k, v in meta["files"].items()}
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

        groups = self._dataset_at(start_sample).batch(FRAMES_PER_FETCH).as_numpy_iterator()
        try:
            tf.train.Checkpoint(iterator=groups).read(str(directory / f"{stem}.tfdata")).assert_consumed()
            group = _load_frames(directory / f"{stem}.frames.npz") if leftover else None
        except Exception as e:  # noqa: BLE001 (tf, numpy and zip errors alike: a damaged snapshot)
            reason = " ".join(str(e).split())[:300]
            raise _SnapshotUnusable(f"it cannot be restored ({type(e).__name__}: {reason})") from e
        if group is not None and len(group.get("action", ())) != leftover:
            raise _SnapshotUnusable(f"its frames file does not hold the {leftover} frames it was saved with")
        return _Stream(groups, start_sample, frames_consumed=frames, group=group)

    def __len__(self) -> int:
        return self.dataset_length

    def __getitem__(self, index: int) -> Any:
        raise TypeError("RLDSDataset is an IterableDataset; iterate over it instead of indexing.")
