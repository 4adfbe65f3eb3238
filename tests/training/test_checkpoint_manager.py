"""The sharded checkpoint manager in one process: layout, round trip, keep_last, async, crash leftovers.

Expected values come from the objects as they were before saving (copied by the test), never from the manager.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from prismatic.models.checkpoint_format import (
    complete_checkpoints,
    latest_checkpoint,
    load_checkpoint_file,
    newest_checkpoint,
)
from prismatic.training.checkpointing import CheckpointManager, training_state
from prismatic.util.errors import ConfigError


class TinyVLM(torch.nn.Module):
    """Three parts under the names a VLM's state dict uses (so checkpoints group by module as for the real one)."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_backbone = torch.nn.Linear(3, 4)
        self.projector = torch.nn.Linear(4, 4)
        self.llm_backbone = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.llm_backbone(self.projector(self.vision_backbone(x)))


def make_run(seed: int):
    torch.manual_seed(seed)
    model = TinyVLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return model, optimizer, scheduler


def train_steps(model, optimizer, scheduler, n: int) -> None:
    for _ in range(n):
        model(torch.randn(5, 3)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def manager(run_dir: Path, **kwargs) -> CheckpointManager:
    return CheckpointManager(
        run_dir,
        save_interval=kwargs.pop("save_interval", 1),
        keep_last=kwargs.pop("keep_last", None),
        async_save=kwargs.pop("async_save", False),
        rank=0,
    )


def save(mgr: CheckpointManager, model, optimizer, scheduler, step: int, **kwargs) -> Path:
    counters = {"step": step, "epoch": 0, "frames": step * 8}
    state = training_state(model, optimizer, scheduler, counters)
    return mgr.save(state, {**counters, "seed": 7, "world_size": 1}, **kwargs)


def test_round_trip_restores_model_optimizer_schedule_counters_and_rng(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    train_steps(model, optimizer, scheduler, 3)
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    expected_weights = {k: v.clone() for k, v in model.state_dict().items()}
    expected_moments = {
        i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(optimizer.state.values())
    }
    path = save(manager(tmp_path), model, optimizer, scheduler, 3)
    draws = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    assert path == tmp_path / "checkpoints" / "step-000003-epoch-00"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == path.name
    assert json.loads((path / "train_state.json").read_text())["frames"] == 24

    fresh_model, fresh_opt, fresh_sched = make_run(1)
    counters = {"step": 0, "epoch": 0, "frames": 0}
    state = training_state(fresh_model, fresh_opt, fresh_sched, counters)
    assert manager(tmp_path).load(path, state, same_world_size=True)
    for key, value in fresh_model.state_dict().items():
        assert torch.equal(value, expected_weights[key]), key
    for i, moments in enumerate(fresh_opt.state.values()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(moments[key], expected_moments[i][key])
    assert fresh_sched.last_epoch == 3 and fresh_sched.get_last_lr() == scheduler.get_last_lr()
    assert counters == {"step": 3, "epoch": 0, "frames": 24}
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == draws


def test_weights_read_back_without_any_process_group(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    train_steps(model, optimizer, scheduler, 1)
    path = save(manager(tmp_path), model, optimizer, scheduler, 1)
    ckpt = load_checkpoint_file(path)
    assert ckpt["train_state"]["step"] == 1
    assert torch.equal(ckpt["model"]["projector"]["weight"], model.projector.weight.detach())
    assert set(ckpt["model"]) == {"vision_backbone", "projector", "llm_backbone"}
    assert latest_checkpoint(tmp_path) == path


def test_keep_last_deletes_only_older_complete_checkpoints(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    mgr = manager(tmp_path, keep_last=2)
    for step in range(1, 5):
        train_steps(model, optimizer, scheduler, 1)
        save(mgr, model, optimizer, scheduler, step)
    assert [p.name for p in complete_checkpoints(tmp_path / "checkpoints")] == [
        "step-000003-epoch-00",
        "step-000004-epoch-00",
    ]
    assert newest_checkpoint(tmp_path / "checkpoints").name == "step-000004-epoch-00"


def test_async_save_holds_the_state_of_the_call_not_of_later_steps(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    train_steps(model, optimizer, scheduler, 1)
    before = model.projector.weight.detach().clone()
    mgr = manager(tmp_path, async_save=True)
    final = save(mgr, model, optimizer, scheduler, 1)
    train_steps(model, optimizer, scheduler, 2)  # training goes on while the write runs
    mgr.wait()
    assert not model.projector.weight.detach().equal(before)
    assert torch.equal(load_checkpoint_file(final)["model"]["projector"]["weight"], before)
    assert newest_checkpoint(tmp_path / "checkpoints") == final


def test_a_crash_mid_save_leaves_the_last_complete_checkpoint_and_a_leftover_that_is_cleaned(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    mgr = manager(tmp_path)
    good = save(mgr, model, optimizer, scheduler, 1)

    def crash(folder: Path) -> None:
        (folder / "data").mkdir()
        (folder / "data" / "partial").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save(mgr, model, optimizer, scheduler, 2, write_rank_files=crash)
    leftover = tmp_path / "checkpoints" / ".tmp-step-000002-epoch-00"
    assert leftover.is_dir()
    assert newest_checkpoint(tmp_path / "checkpoints") == good
    with pytest.raises(ConfigError, match="still being written"):
        load_checkpoint_file(leftover)
    assert manager(tmp_path).remove_leftovers() == [leftover] and not leftover.exists()


def test_a_stale_latest_pointer_or_an_incomplete_folder_is_not_trusted(tmp_path: Path):
    model, optimizer, scheduler = make_run(0)
    mgr = manager(tmp_path)
    save(mgr, model, optimizer, scheduler, 1)
    second = save(mgr, model, optimizer, scheduler, 2)
    ckpts = tmp_path / "checkpoints"
    (ckpts / "latest").write_text("step-000001-epoch-00\n")  # a crash between rename and pointer update
    assert newest_checkpoint(ckpts) == second
    (second / ".metadata").unlink()  # not complete: not a checkpoint
    assert newest_checkpoint(ckpts).name == "step-000001-epoch-00"
