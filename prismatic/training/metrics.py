"""Per-step training metrics: the loss and the action head's ratios (token accuracy and L1 for `tokens`; L1 overall
and per action dimension for `l1-chunk`), overall and per dataset.

Each micro-batch adds the head's per-sample sums into one tensor; at the end of the optimiser step a single
all-reduce (SUM) over ranks turns them into global ratios, so every reported number covers the whole global batch.
The same all-reduce carries the ranks' preemption votes (`also_sum`), so agreeing on a signal costs no collective.
`loss` is the mean of the micro-batches' losses (what backward saw); every other metric is a ratio of sums
(`ActionHead.ratios`), so a dataset counts by its frames, not by its micro-batches.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prismatic.models.action_heads import ActionHead


class StepMetrics:
    """Accumulates one optimiser step's micro-batches on the device; `reduce()` returns the global metrics.

    Nothing here waits for the device: sums stay device tensors until `reduce()`, which packs them with the
    gradient norm into one tensor, all-reduces it and copies it to the host once per step.
    """

    def __init__(self, dataset_names: list[str], head: ActionHead, device: torch.device) -> None:
        self.dataset_names = list(dataset_names)
        self.index = {name: i for i, name in enumerate(self.dataset_names)}
        self.head = head
        self.columns = {name: i for i, name in enumerate(head.columns)}
        self.device = device
        self.reset()

    def reset(self) -> None:
        # Per dataset: the head's sums, then the sample count.
        self.sums = torch.zeros(
            len(self.dataset_names), len(self.columns) + 1, dtype=torch.float64, device=self.device
        )
        # (sum of micro-batch losses, micro-batches)
        self.loss_sum = torch.zeros(2, dtype=torch.float64, device=self.device)

    @torch.no_grad()
    def update(self, loss: torch.Tensor, sums: torch.Tensor, dataset_names: list[str]) -> None:
        """Add one micro-batch: its mean loss and the head's per-sample sums `[B, len(head.columns)]`."""
        self.loss_sum[0] += loss.detach().double()
        self.loss_sum[1] += 1.0
        rows = torch.tensor([self.index[n] for n in dataset_names])
        if self.device.type == "cuda":  # a pageable host copy would wait for the queued backward
            rows = rows.pin_memory().to(self.device, non_blocking=True)
        per_sample = torch.cat(
            [sums.to(self.device, torch.float64), sums.new_ones((sums.shape[0], 1))], dim=1
        )
        self.sums.index_add_(0, rows, per_sample.to(self.device, torch.float64))

    def _ratios(self, row: torch.Tensor) -> dict[str, float]:
        return {
            name: (row[self.columns[num]] / row[self.columns[den]].clamp(min=1)).item()
            for name, (num, den) in self.head.ratios.items()
            if name != "loss"
        }

    def reduce(
        self, grad_norm: torch.Tensor | None = None, also_sum: torch.Tensor | None = None
    ) -> dict[str, float]:
        """Global metrics for the step: means over all ranks and micro-batches (and the gradient norm, which is
        already global). Collective: call on every rank.

        `also_sum`: a small float64 host tensor that rides on the same all-reduce and is replaced in place by its
        sum over the ranks (the preemption votes: the ranks agree on a signal without a collective of their own).
        """
        extra = []
        if also_sum is not None:
            votes = also_sum.reshape(-1).to(torch.float64)
            if self.device.type == "cuda":  # pinned: the copy does not wait for the step's queued work
                votes = votes.pin_memory()
            extra = [votes.to(self.device, non_blocking=True)]
        k = also_sum.numel() if also_sum is not None else 0
        packed = torch.cat([self.sums.flatten(), self.loss_sum, *extra])
        if dist.is_initialized():
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        if grad_norm is not None:
            packed = torch.cat([packed, grad_norm.detach().double().reshape(1).to(packed.device)])
        packed = packed.cpu()  # the step's one host sync
        n = self.sums.numel()
        if also_sum is not None:
            also_sum.copy_(packed[n + 2 : n + 2 + k].view_as(also_sum))
        sums = packed[:n].view_as(self.sums)
        loss_sum, n_micro = packed[n].item(), packed[n + 1].item()
        out = {"loss": loss_sum / max(n_micro, 1.0), **self._ratios(sums.sum(dim=0))}
        if grad_norm is not None:
            out["grad_norm"] = packed[n + 2 + k].item()
        if len(self.dataset_names) > 1:
            for name, row in zip(self.dataset_names, sums, strict=True):
                if row[-1] > 0:
                    out.update({f"{name}/{key}": value for key, value in self._ratios(row).items()})
                    out[f"{name}/samples"] = row[-1].item()
        self.reset()
        return out
