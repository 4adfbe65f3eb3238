"""Metric trackers behind one small interface: jsonl (one object per optimiser step) and Weights & Biases.

Only rank 0 tracks. Both continue, rather than restart, when a run is resumed: the jsonl file is cut back to the
resumed step and appended to; the W&B run id is kept in the run folder and the same W&B run is resumed.
Secrets stay out of W&B: its config has them blanked and the command line it records has their values redacted
(`prismatic/util/redact.py`). A metrics log that cannot be written (full disk) is a `ConfigError` naming it.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Protocol

import jsonlines

from prismatic.run_layout import METRICS_FILE, WANDB_ID_FILE
from prismatic.util.files import atomic_write, write_error, write_text_atomic
from prismatic.util.redact import argv_redacted, redact_config

logger = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self) -> None: ...


class JSONLinesTracker:
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

    def log(self, step: int, metrics: dict[str, float]) -> None:
        try:
            self._writer.write({"step": step, **metrics})
        except OSError as e:
            raise write_error(self.path, f"metrics of step {step}", e) from e

    def finish(self) -> None:
        self._writer.close()


class WandBTracker:
    """Logs to W&B (online, or offline with WANDB_MODE=offline); never asks for a login itself."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        project: str,
        entity: str | None,
        config: dict[str, Any],
        resume: bool,
    ) -> None:
        import wandb

        id_file = run_dir / WANDB_ID_FILE
        # W&B ids are short lowercase alphanumerics; keeping ours in the run folder lets a resume find it.
        wandb_id = id_file.read_text().strip() if (resume and id_file.exists()) else uuid.uuid4().hex[:12]
        write_text_atomic(id_file, wandb_id + "\n", "W&B run id")
        with argv_redacted():  # W&B records the command line in the run's metadata
            self._run = wandb.init(
                project=project,
                entity=entity,
                name=run_id,
                id=wandb_id,
                resume="allow",
                dir=str(run_dir),
                config=redact_config(config),
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def finish(self) -> None:
        self._run.finish()


def build_trackers(
    names: tuple[str, ...],
    run_dir: Path,
    run_id: str,
    config: dict[str, Any],
    wandb_project: str,
    wandb_entity: str | None,
    resume_step: int | None,
) -> list[Tracker]:
    """Trackers for rank 0 (call it on rank 0 only)."""
    trackers: list[Tracker] = []
    for name in names:
        if name == "jsonl":
            trackers.append(JSONLinesTracker(run_dir, resume_step))
        elif name == "wandb":
            trackers.append(
                WandBTracker(
                    run_dir, run_id, wandb_project, wandb_entity, config, resume=resume_step is not None
                )
            )
    return trackers


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All records of a run's metrics.jsonl (for tests and analysis)."""
    return [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
