"""OpenVLA's action head: each action dimension is one of 256 bins on the LLM's last token ids.

Training: the text after the prompt is one token per action dimension and EOS, with labels on them; the loss is
the LLM's next-token cross-entropy. Inference: greedy decoding of `action_dim` tokens (constrained to the action
ids by default), read back as bin centres. `token_layout` is the layout itself, which the batch transform uses by
default, so OpenVLA's frames are laid out by this one function.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from prismatic.models.action_heads.base import ActionHead, DecodeRequest, HeadOutput, HeadPrediction
from prismatic.models.action_heads.registry import ActionSpec
from prismatic.models.decoding import DecodeOptions, greedy_decode, openvla_action_ids
from prismatic.util.constants import IGNORE_INDEX


def token_layout(
    action_tokenizer: Any, prefix_ids: list[int], actions: np.ndarray, eos_id: int
) -> dict[str, torch.Tensor]:
    """prompt + one token per action dimension + EOS; labels on the action tokens and EOS."""
    action_ids = action_tokenizer.encode_to_ids(np.asarray(actions, np.float32).reshape(-1)).tolist()
    input_ids = torch.tensor([*prefix_ids, *action_ids, eos_id], dtype=torch.long)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[len(prefix_ids) :] = input_ids[len(prefix_ids) :]
    return {"input_ids": input_ids, "labels": labels}


class TokenActionHead(ActionHead):
    """OpenVLA's: actions are 256 bins on the LLM's last token ids; the loss is the LLM's next-token cross-entropy
    over the label tokens (prompt and padding masked with IGNORE_INDEX)."""

    uses_lm_head = True
    columns = ("ce_sum", "supervised", "correct", "action_tokens", "l1_sum")
    ratios = {
        "loss": ("ce_sum", "supervised"),
        "action_accuracy": ("correct", "action_tokens"),
        "l1_loss": ("l1_sum", "action_tokens"),
    }

    def __init__(self, spec: ActionSpec, action_tokenizer: Any, num_prefix_tokens: int) -> None:
        super().__init__(spec, action_tokenizer, num_prefix_tokens)
        self._bin_centers: dict[torch.device, torch.Tensor] = {}

    def layout(self, prefix_ids: list[int], actions: np.ndarray, eos_id: int) -> dict[str, torch.Tensor]:
        return token_layout(self.action_tokenizer, prefix_ids, actions, eos_id)

    def _decode(self, ids: torch.Tensor) -> torch.Tensor:
        """`ActionTokenizer.decode_ids` on the device: `vocab_size - id` is the 1-based bin, shifted and clipped."""
        centers = self._bin_centers.get(ids.device)
        if centers is None:
            centers = torch.as_tensor(
                self.action_tokenizer.bin_centers, dtype=torch.float64, device=ids.device
            )
            self._bin_centers[ids.device] = centers
        index = (self.action_tokenizer.vocab_size - ids - 1).clamp(0, centers.numel() - 1)
        return centers[index]

    def __call__(self, model: nn.Module, batch: dict[str, Any], *, with_loss: bool = True) -> HeadOutput:
        labels = batch["labels"]
        if self.logits_at_labels:
            return self._at_labels(model, batch, labels, with_loss)
        output = model(**self.model_inputs(batch), labels=labels if with_loss else None)
        return HeadOutput(
            loss=output.loss if with_loss else output.logits.new_zeros(()),
            sums=self.sums(output.logits, labels),
        )

    def label_positions(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The text positions `[B, K]` whose next token is labelled (in order), and those targets.

        K is this layout's label count (one token per action value, then EOS), so no device sync is needed to
        size it; a row with fewer labels (truncated) fills its tail with unlabelled positions, whose targets are
        IGNORE_INDEX. Position j predicts text token j + 1.
        """
        targets = labels[:, 1:]
        count = min(self.spec.chunk_size * self.spec.action_dim + 1, targets.shape[1])
        supervised = (targets != IGNORE_INDEX).to(torch.uint8)
        order = torch.sort(supervised, dim=1, descending=True, stable=True).indices[:, :count]
        return order, targets.gather(1, order)

    def _at_labels(
        self, model: nn.Module, batch: dict[str, Any], labels: torch.Tensor, with_loss: bool
    ) -> HeadOutput:
        """The loss and sums from the logits at the labelled positions only (`--vla.speed.logits_at_labels`): the same
        mean cross-entropy over labelled tokens as the LLM's own loss, without a `[B, S, vocab]` logits tensor."""
        positions, targets = self.label_positions(labels)
        output = model(**self.model_inputs(batch), logits_positions=positions + self.num_prefix_tokens)
        logits = output.logits.float()
        loss = (
            F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
            if with_loss
            else logits.new_zeros(())
        )
        return HeadOutput(loss=loss, sums=self._sums(logits, targets))

    @torch.no_grad()
    def sums(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """float64 [B, 5]: CE summed over supervised tokens, their count, correct / all action tokens, L1 sum.

        Logit at position t predicts token t+1; the prefix (patches, proprio) sits after BOS, so text token j >= 1 is
        predicted at position num_prefix_tokens + j - 1. No host synchronisation: masks multiply.
        """
        text_logits = logits[:, self.num_prefix_tokens : -1]
        return self._sums(text_logits, labels[:, 1:].to(text_logits.device))

    @torch.no_grad()
    def _sums(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """`sums` of logits `[B, T, vocab]` already aligned with their targets `[B, T]`."""
        ce = F.cross_entropy(
            logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
        ).view_as(targets)  # 0 where ignored
        supervised = targets != IGNORE_INDEX
        preds = logits.argmax(dim=-1)
        action = targets > self.action_tokenizer.action_token_begin_idx
        correct = (preds == targets) & action
        l1 = (self._decode(preds) - self._decode(targets)).abs() * action
        return torch.stack(
            [
                ce.double().sum(1),
                supervised.sum(1).double(),
                correct.sum(1).double(),
                action.sum(1).double(),
                l1.sum(1),
            ],
            dim=1,
        )

    def predict(self, vlm: nn.Module, request: DecodeRequest) -> HeadPrediction:
        """Greedy decoding of `action_dim` tokens per row, as OpenVLA's `predict_action`; unconstrained decoding
        stops at EOS as its `generate` does, and the action is read from prompt + output (logprobs of ids taken
        from the prompt are NaN)."""
        # Action ids come from the tokenizer's vocabulary size, as in training; the model's embedding matrix may
        # have more (padded) rows, which only unconstrained decoding can pick.
        action_ids = range(self.action_tokenizer.action_token_begin_idx + 1, self.action_tokenizer.vocab_size)
        action_dim = request.action_dim
        tokens = greedy_decode(
            vlm,
            request.prompt_ids,
            request.pixel_values,
            action_dim,
            pad_id=request.pad_id,
            allowed_ids=action_ids if request.constrained else None,
            proprio=request.proprio,
            options=DecodeOptions(
                use_cache=request.use_cache,
                static_cache=request.static_cache,
                compile_steps=request.compile_steps,
                compile_scope=request.compile_scope,
            ),
        )
        token_ids, logprobs = tokens.token_ids.numpy(), tokens.logprobs.numpy()
        if not request.constrained:
            for row, prompt in enumerate(request.prompt_ids):
                ids, generated = openvla_action_ids(
                    prompt, token_ids[row].tolist(), request.eos_id, action_dim
                )
                shift = action_dim - sum(generated)
                logprobs[row] = np.concatenate(
                    [np.full(shift, np.nan, np.float32), logprobs[row, : action_dim - shift]]
                )
                token_ids[row] = ids
        normalized = self.action_tokenizer.decode_ids(token_ids)
        return HeadPrediction(token_ids.astype(np.int64), normalized, logprobs.astype(np.float32))
