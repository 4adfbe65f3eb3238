"""LIBERO's task suites: their names, sizes and episode lengths as OpenVLA's evaluation uses them, and the checks
that turn a bad suite or task id into one clear message.

The tables need no simulator; `task_language` and `libero_benchmark` import LIBERO (`setup.import_libero`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterable
from typing import Any

from prismatic.sim.libero.setup import import_libero
from prismatic.util.errors import ConfigError, did_you_mean

# Policy steps per episode, openvla/openvla `experiments/robot/libero/run_libero_eval.py` (OFT's is the same): a
# little above each suite's longest training demonstration.
LIBERO_SUITES: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
SUITE_TASK_COUNTS: dict[str, int] = {  # tasks per suite (LIBERO's benchmark task map)
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}
# Fixed initial states per task (every task of every suite has 50): episode i starts from state i, so at most 50
# episodes per task are distinct (OpenVLA's `num_trials_per_task` default).
NUM_INITIAL_STATES = 50
NUM_STEPS_WAIT = (
    10  # no-op steps at the start of each episode while objects settle (OpenVLA's `num_steps_wait`)
)
# OpenVLA's `get_libero_dummy_action`: no motion, gripper open (LIBERO: -1 = open, +1 = close).
DUMMY_ACTION: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)


def check_suite(suite: str) -> None:
    """Raises ConfigError naming the valid suites when `suite` is not one of LIBERO's."""
    if suite not in LIBERO_SUITES:
        raise ConfigError(
            f"Unknown LIBERO task suite '{suite}'.{did_you_mean(suite, LIBERO_SUITES)} Valid choices: "
            f"{', '.join(LIBERO_SUITES)}."
        )


def suite_task_count(suite: str) -> int:
    """Number of tasks in `suite` (10, or 90 for libero_90)."""
    check_suite(suite)
    return SUITE_TASK_COUNTS[suite]


def check_task_ids(suite: str, task_ids: Iterable[int]) -> None:
    """Raises ConfigError when a task id is not one of `suite`'s (0 .. count - 1)."""
    count = suite_task_count(suite)
    bad = [task_id for task_id in task_ids if isinstance(task_id, bool) or task_id not in range(count)]
    if bad:
        raise ConfigError(
            f"Task id {', '.join(str(t) for t in bad)} is not in LIBERO suite '{suite}': it has {count} tasks, "
            f"valid ids are 0-{count - 1}."
        )


def libero_benchmark(suite: str) -> Any:
    """LIBERO's benchmark object for `suite` (tasks, BDDL files, fixed initial states)."""
    check_suite(suite)
    import_libero()
    from libero.libero import benchmark  # lazy: needs the config import_libero writes (and imports torch)

    with contextlib.redirect_stdout(io.StringIO()):  # its "[info] using task orders ..." line, at every call
        return benchmark.get_benchmark_dict()[suite]()


def task_language(suite: str, task_id: int) -> str:
    """The instruction of task `task_id` of `suite`, as LIBERO states it (what the policy is prompted with)."""
    check_task_ids(suite, [task_id])
    return libero_benchmark(suite).get_task(task_id).language
