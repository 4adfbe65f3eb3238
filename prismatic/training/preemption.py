"""Preemption: SIGTERM / SIGINT end a run cleanly at a step boundary with a checkpoint, on every rank together.

Clusters preempt with SIGTERM (SLURM, Kubernetes; torchrun forwards it to its workers), people press Ctrl-C
(SIGINT). The handler only records the signal. After each optimiser step the loop asks `requested()`: the ranks
agree (one max-reduction of a small CPU tensor on a gloo group, no device sync), because a signal can reach
them between different steps and a rank that stopped alone would leave the others waiting in a collective. Then
every rank saves a checkpoint and the process exits with code 128 + signal (143 for SIGTERM, 130 for SIGINT), the
shell's convention for "ended by this signal"; a plain `--resume` continues the run. A second Ctrl-C while
saving interrupts at once (KeyboardInterrupt): the last complete checkpoint is untouched.

torchrun gives its workers 30 s after forwarding SIGTERM before it kills them; a save that takes longer (very
large models on slow storage) needs the signal delivered to the workers directly (e.g. SLURM `--signal`) earlier.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's code for a process ended by `signum` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + signum


class Preempted(Exception):
    """Raised by the loop after the preemption checkpoint is saved on every rank."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} at step {step}")
        self.signum, self.step = signum, step


class PreemptionHandler:
    """Records SIGTERM / SIGINT while installed (a context manager); `requested()` is the ranks' agreement."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}
        # Agreement on a gloo group: CPU tensors, no wait on the GPU, and never interleaved with training's own
        # collectives on the default (NCCL) group.
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None

    def __enter__(self) -> PreemptionHandler:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._group is not None:
            dist.destroy_process_group(self._group)
            self._group = None

    def _record(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if not self.signum:
            logger.warning(
                "Received %s: finishing this step, then saving a checkpoint and exiting (Ctrl-C again to stop now).",
                signal.Signals(signum).name,
            )
        self.signum = signum

    def requested(self) -> int:
        """The signal any rank received (0 if none). Collective: every rank calls it after every step."""
        if self._group is None:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return int(flag.item())
