"""A window of training steps under `torch.profiler` (`--profile.start_step`, `--profile.num_steps`).

`bench_gpu.py --profile` says where a synthetic step's time goes; this says it for the run itself: its data
pipeline, its strategy on its cluster, its model. Every rank profiles the same steps and writes its own files to
`<run_dir>/profile/` (no gather: a slow rank shows in its own trace): the Chrome trace, and a summary of where the
time went (`prismatic.util.kernel_profile.summarize`: device busy and idle, time and launches by kind of kernel,
the costliest kernels and host events), which is also logged. The device is synchronised at the window's two ends
so that it holds exactly those steps' work; the steps themselves run as without profiling (the same losses).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from prismatic.run_layout import PROFILE_DIR, PROFILE_SUMMARY, PROFILE_TRACE, TMP_PREFIX, profile_stem
from prismatic.util.files import write_json_atomic
from prismatic.util.kernel_profile import ProfileWindow, format_profile

if TYPE_CHECKING:
    from prismatic.conf.train import ProfileConfig

logger = logging.getLogger(__name__)


class StepProfiler:
    """Profiles optimiser steps `start_step` .. `start_step + num_steps - 1` of this rank. The loop calls
    `before_step(step)` before queuing each step and `close()` when it ends (a window the run did not finish is
    written with the steps it ran)."""

    def __init__(
        self, run_dir: Path, rank: int, device: torch.device, start_step: int, num_steps: int
    ) -> None:
        self.folder = run_dir / PROFILE_DIR
        self.rank, self.device = rank, device
        self.start_step, self.end_step = start_step, start_step + num_steps
        self._window: ProfileWindow | None = None
        self._last_step = 0
        self.written: list[Path] = []  # the trace and summary, once written

    def before_step(self, step: int) -> None:
        if step == self.end_step and self._window is not None:
            self._stop()
        if step == self.start_step:
            self._window = ProfileWindow(self.device)
            self._window.start()
        self._last_step = step

    def close(self) -> None:
        """Stop and write a window still open. Called in the loop's `finally`, so a failure here (the device
        that failed the step fails the sync too) is logged, never raised over the error that ended the loop."""
        if self._window is None:
            return
        try:
            self._stop()
        except Exception as error:  # noqa: BLE001
            logger.warning(
                "The profile of steps %d-%d was not written: %s", self.start_step, self._last_step, error
            )

    def _stop(self) -> None:
        window, self._window = self._window, None
        last = self._last_step
        summary = window.stop(last - self.start_step + 1)
        summary["steps"] = [self.start_step, last]
        stem = profile_stem(self.rank, self.start_step, last)
        trace = self.folder / f"{stem}{PROFILE_TRACE}"
        partial = trace.with_name(TMP_PREFIX + trace.name)  # renamed once whole: never a half-written trace
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            window.profiler.export_chrome_trace(str(partial))
            partial.replace(trace)
            summary_path = write_json_atomic(
                self.folder / f"{stem}{PROFILE_SUMMARY}", summary, "profile summary"
            )
        except Exception as error:  # noqa: BLE001 (a diagnostic that cannot be written must not stop training)
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            logger.warning(
                "Could not write the profile of steps %d-%d to %s: %s", self.start_step, last, trace, error
            )
            return
        self.written = [trace, summary_path]
        logger.info(
            "%s\n  (trace: %s)",
            format_profile(f"rank {self.rank}, steps {self.start_step}-{last}", summary),
            trace,
        )


def build_profiler(
    options: ProfileConfig, run_dir: Path, rank: int, device: torch.device, first_step: int, last_step: int
) -> StepProfiler | None:
    """The run's `StepProfiler` (None without `--profile.start_step`, or when the run, which trains steps
    `first_step` to `last_step`, never reaches the window: a warning says so)."""
    if options.start_step is None:
        return None
    if not first_step <= options.start_step <= last_step:
        logger.warning(
            "--profile.start_step %d is outside the steps this run trains (%d to %d): nothing is profiled.",
            options.start_step,
            first_step,
            last_step,
        )
        return None
    return StepProfiler(run_dir, rank, device, options.start_step, options.num_steps)
