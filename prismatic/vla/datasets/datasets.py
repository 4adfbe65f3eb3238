"""`RLDSDataset`: the torch `IterableDataset` over one rank's tf.data pipeline (`rlds/`), with resumable position.

Iterate it with a `DataLoader` with `num_workers=0` (the pipeline parallelises internally, and copies in worker
processes would repeat one stream). Each frame goes through a batch transform (`batch_transform.py`).

Resume: `frames_consumed` counts the frames the current iterator has yielded. `save_stream_state(dir)` writes the
rank's position without disturbing the live stream: a checkpoint of the tf.data iterator (readers' positions,
shuffle buffer, in-flight frames; see `rlds/dataset.py`) plus the frames of the last fetched group not yet
yielded (frames leave tf.data in groups of `FRAMES_PER_FETCH`), keyed by a fingerprint of everything that
defines the stream. `resume_from(n, dir)` restores that snapshot when it matches (time independent of n), and
otherwise falls back to skipping n frames (time linear in n).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.dataset import make_interleaved_dataset, tfrecord_errors

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


def _save_frames(path: Path, group: Mapping[str, Any], start: int) -> None:
    """Write frames `start:` of a fetched group to `path` (.npz, no pickle); strings as bytes + lengths."""
    arrays = {}
    for key, value in _flatten(group).items():
        rest = np.asarray(value[start:])
        if rest.dtype == object:  # tf.string leaves arrive as object arrays of bytes
            items = [bytes(b) for b in rest.ravel()]
            arrays[f"{key}:bytes"] = np.frombuffer(b"".join(items), np.uint8)
            arrays[f"{key}:lengths"] = np.array([len(b) for b in items], np.int64).reshape(rest.shape)
        else:
            arrays[key] = rest
    with open(path, "wb") as f:
        np.savez(f, **arrays)


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


def _replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` then rename onto `path`, so a crash never leaves a partial file under `path`'s name."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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

    Deterministic for (seed, rank, world_size): every `iter()` restarts the same stream at `start_sample` (or at
    the frame given to `resume_from`). `len()` is OpenVLA's dataset length, one mixture epoch across all ranks
    (`RLDSPipeline.dataset_length`: the summed transitions when every weight is 1.0). `dataset_statistics` holds every dataset's statistics in
    OpenVLA's layout (save it with `save_dataset_statistics`; inference needs it to un-normalise actions).
    """

    def __init__(
        self,
        data_root_dir: Path,
        data_mix: str,
        batch_transform: Callable[[dict[str, Any]], dict[str, Any]],
        resize_resolution: tuple[int, int],
        shuffle_buffer_size: int,
        *,
        train: bool = True,
        image_aug: bool = False,
        seed: int = 7,
        rank: int = 0,
        world_size: int = 1,
        start_sample: int = 0,
        skip_missing_datasets: bool = False,
        shuffle_buffer_ram_gb: float | None = None,
        window_size: int = 1,
        future_action_window_size: int = 0,
        keep_raw_action: bool = False,
        options: DataOptions | None = None,
        image_views: tuple[str, ...] = ("primary",),
    ) -> None:
        self.data_root_dir, self.data_mix, self.batch_transform = (
            Path(data_root_dir),
            data_mix,
            batch_transform,
        )
        self.train, self.seed, self.rank, self.world_size = train, seed, rank, world_size
        pipeline = make_interleaved_dataset(
            self.data_root_dir,
            data_mix,
            resize_resolution=tuple(resize_resolution),
            shuffle_buffer_size=shuffle_buffer_size,
            train=train,
            image_aug=image_aug,
            seed=seed,
            rank=rank,
            world_size=world_size,
            start_sample=start_sample,
            skip_missing_datasets=skip_missing_datasets,
            shuffle_buffer_ram_gb=shuffle_buffer_ram_gb,
            window_size=window_size,
            future_action_window_size=future_action_window_size,
            keep_raw_action=keep_raw_action,
            options=options,
            image_views=image_views,
        )
        self.options = options or DataOptions()
        self.dataset = pipeline.dataset
        self.dataset_statistics = pipeline.dataset_statistics
        self.sample_weights = pipeline.sample_weights
        self.num_transitions = pipeline.num_transitions
        self.dataset_length = pipeline.dataset_length
        self.shuffle_buffer_gb = pipeline.shuffle_buffer_gb
        self.dataset_dirs = pipeline.dataset_dirs
        self._from_sample = pipeline.from_sample
        self._start_sample = start_sample
        self._datasets = {start_sample: pipeline.dataset}
        # The latest iterator's position, kept (with its tf.data iterator) after its consumer drops it, so that a
        # trainer whose loop has ended can still save it.
        self._stream: _Stream | None = None
        self._restored: _Stream | None = None  # what the next `iter()` continues, after a snapshot resume
        # Everything that defines this rank's stream (not where it started: a snapshot records that itself).
        self._fingerprint = json.loads(
            json.dumps(
                {
                    "data_mix": data_mix,
                    "datasets": [f"{d.parent.name}/{d.name}" for d in pipeline.dataset_dirs],
                    "num_transitions": pipeline.num_transitions,
                    "seed": seed,
                    "rank": rank,
                    "world_size": world_size,
                    "train": train,
                    "shuffle_buffer_size": shuffle_buffer_size if train else None,
                    "resize_resolution": list(resize_resolution),
                    "image_aug": bool(image_aug and train),
                    "window_size": window_size,
                    "future_action_window_size": future_action_window_size,
                    "data_options": (options or DataOptions()).to_dict(),
                    "keep_raw_action": keep_raw_action,
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
            frames_path = directory / f"{stem}.frames.npz"
            _replace_atomically(frames_path, lambda tmp: _save_frames(tmp, stream.group, stream.next_index))
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
        _replace_atomically(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1)))

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
