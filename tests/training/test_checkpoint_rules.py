"""The checkpoint manager's rules in one process: which steps save, async saves visible only once finished,
leftover cleaning on rank 0 only, RNG restored only at the same world size (and older checkpoints without RNG
still resume), the Python RNG's cached Gaussian, and refusing to resume a run as another experiment."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from prismatic.training.checkpointing import (
    CheckpointManager,
    CountersState,
    RNGState,
    atomic_torch_save,
    read_resume_state,
    saved_train_state,
    training_state,
)
from prismatic.training.run_folder import check_resume_compatible
from prismatic.util.errors import ConfigError


def _manager(run_dir: Path, **kwargs) -> CheckpointManager:
    return CheckpointManager(
        run_dir,
        save_interval=kwargs.pop("save_interval", 1),
        keep_last=kwargs.pop("keep_last", None),
        async_save=kwargs.pop("async_save", False),
        rank=kwargs.pop("rank", 0),
    )


def _run():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return model, optimizer, scheduler


def test_saves_every_interval_and_at_the_last_step(tmp_path):
    mgr = _manager(tmp_path, save_interval=3)
    assert [s for s in range(1, 8) if mgr.should_save(s, is_last_step=s == 7)] == [3, 6, 7]
    assert not mgr.should_save(1, is_last_step=False) and mgr.should_save(1, is_last_step=True)


def test_an_async_save_becomes_visible_only_when_finished(tmp_path):
    model, optimizer, scheduler = _run()
    counters = {"step": 2, "epoch": 0, "frames": 4}
    mgr = _manager(tmp_path, async_save=True)
    final = mgr.save(training_state(model, optimizer, scheduler, counters), dict(counters))
    assert (
        not final.exists()
    )  # still .tmp-...: a crash now would leave no half checkpoint under the final name
    mgr.wait()
    assert final.is_dir() and (tmp_path / "checkpoints" / "latest").read_text().strip() == final.name
    blocking = mgr.save(
        training_state(model, optimizer, scheduler, counters | {"step": 3}),
        counters | {"step": 3},
        blocking=True,
    )
    assert blocking.is_dir()  # written before save returns


def test_only_rank_zero_removes_leftovers(tmp_path):
    ckpts = tmp_path / "checkpoints"
    (ckpts / ".tmp-step-000001-epoch-00").mkdir(parents=True)
    (ckpts / ".tmp-stray-file").write_text("x")
    assert _manager(tmp_path, rank=1).remove_leftovers() == []
    assert (ckpts / ".tmp-stray-file").exists()
    removed = _manager(tmp_path, rank=0).remove_leftovers()
    assert sorted(p.name for p in removed) == [".tmp-step-000001-epoch-00", ".tmp-stray-file"]
    assert list(ckpts.iterdir()) == []
    assert _manager(tmp_path / "nothing-here").remove_leftovers() == []


def test_rng_is_restored_only_at_the_same_world_size(tmp_path):
    model, optimizer, scheduler = _run()
    counters = {"step": 1, "epoch": 0, "frames": 2}
    mgr = _manager(tmp_path)
    torch.manual_seed(5)
    path = mgr.save(training_state(model, optimizer, scheduler, counters), dict(counters))
    saved_draw = float(torch.rand(1))
    fresh, fresh_again = training_state(*_run(), dict(counters)), training_state(*_run(), dict(counters))
    torch.manual_seed(6)
    other_draw = float(torch.rand(1))
    torch.manual_seed(6)
    assert mgr.load(path, fresh, same_world_size=False) is False
    assert float(torch.rand(1)) == other_draw  # not restored
    assert mgr.load(path, fresh_again, same_world_size=True) is True
    assert float(torch.rand(1)) == saved_draw


def test_a_checkpoint_without_rng_entries_still_resumes(tmp_path):
    """Checkpoints written before RNG states were saved: the counters load, the RNG stays as it is."""
    path = tmp_path / "old"
    dcp.save({"trainer": CountersState({"step": 4, "epoch": 1, "frames": 8})}, checkpoint_id=str(path))
    counters = {"step": 0, "epoch": 0, "frames": 0}
    torch.manual_seed(3)
    expected = float(torch.rand(1))
    torch.manual_seed(3)
    assert _manager(tmp_path).load(path, {"trainer": CountersState(counters)}, same_world_size=True)
    assert counters == {"step": 4, "epoch": 1, "frames": 8}
    assert float(torch.rand(1)) == expected


def test_python_rng_round_trip_keeps_a_cached_gaussian():
    """random.gauss draws two values and caches the second: it must be the next gauss after a restore."""
    random.seed(1)
    random.gauss(0, 1)  # leaves one cached
    state = RNGState(0).state_dict()
    expected = (random.gauss(0, 1), random.gauss(0, 1), float(np.random.rand()))
    random.seed(99)
    np.random.seed(99)
    RNGState(0).load_state_dict(state)
    assert (random.gauss(0, 1), random.gauss(0, 1), float(np.random.rand())) == expected
    random.seed(2)  # no cached value
    state = RNGState(3).state_dict()
    assert list(state) == ["rank3"]
    expected = random.gauss(0, 1)
    random.gauss(0, 1)  # caches one
    RNGState(3).load_state_dict(state)
    assert random.gauss(0, 1) == expected


SAVED = {"vla_id": "tiny", "seed": 7, "data_mix": "toy"}


def test_the_same_experiment_resumes_and_missing_keys_are_not_checked():
    assert check_resume_compatible(SAVED, dict(SAVED), path=Path("c"), allow_config_change=False) == []
    assert (
        check_resume_compatible(
            {"seed": 7}, {"seed": 7, "vla_id": "x"}, path=Path("c"), allow_config_change=False
        )
        == []
    )
    assert (
        check_resume_compatible(
            {"seed": 7, "vla_id": "x"}, {"seed": 7}, path=Path("c"), allow_config_change=False
        )
        == []
    )


def test_another_experiment_is_refused_naming_the_flag_and_the_fix():
    with pytest.raises(ConfigError, match=r"--seed 8 \(the checkpoint's run used 7\).*--seed 7 to continue"):
        check_resume_compatible(SAVED, {**SAVED, "seed": 8}, path=Path("c"), allow_config_change=False)


def test_allow_config_change_returns_the_differences():
    out = check_resume_compatible(
        SAVED, {**SAVED, "data_mix": "bridge"}, path=Path("c"), allow_config_change=True
    )
    assert out == ["--vla.data_mix bridge (the checkpoint's run used toy)"]


def test_single_file_checkpoints_resume_only_with_optimizer_schedule_and_state(tmp_path):
    full = {"model": {}, "optimizer": {}, "lr_scheduler": {}, "train_state": {"step": 9}}
    assert saved_train_state(full, tmp_path) == {"step": 9}
    for key in ("optimizer", "lr_scheduler", "train_state"):
        with pytest.raises(ConfigError, match=f"holds no '{key}'"):
            saved_train_state({k: v for k, v in full.items() if k != key}, tmp_path)


def test_resume_state_of_a_folder_and_of_a_file(tmp_path):
    folder = tmp_path / "step-000002-epoch-00"
    folder.mkdir()
    (folder / "train_state.json").write_text(json.dumps({"step": 2}))
    assert read_resume_state(folder) == {"step": 2}
    model = torch.nn.Linear(2, 2)
    pt = tmp_path / "step-000003-epoch-00-loss=1.0000.pt"
    atomic_torch_save(
        {
            "model": {"llm_backbone": model.state_dict()},
            "optimizer": {},
            "lr_scheduler": {},
            "train_state": {"step": 3},
        },
        pt,
    )
    assert read_resume_state(pt) == {"step": 3}


def test_cuda_generator_is_saved_and_restored_when_there_is_one(monkeypatch):
    """On a GPU machine the CUDA generator joins the state; a state without it (saved on CPU) restores nothing."""
    cuda_state = torch.tensor([7, 8, 9], dtype=torch.uint8)
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: cuda_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", restored.append)
    state = RNGState(0).state_dict()
    assert torch.equal(state["rank0"]["cuda"], cuda_state)
    RNGState(0).load_state_dict(state)
    assert len(restored) == 1 and torch.equal(restored[0], cuda_state)
    del state["rank0"]["cuda"]
    RNGState(0).load_state_dict(state)
    assert len(restored) == 1
