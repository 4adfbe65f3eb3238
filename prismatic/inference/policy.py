"""The trained policy: one object that turns (camera image, instruction) into a continuous robot action.

    policy = prismatic.load_policy("runs/demo")                  # or a checkpoint, an HF OpenVLA folder, a Hub id
    action = policy.predict_action(image_HW3_uint8, "pick up the can", unnorm_key="bridge_orig")   # (7,)
    actions, logprobs = policy.predict_action_batch(images, instructions, return_logprobs=True)   # (B, 7) each

`VLAPolicy` owns everything inference needs in one place: the VLM, its image transform, the prompt of its LLM
(`prismatic/vla/prompt.py`, the one training uses), the action tokenizer, the checkpoint's `norm_stats`, the
device and dtype, and the action head the model was trained with, which decodes (`ActionHead.predict`): the
policy prepares the requests and un-normalises whatever the head predicts. An action comes out as OpenVLA's HF
`predict_action` makes it: the same prompt and special tokens, greedy decoding of `action_dim` tokens, the
same bin centres (`vocab_size - id`, shifted and clipped), and the same un-normalisation (`0.5 * (a + 1) *
(q99 - q01) + q01` where the mask is True, float64), so a checkpoint gives the same action here and in
OpenVLA's evaluation code.

Decoding is constrained to the 256 action-token ids by default; `constrained=False` is OpenVLA's unconstrained
greedy decoding, including its stop at EOS (the action is then the last `action_dim` ids of prompt + output, as
OpenVLA reads them; logprobs of ids taken from the prompt are NaN).

A model trained with a chunk head (`--vla.action_head l1-chunk`, OpenVLA-OFT's recipe) predicts `chunk_size`
actions in one forward (parallel decoding): `predict_action` returns `(chunk_size, action_dim)` and
`predict_action_batch` `(B, chunk_size, action_dim)`, un-normalised as above. Such a model may also read proprio
(`proprio=`, in robot units: normalised here with the dataset's q01 / q99 as in training) and several camera views
(`image=[primary, wrist]`, in the order `--vla.num_images` took them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from prismatic.inference.pixels import DevicePixels
from prismatic.models.action_heads import DecodeRequest, build_action_head
from prismatic.models.checkpoint_format import run_folder_of
from prismatic.models.compile_scope import DEFAULT_COMPILE_SCOPE
from prismatic.models.decoding import PolicyInputError
from prismatic.models.loading import load_vla
from prismatic.models.vlms.prismatic import PrismaticVLM
from prismatic.run_layout import RUN_CONFIG_FILE
from prismatic.util.errors import ConfigError
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets.batch_transform import IMAGE_VIEWS, fast_image_transform
from prismatic.vla.datasets.rlds.configs import NormalizationType
from prismatic.vla.datasets.rlds.normalization import normalize_np, unnormalize_np
from prismatic.vla.prompt import action_prompt_ids

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ImageLike = np.ndarray | Image.Image
DEFAULT_ACTION_DIM = 7  # tokens decoded for a checkpoint without statistics (OpenVLA's EEF delta + gripper)


def unnormalize_actions(normalized: np.ndarray, action_stats: Mapping[str, Any]) -> np.ndarray:
    """OpenVLA's un-normalisation: q01/q99 bounds where `mask` is True (default: everywhere), float64.

    Args:
        normalized: actions in [-1, 1] (bin centres), `[..., action_dim]`.
        action_stats: one dataset's `norm_stats[key]["action"]` (q01, q99, optional mask).
    """
    mask = action_stats.get("mask")
    return unnormalize_np(normalized, action_stats, NormalizationType.BOUNDS_Q99, mask, dtype=np.float64)


@dataclass(frozen=True)
class DecodedActions:
    """One batch's decoded actions: token ids, bin centres in [-1, 1], un-normalised actions, log-probabilities."""

    token_ids: np.ndarray  # int64 [B, A] ([B, 0] for a continuous head)
    normalized: np.ndarray  # float64 [B, A] ([B, K, A] for a chunk head)
    actions: np.ndarray  # float64 [B, A] ([B, K, A] for a chunk head)
    logprobs: np.ndarray  # float32 [B, A] (NaN for a continuous head: it has no token distribution)
    valid: np.ndarray | None = None  # bool [B]: the head's `HeadPrediction.valid` (None: always valid)


