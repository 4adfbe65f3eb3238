"""`RLDSBatchTransform`: prompt, action token ids appended as integers, labels only on actions + EOS."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prismatic.models.backbones.llm.prompting.base_prompter import PurePromptBuilder
from prismatic.util.constants import IGNORE_INDEX
from prismatic.vla.action_tokenizer import ActionTokenizer
from prismatic.vla.datasets import RLDSBatchTransform


def _frame(action: np.ndarray) -> dict:
    return {
        "observation": {
            "image_primary": np.full((8, 8, 3), 200, np.uint8),
            "proprio": np.zeros(8, np.float32),
        },
        "task": {"language_instruction": b"Pick up the Red Block"},
        "action": action,
        "dataset_name": b"toy_pick_place",
    }


@pytest.mark.parametrize("predict_stop_token", [True, False])
def test_labels_are_action_ids_and_eos(tiny_tokenizer, predict_stop_token: bool) -> None:
    action_tokenizer = ActionTokenizer(tiny_tokenizer)
    transform = RLDSBatchTransform(
        action_tokenizer,
        tiny_tokenizer,
        image_transform=lambda img: torch.from_numpy(np.array(img)).permute(2, 0, 1),
        prompt_builder_fn=PurePromptBuilder,
        predict_stop_token=predict_stop_token,
    )
    action = np.array([-1.0, -0.5, 0.0, 0.3, 0.99, 1.0, 1.0], np.float32)
    out = transform(_frame(action))

    action_ids = action_tokenizer.encode_to_ids(action).tolist()
    assert all(i > action_tokenizer.action_token_begin_idx for i in action_ids)
    prefix = "In: What action should the robot take to pick up the red block?\nOut: "
    prefix_ids = tiny_tokenizer(prefix, add_special_tokens=True).input_ids
    assert prefix_ids[0] == tiny_tokenizer.bos_token_id == 1
    eos = tiny_tokenizer.eos_token_id

    assert out["input_ids"].dtype == torch.long
    assert out["input_ids"].tolist() == prefix_ids + action_ids + [eos]
    expected_labels = (
        [IGNORE_INDEX] * len(prefix_ids) + action_ids + [eos if predict_stop_token else IGNORE_INDEX]
    )
    assert out["labels"].tolist() == expected_labels
    assert out["dataset_name"] == "toy_pick_place"
    np.testing.assert_array_equal(out["actions"], action)
    assert out["actions"].dtype == np.float32
    assert out["pixel_values"].shape == (3, 8, 8) and int(out["pixel_values"][0, 0, 0]) == 200


def test_dict_image_transform_passes_through(tiny_tokenizer) -> None:
    transform = RLDSBatchTransform(
        ActionTokenizer(tiny_tokenizer),
        tiny_tokenizer,
        image_transform=lambda img: {"dino": torch.zeros(3, 4, 4), "siglip": torch.ones(3, 4, 4)},
        prompt_builder_fn=PurePromptBuilder,
    )
    out = transform(_frame(np.zeros(7, np.float32)))
    assert set(out["pixel_values"]) == {"dino", "siglip"}


def test_fast_image_path_is_bit_identical_to_the_backbones_transform(tiny_tokenizer) -> None:
    """Resize-naive 224 timm transform (SigLIP and ImageNet normalisation, fused): array path == PIL path."""
    from PIL import Image

    from prismatic.models.backbones.vision.transforms import FusedImageTransform, build_image_transform
    from prismatic.vla.datasets.batch_transform import fast_image_transform

    def timm_224(mean: tuple, std: tuple) -> object:
        cfg = {
            "input_size": (3, 224, 224),
            "interpolation": "bicubic",
            "mean": mean,
            "std": std,
            "crop_pct": 1.0,
        }
        return build_image_transform(cfg, "resize-naive")

    siglip = timm_224((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    dino = timm_224((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    image = np.random.default_rng(0).integers(0, 256, size=(224, 224, 3), dtype=np.uint8)
    for transform in (siglip, dino):
        fast = fast_image_transform(transform)
        assert fast is not None
        assert torch.equal(fast(image), transform(Image.fromarray(image)))
    fused = FusedImageTransform({"dino": dino, "siglip": siglip})
    fast = fast_image_transform(fused)
    reference = fused(Image.fromarray(image))
    assert all(torch.equal(fast(image)[k], reference[k]) for k in reference)
    # Through the batch transform: same pixel values with and without the fast path; other sizes use PIL.
    action_tokenizer = ActionTokenizer(tiny_tokenizer)
    frame = _frame(np.zeros(7, np.float32))
    for size in (224, 100):
        frame["observation"]["image_primary"] = image[:size, :size]
        outputs = [
            RLDSBatchTransform(
                action_tokenizer, tiny_tokenizer, siglip, PurePromptBuilder, use_fast_image_path=fast
            )(frame)
            for fast in (True, False)
        ]
        assert torch.equal(outputs[0]["pixel_values"], outputs[1]["pixel_values"])
        assert outputs[0]["pixel_values"].shape == (3, 224, 224)
    assert fast_image_transform(lambda image: image) is None


def test_only_uint8_rgb_arrays_at_the_transform_size_take_the_array_path() -> None:
    """`accepts` is the one test training's batch transform, the policy and `DevicePixels` use: anything else
    (another size, a fourth channel, another dtype, a PIL image) goes through the backbone's own transform."""
    from PIL import Image

    from prismatic.vla.datasets.batch_transform import _ArrayToNormalizedTensor, _FusedArrayTransform

    part = _ArrayToNormalizedTensor.from_mean_std((4, 6), [0.5] * 3, [0.5] * 3)
    fused = _FusedArrayTransform({"a": part, "b": part}, (4, 6))
    cases = {
        "uint8 4x6x3": (np.zeros((4, 6, 3), np.uint8), True),
        "uint8 6x4x3": (np.zeros((6, 4, 3), np.uint8), False),
        "uint8 4x6x4": (np.zeros((4, 6, 4), np.uint8), False),
        "uint8 4x6": (np.zeros((4, 6), np.uint8), False),
        "float32 4x6x3": (np.zeros((4, 6, 3), np.float32), False),
        "PIL 6x4": (Image.new("RGB", (6, 4)), False),
    }
    for name, (image, expected) in cases.items():
        assert (part.accepts(image), fused.accepts(image)) == (expected, expected), name
