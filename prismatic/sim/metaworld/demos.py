"""Demonstrations from Meta-World's scripted experts (`metaworld.policies`), one episode file each, in worker
processes: what `vla_scripts/collect_demos.py` runs.

An episode file is the own-data format of `vla_scripts/convert_to_rlds.py` (docs/own_data.md): `image` (the upright
corner2 view), `state` (the 4-d proprio the policy reads), `action` (the expert's 4-d action), `instruction`.

Seeds: evaluation episode `i` of a task is `MetaWorldTaskEnv.reset(i, seed)`; demonstration `j` is episode
`DEMO_EPISODE_OFFSET + j` of the same stream, so demonstrations never repeat an evaluated configuration (for fewer
than a million evaluation episodes per task). Everything an episode holds depends only on (task, episode index,
seed, resolution, shadows, action noise): the same request writes the same arrays in any worker, in any order.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from prismatic.sim.metaworld.env import ACTION_DIM, MetaWorldTaskEnv
from prismatic.sim.metaworld.tasks import MT50_TASKS, expert_policy_name

DEMO_EPISODE_OFFSET = (
    1_000_000  # demonstration j is episode DEMO_EPISODE_OFFSET + j (evaluation uses 0, 1, ...)
)


@dataclass(frozen=True)
class DemoRequest:
    """Some demonstrations of one task, run by one worker with one simulator."""

    task: str  # Meta-World task name, e.g. "reach-v3"
    demo_indices: tuple[int, ...]  # demonstration numbers j (episode DEMO_EPISODE_OFFSET + j)
    seed: int
    resolution: int
    shadows: bool
    action_noise: float  # std of the Gaussian noise added to the executed xyz action (0: none)
    out_dir: str  # where the episode files go


@dataclass(frozen=True)
class DemoResult:
    """What one demonstration gave: success, its number of steps, and its file (None when it failed)."""

    task: str
    demo_index: int
    success: bool
    num_steps: int
    path: str | None


def episode_file_name(task: str, demo_index: int) -> str:
    """`<MT50 id>_<task>_<demo>.npz`: sorted by task, then by demonstration."""
    return f"{MT50_TASKS.index(task):02d}_{task}_{demo_index:06d}.npz"


def noise_rng(task: str, demo_index: int, seed: int) -> np.random.Generator:
    """The generator of one demonstration's action noise: its own stream of (seed, task, demonstration), apart from
    the positions' stream."""
    return np.random.default_rng(
        [int(seed), MT50_TASKS.index(task), int(demo_index), zlib.crc32(b"action_noise")]
    )


def run_demo(env: MetaWorldTaskEnv, policy: object, request: DemoRequest, demo_index: int) -> DemoResult:
    """Run the expert for one demonstration until the task succeeds or the step limit; write its file on success.

    With `action_noise`, the simulator executes the expert's action plus Gaussian noise on xyz (clipped to [-1,
    1]) while the file records the expert's clean action for each state: states off the expert's path labelled
    with the way back (recovery data). The gripper command is not perturbed: a perturbed grasp drops the object
    instead of teaching a correction.
    """
    rng = noise_rng(request.task, demo_index, request.seed)
    observation = env.reset(DEMO_EPISODE_OFFSET + demo_index, request.seed)
    images, states, actions = [], [], []
    success = False
    for _ in range(env.max_steps):
        action = np.clip(np.asarray(policy.get_action(observation.raw_state), dtype=np.float64), -1.0, 1.0)
        executed = action.copy()
        if request.action_noise > 0:
            executed[:3] = np.clip(executed[:3] + rng.normal(0.0, request.action_noise, 3), -1.0, 1.0)
        images.append(observation.views[0])
        states.append(observation.proprio)
        actions.append(action.astype(np.float32))
        observation, success = env.step(executed)
        if success:
            break
    path = None
    if success:
        path = str(Path(request.out_dir) / episode_file_name(request.task, demo_index))
        np.savez(
            path,
            image=np.stack(images),
            state=np.stack(states).astype(np.float32),
            action=np.stack(actions).reshape(-1, ACTION_DIM),
            instruction=np.array(env.language),
        )
    return DemoResult(request.task, demo_index, success, len(actions), path)


def collect(request: DemoRequest) -> list[DemoResult]:
    """Run `request`'s demonstrations with one simulator (a worker process's job)."""
    import warnings

    import metaworld.policies  # lazy: MuJoCo; in the worker only

    policy = getattr(metaworld.policies, expert_policy_name(request.task))()
    with warnings.catch_warnings():
        # The experts' gains exceed 1 and Meta-World says so on every call; the actions are clipped as it does.
        warnings.filterwarnings("ignore", message="Constant\\(s\\) may be too high")
        with MetaWorldTaskEnv(
            "MT50", MT50_TASKS.index(request.task), request.resolution, shadows=request.shadows
        ) as env:
            return [run_demo(env, policy, request, j) for j in request.demo_indices]
