"""Which checkpoint `--resume` (alone), `load_vla(<run folder>)` and `export_hf.py <run folder>` take when a run
folder holds several: the highest complete step, compared as a number, whatever the folder names' text order, the
epochs, the files' modification times, the `latest` pointer or a newer checkpoint still being written say."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import VLAConfig
from prismatic.models import build_vlm, load_vla
from prismatic.models.checkpoint_format import latest_checkpoint, load_checkpoint_file, newest_checkpoint
from prismatic.training.run_folder import resume_point

PROJECTOR_W = "projector.projector.0.weight"


def _write_run(run: Path, steps_epochs, weights: dict[str, torch.Tensor]) -> Path:
    """A run folder with one real sharded (DCP) checkpoint per (step, epoch): the model weights with
    `PROJECTOR_W` filled with the step number, and its train_state.json."""
    ckpts = run / "checkpoints"
    for step, epoch in steps_epochs:
        state = {**weights, PROJECTOR_W: torch.full_like(weights[PROJECTOR_W], float(step))}
        folder = ckpts / f"step-{step:06d}-epoch-{epoch:02d}"
        dcp.save({"model": state}, checkpoint_id=str(folder), no_dist=True)
        (folder / "train_state.json").write_text(json.dumps({"step": step, "epoch": epoch}))
    (run / "config.json").write_text(
        json.dumps({"vla": {"type": "tiny+mx-toy", "base_vlm": "tiny-vit+tiny-llama"}})
    )
    return ckpts


def _age(path: Path, seconds_ago: int) -> None:
    stamp = 1_700_000_000 - seconds_ago
    os.utime(path, (stamp, stamp))


@pytest.fixture(scope="module")
def tiny_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: v.clone() for k, v in build_vlm("tiny-vit+tiny-llama").state_dict().items()}


def _cases():
    # (steps and epochs written, in this order; the step expected)
    return [
        pytest.param([(2, 0), (10, 1), (9, 1)], 10, id="steps-2-10-9"),
        # As text "step-1000000" sorts before "step-999999": only a numeric comparison finds the newest.
        pytest.param([(999_999, 3), (1_000_000, 3), (2, 0)], 1_000_000, id="a-million-steps"),
    ]


@pytest.mark.parametrize(("written", "expected_step"), _cases())
def test_the_highest_complete_step_is_resumed_and_loaded(tmp_path, tiny_weights, written, expected_step):
    run = tmp_path / "runs" / "r"
    ckpts = _write_run(run, written, {PROJECTOR_W: tiny_weights[PROJECTOR_W]})
    expected_name = next(f"step-{s:06d}-epoch-{e:02d}" for s, e in written if s == expected_step)
    # Modification times in the reverse order of steps: the newest step is the oldest folder.
    for rank, (step, epoch) in enumerate(sorted(written)):
        _age(ckpts / f"step-{step:06d}-epoch-{epoch:02d}", seconds_ago=10 * rank)
    # Newer but not usable: one still being written (a crash left it), one without its train state (cut short
    # by a full disk), and a `latest` pointer one behind (a crash between the rename and the pointer update).
    dcp.save({"model": {"x": torch.zeros(1)}}, checkpoint_id=str(ckpts / ".tmp-step-2000000-epoch-09"))
    dcp.save({"model": {"x": torch.zeros(1)}}, checkpoint_id=str(ckpts / "step-3000000-epoch-09"))
    (ckpts / "latest").write_text(f"step-{min(written)[0]:06d}-epoch-{min(written)[1]:02d}\n")

    assert newest_checkpoint(ckpts) == ckpts / expected_name
    assert latest_checkpoint(run) == ckpts / expected_name
    cfg = TrainConfig(vla=VLAConfig.get_choice_class("tiny+mx-toy")(), resume="latest")
    point = resume_point(cfg, run)
    expected_epoch = dict(written)[expected_step]
    assert (point.path, point.step, point.epoch) == (ckpts / expected_name, expected_step, expected_epoch)
    weights = load_checkpoint_file(latest_checkpoint(run))["model"]["projector"]["projector.0.weight"]
    assert torch.equal(weights, torch.full_like(weights, float(expected_step)))


def test_load_vla_of_a_run_folder_uses_its_highest_step(tmp_path, tiny_weights):
    """What `load_policy(<run folder>)` / `export_hf.py --checkpoint <run folder>` build from."""
    run = tmp_path / "run"
    ckpts = _write_run(run, [(2, 0), (10, 1), (9, 1)], tiny_weights)
    _age(ckpts / "step-000010-epoch-01", seconds_ago=100)
    loaded = load_vla(run).vlm.state_dict()
    assert torch.equal(loaded[PROJECTOR_W], torch.full_like(tiny_weights[PROJECTOR_W], 10.0))
    name = "llm_backbone.llm.model.layers.0.mlp.up_proj.weight"
    assert torch.equal(loaded[name], tiny_weights[name])


def test_older_single_file_checkpoints_are_compared_by_step_number(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name in ("step-999999-epoch-03-loss=0.5000.pt", "step-1000000-epoch-03-loss=0.7000.pt"):
        (ckpts / name).write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == ckpts / "step-1000000-epoch-03-loss=0.7000.pt"
