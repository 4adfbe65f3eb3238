"""LIBERO behind the benchmark interface (`prismatic/sim/benchmark.py`): its suites, simulator and OpenVLA's protocol.

The tables come from `suites.py`, the simulator from `env.py`, the action and statistics rules from `protocol.py`;
this file only binds them to the names the pool, the rollout and `vla_scripts/eval_sim.py` use.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prismatic.sim.libero import suites
from prismatic.sim.libero.env import ACTION_DIM, LiberoTaskEnv
from prismatic.sim.libero.protocol import gripper_to_env, suite_unnorm_key
from prismatic.sim.libero.setup import prepare_libero
from prismatic.util.errors import ConfigError

# LIBERO renders as OpenVLA's evaluation does, which its training images were rendered like.
SHADOWS_REFUSED = (
    "--shadows false is Meta-World's: LIBERO renders as OpenVLA's evaluation does, with its shadows."
)


class LiberoBenchmark:
    """LIBERO's five suites with OpenVLA's evaluation protocol (OFT's for chunk heads)."""

    name = "libero"
    title = "LIBERO"
    action_dim = ACTION_DIM
    proprio_dim = 8  # OFT's state: eef position (3), axis-angle (3), gripper finger qpos (2)
    num_views = 2  # agent view, wrist camera
    num_steps_wait = suites.NUM_STEPS_WAIT
    dummy_action = suites.DUMMY_ACTION
    default_resolution = 256  # OpenVLA's render size
    suites = tuple(suites.LIBERO_SUITES)

    def __init__(self) -> None:
        self.assets_dir: Path | None = (
            None  # --libero_assets_dir, set by the entry point before check_install
        )

    def check_install(self) -> None:
        """Write LIBERO's config (its assets) so that no import prompts; ConfigError when LIBERO is missing."""
        prepare_libero(self.assets_dir)

    def task_names(self, suite: str) -> list[str]:
        """LIBERO names its tasks by number: `task0`, `task1`, ... (the instructions come from the simulator)."""
        return [f"task{i}" for i in range(suites.suite_task_count(suite))]

    def task_language(self, suite: str, task_id: int) -> str:
        return suites.task_language(suite, task_id)

    def max_steps(self, suite: str) -> int:
        suites.check_suite(suite)
        return suites.LIBERO_SUITES[suite]

    def max_episodes_per_task(self, suite: str) -> int | None:
        suites.check_suite(suite)
        return suites.NUM_INITIAL_STATES

    def make_env(self, suite: str, task_id: int, resolution: int, shadows: bool = True) -> LiberoTaskEnv:
        if not shadows:
            raise ConfigError(SHADOWS_REFUSED)
        return LiberoTaskEnv(suite, task_id, resolution)

    def action_to_env(self, actions: np.ndarray) -> np.ndarray:
        return gripper_to_env(actions)

    def unnorm_key(self, suite: str, available: Sequence[str]) -> str:
        return suite_unnorm_key(suite, available)


BENCHMARK = LiberoBenchmark()
