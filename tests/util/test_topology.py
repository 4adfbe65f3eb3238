"""Processes per node from torchrun's environment (prismatic/util/topology.py): a multi-process job that does not
say how many processes share a node is refused, instead of silently running as one flat FSDP mesh."""

from __future__ import annotations

import pytest

from prismatic.util.errors import ConfigError
from prismatic.util.topology import local_world_size, num_nodes, world_size


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (1, 1, 1)),  # a plain process
        ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, (16, 8, 2)),  # 2 nodes x 8 GPUs
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}, (8, 8, 1)),
        ({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}, (2, 1, 2)),
    ],
)
def test_world_local_and_nodes(monkeypatch: pytest.MonkeyPatch, env: dict, expected: tuple) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    world = world_size()
    assert (world, local_world_size(world), num_nodes(world)) == expected


def test_several_processes_without_local_world_size_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    with pytest.raises(
        ConfigError, match=r"LOCAL_WORLD_SIZE is not set, but WORLD_SIZE is 16: .*torchrun"
    ) as error:
        num_nodes(world_size())
    assert "export LOCAL_WORLD_SIZE=<processes per node>" in str(error.value)
