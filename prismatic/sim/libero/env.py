"""One LIBERO task in the simulator, set up as OpenVLA's evaluation does, and its observations as the policy needs
them.

    env = LiberoTaskEnv("libero_spatial", task_id=0)   # ~5 s: builds the MuJoCo scene
    observation = env.reset(episode_idx=3, seed=0)     # the task's fixed initial state number 3
    observation, success = env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))

Read from openvla/openvla `experiments/robot/libero/libero_utils.py` (`get_libero_env`, `get_libero_image`) and
openvla-oft's (`get_libero_wrist_image`, `quat2axisangle`, `prepare_observation`'s state).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.sim.libero.setup import import_libero
from prismatic.sim.libero.suites import check_task_ids, libero_benchmark
from prismatic.sim.render import check_render_backend
from prismatic.util.errors import ConfigError

ACTION_DIM = 7  # end-effector delta position (3) and rotation (3), gripper (-1 open, +1 close)


@dataclass(frozen=True)
class LiberoObservation:
    """What the policy side reads from one simulator step."""

    full_image: np.ndarray  # (H, W, 3) uint8: the agent-view camera, rotated 180 degrees (OpenVLA's image)
    wrist_image: (
        np.ndarray
    )  # (H, W, 3) uint8: the eye-in-hand camera, rotated 180 degrees (OFT's wrist image)
    proprio: (
        np.ndarray
    )  # (8,) float32: OFT's state, eef position (3), axis-angle (3), gripper finger qpos (2)
    eef_pos: np.ndarray  # (3,) float64: end-effector position in world coordinates (metres)

    @property
    def views(self) -> tuple[np.ndarray, np.ndarray]:
        """The camera views in the order a policy reads them (`SimObservation.views`): agent view, then wrist."""
        return self.full_image, self.wrist_image


def quat_to_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """Axis-angle vector (unit axis times angle in radians) of a unit quaternion in robosuite's (x, y, z, w)
    order; zero for a zero rotation. The input is not modified (robosuite's version clips it in place)."""
    w = min(max(float(quat_xyzw[3]), -1.0), 1.0)
    sin_half = math.sqrt(1.0 - w * w)
    if math.isclose(sin_half, 0.0):
        return np.zeros(3)
    return np.asarray(quat_xyzw[:3], dtype=np.float64) * (2.0 * math.acos(w) / sin_half)


def observation_from_libero(raw: dict[str, Any]) -> LiberoObservation:
    """Convert LIBERO's observation dict. Its renders are upside down (OpenGL's row order), and OpenVLA's training
    data was rotated 180 degrees (`img[::-1, ::-1]`), so both cameras are turned that way."""
    eef_pos = np.asarray(raw["robot0_eef_pos"], dtype=np.float64)
    proprio = np.concatenate(
        [eef_pos, quat_to_axis_angle(raw["robot0_eef_quat"]), np.asarray(raw["robot0_gripper_qpos"])]
    )
    return LiberoObservation(
        full_image=np.ascontiguousarray(raw["agentview_image"][::-1, ::-1]),
        wrist_image=np.ascontiguousarray(raw["robot0_eye_in_hand_image"][::-1, ::-1]),
        proprio=proprio.astype(np.float32),
        eef_pos=eef_pos.copy(),
    )


class LiberoTaskEnv:
    """LIBERO's `OffScreenRenderEnv` for one task, created as OpenVLA's `get_libero_env` does (the task's BDDL file,
    both cameras at `resolution` squared, `env.seed(0)`), with reset and step returning `LiberoObservation`s.

    Not in a process that imports TensorFlow (the policy's image maths does): use `pool.EnvPool`, whose workers are
    fresh processes."""

    def __init__(self, suite: str, task_id: int, resolution: int = 256) -> None:
        check_task_ids(suite, [task_id])
        if "tensorflow" in sys.modules:  # measured: a segfault in the first GL call, with Mesa's llvmpipe
            raise RuntimeError(
                "A LIBERO simulator cannot run in a process that has imported TensorFlow: MuJoCo's software "
                "rendering (Mesa) crashes there. Run it in a fresh process, as EnvPool's workers do."
            )
        if "robosuite" not in sys.modules:  # robosuite fixes the rendering back-end when first imported
            check_render_backend()
        libero_root = import_libero()
        from libero.libero.envs import OffScreenRenderEnv  # lazy: robosuite + MuJoCo, after the checks above

        task_suite = libero_benchmark(suite)
        task = task_suite.get_task(task_id)
        self.suite, self.task_id, self.language = suite, task_id, task.language
        self._initial_states = task_suite.get_task_init_states(task_id)
        bddl_file = Path(libero_root.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
        self._env = OffScreenRenderEnv(
            bddl_file_name=str(bddl_file), camera_heights=resolution, camera_widths=resolution
        )
        self._env.seed(0)

    @property
    def num_episodes(self) -> int:
        """How many fixed initial states the task has (50 in every LIBERO suite)."""
        return len(self._initial_states)

    def reset(self, episode_idx: int, seed: int = 0) -> LiberoObservation:
        """Start episode `episode_idx` from the task's fixed initial state of that number.

        LIBERO's reset rebuilds the scene and draws object placements from numpy's global generator (`env.seed`
        seeds it) before the initial state overwrites the objects' poses; seeding it with `seed` right before each
        reset makes an episode depend on (task, `episode_idx`, `seed`) only, not on the episodes run before it.
        `seed=0` matches OpenVLA's `env.seed(0)` for a task's first episode.

        Raises:
            ConfigError: the task has no initial state `episode_idx`.
        """
        if episode_idx not in range(self.num_episodes):
            raise ConfigError(
                f"Episode {episode_idx} has no fixed initial state: LIBERO's {self.suite} task {self.task_id} has "
                f"{self.num_episodes} (episodes 0-{self.num_episodes - 1}); ask for at most {self.num_episodes} "
                f"trials per task."
            )
        self._env.seed(seed)
        self._env.reset()
        return observation_from_libero(self._env.set_init_state(self._initial_states[episode_idx]))

    def step(self, action: np.ndarray) -> tuple[LiberoObservation, bool]:
        """Apply one 7-d action (LIBERO's convention: gripper -1 open, +1 close). Returns the observation and
        whether the task is now achieved (LIBERO's `done`)."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (ACTION_DIM,):
            raise ValueError(f"A LIBERO action has shape ({ACTION_DIM},), got {action.shape}.")
        raw, _, done, _ = self._env.step(action.tolist())
        return observation_from_libero(raw), bool(done)

    def close(self) -> None:
        """Free the simulator and its rendering context."""
        self._env.close()

    def __enter__(self) -> LiberoTaskEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
