"""Metric trackers behind one small interface: jsonl (one object per optimiser step) and Weights & Biases.

Only rank 0 tracks. Both continue, rather than restart, when a run is resumed: the jsonl file is cut back to the
resumed step and appended to; the W&B run id is kept in the run folder and the same W&B run is resumed.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Protocol

import jsonlines

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_run_id.txt"


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
            tmp = self.path.with_suffix(".jsonl.tmp")
            with jsonlines.open(tmp, mode="w") as writer:
                writer.write_all(kept)
            os.replace(tmp, self.path)
        self._writer = jsonlines.open(self.path, mode="a", flush=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._writer.write({"step": step, **metrics})

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
        id_file.write_text(wandb_id + "\n")
        self._run = wandb.init(
            project=project,
            entity=entity,
            name=run_id,
            id=wandb_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
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
