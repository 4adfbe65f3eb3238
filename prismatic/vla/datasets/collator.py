"""Batch collation for VLA training: pad token sequences, stack images, keep the continuous actions.

Sequences are padded to the longest in the batch (`input_ids` with the pad id, `labels` with `IGNORE_INDEX`, so
padding never enters the loss), that length rounded up to a multiple of `pad_to_multiple_of` (1: not rounded), and
then cut to `model_max_length`. Rounding bounds the distinct batch shapes: blocks replayed from CUDA graphs record a
graph per shape. `pixel_values` are stacked whether the vision backbone's transform returns one tensor or a dict of
tensors (fused backbones such as DINO + SigLIP).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from prismatic.util.constants import IGNORE_INDEX


def _stack(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`torch.stack`, through NumPy for plain CPU tensors: a single-threaded copy is several times faster than
    torch's thread pool while tf.data keeps the cores busy (same values, same dtype)."""
    if all(t.device.type == "cpu" and not t.requires_grad for t in tensors):
        return torch.from_numpy(np.stack([t.numpy() for t in tensors]))
    return torch.stack(tensors)


@dataclass
class PaddedCollatorForActionPrediction:
    """list of `RLDSBatchTransform` outputs -> {"pixel_values", "input_ids", "attention_mask", "labels",
    "actions" (float32[B, action_dim] or [B, chunk, action_dim]), "dataset_names" (list[str])}, plus "proprio"
    (float32[B, P]) and "action_mask" (bool[B, L], padded with False) when the instances carry them."""

    model_max_length: int
    pad_token_id: int
    padding_side: str = "right"
    pad_to_multiple_of: int = 1

    def __post_init__(self) -> None:
        if self.padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got '{self.padding_side}'.")
        if self.model_max_length < 1:
            raise ValueError(f"model_max_length must be >= 1, got {self.model_max_length}.")
        if self.pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}.")

    def _pad(self, sequences: Sequence[torch.Tensor], value: int, length: int) -> torch.Tensor:
        out = torch.full((len(sequences), length), value, dtype=torch.long)
        for i, seq in enumerate(sequences):
            if self.padding_side == "right":
                out[i, : len(seq)] = seq
            else:
                out[i, length - len(seq) :] = seq
        return out

    def __call__(self, instances: Sequence[dict[str, Any]]) -> dict[str, Any]:
        input_ids = [torch.as_tensor(x["input_ids"], dtype=torch.long) for x in instances]
        labels = [torch.as_tensor(x["labels"], dtype=torch.long) for x in instances]
        longest, multiple = max(len(ids) for ids in input_ids), self.pad_to_multiple_of
        length = -(-longest // multiple) * multiple

        batch_input_ids = self._pad(input_ids, self.pad_token_id, length)
        batch_labels = self._pad(labels, IGNORE_INDEX, length)
        # From the lengths, not `!= pad_token_id`: correct even if the pad id also occurs as a real token.
        attention_mask = self._pad(
            [torch.ones(len(ids), dtype=torch.long) for ids in input_ids], 0, length
        ).bool()

        # Truncate (right padding keeps the start of each sequence; left padding keeps the end).
        cut = (
            slice(0, self.model_max_length)
            if self.padding_side == "right"
            else slice(-self.model_max_length, None)
        )
        batch_input_ids, batch_labels, attention_mask = (
            batch_input_ids[:, cut],
            batch_labels[:, cut],
            attention_mask[:, cut],
        )

        pixel_values = [x["pixel_values"] for x in instances]
        if isinstance(pixel_values[0], torch.Tensor):
            stacked_pixels: torch.Tensor | dict[str, torch.Tensor] = _stack(pixel_values)
        elif isinstance(pixel_values[0], dict):
            stacked_pixels = {k: _stack([pv[k] for pv in pixel_values]) for k in pixel_values[0]}
        else:
            raise TypeError(
                f"pixel_values must be a Tensor or a dict of Tensors, got {type(pixel_values[0])}."
            )

        batch = {
            "pixel_values": stacked_pixels,
            "input_ids": batch_input_ids,
            "attention_mask": attention_mask,
            "labels": batch_labels,
            "actions": torch.from_numpy(np.stack([np.asarray(x["actions"], np.float32) for x in instances])),
            "dataset_names": [x["dataset_name"] for x in instances],
        }
        if "action_mask" in instances[0]:
            masks = [torch.as_tensor(x["action_mask"], dtype=torch.long) for x in instances]
            batch["action_mask"] = self._pad(masks, 0, length)[:, cut].bool()
            if not torch.equal(
                batch["action_mask"].sum(1), masks[0].new_tensor([int(m.sum()) for m in masks])
            ):
                raise ValueError(
                    f"Sequences longer than model_max_length={self.model_max_length} lost action positions when "
                    "cut; raise the model's max length or shorten the instructions."
                )
        if "proprio" in instances[0]:
            batch["proprio"] = torch.from_numpy(
                np.stack([np.asarray(x["proprio"], np.float32) for x in instances])
            )
        return batch
