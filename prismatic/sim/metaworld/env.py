"""One Meta-World task in the simulator, set up as LeRobot's evaluation does, with reproducible fresh positions.

    env = MetaWorldTaskEnv("MT50", task_id=40, resolution=128)   # reach-v3; ~1 s: builds the MuJoCo scene
    observation = env.reset(episode_idx=3, seed=0)                # object / goal positions of episode 3
    observation, success = env.step(np.array([0.0, 0.0, 0.0, -1.0]))

Read from huggingface/lerobot `src/lerobot/envs/metaworld.py`: the task is built through `metaworld.MT1(task,
seed=42)` and its first train task, the `corner2` camera moved to (0.75, 0.075, 0.7), the positions left free
(`_freeze_rand_vec = False`: fresh ones each reset, not MT1's 50 pre-sampled ones), the image turned 180 degrees
(`np.flip(image, (0, 1))`: corner2 renders upside down), the state the first 4 numbers of the observation (hand
xyz, gripper opening), 4-d actions in [-1, 1], success when `info["success"]` is set at any step.

Where LeRobot draws the positions from NumPy's global generator, an episode here draws them from the environment's
own generator, seeded from (task, episode index, seed) before each reset, so it is the same in any process, order
or worker.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from prismatic.sim.benchmark import SimObservation
from prismatic.sim.metaworld.tasks import MT50_TASKS, TASK_DESCRIPTIONS, task_name
from prismatic.sim.render import RENDER_BACKENDS, check_render_backend

ACTION_DIM = (
    4  # hand xyz displacement (scaled by 1/100 m), gripper effort (-1 open, +1 close); all in [-1, 1]
)
PROPRIO_DIM = 4  # hand xyz (m), gripper opening (0 closed .. 1 open)
CAMERA = "corner2"
CAMERA_POS = (0.75, 0.075, 0.7)  # LeRobot's corner2 position (as in arXiv:2206.14244)
MT1_SEED = 42  # LeRobot's `metaworld.MT1(task, seed=42)`: fixes the task's configuration, not the positions


@dataclass(frozen=True)
class MetaWorldObservation(SimObservation):
    """A `SimObservation` with Meta-World's full state vector, which the scripted experts read."""

    raw_state: np.ndarray  # (39,) float64: hand, gripper, objects, previous frame's, goal (Meta-World's obs)


def episode_seed(name: str, episode_idx: int, seed: int) -> int:
    """The seed of the positions of episode `episode_idx` of task `name` under run seed `seed`: a hash of the three
    (NumPy's SeedSequence), with the task as its MT50 id so that a task has the same episodes in every suite."""
    entropy = [int(seed), MT50_TASKS.index(name), int(episode_idx)]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0])


def observation_from_metaworld(raw_state: np.ndarray, image: np.ndarray) -> MetaWorldObservation:
    """The policy's view of one step: the corner2 render turned upright, the first 4 state numbers."""
    raw_state = np.asarray(raw_state, dtype=np.float64)
    return MetaWorldObservation(
        views=(np.ascontiguousarray(np.flip(image, (0, 1))),),
        proprio=raw_state[:PROPRIO_DIM].astype(np.float32),
        eef_pos=raw_state[:3].copy(),
        raw_state=raw_state.copy(),
    )


class MetaWorldTaskEnv:
    """Meta-World's environment of one task, built as LeRobot's `MetaworldEnv` builds it, rendering `corner2` at
    `resolution` squared. `shadows=False` skips MuJoCo's shadow pass, the bulk of a frame's cost on a software
    renderer; the images then differ from the benchmark's (no shadows under the arm and objects), so data
    collected that way is best evaluated that way.

    Not in a process that imports TensorFlow (the policy's image maths does): MuJoCo's software rendering crashes
    there. The evaluation pool's workers and `collect_demos.py`'s are fresh processes."""

    def __init__(self, suite: str, task_id: int, resolution: int = 480, *, shadows: bool = True) -> None:
        name = task_name(suite, task_id)
        # Measured: a segfault in the first render after `import tensorflow`, with Mesa's EGL (llvmpipe).
        if "tensorflow" in sys.modules:
            raise RuntimeError(
                "A Meta-World simulator cannot run in a process that has imported TensorFlow: MuJoCo's software "
                "rendering (Mesa) crashes there. Run it in a fresh process, as EnvPool's workers do."
            )
        # Choose the back-end unless a checked one is set (entry points check it before starting workers, which
        # inherit it); once PyOpenGL is imported the platform is fixed anyway.
        if os.environ.get("MUJOCO_GL") not in RENDER_BACKENDS and "OpenGL" not in sys.modules:
            check_render_backend()
        import metaworld  # lazy: MuJoCo and gymnasium, after the back-end is chosen

        self.suite, self.task_id, self.name = suite, task_id, name
        self.language = TASK_DESCRIPTIONS[name]
        mt1 = metaworld.MT1(name, seed=MT1_SEED)
        self._env = mt1.train_classes[name](
            render_mode="rgb_array", camera_name=CAMERA, width=resolution, height=resolution
        )
        self._env.set_task(mt1.train_tasks[0])
        self._env.model.cam_pos[self._env.model.camera(CAMERA).id] = CAMERA_POS
        self._env._freeze_rand_vec = False  # fresh positions at each reset (LeRobot's setting) ...
        self._env.seeded_rand_vec = True  # ... drawn from the env's own generator, which `reset` seeds
        self.max_steps = int(self._env.max_path_length)
        self._viewer = self._env.mujoco_renderer._get_viewer("rgb_array")  # creates the GL context now
        if not shadows:
            import mujoco

            self._viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0

    def _observe(self, raw_state: np.ndarray) -> MetaWorldObservation:
        # gymnasium makes a context current only when it creates it: another env's in this process may be current.
        self._viewer.make_context_current()
        return observation_from_metaworld(raw_state, self._env.render())

    def reset(self, episode_idx: int, seed: int = 0) -> MetaWorldObservation:
        """Start episode `episode_idx`: object and goal positions drawn from the task's random reset space with the
        generator seeded by `episode_seed(task, episode_idx, seed)`; the hand at its start pose."""
        self._env.seed(episode_seed(self.name, episode_idx, seed))
        raw_state, _ = self._env.reset()
        return self._observe(raw_state)

    def step(self, action: np.ndarray) -> tuple[MetaWorldObservation, bool]:
        """Apply one 4-d action (clipped to [-1, 1] by Meta-World's controller). Returns the observation and whether
        the task is achieved at this step (`info["success"]`, which LeRobot ends the episode on)."""
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (ACTION_DIM,):
            raise ValueError(f"A Meta-World action has shape ({ACTION_DIM},), got {action.shape}.")
        raw_state, _, _, _, info = self._env.step(action)
        return self._observe(raw_state), bool(info.get("success", 0.0))

    def close(self) -> None:
        """Free the simulator and its rendering context."""
        # MuJoCo frees a render context's GL objects in whichever GL context is current when it is collected: free
        # them now, in their own, or a later collection breaks the next simulator's rendering (black frames).
        self._viewer.make_context_current()
        self._viewer.con.free()
        self._env.close()

    def __enter__(self) -> MetaWorldTaskEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
