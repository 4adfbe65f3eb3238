"""Preemption: SIGTERM / SIGINT end a run cleanly at a step boundary with a checkpoint, on every rank together.

Clusters preempt with SIGTERM (SLURM, Kubernetes; torchrun forwards it to its workers), people press Ctrl-C
(SIGINT). The handler only records the signal. The ranks must agree, because a signal can reach them between
different steps and a rank that stopped alone would leave the others waiting in a collective. They agree without a
collective of their own: each step the loop hands `votes()` (this rank's "got SIGTERM", "got SIGINT" as 0 / 1) to the
metrics' all-reduce that runs anyway (`StepMetrics.reduce(..., also_sum=votes)`), which sums them over the ranks,
and `agreed(votes)` reads the same signal on every rank (SIGTERM when any rank got it, else SIGINT). Then every
rank saves a checkpoint and the process exits with code 128 + signal (143 for SIGTERM, 130 for SIGINT), the
shell's convention for "ended by this signal"; a plain `--resume` continues the run. A second Ctrl-C while saving
interrupts at once (KeyboardInterrupt): the last complete checkpoint is untouched.

torchrun gives its workers 30 s after forwarding SIGTERM before it kills them; a save that takes longer (very
large models on slow storage) needs the signal delivered to the workers directly and earlier
(`configs/slurm_train.sh` does the arithmetic for a 7B save).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import torch

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)  # the order of the vote columns


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by `signum` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


class Preempted(Exception):
    """Raised by the loop after the preemption checkpoint is saved on every rank."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


class PreemptionHandler:
    """Records SIGTERM / SIGINT while installed (a context manager). `votes()` and `agreed()` turn the ranks'
    records into one decision through a reduction the caller already runs; the handler communicates nothing."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> PreemptionHandler:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if not self.signum:
            logger.warning(
                "Received %s: finishing this step, then saving a checkpoint and exiting (Ctrl-C again to stop now).",
                signal.Signals(signum).name,
            )
        self.signum = signum

    def votes(self) -> torch.Tensor:
        """This rank's record as float64 host columns `[got SIGTERM, got SIGINT]` (0 or 1), to be summed over the
        ranks by a reduction that already runs; the sums count the ranks that got each signal."""
        return torch.tensor([float(self.signum == sig) for sig in SIGNALS], dtype=torch.float64)

    def agreed(self, ranks_per_signal: torch.Tensor) -> int:
        """The signal every rank acts on, from `votes()` summed over all ranks: SIGTERM when any rank got it (the
        scheduler's stop outranks a Ctrl-C), else SIGINT when any rank got it, else 0."""
        for sig, ranks in zip(SIGNALS, ranks_per_signal.tolist(), strict=True):
            if ranks > 0:
                return int(sig)
        return 0
