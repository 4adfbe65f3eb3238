"""`PaddedCollatorForActionPrediction`: padding, attention mask, truncation, image stacking."""

from __future__ import annotations

from pathlib import Path

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


def test_lengths_round_up_to_the_multiple_and_stay_within_the_max_length() -> None:
    """`pad_to_multiple_of`: the batch's longest sequence (5 tokens) rounds up to 8, with pad ids, ignored labels and
    masked positions; a batch already at a multiple keeps its length; the max length still cuts (to 6, padding only);
    the action mask pads with False like the attention mask."""
    collator = PaddedCollatorForActionPrediction(model_max_length=16, pad_token_id=PAD, pad_to_multiple_of=4)
    first = _instance([1, 5, 6, 7, 2], torch.zeros(1))
    first["action_mask"] = torch.tensor([0, 0, 0, 1, 1])
    second = _instance([1, 7, 2], torch.zeros(1))
    second["action_mask"] = torch.tensor([0, 1, 1])
    batch = collator([first, second])
    assert batch["input_ids"].tolist() == [[1, 5, 6, 7, 2, PAD, PAD, PAD], [1, 7, 2] + [PAD] * 5]
    assert batch["labels"].tolist() == [[-100, -100, -100, 7, 2, -100, -100, -100], [-100, 7, 2] + [-100] * 5]
    assert batch["attention_mask"].tolist() == [[True] * 5 + [False] * 3, [True] * 3 + [False] * 5]
    assert batch["action_mask"].tolist() == [
        [False] * 3 + [True] * 2 + [False] * 3,
        [False, True, True] + [False] * 5,
    ]

    four = collator([_instance([1, 5, 6, 2], torch.zeros(1)), _instance([1, 2], torch.zeros(1))])
    assert four["input_ids"].tolist() == [[1, 5, 6, 2], [1, 2, PAD, PAD]]

    capped = PaddedCollatorForActionPrediction(model_max_length=6, pad_token_id=PAD, pad_to_multiple_of=4)
    assert capped([_instance([1, 5, 6, 7, 2], torch.zeros(1))])["input_ids"].tolist() == [
        [1, 5, 6, 7, 2, PAD]
    ]

    left = PaddedCollatorForActionPrediction(16, PAD, padding_side="left", pad_to_multiple_of=4)
    assert left([_instance([1, 7, 2], torch.zeros(1))])["input_ids"].tolist() == [[PAD, 1, 7, 2]]
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PaddedCollatorForActionPrediction(8, PAD, pad_to_multiple_of=0)


def test_the_training_stream_rounds_lengths_as_asked(toy_data_root: Path) -> None:
    """`build_train_data(..., pad_to_multiple=16)` (what `train()` passes from the strategy) hands the loader a
    collator that rounds: the first batch of the toy mixture holds the same real tokens as without rounding, in a
    length that is a multiple of 16."""
    from prismatic.conf.train import TrainConfig
    from prismatic.conf.vla import VLAConfig
    from prismatic.training.model_setup import attach_action_head, build_vlm
    from prismatic.util.dist import DistInfo
    from prismatic.vla.datasets.builders import build_train_data
    from prismatic.vla.datasets.rlds import mixture_statistics

    cfg = TrainConfig(vla=VLAConfig.get_choice_class("tiny+mx-toy")(), data_root_dir=toy_data_root)
    cfg.vla.shuffle_buffer_size = 8
    info = DistInfo(0, 0, 1, 1, torch.device("cpu"))
    vlm = build_vlm(cfg.vla, None)
    head = attach_action_head(vlm, cfg.vla, mixture_statistics(toy_data_root, "toy", options=cfg.data))
    shapes = {}
    for multiple in (1, 16):
        data = build_train_data(cfg, vlm, head, info, pad_to_multiple=multiple)
        batch = next(iter(data.loader))
        shapes[multiple] = (batch["input_ids"].shape[1], batch["attention_mask"].sum(1).tolist())
    (plain, real), (rounded, rounded_real) = shapes[1], shapes[16]
    assert rounded % 16 == 0 and plain <= rounded < plain + 16 and rounded_real == real
