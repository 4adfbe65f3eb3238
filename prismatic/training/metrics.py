"""Per-step training metrics: loss, action-token accuracy and L1 of decoded actions, overall and per dataset.

Each micro-batch adds sums into one tensor; at the end of the optimiser step a single all-reduce (SUM) over
ranks turns them into global means, so every reported number covers the whole global batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from prismatic.vla.action_tokenizer import ActionTokenizer

# Columns of the per-dataset sums: correct action tokens, action tokens, |pred - true| summed, samples.
_CORRECT, _COUNT, _L1, _SAMPLES = range(4)


class StepMetrics:
    """Accumulates one optimiser step's micro-batches; `reduce()` returns the global metrics (collective)."""

    def __init__(
        self, dataset_names: list[str], action_tokenizer: ActionTokenizer, device: torch.device
    ) -> None:
        self.dataset_names = list(dataset_names)
        self.index = {name: i for i, name in enumerate(self.dataset_names)}
        self.action_tokenizer = action_tokenizer
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.dataset_names), 4, dtype=torch.float64)
        self.loss_sum = torch.zeros(2, dtype=torch.float64)  # (sum of micro-batch losses, micro-batches)

    @torch.no_grad()
    def update(
        self,
        loss: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        num_patches: int,
        dataset_names: list[str],
    ) -> None:
        """Add one micro-batch. `logits` are the VLM's (patches included); `labels` are the text labels."""
        self.loss_sum += torch.tensor([float(loss), 1.0], dtype=torch.float64)
        # Logit at position t predicts token t+1; patches sit after BOS, so text token j>=1 is predicted at
        # position num_patches + j - 1.
        preds = logits[:, num_patches:-1].argmax(dim=-1).cpu().numpy()
        targets = labels[:, 1:].cpu().numpy()
        mask = targets > self.action_tokenizer.action_token_begin_idx
        correct = ((preds == targets) & mask).sum(axis=1)
        count = mask.sum(axis=1)
        err = np.abs(self.action_tokenizer.decode_ids(preds) - self.action_tokenizer.decode_ids(targets))
        l1 = np.where(mask, err, 0.0).sum(axis=1)
        for i, name in enumerate(dataset_names):
            row = self.index[name]
            self.sums[row] += torch.tensor([correct[i], count[i], l1[i], 1.0], dtype=torch.float64)

    def reduce(self) -> dict[str, float]:
        """Global metrics for the step: means over all ranks and micro-batches. Collective: call on every rank."""
        packed = torch.cat([self.sums.flatten(), self.loss_sum]).to(self.device)
        if dist.is_initialized():
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        packed = packed.cpu()
        sums = packed[: self.sums.numel()].view_as(self.sums)
        loss_sum, n_micro = packed[-2].item(), packed[-1].item()
        total = sums.sum(dim=0)
        out = {
            "loss": loss_sum / max(n_micro, 1.0),
            "action_accuracy": (total[_CORRECT] / total[_COUNT].clamp(min=1)).item(),
            "l1_loss": (total[_L1] / total[_COUNT].clamp(min=1)).item(),
        }
        if len(self.dataset_names) > 1:
            for name, row in zip(self.dataset_names, sums, strict=True):
                if row[_COUNT] > 0:
                    out[f"{name}/action_accuracy"] = (row[_CORRECT] / row[_COUNT]).item()
                    out[f"{name}/l1_loss"] = (row[_L1] / row[_COUNT]).item()
                    out[f"{name}/samples"] = row[_SAMPLES].item()
        self.reset()
        return out
