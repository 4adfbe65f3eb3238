"""Single-file checkpoint helpers, atomic writes, and the trackers' resume behaviour (sharded checkpoints:
test_checkpoint_manager.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from prismatic.training.checkpointing import (
    atomic_torch_save,
    flatten_modules,
    group_by_module,
    load_checkpoint_file,
)
from prismatic.training.trackers import JSONLinesTracker, read_metrics
from prismatic.util.errors import ConfigError


def test_group_and_flatten_round_trip():
    flat = {"llm_backbone.llm.lm_head.weight": torch.ones(2), "projector.fc1.bias": torch.zeros(1)}
    grouped = group_by_module(flat)
    assert set(grouped["llm_backbone"]) == {"llm.lm_head.weight"} and grouped["vision_backbone"] == {}
    assert flatten_modules(grouped).keys() == flat.keys()


def test_atomic_save_keeps_previous_file_when_interrupted(tmp_path: Path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    atomic_torch_save({"model": {"w": torch.ones(3)}}, path)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", crash)  # the rename of prismatic.util.files.atomic_write
    with pytest.raises(KeyboardInterrupt):
        atomic_torch_save({"model": {"w": torch.zeros(3)}}, path)
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temporary file left behind


def test_loading_a_foreign_file_is_a_clear_error(tmp_path: Path):
    bad = tmp_path / "x.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="Cannot read checkpoint"):
        load_checkpoint_file(bad)
    torch.save({"weights": 1}, bad)
    with pytest.raises(ConfigError, match="not a checkpoint written by this tool"):
        load_checkpoint_file(bad)


def test_jsonl_tracker_continues_from_resumed_step(tmp_path: Path):
    tracker = JSONLinesTracker(tmp_path, resume_step=None)
    for step in range(1, 8):
        tracker.log(step, {"loss": float(step)})
    tracker.finish()
    tracker = JSONLinesTracker(tmp_path, resume_step=5)  # steps 6, 7 will be re-run
    tracker.log(6, {"loss": 60.0})
    tracker.finish()
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[-1]["loss"] == 60.0
