"""Per-step training metrics: loss, action-token accuracy and L1 of decoded actions, overall and per dataset.

Each micro-batch adds sums into one tensor; at the end of the optimiser step a single all-reduce (SUM) over
ranks turns them into global means, so every reported number covers the whole global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prismatic.vla.action_tokenizer import ActionTokenizer

# Columns of the per-dataset sums: correct action tokens, action tokens, |pred - true| summed, samples.
_CORRECT, _COUNT, _L1, _SAMPLES = range(4)


class StepMetrics:
    """Accumulates one optimiser step's micro-batches on the device; `reduce()` returns the global metrics.

    Nothing here waits for the device: sums stay device tensors until `reduce()`, which packs them with the
    gradient norm into one tensor, all-reduces it and copies it to the host once per step.
    """

    def __init__(
        self, dataset_names: list[str], action_tokenizer: ActionTokenizer, device: torch.device
    ) -> None:
        self.dataset_names = list(dataset_names)
        self.index = {name: i for i, name in enumerate(self.dataset_names)}
        self.action_tokenizer = action_tokenizer
        self.device = device
        self.bin_centers = torch.as_tensor(action_tokenizer.bin_centers, dtype=torch.float64, device=device)
        self.reset()

    def reset(self) -> None:
        self.sums = torch.zeros(len(self.dataset_names), 4, dtype=torch.float64, device=self.device)
        # (sum of micro-batch losses, micro-batches)
        self.loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)

    def _decode(self, ids: torch.Tensor) -> torch.Tensor:
        """`ActionTokenizer.decode_ids` on the device: `vocab_size - id` is the 1-based bin, shifted and clipped."""
        index = (self.action_tokenizer.vocab_size - ids - 1).clamp(0, self.bin_centers.numel() - 1)
        return self.bin_centers[index]

    @torch.no_grad()
    def update(
        self,
        loss: torch.Tensor,
        logits: torch.Tensor,
        labels: torch.Tensor,
        num_patches: int,
        dataset_names: list[str],
    ) -> None:
        """Add one micro-batch. `logits` are the VLM's (patches included); `labels` are the text labels (on the
        logits' device)."""
        self.loss_sum[0] += loss.detach().double()
        self.loss_sum[1] += 1.0
        # Logit at position t predicts token t+1; patches sit after BOS, so text token j>=1 is predicted at
        # position num_patches + j - 1.
        preds = logits[:, num_patches:-1].argmax(dim=-1)
        targets = labels[:, 1:].to(preds.device)
        mask = targets > self.action_tokenizer.action_token_begin_idx
        correct = ((preds == targets) & mask).sum(dim=1).double()
        count = mask.sum(dim=1).double()
        l1 = torch.where(mask, (self._decode(preds) - self._decode(targets)).abs(), 0.0).sum(dim=1)
        rows = torch.tensor([self.index[n] for n in dataset_names], device=self.device)
        per_sample = torch.stack([correct, count, l1, torch.ones_like(count)], dim=1).to(self.device)
        self.sums.index_add_(0, rows, per_sample)

    def reduce(self, grad_norm: torch.Tensor | None = None) -> dict[str, float]:
        """Global metrics for the step: means over all ranks and micro-batches (and the gradient norm, which is
        already global). Collective: call on every rank."""
        packed = torch.cat([self.sums.flatten(), self.loss_sum])
        if dist.is_initialized():
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        if grad_norm is not None:
            packed = torch.cat([packed, grad_norm.detach().double().reshape(1).to(packed.device)])
        packed = packed.cpu()  # the step's one host sync
        n = self.sums.numel()
        sums = packed[:n].view_as(self.sums)
        loss_sum, n_micro = packed[n].item(), packed[n + 1].item()
        total = sums.sum(dim=0)
        out = {
            "loss": loss_sum / max(n_micro, 1.0),
            "action_accuracy": (total[_CORRECT] / total[_COUNT].clamp(min=1)).item(),
            "l1_loss": (total[_L1] / total[_COUNT].clamp(min=1)).item(),
        }
        if grad_norm is not None:
            out["grad_norm"] = packed[n + 2].item()
        if len(self.dataset_names) > 1:
            for name, row in zip(self.dataset_names, sums, strict=True):
                if row[_COUNT] > 0:
                    out[f"{name}/action_accuracy"] = (row[_CORRECT] / row[_COUNT]).item()
                    out[f"{name}/l1_loss"] = (row[_L1] / row[_COUNT]).item()
                    out[f"{name}/samples"] = row[_SAMPLES].item()
        self.reset()
        return out
