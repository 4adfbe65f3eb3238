"""Torch side of the VLA data path: one RLDS frame -> model inputs, and the `IterableDataset` over the pipeline.

`RLDSBatchTransform` builds OpenVLA's prompt (`prismatic/vla/prompt.py`, shared with inference), tokenizes
the text *before* the answer, and appends the action token ids and EOS as integers: the ids a released OpenVLA
checkpoint was trained on, with no decode / re-encode round trip through text that could merge or split them.
`RLDSDataset` wraps the `tf.data` pipeline of `rlds/dataset.py`; iterate it with a `DataLoader` with
`num_workers=0` (the pipeline parallelises internally, and copies in worker processes would repeat one stream).

Resume: `frames_consumed` counts the frames the current iterator has yielded. `save_stream_state(dir)` writes the
rank's position without disturbing the live stream: a checkpoint of the tf.data iterator (readers' positions,
shuffle buffer, in-flight frames; see `rlds/dataset.py`) plus the frames of the last fetched group not yet
yielded (frames leave tf.data in groups of `FRAMES_PER_FETCH`), keyed by a fingerprint of everything that
defines the stream. `resume_from(n, dir)` restores that snapshot when it matches (time independent of n), and
otherwise falls back to skipping n frames (time linear in n).

Per-frame Python work bounds the data rate, so the transform avoids two costs when it can prove the result is
identical: the tokenized prompt prefix is cached per instruction, and when the backbone's transform is a plain
"resize to H x W (a no-op: the pipeline already delivers H x W), to tensor, normalise" (every resize-naive timm
ViT), the image goes straight from the NumPy array to the normalised tensor with the same float32 operations,
skipping the PIL round trip (`fast_image_transform`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from transformers import PreTrainedTokenizerBase

from prismatic.conf.data import DataOptions
from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder
from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.rlds.dataset import make_interleaved_dataset, tfrecord_errors
from prismatic.vla.prompt import action_prompt_ids

ImageTransform = Callable[[Image.Image], torch.Tensor | dict[str, torch.Tensor]]

logger = logging.getLogger(__name__)

FRAMES_PER_FETCH = 16
STREAM_STATE_FORMAT = 1  # bump when the snapshot layout changes: older snapshots then resume by skipping


def _frame_at(group: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Frame `index` of a batched group of frames (nested dicts of arrays), as views."""
    return {k: _frame_at(v, index) if isinstance(v, Mapping) else v[index] for k, v in group.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class _ArrayToNormalizedTensor:
    """uint8[H, W, 3] array -> normalised float32 Tensor[3, H, W], bit-identical to `ToTensor` + `Normalize`.

    A uint8 input has 256 possible values per channel, so the result is a table look-up: `table[c, v]` holds
    `((v / 255) - mean[c]) / std[c]` computed with the same float32 operations in the same order as torchvision.
    One gather per pixel instead of three arithmetic passes, in NumPy (single-threaded): torch's intra-op
    thread pool makes tiny per-frame ops ~10x slower when tf.data keeps the cores busy.
    """

    size_hw: tuple[int, int]
    table: np.ndarray  # float32[3, 256]

    @classmethod
    def from_mean_std(cls, size_hw: tuple[int, int], mean: Any, std: Any) -> _ArrayToNormalizedTensor:
        values = torch.arange(256, dtype=torch.float32)[None, :].expand(3, 256)
        mean_t = torch.as_tensor(mean, dtype=torch.float32).reshape(3, 1)
        std_t = torch.as_tensor(std, dtype=torch.float32).reshape(3, 1)
        return cls(size_hw, values.div(255).sub(mean_t).div(std_t).numpy())

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        out = np.empty((3, *image.shape[:2]), np.float32)
        for channel in range(3):
            np.take(self.table[channel], image[:, :, channel], out=out[channel])
        return torch.from_numpy(out)


@dataclass(frozen=True)
class _FusedArrayTransform:
    """`_ArrayToNormalizedTensor` per part of a fused backbone (same size): {"dino": Tensor, "siglip": Tensor}."""

    parts: Mapping[str, _ArrayToNormalizedTensor]
    size_hw: tuple[int, int]

    def __call__(self, image: np.ndarray) -> dict[str, torch.Tensor]:
        return {name: part(image) for name, part in self.parts.items()}


def _size_hw(size: Any) -> tuple[int, int] | None:
    if isinstance(size, int):
        return size, size
    if isinstance(size, tuple | list) and len(size) == 2:
        return int(size[0]), int(size[1])
    return None


def fast_image_transform(image_transform: Any) -> _ArrayToNormalizedTensor | _FusedArrayTransform | None:
    """An array-to-tensor equivalent of `image_transform` for images already at its output size, or None.

    Recognised: a torchvision `Compose` of [Resize(H, W) (PIL returns an unchanged copy at that size),
    CenterCrop(H, W) (a no-op at that size), ToTensor / timm's MaybeToTensor, Normalize(mean, std)], and a
    fused transform (`.transforms` dict) whose parts are all recognised. Anything else returns None (the
    caller keeps the PIL path).
    """
    from torchvision import transforms as T

    parts = getattr(image_transform, "transforms", None)
    if isinstance(parts, Mapping):
        fast = {name: fast_image_transform(part) for name, part in parts.items()}
        sizes = {getattr(f, "size_hw", None) for f in fast.values()}
        if not fast or None in sizes or len(sizes) != 1:
            return None
        return _FusedArrayTransform(fast, sizes.pop())
    if not isinstance(image_transform, T.Compose) or len(parts) != 4:
        return None
    resize, crop, to_tensor, normalize = parts
    size = _size_hw(getattr(resize, "size", None))
    if (
        not isinstance(resize, T.Resize)
        or size is None
        or getattr(resize, "max_size", None) is not None
        or not isinstance(crop, T.CenterCrop)
        or _size_hw(crop.size) != size
        or type(to_tensor).__name__ not in ("ToTensor", "MaybeToTensor")
        or not isinstance(normalize, T.Normalize)
        or normalize.inplace
    ):
        return None
    if torch.as_tensor(normalize.mean).numel() != 3 or torch.as_tensor(normalize.std).numel() != 3:
        return None
    return _ArrayToNormalizedTensor.from_mean_std(size, normalize.mean, normalize.std)


# Camera views in the order `--vla.num_images N` takes them: the primary camera, then the wrist camera, then the
# secondary third-person camera (OpenVLA-OFT: LIBERO uses primary + wrist).
IMAGE_VIEWS = ("primary", "wrist", "secondary")


def views_for(num_images: int) -> tuple[str, ...]:
    """The first `num_images` of `IMAGE_VIEWS` (a ConfigError beyond them)."""
    if not 1 <= num_images <= len(IMAGE_VIEWS):
        raise ConfigError(
            f"--vla.num_images={num_images} is out of range: frames carry 1 to {len(IMAGE_VIEWS)} camera views "
            f"({', '.join(IMAGE_VIEWS)}, in that order)."
        )
    return IMAGE_VIEWS[:num_images]


@dataclass
class RLDSBatchTransform:
    """One standardised frame -> {"pixel_values", "input_ids", "labels", "dataset_name", "actions"} (+ "proprio",
    "action_mask" where the head or model needs them).

    The text after the prompt is the action head's `layout` (default: OpenVLA's action tokens + EOS, labels on
    them; the EOS label only when `predict_stop_token`). HF causal LMs shift labels inside `forward`, so labels
    align with `input_ids` here. With several `views`, their pixel values are concatenated along the channel axis
    (`[3N, H, W]`, per part for fused backbones), the layout `PrismaticVLM.prefix_embeddings` reads.
    """

    action_tokenizer: ActionTokenizer
    base_tokenizer: PreTrainedTokenizerBase
    image_transform: ImageTransform
    prompt_builder_fn: type[PromptBuilder]
    predict_stop_token: bool = True
    use_fast_image_path: bool = True  # skip the PIL round trip where provably identical (module docstring)
    layout: Callable[[list[int], np.ndarray, int], dict[str, torch.Tensor]] | None = None  # ActionHead.layout
    views: tuple[str, ...] = ("primary",)  # camera views fed to the model, in order
    use_proprio: bool = False  # pass the frame's normalised proprio on as "proprio"
    _prefix_cache: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _fast_image: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.use_fast_image_path:
            self._fast_image = fast_image_transform(self.image_transform)

    def _prefix_ids(self, instruction: str) -> list[int]:
        """Token ids of the prompt up to the answer; cached (datasets repeat a few thousand instructions)."""
        ids = self._prefix_cache.get(instruction)
        if ids is None:
            ids = action_prompt_ids(self.base_tokenizer, self.prompt_builder_fn, instruction)
            if len(self._prefix_cache) < 100_000:  # bounded, in case every frame has its own instruction
                self._prefix_cache[instruction] = ids
        return ids

    def _pixel_values(self, image: np.ndarray) -> Any:
        fast = self._fast_image
        if (
            fast is not None
            and image.shape[:2] == fast.size_hw
            and image.shape[2:] == (3,)
            and image.dtype == np.uint8
        ):
            return fast(image)
        return self.image_transform(Image.fromarray(image))

    def _views(self, observation: Mapping[str, Any]) -> Any:
        # A chunked pipeline gives each observation a leading window axis (`[W, H, W, 3]`): the frame's own is last.
        images = [np.asarray(observation[f"image_{view}"]) for view in self.views]
        values = [self._pixel_values(image[-1] if image.ndim == 4 else image) for image in images]
        if len(values) == 1:
            return values[0]
        if isinstance(values[0], Mapping):
            return {k: torch.cat([v[k] for v in values], dim=0) for k in values[0]}
        return torch.cat(values, dim=0)

    def __call__(self, frame: dict[str, Any]) -> dict[str, Any]:
        instruction = _text(frame["task"]["language_instruction"])
        action = np.asarray(frame["action"], dtype=np.float32)
        prefix_ids = self._prefix_ids(instruction)
        eos_id = self.base_tokenizer.eos_token_id
        if self.layout is None:
            action_ids = self.action_tokenizer.encode_to_ids(action).tolist()
            input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
            labels = torch.full_like(input_ids, IGNORE_INDEX)
            labels[len(prefix_ids) :] = input_ids[len(prefix_ids) :]
            text = {"input_ids": input_ids, "labels": labels}
        else:
            text = self.layout(prefix_ids, action, eos_id)
        if not self.predict_stop_token:
            text["labels"][-1] = IGNORE_INDEX

        out = {
            "pixel_values": self._views(frame["observation"]),
            **text,
            "dataset_name": _text(frame["dataset_name"]),
            "actions": action,
        }
        if self.use_proprio:
            proprio = frame["observation"].get("proprio")
            if proprio is None:
                raise ConfigError(
                    f"Dataset '{out['dataset_name']}' gives no proprio, but the model reads it (--vla.use_proprio "
                    "true): its config needs state_obs_keys, and the pipeline --data.load_proprio true."
                )
            proprio = np.asarray(proprio, dtype=np.float32)
            out["proprio"] = proprio[-1] if proprio.ndim == 2 else proprio
        return out


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
