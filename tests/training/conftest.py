"""Fixtures shared by the training tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from prismatic.util.dist import DistInfo


@pytest.fixture(scope="module")
def one_rank() -> Iterator[DistInfo]:
    """A gloo process group of one, in this process, removed afterwards (one test module at a time holds it)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DistInfo(0, 0, 1, 1, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
