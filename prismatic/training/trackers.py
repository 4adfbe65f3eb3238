"""Metric trackers behind one small interface: jsonl (one object per optimiser step) and Weights & Biases.

`TRACKERS` is the registry `--trackers` chooses from (the config reads it while parsing: this module imports no
torch). A new tracker is a `Tracker` subclass (`from_run`, `log`, `finish`) plus one `TRACKERS.register` line.
Only rank 0 tracks. Both continue, rather than restart, when a run is resumed: the jsonl file is cut back to the
resumed step and appended to; the W&B run id is kept in the run folder and the same W&B run is resumed.
Secrets stay out of W&B: its config has them blanked and the command line it records has their values redacted
(`prismatic/util/redact.py`). A metrics log that cannot be written (full disk) is a `ConfigError` naming it.
"""

from __future__ import annotations

import json
import logging
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonlines

from prismatic.run_layout import METRICS_FILE, WANDB_ID_FILE
from prismatic.util.files import atomic_write, write_error, write_text_atomic
from prismatic.util.lazy import LazyRegistry
from prismatic.util.redact import argv_redacted, redact_config

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker may need of the run it tracks; `build_trackers` hands the same one to every tracker."""

    run_dir: Path
    run_id: str
    config: dict[str, Any]  # the run's config as plain data (what W&B records)
    resume_step: int | None  # the step resumed from; None for a new run
    wandb_project: str = "openvla"
    wandb_entity: str | None = None


class Tracker(ABC):
    """One metrics sink. `from_run` builds it for a run (on rank 0 only); the loop calls `log` once per optimiser
    step and `finish` at the end."""

    @classmethod
    def from_run(cls, run: TrackerRun) -> Tracker:
        """This tracker for `run`, continuing its earlier records when `run.resume_step` is set (default:
        `cls(run)`; a tracker with other constructor arguments overrides it)."""
        return cls(run)

    @abstractmethod
    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of optimiser step `step`."""

    @abstractmethod
    def finish(self) -> None:
        """Flush and close, at the end of the run."""


class JSONLinesTracker(Tracker):
    """Appends `{"step": N, ...metrics}` to `<run_dir>/metrics.jsonl`, flushed every step."""

    def __init__(self, run_dir: Path, resume_step: int | None) -> None:
        self.path = run_dir / METRICS_FILE
        if self.path.exists():
            # Steps after the checkpoint we resume from are re-run, so their old records are dropped.
            keep_until = resume_step if resume_step is not None else -1
            with jsonlines.open(self.path) as reader:
                kept = [r for r in reader.iter(skip_invalid=True) if r.get("step", 0) <= keep_until]
            with atomic_write(self.path, "metrics log", text=True) as f:
                jsonlines.Writer(f).write_all(kept)
        try:
            self._writer = jsonlines.open(self.path, mode="a", flush=True)
        except OSError as e:
            raise write_error(self.path, "metrics log", e) from e

    @classmethod
    def from_run(cls, run: TrackerRun) -> JSONLinesTracker:
        return cls(run.run_dir, run.resume_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        try:
            self._writer.write({"step": step, **metrics})
        except OSError as e:
            raise write_error(self.path, f"metrics of step {step}", e) from e

    def finish(self) -> None:
        self._writer.close()


class WandBTracker(Tracker):
    """Logs to W&B (online, or offline with WANDB_MODE=offline); never asks for a login itself."""

    def __init__(self, run: TrackerRun) -> None:
        import wandb  # lazy: ~0.5 s, paid only by runs that log to W&B (the config reads this module)

        id_file = run.run_dir / WANDB_ID_FILE
        # W&B ids are short lowercase alphanumerics; keeping ours in the run folder lets a resume find it.
        resume = run.resume_step is not None
        wandb_id = id_file.read_text().strip() if (resume and id_file.exists()) else uuid.uuid4().hex[:12]
        write_text_atomic(id_file, wandb_id + "\n", "W&B run id")
        with argv_redacted():  # W&B records the command line in the run's metadata
            self._run = wandb.init(
                project=run.wandb_project,
                entity=run.wandb_entity,
                name=run.run_id,
                id=wandb_id,
                resume="allow",
                dir=str(run.run_dir),
                config=redact_config(run.config),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


TRACKERS = LazyRegistry("tracker")
TRACKERS.register("jsonl", JSONLinesTracker)
TRACKERS.register("wandb", WandBTracker)


def build_trackers(names: Sequence[str], run: TrackerRun) -> list[Tracker]:
    """The trackers `names` (`--trackers`) for `run`, in that order. Call it on rank 0 only."""
    return [TRACKERS.get_class(name).from_run(run) for name in names]


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (for tests and analysis)."""
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
