"""Process-group timeouts sized for the work (`--dist_timeout_s`): the default group gets the flag's timeout, and a
value too short for a checkpoint write is refused while parsing."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch.distributed as dist

from prismatic.conf.train import TrainConfig
from prismatic.util import dist as dist_util
from prismatic.util.cli import parse_config
from prismatic.util.errors import ConfigError


def test_the_default_group_gets_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: calls.append(kwargs))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    info = dist_util.init_distributed(timedelta(seconds=5400))
    assert [c["timeout"] for c in calls] == [timedelta(seconds=5400)]
    assert (info.rank, info.world_size, info.num_nodes) == (0, 1, 1)
    assert info.timeout == timedelta(seconds=5400)  # what groups made later (the hybrid mesh's) are given


def test_the_flag_defaults_to_an_hour_and_refuses_less_than_a_minute() -> None:
    assert parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy"]).dist_timeout_s == 3600
    assert (
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--dist_timeout_s", "60"]).dist_timeout_s
        == 60
    )
    with pytest.raises(
        ConfigError, match=r"--dist_timeout_s=59 is out of range: it must be an integer >= 60"
    ):
        parse_config(TrainConfig, ["--vla.type", "tiny+mx-toy", "--dist_timeout_s", "59"])


def test_run_on_main_runs_where_it_should_without_a_group() -> None:
    ran: list[int] = []
    main = dist_util.DistInfo(0, 0, 1, 1, None)
    dist_util.run_on_main(lambda: ran.append(0), main, timeout=timedelta(seconds=60))
    assert ran == [0]
