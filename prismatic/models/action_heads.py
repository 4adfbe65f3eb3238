"""Action heads: how a batch becomes the training loss. The loop calls a head and never knows how actions are
represented, so a new representation (e.g. continuous actions with an L1 head) is one registry entry here.

A head is called with the (possibly FSDP- or DDP-wrapped) model and a batch already on the device; it must call the
model through its `forward` (wrappers hook it) and return the loss to minimise plus what metrics read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from prismatic.util.errors import lookup


@dataclass
class HeadOutput:
    loss: torch.Tensor  # scalar, the mean loss of this micro-batch
    logits: torch.Tensor  # the LLM's logits over the sequence (patches included)


class TokenActionHead:
    """OpenVLA's: actions are 256 bins on the LLM's last token ids; the loss is the LLM's next-token cross-entropy
    over the label tokens (prompt and padding masked with -100, as the batch transform sets them)."""

    def __call__(self, model: torch.nn.Module, batch: dict[str, Any]) -> HeadOutput:
        output = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            labels=batch["labels"],
        )
        return HeadOutput(loss=output.loss, logits=output.logits)


ACTION_HEADS: dict[str, Callable[[], Callable[[torch.nn.Module, dict[str, Any]], HeadOutput]]] = {
    "tokens": TokenActionHead,
}


def get_action_head(name: str) -> Callable[[torch.nn.Module, dict[str, Any]], HeadOutput]:
    return lookup(ACTION_HEADS, name, "action head")()
