"""Meta-World behind the benchmark interface (`prismatic/sim/benchmark.py`), with LeRobot's evaluation protocol.

LeRobot's `MetaworldEnv` (huggingface/lerobot `src/lerobot/envs/metaworld.py`), which SmolVLA's and pi0's published
Meta-World figures come from: the MT50 task names, the difficulty groups and MT10 as suites (`tasks.py`); one
`corner2` view at 480 px turned upright, the 4-d state and action, no wait steps, an episode ending at the first
step with `info["success"]` or after the task's `max_path_length` (500) steps (`env.py`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import numpy as np

from prismatic.sim.metaworld import tasks
from prismatic.sim.metaworld.env import ACTION_DIM, PROPRIO_DIM, MetaWorldTaskEnv
from prismatic.util.errors import ConfigError

INSTALL_HINT = "pip install -e '.[sim]' (or `make install`)"
MAX_PATH_LENGTH = 500  # every Meta-World v3 task's `max_path_length` (the tests check it against Meta-World)
DATASET_PREFIX = "metaworld"  # `collect_demos.py` names its datasets metaworld_<suite, lowercase> by default


def default_dataset_name(suite: str) -> str:
    """The dataset name `collect_demos.py` writes by default for `suite`: `metaworld_mt10`, `metaworld_easy`, ..."""
    tasks.check_suite(suite)
    return f"{DATASET_PREFIX}_{suite.lower()}"


def metaworld_unnorm_key(suite: str, available: Sequence[str]) -> str:
    """The statistics key of a checkpoint evaluated on `suite`: `collect_demos.py`'s default name for the suite,
    else `metaworld`, else the checkpoint's only key (a model fine-tuned on one dataset has one choice).

    Raises:
        ConfigError: none of those applies (the keys are listed).
    """
    for key in (default_dataset_name(suite), DATASET_PREFIX):
        if key in available:
            return key
    if len(available) == 1:
        return available[0]
    keys = ", ".join(sorted(available)) or "none"
    raise ConfigError(
        f"The checkpoint has no action statistics for Meta-World suite '{suite}' (looked for "
        f"'{default_dataset_name(suite)}' and '{DATASET_PREFIX}'); its keys are: {keys}. Pass --unnorm_key <one of "
        "those keys> to un-normalise with that dataset's statistics."
    )


class MetaWorldBenchmark:
    """Meta-World's 50 tasks with LeRobot's evaluation protocol."""

    name = "metaworld"
    title = "Meta-World"
    action_dim = ACTION_DIM  # hand xyz displacement, gripper effort (-1 open, +1 close), in [-1, 1]
    proprio_dim = PROPRIO_DIM  # hand xyz, gripper opening (LeRobot's agent_pos = obs[:4])
    num_views = 1  # corner2
    num_steps_wait = 0  # LeRobot asks the policy from the first step
    dummy_action = (
        0.0,
        0.0,
        0.0,
        -1.0,
    )  # no motion, gripper open (used only for wait steps, of which there are none)
    default_resolution = 480  # LeRobot's observation size
    suites = tuple(tasks.SUITES)

    def check_install(self) -> None:
        """ConfigError naming the install command when Meta-World or MuJoCo is missing."""
        missing = [name for name in ("metaworld", "mujoco") if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(
                f"Meta-World cannot run: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                f"installed. {INSTALL_HINT}."
            )

    def task_names(self, suite: str) -> list[str]:
        return tasks.suite_tasks(suite)

    def task_language(self, suite: str, task_id: int) -> str:
        return tasks.TASK_DESCRIPTIONS[tasks.task_name(suite, task_id)]

    def max_steps(self, suite: str) -> int:
        tasks.check_suite(suite)
        return MAX_PATH_LENGTH

    def max_episodes_per_task(self, suite: str) -> int | None:
        tasks.check_suite(suite)
        return None  # positions are drawn fresh for every episode

    def make_env(self, suite: str, task_id: int, resolution: int, shadows: bool = True) -> MetaWorldTaskEnv:
        return MetaWorldTaskEnv(suite, task_id, resolution, shadows=shadows)

    def action_to_env(self, actions: np.ndarray) -> np.ndarray:
        """Policy actions as Meta-World's controller takes them: clipped to [-1, 1], a float64 copy."""
        return np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)

    def unnorm_key(self, suite: str, available: Sequence[str]) -> str:
        return metaworld_unnorm_key(suite, available)


BENCHMARK = MetaWorldBenchmark()