def resolve_device_dtype(
    device: str | torch.device | None, dtype: str | torch.dtype | None
) -> tuple[torch.device, torch.dtype]:
    """`device` as a torch.device (None: cuda when a GPU is visible, else cpu) and `dtype` (default: bf16 on GPU,
    fp32 on CPU), with clear errors."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(device)
    except RuntimeError as err:
        raise ConfigError(f"Unknown device '{device}': use 'cpu', 'cuda' or 'cuda:N'.") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"Device '{device}' asked for, but no CUDA GPU is available here: use device='cpu'."
        )
    if dtype is None:
        return device, torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ConfigError(f"Unsupported dtype {dtype}: use one of {', '.join(DTYPES)}.")
        return device, dtype
    if dtype not in DTYPES:
        raise ConfigError(f"Unknown dtype '{dtype}': use one of {', '.join(DTYPES)}.")
    return device, DTYPES[dtype]


class VLAPolicy:
    """A loaded VLA ready for inference (see the module docstring). Build it with `load_policy`.

    Args:
        vlm: the model (moved to `device` / `dtype` and put in eval mode here).
        norm_stats: the checkpoint's action statistics in OpenVLA's layout, or None (actions can't be
            un-normalised then; `decode_batch` still returns token ids and normalised actions).
        source: where it was loaded from (for logs and the server's metadata).
        device, dtype: where and in which precision the model runs.
        constrained: default decoding mode (True: only action-token ids).
    """

    def __init__(
        self,
        vlm: PrismaticVLM,
        norm_stats: Mapping[str, Any] | None,
        source: str,
        device: torch.device,
        dtype: torch.dtype,
        constrained: bool = True,
    ) -> None:
        self.vlm = vlm.to(device=device, dtype=dtype).eval()
        self.norm_stats = dict(norm_stats) if norm_stats is not None else None
        self.source, self.device, self.dtype, self.constrained = source, device, dtype, constrained
        self.tokenizer = vlm.llm_backbone.tokenizer
        self.image_transform = vlm.vision_backbone.get_image_transform()
        # uint8 arrays already at the transform's size skip the PIL round trip (the same tensors, much less time).
        self._fast_transform = fast_image_transform(self.image_transform)
        self.prompt_builder_fn = vlm.llm_backbone.prompt_builder_fn
        self.action_tokenizer = ActionTokenizer(self.tokenizer)
        self._prompt_cache: dict[str, list[int]] = {}
        self.action_spec = vlm.action_spec
        self.head = build_action_head(self.action_spec, self.action_tokenizer, vlm.num_prefix_tokens)
        # What the head keeps beside the statistics (FAST's vocabulary), from the folder the model was loaded from.
        self.head.load_files(getattr(vlm, "run_files_dir", None))
        # Token heads on CUDA decode over a static KV cache replayed from CUDA graphs (None: where supported);
        # False keeps the dynamic cache (`prismatic.models.static_decoding`; the ids are the same).
        self.static_cache: bool | None = None
        # With the static cache, `torch.compile` its prefill and decode step before capture (fused kernels; off:
        # the first single request and the first larger batch each compile, tens of seconds at 7B). What compiles
        # (`prismatic.models.compile_scope`): each ViT block and decoder layer ("layers"), or each function "whole".
        self.compile_decoding = False
        self.compile_scope = DEFAULT_COMPILE_SCOPE
        # Arrays at the backbone's size normalised by the device (`prismatic.inference.pixels`: bytes up, the same
        # pixel values); None: on accelerators, where it saves the host's look-ups and a 4x larger upload.
        self.pixels_on_device: bool | None = None
        self._device_pixels: DevicePixels | None = None
        # Whether training augmented images (random crops): evaluations then centre-crop (OpenVLA's protocol).
        # None where the checkpoint does not record it (HF folders, Hub ids).
        self.trained_with_image_aug: bool | None = None

    @property
    def chunk_size(self) -> int:
        """Actions per prediction: 1 for OpenVLA's tokens head, `chunk_size` for a chunk head."""
        return self.action_spec.chunk_size

    @property
    def is_chunked(self) -> bool:
        """Whether actions come out as chunks `(chunk_size, action_dim)` without token ids (the head says)."""
        return self.head.chunked

    @property
    def views(self) -> tuple[str, ...]:
        """The camera views a request carries, in order (`--vla.num_images` of primary, wrist, secondary)."""
        return IMAGE_VIEWS[: self.action_spec.num_images]

    @property
    def image_size(self) -> tuple[int, int]:
        """`(H, W)` training resized images to (the vision backbone's resolution); evaluations resize to it too."""
        _, height, width = self.vlm.vision_backbone.default_image_resolution
        return height, width

    @property
    def model_id(self) -> str:
        return self.vlm.model_id

    @property
    def unnorm_keys(self) -> list[str]:
        """The datasets whose statistics the checkpoint carries (valid `unnorm_key` values)."""
        return sorted(self.norm_stats) if self.norm_stats else []

    def resolve_unnorm_key(self, unnorm_key: str | None) -> str:
        """The dataset key to un-normalise with; None is fine when the checkpoint has exactly one.

        Raises:
            PolicyInputError: no statistics, None with several keys, or an unknown key (the valid ones listed).
        """
        keys = self.unnorm_keys
        if not keys:
            raise PolicyInputError(
                f"'{self.source}' carries no action statistics (norm_stats), so actions can't be un-normalised: "
                "load a run folder with dataset_statistics.json or an HF export with norm_stats."
            )
        if unnorm_key is None:
            if len(keys) == 1:
                return keys[0]
            raise PolicyInputError(
                f"This policy was trained on several datasets: pass unnorm_key, one of {', '.join(keys)}."
            )
        if not isinstance(unnorm_key, str) or unnorm_key not in self.norm_stats:
            shown = repr(unnorm_key)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."  # a client may send anything
            raise PolicyInputError(f"Unknown unnorm_key {shown}: valid keys are {', '.join(keys)}.")
        return unnorm_key

    def action_dim(self, unnorm_key: str | None = None) -> int:
        """Action dimensions of dataset `unnorm_key` (tokens decoded per action), as OpenVLA's `get_action_dim`."""
        return len(self.norm_stats[self.resolve_unnorm_key(unnorm_key)]["action"]["q01"])

    def check_image(self, image: Any) -> ImageLike:
        """The image if it is an H x W x 3 uint8 array or a PIL image; otherwise a PolicyInputError saying why."""
        if isinstance(image, Image.Image):
            return image
        if not isinstance(image, np.ndarray):
            raise PolicyInputError(
                f"image must be an H x W x 3 uint8 array or a PIL image, got {type(image).__name__}."
            )
        if image.dtype != np.uint8:
            raise PolicyInputError(f"image must have dtype uint8 (RGB 0-255), got {image.dtype}.")
        if image.ndim != 3 or image.shape[2] != 3 or min(image.shape[:2]) < 1:
            raise PolicyInputError(f"image must have shape (H, W, 3), got {tuple(image.shape)}.")
        return image

    def _prompt_ids(self, instruction: Any) -> list[int]:
        if not isinstance(instruction, str):
            raise PolicyInputError(f"instruction must be a string, got {type(instruction).__name__}.")
        ids = self._prompt_cache.get(instruction)
        if ids is None:
            ids = action_prompt_ids(self.tokenizer, self.prompt_builder_fn, instruction)
            if len(self._prompt_cache) < 10_000:
                self._prompt_cache[instruction] = ids
        return ids

    def _views_of(self, image: Any) -> list[ImageLike]:
        """One request's camera views: an image, or a list / tuple of `num_images` of them."""
        views = self.action_spec.num_images
        if isinstance(image, list | tuple):
            if len(image) != views:
                raise PolicyInputError(
                    f"Got {len(image)} camera images for one request; this policy reads {views} (in the order "
                    "it was trained with: primary, wrist, secondary)."
                )
            return [self.check_image(view) for view in image]
        if views != 1:
            raise PolicyInputError(
                f"This policy reads {views} camera views per request: pass image=[primary, wrist, ...], not one image."
            )
        return [self.check_image(image)]

    def _transform(self, image: ImageLike) -> Any:
        fast = self._fast_transform
        if fast is not None and fast.accepts(image):
            return fast(image)
        pil = image if isinstance(image, Image.Image) else Image.fromarray(image)
        return self.image_transform(pil.convert("RGB"))

    def pixel_values(self, images: Sequence[Any]) -> Any:
        """The model's `pixel_values` for a batch of requests (each one image or a list of camera views), as
        `predict_action_batch` makes them; public so benchmarks time this stage alone.

        OpenVLA's processor path: PIL RGB image -> the backbone's transform -> stacked, on device/dtype (an array
        already at the transform's size takes the array path, which gives the same tensors). Several views of one
        request are concatenated along the channel axis, as in training. Where every view is an array at that size,
        `pixels_on_device` has the device normalise them (`DevicePixels`)."""
        requests = [self._views_of(image) for image in images]
        on_device = self._device_pixel_path()
        if on_device is not None and all(on_device.accepts(view) for views in requests for view in views):
            return on_device(requests)
        tensors = []
        for request in requests:
            views = [self._transform(view) for view in request]
            if isinstance(views[0], Mapping):
                tensors.append({k: torch.cat([v[k] for v in views]) for k in views[0]})
            else:
                tensors.append(torch.cat(views))
        if isinstance(tensors[0], Mapping):
            return {k: torch.stack([t[k] for t in tensors]).to(self.device, self.dtype) for k in tensors[0]}
        return torch.stack(tensors).to(self.device, self.dtype)

    def _device_pixel_path(self) -> DevicePixels | None:
        """`DevicePixels` for this policy's transform, device and dtype where `pixels_on_device` (None: not on CPU)
        and the transform has an array path; None otherwise."""
        wanted = self.device.type != "cpu" if self.pixels_on_device is None else self.pixels_on_device
        if not wanted or self._fast_transform is None:
            return None
        if self._device_pixels is None:
            self._device_pixels = DevicePixels(self._fast_transform, self.device, self.dtype)
        return self._device_pixels

    def _proprio(self, proprio: Any, keys: Sequence[str | None]) -> torch.Tensor | None:
        """Normalised proprio `[B, P]` for a model that reads it (q01 / q99 bounds of each row's dataset, as the
        training pipeline normalises it); None for one that does not."""
        width = self.action_spec.proprio_dim
        if not width:
            if proprio is not None:
                raise PolicyInputError(
                    "This policy reads no proprio (it was trained without --vla.use_proprio)."
                )
            return None
        if proprio is None:
            raise PolicyInputError(f"This policy reads proprio: pass proprio= ({width} numbers per request).")
        values = np.asarray(proprio, dtype=np.float32).reshape(len(keys), -1)
        if values.shape[1] != width:
            raise PolicyInputError(f"proprio must have {width} numbers per request, got {values.shape[1]}.")
        rows = []
        for row, key in zip(values, keys, strict=True):
            if key is None:
                raise PolicyInputError("Proprio can't be normalised without statistics: pass unnorm_key.")
            rows.append(normalize_np(row, self.norm_stats[key]["proprio"], NormalizationType.BOUNDS_Q99))
        return torch.from_numpy(np.stack(rows)).to(self.device, self.dtype)

    def _row_keys(self, unnorm_key: str | None | Sequence[str | None], batch_size: int) -> list[str | None]:
        if unnorm_key is None or isinstance(unnorm_key, str):
            keys = [unnorm_key] * batch_size
        else:
            keys = list(unnorm_key)
            if len(keys) != batch_size:
                raise PolicyInputError(f"Got {len(keys)} unnorm keys for a batch of {batch_size} requests.")
        return keys

    def decode_ids(
        self, token_ids: np.ndarray, unnorm_keys: Sequence[str | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids `[B, A]` -> (bin centres `[B, A]`, un-normalised actions `[B, A]`), float64, row by row.

        A row whose key is None (a checkpoint without statistics) keeps its normalised action.
        """
        normalized = self.action_tokenizer.decode_ids(token_ids)
        return normalized, self.unnormalize(normalized, unnorm_keys)

    def unnormalize(self, normalized: np.ndarray, unnorm_keys: Sequence[str | None]) -> np.ndarray:
        """Normalised actions `[B, ...]` -> robot units, float64, each row with its dataset's statistics (a row
        whose key is None keeps its normalised values)."""
        actions = normalized.copy()
        for row, key in enumerate(unnorm_keys):
            if key is not None:
                actions[row] = unnormalize_actions(normalized[row], self.norm_stats[key]["action"])
        return actions

    def decode_batch(
        self,
        images: Sequence[Any],
        instructions: Sequence[str],
        unnorm_key: str | None | Sequence[str | None] = None,
        *,
        constrained: bool | None = None,
        use_cache: bool = True,
        proprio: Any = None,
    ) -> DecodedActions:
        """Decode a batch of requests together; everything `predict_action_batch` returns, and the token ids.

        Args:
            images: B images (H x W x 3 uint8 arrays or PIL images; sizes may differ), or B lists of camera views.
            instructions: B instructions.
            unnorm_key: one dataset key for every row, or one per row (None: the checkpoint's only key).
            constrained: decode action-token ids only (default: the policy's `constrained`).
            use_cache: KV-cached decoding (False re-runs the full sequence each step; same result, slower).
            proprio: `[B, P]` proprio in robot units, for a policy trained with it.

        Raises:
            PolicyInputError: a bad image, instruction or key; rows whose keys have different action dims.
        """
        if len(images) != len(instructions) or not images:
            raise PolicyInputError(
                f"Need as many images as instructions (at least one), got {len(images)} and {len(instructions)}."
            )
        keys = self._row_keys(unnorm_key, len(images))
        if self.norm_stats is None and all(key is None for key in keys):
            resolved: list[str | None] = keys
            dims = {DEFAULT_ACTION_DIM}
        else:
            resolved = [self.resolve_unnorm_key(key) for key in keys]
            dims = {len(self.norm_stats[key]["action"]["q01"]) for key in resolved}
        if len(dims) != 1:
            raise PolicyInputError(
                f"Requests of one batch need the same action dimension; unnorm keys {sorted(set(resolved))} have "
                f"{sorted(dims)}."
            )
        request = DecodeRequest(
            prompt_ids=[self._prompt_ids(instruction) for instruction in instructions],
            pixel_values=self.pixel_values(images),
            proprio=self._proprio(proprio, resolved),
            action_dim=dims.pop(),
            pad_id=self.tokenizer.pad_token_id,
            eos_id=self.tokenizer.eos_token_id,
            device=self.device,
            constrained=self.constrained if constrained is None else constrained,
            use_cache=use_cache,
            static_cache=self.static_cache,
            compile_steps=self.compile_decoding,
            compile_scope=self.compile_scope,
        )
        predicted = self.head.predict(self.vlm, request)
        actions = self.unnormalize(predicted.normalized, resolved)
        return DecodedActions(
            predicted.token_ids, predicted.normalized, actions, predicted.logprobs, predicted.valid
        )

    def predict_action_batch(
        self,
        images: Sequence[Any],
        instructions: Sequence[str],
        unnorm_key: str | None | Sequence[str | None] = None,
        return_logprobs: bool = False,
        *,
        constrained: bool | None = None,
        proprio: Any = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Actions `(B, action_dim)` float64 (`(B, chunk_size, action_dim)` for a chunk head) for B requests decoded
        together; row i equals `predict_action(images[i], instructions[i])`. With `return_logprobs`, also the
        log-probabilities of the chosen tokens `(B, action_dim)` float32 (tokens head only).
        """
        if return_logprobs and self.is_chunked:
            raise PolicyInputError(
                f"This policy's '{self.action_spec.head}' head predicts continuous actions: it has no token "
                "log-probabilities (return_logprobs=False)."
            )
        decoded = self.decode_batch(
            images, instructions, unnorm_key, constrained=constrained, proprio=proprio
        )
        return (decoded.actions, decoded.logprobs) if return_logprobs else decoded.actions

    def predict_action(
        self,
        image: Any,
        instruction: str,
        unnorm_key: str | None = None,
        *,
        constrained: bool | None = None,
        proprio: Any = None,
    ) -> np.ndarray:
        """The un-normalised action `(action_dim,)` float64 for one camera image (or list of views) and instruction;
        `(chunk_size, action_dim)` for a chunk head."""
        batch_proprio = None if proprio is None else np.asarray(proprio, np.float32)[None]
        return self.decode_batch(
            [image], [instruction], unnorm_key, constrained=constrained, proprio=batch_proprio
        ).actions[0]


def load_policy(
    path_or_id: str | Path,
    device: str | torch.device | None = "cpu",
    dtype: str | torch.dtype | None = None,
    hf_token: str | None = None,
    constrained: bool = True,
) -> VLAPolicy:
    """Load a trained policy from anything `prismatic.models.load_vla` accepts.

    Args:
        path_or_id: a run folder (its newest checkpoint), a `<run>/checkpoints/*.pt` file, an exported HF
            OpenVLA folder, or a Hub id.
        device: where the model runs ("cpu", "cuda", "cuda:1", ...; None: cuda when a GPU is visible, else cpu).
        dtype: "bfloat16" / "float32" / "float16" or a torch dtype; default bf16 on GPU, fp32 on CPU.
        hf_token: for gated Hub repos.
        constrained: decode only action-token ids (False: OpenVLA's unconstrained greedy decoding).

    Raises:
        ConfigError: unknown path or id, unreadable checkpoint, unknown device or dtype.
    """
    device, dtype = resolve_device_dtype(device, dtype)
    loaded = load_vla(path_or_id, hf_token=hf_token, dtype=dtype)  # streamed into `dtype`: one copy in memory
    policy = VLAPolicy(loaded.vlm, loaded.norm_stats, loaded.source, device, dtype, constrained=constrained)
    policy.trained_with_image_aug = trained_with_image_aug(path_or_id)
    return policy


def trained_with_image_aug(path_or_id: str | Path) -> bool | None:
    """Whether the run a local checkpoint comes from trained with image augmentation (its config.json's
    `image_aug`, or `vla.image_aug` where the preset sets it); None when it does not say (HF folders, Hub ids)."""
    path = Path(path_or_id).expanduser()
    try:
        config = json.loads((run_folder_of(path) / RUN_CONFIG_FILE).read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    vla = config.get("vla") if isinstance(config.get("vla"), dict) else {}
    for value in (config.get("image_aug"), vla.get("image_aug")):
        if isinstance(value, bool):
            return value
    return None
