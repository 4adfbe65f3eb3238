"""Torch side of the VLA data path: one RLDS frame -> model inputs, and the `IterableDataset` over the pipeline.

`RLDSBatchTransform` builds OpenVLA's prompt (`prismatic/vla/prompt.py`, shared with inference), tokenizes
the text *before* the answer, and appends the action token ids and EOS as integers: the ids a released OpenVLA
checkpoint was trained on, with no decode / re-encode round trip through text that could merge or split them.
`RLDSDataset` wraps the `tf.data` pipeline of `rlds/dataset.py`; iterate it with a `DataLoader` with
`num_workers=0` (the pipeline parallelises internally, and copies in worker processes would repeat one stream).

Per-frame Python work bounds the data rate, so the transform avoids two costs when it can prove the result is
identical: the tokenized prompt prefix is cached per instruction, and when the backbone's transform is a plain
"resize to H x W (a no-op: the pipeline already delivers H x W), to tensor, normalise" (every resize-naive timm
ViT), the image goes straight from the NumPy array to the normalised tensor with the same float32 operations,
skipping the PIL round trip (`fast_image_transform`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info
from transformers import PreTrainedTokenizerBase

from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder
from prismatic.util.constants import IGNORE_INDEX
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.rlds.dataset import make_interleaved_dataset, tfrecord_errors
from prismatic.vla.prompt import action_prompt_ids

ImageTransform = Callable[[Image.Image], torch.Tensor | dict[str, torch.Tensor]]


FRAMES_PER_FETCH = 16


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


@dataclass
class RLDSBatchTransform:
    """One standardised frame -> {"pixel_values", "input_ids", "labels", "dataset_name", "actions"}.

    Only the action tokens (and EOS, when `predict_stop_token`) carry labels; everything else is
    `IGNORE_INDEX`. HF causal LMs shift labels inside `forward`, so labels align with `input_ids` here.
    """

    action_tokenizer: ActionTokenizer
    base_tokenizer: PreTrainedTokenizerBase
    image_transform: ImageTransform
    prompt_builder_fn: type[PromptBuilder]
    predict_stop_token: bool = True
    use_fast_image_path: bool = True  # skip the PIL round trip where provably identical (module docstring)
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

    def __call__(self, frame: dict[str, Any]) -> dict[str, Any]:
        instruction = _text(frame["task"]["language_instruction"])
        action = np.asarray(frame["action"], dtype=np.float32)

        prefix_ids = self._prefix_ids(instruction)
        action_ids = self.action_tokenizer.encode_to_ids(action).tolist()
        eos_id = self.base_tokenizer.eos_token_id

        input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        labels[len(prefix_ids) : len(prefix_ids) + len(action_ids)] = torch.tensor(action_ids)
        if self.predict_stop_token:
            labels[-1] = eos_id

        image = np.asarray(frame["observation"]["image_primary"])
        return {
            "pixel_values": self._pixel_values(image),
            "input_ids": input_ids,
            "labels": labels,
            "dataset_name": _text(frame["dataset_name"]),
            "actions": action,
        }


class RLDSDataset(IterableDataset):
    """Infinite (train) or single-pass (val) stream of transformed frames for one rank.

    Deterministic for (seed, rank, world_size): every `iter()` restarts the same stream at `start_sample`.
    `len()` is the number of train transitions in the mixture, summed over its datasets (one mixture epoch,
    across all ranks). `dataset_statistics` holds every dataset's statistics in OpenVLA's layout (save it with
    `save_dataset_statistics`; inference needs it to un-normalise actions).
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
        )
        self.dataset = pipeline.dataset
        self.dataset_statistics = pipeline.dataset_statistics
        self.sample_weights = pipeline.sample_weights
        self.num_transitions = pipeline.num_transitions
        self.shuffle_buffer_gb = pipeline.shuffle_buffer_gb
        self.dataset_dirs = pipeline.dataset_dirs

    def __iter__(self) -> Iterator[dict[str, Any]]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "RLDSDataset must be loaded with num_workers=0: each worker would repeat the stream."
            )
        # Frames leave tf.data in groups: one NumPy conversion per group instead of per frame (~15% more frames/s
        # on 2 cores); each frame is then a view into its group's arrays.
        with tfrecord_errors(self.dataset_dirs):  # a damaged TFRecord is named, not a TensorFlow traceback
            for group in self.dataset.batch(FRAMES_PER_FETCH).as_numpy_iterator():
                for index in range(len(group["action"])):
                    yield self.batch_transform(_frame_at(group, index))

    def __len__(self) -> int:
        return self.num_transitions

    def __getitem__(self, index: int) -> Any:
        raise TypeError("RLDSDataset is an IterableDataset; iterate over it instead of indexing.")
