"""EnvPool's bookkeeping with LIBERO's workers, none of which builds a scene: bad input fails before any worker is
asked; a dead worker raises; leaving the pool (Ctrl-C included) stops the workers.

That an episode's observations do not depend on the simulator that runs it or on what ran before is in
tests/sim/test_libero_env.py, on the pool its simulator tests share (a LIBERO scene costs seconds of CPU to build).
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from prismatic.sim.libero.benchmark import BENCHMARK as LIBERO
from prismatic.sim.pool import EnvPool, EnvWorkerError, EpisodeSpec
from prismatic.util.errors import ConfigError


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bad_input_fails_before_the_workers_are_asked() -> None:
    with pytest.raises(ConfigError, match="The number of simulators must be a whole number >= 1, got 0"):
        EnvPool(LIBERO, 0)
    with EnvPool(LIBERO, 1) as pool:
        with pytest.raises(ConfigError, match="Unknown LIBERO task suite 'libero_spatail'. Did you mean"):
            pool.reset({0: EpisodeSpec("libero_spatail", 0, 0)})
        with pytest.raises(ConfigError, match="Task id 10 is not in LIBERO suite 'libero_goal'"):
            pool.reset([EpisodeSpec("libero_goal", 10, 0)])
        with pytest.raises(ValueError, match=r"Simulator slots \[1\] do not exist: this pool has slots 0-0"):
            pool.reset({1: EpisodeSpec("libero_goal", 0, 0)})
        with pytest.raises(ValueError, match="Simulator slot 0 has no episode running"):
            pool.step({0: np.zeros(7)})


def test_a_dead_worker_raises_instead_of_hanging() -> None:
    with EnvPool(LIBERO, 1) as pool:
        pid = pool.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(
            EnvWorkerError, match=rf"LIBERO simulator 0 \(pid {pid}\) died during reset \(exit code -9\)"
        ):
            pool.reset([EpisodeSpec("libero_spatial", 0, 0)])


def test_leaving_the_pool_on_ctrl_c_stops_the_workers() -> None:
    with pytest.raises(KeyboardInterrupt):
        with EnvPool(LIBERO, 2) as pool:
            pids = pool.worker_pids
            assert all(_alive(pid) for pid in pids)
            raise KeyboardInterrupt
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(EnvWorkerError, match="This EnvPool is closed"):
        pool.reset([EpisodeSpec("libero_spatial", 0, 0)])
