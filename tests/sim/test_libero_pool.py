"""EnvPool: simulators in worker processes give the same observations however many there are and in whatever
order episodes run; bad input fails before any worker is asked; a dead worker raises; leaving the pool (Ctrl-C
included) stops the workers.

The comparison needs LIBERO (`make install`) and is skipped with the reason when it is missing.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from prismatic.sim.libero.benchmark import BENCHMARK as LIBERO
from prismatic.sim.libero.env import LiberoObservation
from prismatic.sim.pool import EnvPool, EnvWorkerError, EpisodeSpec
from prismatic.util.errors import ConfigError

ACTIONS = [  # a short scripted episode: move, turn, close the gripper
    np.array([0.6, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]),
    np.array([0.0, -0.4, 0.5, 0.0, 0.2, 0.0, -1.0]),
    np.array([0.0, 0.0, -0.3, 0.1, 0.0, -0.2, 1.0]),
]
FIELDS = ("full_image", "wrist_image", "proprio", "eef_pos")


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and has not exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_pool_of_one_and_of_two_give_the_same_observations(libero_config: Path) -> None:
    episodes = [
        EpisodeSpec("libero_spatial", 0, episode_idx=0),
        EpisodeSpec("libero_spatial", 0, episode_idx=1),
    ]

    def trace(first: LiberoObservation, outcomes: list) -> list[LiberoObservation]:
        assert all(o.error is None and not o.success for o in outcomes)
        return [first] + [o.observation for o in outcomes]

    with EnvPool(LIBERO, 2, resolution=128) as pool:  # both episodes side by side
        firsts = pool.reset(episodes)
        steps = [pool.step([action, action]) for action in ACTIONS]
        together = [trace(firsts[slot], [step[slot] for step in steps]) for slot in (0, 1)]
        assert pool.language("libero_spatial", 0).startswith("pick up the black bowl between the plate")

    alone = {}
    with EnvPool(
        LIBERO, 1, resolution=128
    ) as pool:  # one after the other, in the other order, on one simulator
        for index in (1, 0):
            first = pool.reset({0: episodes[index]})[0]
            alone[index] = trace(first, [pool.step({0: action})[0] for action in ACTIONS])
        with pytest.raises(
            ConfigError, match="Episode 99 has no fixed initial state"
        ):  # raised in the worker
            pool.reset({0: EpisodeSpec("libero_spatial", 0, episode_idx=99)})

    for index in (0, 1):
        for step, (a, b) in enumerate(zip(together[index], alone[index], strict=True)):
            for name in FIELDS:
                assert np.array_equal(getattr(a, name), getattr(b, name)), (index, step, name)
    assert not np.array_equal(together[0][-1].full_image, together[1][-1].full_image)


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
