"""One standardised RLDS frame -> model inputs: OpenVLA's prompt, the action head's text layout, pixel values.

`RLDSBatchTransform` builds OpenVLA's prompt (`prismatic/vla/prompt.py`, shared with inference), tokenizes
the text *before* the answer, and appends the action token ids and EOS as integers: the ids a released OpenVLA
checkpoint was trained on, with no decode / re-encode round trip through text that could merge or split them.

Per-frame Python work bounds the data rate, so the transform avoids two costs when it can prove the result is
identical: the tokenized prompt prefix is cached per instruction, and when the backbone's transform is a plain
"resize to H x W (a no-op: the pipeline already delivers H x W), to tensor, normalise" (every resize-naive timm
ViT), the image goes straight from the NumPy array to the normalised tensor with the same float32 operations,
skipping the PIL round trip (`fast_image_transform`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import PreTrainedTokenizerBase

from prismatic.models.action_heads.tokens import token_layout
from prismatic.models.backbones.llm.prompting.base_prompter import PromptBuilder
from prismatic.util.constants import IGNORE_INDEX
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.prompt import action_prompt_ids

ImageTransform = Callable[[Image.Image], torch.Tensor | dict[str, torch.Tensor]]
# An action head's `layout`: (prompt ids, the frame's actions, EOS id) -> {"input_ids", "labels", ...}
Layout = Callable[[list[int], np.ndarray, int], dict[str, torch.Tensor]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _at_size(image: Any, size_hw: tuple[int, int]) -> bool:
    """Whether `image` is an H x W x 3 uint8 array with (H, W) == `size_hw`: what the array path takes."""
    return isinstance(image, np.ndarray) and image.shape == (*size_hw, 3) and image.dtype == np.uint8


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
        # A host table whatever the default device (a policy may be built inside `with torch.device("cuda")`).
        values = torch.arange(256, dtype=torch.float32, device="cpu")[None, :].expand(3, 256)
        mean_t = torch.as_tensor(mean, dtype=torch.float32, device="cpu").reshape(3, 1)
        std_t = torch.as_tensor(std, dtype=torch.float32, device="cpu").reshape(3, 1)
        return cls(size_hw, values.div(255).sub(mean_t).div(std_t).numpy())

    def accepts(self, image: Any) -> bool:
        """Whether `image` takes this path (training's batch transform, the policy and `DevicePixels` ask this)."""
        return _at_size(image, self.size_hw)

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

    def accepts(self, image: Any) -> bool:
        """Whether `image` takes this path: an H x W x 3 uint8 array at the parts' common size."""
        return _at_size(image, self.size_hw)

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
    from torchvision import transforms as T  # lazy: ~1.3 s; a backbone transform has loaded it already

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

    The text after the prompt is the action head's `layout` (default: the tokens head's, OpenVLA's action
    tokens + EOS with labels on them); the EOS label only when `predict_stop_token`. HF causal LMs shift
    labels inside `forward`, so labels align with `input_ids` here. With several `views`, their pixel values
    are concatenated along the channel axis (`[3N, H, W]`, per part for fused backbones), the layout
    `PrismaticVLM.prefix_embeddings` reads.
    """

    action_tokenizer: ActionTokenizer
    base_tokenizer: PreTrainedTokenizerBase
    image_transform: ImageTransform
    prompt_builder_fn: type[PromptBuilder]
    predict_stop_token: bool = True
    use_fast_image_path: bool = True  # skip the PIL round trip where provably identical (module docstring)
    layout: Layout | None = None  # the head's `ActionHead.layout`; None: the tokens head's
    views: tuple[str, ...] = ("primary",)  # camera views fed to the model, in order
    use_proprio: bool = False  # pass the frame's normalised proprio on as "proprio"
    _prefix_cache: dict[str, list[int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _fast_image: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.layout is None:
            self.layout = partial(token_layout, self.action_tokenizer)
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
        if fast is not None and fast.accepts(image):
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
        text = self.layout(prefix_ids, action, self.base_tokenizer.eos_token_id)
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
