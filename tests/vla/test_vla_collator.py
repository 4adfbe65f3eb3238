"""`PaddedCollatorForActionPrediction`: padding, attention mask, truncation, image stacking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from prismatic.util.constants import IGNORE_INDEX
from prismatic.vla.datasets import PaddedCollatorForActionPrediction

PAD = 1024


def _instance(ids: list[int], pixel_values: object, name: str = "toy_push") -> dict:
    return {
        "pixel_values": pixel_values,
        "input_ids": torch.tensor(ids),
        "labels": torch.tensor([IGNORE_INDEX] * (len(ids) - 2) + ids[-2:]),
        "dataset_name": name,
        "actions": np.arange(7, dtype=np.float32) * len(ids),
    }


def test_right_padding() -> None:
    collator = PaddedCollatorForActionPrediction(model_max_length=16, pad_token_id=PAD)
    batch = collator(
        [_instance([1, 5, 6, 2], torch.zeros(3, 2, 2)), _instance([1, 7, 2], torch.ones(3, 2, 2), "b")]
    )
    assert batch["input_ids"].tolist() == [[1, 5, 6, 2], [1, 7, 2, PAD]]
    assert batch["labels"].tolist() == [[-100, -100, 6, 2], [-100, 7, 2, -100]]
    assert batch["attention_mask"].tolist() == [[True] * 4, [True, True, True, False]]
    assert batch["pixel_values"].shape == (2, 3, 2, 2)
    assert batch["actions"].dtype == torch.float32 and batch["actions"].shape == (2, 7)
    assert batch["actions"][1, 1].item() == 3.0
    assert batch["dataset_names"] == ["toy_push", "b"]


def test_left_padding_truncation_and_dict_pixels() -> None:
    pixels = {"dino": torch.zeros(3, 2, 2), "siglip": torch.ones(3, 4, 4)}
    left = PaddedCollatorForActionPrediction(model_max_length=16, pad_token_id=PAD, padding_side="left")
    batch = left([_instance([1, 5, 6, 2], pixels), _instance([1, 7, 2], pixels)])
    assert batch["input_ids"].tolist() == [[1, 5, 6, 2], [PAD, 1, 7, 2]]
    assert batch["attention_mask"][1].tolist() == [False, True, True, True]
    assert batch["pixel_values"]["siglip"].shape == (2, 3, 4, 4)

    short = PaddedCollatorForActionPrediction(model_max_length=3, pad_token_id=PAD)
    batch = short([_instance([1, 5, 6, 2], torch.zeros(1)), _instance([1, 7, 2], torch.zeros(1))])
    assert batch["input_ids"].tolist() == [[1, 5, 6], [1, 7, 2]]
    assert batch["labels"].shape == batch["attention_mask"].shape == (2, 3)
    with pytest.raises(ValueError, match="padding_side"):
        PaddedCollatorForActionPrediction(8, PAD, padding_side="middle")
