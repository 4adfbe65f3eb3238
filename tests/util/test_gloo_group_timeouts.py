"""The gloo groups that training makes wait as long as `--dist_timeout_s` says, never gloo's 30-minute default:
ranks wait in them for the slowest rank's long write.

Groups: the background checkpoint saves' (`CheckpointManager`, made by `build_checkpointer` from the flag) and the
wait-for-rank-0 barrier of `run_on_main` (the final export). The preemption flag has no group any more
(tests/training/test_preemption_agreement.py); the statistics pass (`run_once_per_node`) keeps its own 12-hour
bound, a pass over a large mixture taking hours. Each test records the keyword arguments `dist.new_group` receives.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from prismatic.conf.train import TrainConfig
from prismatic.training import checkpointing
from prismatic.util import dist as dist_util
from prismatic.util.cli import parse_config


@pytest.fixture
def new_groups(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """`dist.new_group` records its keyword arguments and makes nothing; the process acts as an initialised rank."""
    calls: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: calls.append(kwargs) or "group")
    monkeypatch.setattr(dist, "barrier", lambda **kwargs: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: None)
    return calls


def test_the_async_save_group_gets_the_timeout(new_groups: list[dict], tmp_path: Path) -> None:
    checkpointing.CheckpointManager(
        tmp_path,
        save_interval=1,
        keep_last=None,
        async_save=True,
        rank=0,
        dist_timeout=timedelta(seconds=5400),
    )
    assert new_groups == [{"backend": "gloo", "timeout": timedelta(seconds=5400)}]


def test_build_checkpointer_passes_dist_timeout_s_to_the_manager(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[dict] = []

    class Stop(Exception):
        pass

    def manager(run_dir, **kwargs):
        made.append(kwargs)
        raise Stop

    monkeypatch.setattr(checkpointing, "CheckpointManager", manager)
    cfg = parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--dist_timeout_s", "7200"])
    strategy = SimpleNamespace(dist=SimpleNamespace(rank=0, world_size=1))
    with pytest.raises(Stop):
        checkpointing.build_checkpointer(cfg, SimpleNamespace(path=tmp_path), strategy, None, None)
    assert [m["dist_timeout"] for m in made] == [timedelta(seconds=7200)]


def test_run_on_main_waits_on_a_gloo_group_with_the_timeout(new_groups: list[dict]) -> None:
    ran: list[int] = []
    info = dist_util.DistInfo(1, 1, 2, 1, None)
    dist_util.run_on_main(lambda: ran.append(1), info, timeout=timedelta(seconds=3600))
    assert ran == []  # rank 1 only waits
    assert new_groups == [{"backend": "gloo", "timeout": timedelta(seconds=3600)}]


def test_the_hybrid_mesh_groups_get_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP's hybrid mesh is built from groups made with the run's timeout (`init_device_mesh` would give torch's
    default): a real 1 x 1 mesh in a gloo group of one, each enumeration's timeout recorded."""
    import torch

    from prismatic.training.strategies.fsdp import hybrid_mesh

    timeouts: list[timedelta | None] = []
    real = dist.new_subgroups_by_enumeration

    def recording(ranks, timeout=None, **kwargs):
        timeouts.append(timeout)
        return real(ranks, timeout=timeout, **kwargs)

    monkeypatch.setattr(dist, "new_subgroups_by_enumeration", recording)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = hybrid_mesh("cpu", 1, 1, timedelta(seconds=4321))
        assert mesh.mesh_dim_names == ("replicate", "shard") and mesh.mesh.tolist() == [[0]]
        assert torch.equal(mesh.mesh, torch.tensor([[0]]))
    finally:
        dist.destroy_process_group()
    assert timeouts == [timedelta(seconds=4321)] * 2
