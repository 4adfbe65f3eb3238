"""Process-group setup for torchrun (or a single plain process): gloo on CPU, nccl on CUDA, same code."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from prismatic.util.errors import ConfigError
from prismatic.util.topology import num_nodes

LAUNCHER_GONE_EXIT_CODE = 70  # a worker whose torchrun died exits with this code instead of training on
LAUNCHER_POLL_S = 1.0
T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    num_nodes: int
    device: torch.device
    # The default group's (`--dist_timeout_s`); groups made later (the hybrid mesh's) take it too.
    timeout: timedelta | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout: timedelta | None = None) -> DistInfo:
    """Join the torchrun process group (a group of one when run without torchrun); pick device and backend.

    `timeout`: how long a rank waits in a collective of the default group for the others (None: torch's default,
    10 minutes for NCCL); training sets it from `--dist_timeout_s` so a slow rank's checkpoint write fits.
    """
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:  # a plain process, not torchrun: a group of one on a free port
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if backend == "nccl" else None,
        )
    if "TORCHELASTIC_RUN_ID" in os.environ:
        exit_when_launcher_dies()
    return DistInfo(rank, local_rank, world_size, num_nodes(world_size), device, timeout)


def exit_when_launcher_dies(poll_s: float = LAUNCHER_POLL_S) -> threading.Thread:
    """Exit this worker when its launcher (torchrun, the parent process) is gone.

    A torchrun killed with SIGKILL (or an OOM kill) cannot stop its workers; without this they would train on as
    orphans, holding GPUs and writing checkpoints no one resumes. A daemon thread notices the parent change (the
    orphan is re-parented) within `poll_s` and ends the process with `LAUNCHER_GONE_EXIT_CODE`.
    """
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                print(
                    f"[rank {os.environ.get('RANK', '?')}] The launcher (pid {parent}) is gone: exiting instead of "
                    f"training on as an orphan (exit code {LAUNCHER_GONE_EXIT_CODE}). Resume the run with --resume.",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(LAUNCHER_GONE_EXIT_CODE)

    thread = threading.Thread(target=watch, name="launcher-watchdog", daemon=True)
    thread.start()
    return thread


def run_once_per_node(
    fn: Callable[[], Any], info: DistInfo, *, timeout: timedelta = timedelta(hours=12)
) -> None:
    """Run `fn` on every node's local rank 0 while the node's other ranks wait; for filling a cache (dataset
    statistics) that they then read instead of each computing it, which would multiply a pass that can take
    hours and its memory by the ranks per node. Collective."""
    _run_while_others_wait(fn, info, info.local_rank == 0, timeout)


def run_on_main(fn: Callable[[], Any], info: DistInfo, *, timeout: timedelta) -> None:
    """Run `fn` on rank 0 while every other rank waits (rank 0's HF export after training). Collective."""
    _run_while_others_wait(fn, info, info.is_main, timeout)


def _run_while_others_wait(
    fn: Callable[[], Any], info: DistInfo, runs_here: bool, timeout: timedelta
) -> None:
    """The wait is a barrier on a gloo group made before `fn` starts, with `timeout`: the default group's (NCCL: its
    watchdog) could expire during a long write. If `fn` raises, the barrier is still reached, so the other ranks go
    on (and meet the error themselves) instead of waiting out the timeout."""
    if info.world_size == 1 or not dist.is_initialized():
        fn()
        return
    group = dist.new_group(backend="gloo", timeout=timeout)
    try:
        if runs_here:
            fn()
    finally:
        dist.barrier(group=group)
        dist.destroy_process_group(group)


def first_over_ranks(value: T | None) -> tuple[int, T] | None:
    """`(rank, value)` of the lowest rank whose `value` is not None, the same on every rank; None where no rank has
    one. Small picklable values only (one `all_gather_object`). Collective; in one process, this rank's."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None if value is None else (0, value)
    values: list[T | None] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return next(((rank, v) for rank, v in enumerate(values) if v is not None), None)


def call_and_agree(fn: Callable[[], T]) -> T:
    """`fn()` on every rank, then one exchange of whether it failed anywhere: if it raised on some rank, every rank
    raises (that rank its own exception; the others a `ConfigError` with the lowest failing rank's message when that
    was a `ConfigError`, else a `RuntimeError` naming the rank). For work done by some ranks only (rank 0 reads a
    checkpoint), so that no rank goes on into a collective that waits for one that stopped. Collective.
    """
    error: Exception | None = None
    try:
        result = fn()
    except Exception as e:  # every kind: any rank that stops here must stop the others too
        error = e
    mine = None if error is None else (isinstance(error, ConfigError), f"{type(error).__name__}: {error}")
    found = first_over_ranks(mine)
    if found is not None and error is None:
        rank, (is_config, message) = found
        if is_config:
            raise ConfigError(message.removeprefix("ConfigError: "))
        raise RuntimeError(f"rank {rank} failed ({message}), so this rank stops too")
    if error is not None:
        raise error
    return result


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
