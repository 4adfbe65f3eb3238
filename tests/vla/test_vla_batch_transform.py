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
