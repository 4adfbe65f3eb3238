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
        already global). Collective: call on every rank. `start(...).result()`, waiting for the step at once.

        `also_sum`: a small float64 host tensor that rides on the same all-reduce and is replaced in place by its
        sum over the ranks (the preemption votes: the ranks agree on a signal without a collective of their own).
        """
        return self.start(grad_norm, also_sum).result()

    def start(
        self, grad_norm: torch.Tensor | None = None, also_sum: torch.Tensor | None = None
    ) -> PendingMetrics:
        """Queue the step's all-reduce and its copy to the host, and start the next step's sums; nothing waits.

        `result()` on the returned object waits for this step's work alone, so a loop can queue the next step
        first (`--vla.speed.overlap_steps`) and the device never idles while the host logs or makes the next batch.
        """
        extra = []
        if also_sum is not None:
            votes = also_sum.reshape(-1).to(torch.float64)
            if self.device.type == "cuda":  # pinned: the copy does not wait for the step's queued work
                votes = votes.pin_memory()
            extra = [votes.to(self.device, non_blocking=True)]
        packed = torch.cat([self.sums.flatten(), self.loss_sum, *extra])
        if dist.is_initialized():
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        if grad_norm is not None:
            packed = torch.cat([packed, grad_norm.detach().double().reshape(1).to(packed.device)])
        pending = PendingMetrics(self, packed, also_sum, grad_norm is not None)
        self.reset()
        return pending

    def parse(
        self, packed: torch.Tensor, also_sum: torch.Tensor | None, has_grad_norm: bool
    ) -> dict[str, float]:
        """The metrics dict from a packed host copy (`start`'s layout: sums, loss sum, micro-batches, votes,
        gradient norm); the votes' sums go into `also_sum`."""
        n = self.sums.numel()
        k = also_sum.numel() if also_sum is not None else 0
        if also_sum is not None:
            also_sum.copy_(packed[n + 2 : n + 2 + k].view_as(also_sum))
        sums = packed[:n].view_as(self.sums)
        loss_sum, n_micro = packed[n].item(), packed[n + 1].item()
        out = {"loss": loss_sum / max(n_micro, 1.0), **self._ratios(sums.sum(dim=0))}
        if has_grad_norm:
            out["grad_norm"] = packed[n + 2 + k].item()
        if len(self.dataset_names) > 1:
            for name, row in zip(self.dataset_names, sums, strict=True):
                if row[-1] > 0:
                    out.update({f"{name}/{key}": value for key, value in self._ratios(row).items()})
                    out[f"{name}/samples"] = row[-1].item()
        return out


class PendingMetrics:
    """One step's packed metrics on their way to the host. On CUDA the copy goes into pinned memory behind the
    step's queued work, with an event; `result()` waits for that event (this step), not for later queued steps."""

    def __init__(
        self,
        metrics: StepMetrics,
        packed: torch.Tensor,
        also_sum: torch.Tensor | None,
        has_grad_norm: bool,
    ) -> None:
        self.metrics, self.also_sum, self.has_grad_norm = metrics, also_sum, has_grad_norm
        self.event: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self.host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self.host.copy_(packed, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = packed.cpu()  # the host's own tensor (CPU), or a copy that waits (other devices)

    def ready(self) -> bool:
        """Whether `result()` would return without waiting (the step's work is done)."""
        return self.event is None or self.event.query()

    def result(self) -> dict[str, float]:
        """The step's global metrics (waits for the step's work on the device, the one host sync per step)."""
        if self.event is not None:
            self.event.synchronize()
        return self.metrics.parse(self.host, self.also_sum, self.has_grad_norm)
