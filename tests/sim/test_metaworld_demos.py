"""Demonstrations from Meta-World's scripted experts (`prismatic/sim/metaworld/demos.py`): the expert succeeds and the
episode ends at that step, the file records the expert's clean action under action noise, and an episode's arrays
depend only on its request, not on what the simulator ran before it. In a spawned process (no TensorFlow there), at
32 px, without shadows.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prismatic.sim.metaworld.demos import DEMO_EPISODE_OFFSET, DemoRequest, episode_file_name

MISSING = [name for name in ("metaworld", "mujoco") if importlib.util.find_spec(name) is None]


class _Recording:
    """Wraps the expert and the simulator to see what the expert answered and what was executed."""

    def __init__(self, policy: Any, env: Any) -> None:
        self.policy, self.env = policy, env
        self.answers: list[np.ndarray] = []
        self.executed: list[np.ndarray] = []
        self.max_steps, self.language = env.max_steps, env.language
        self.successes: list[bool] = []

    def get_action(self, raw_state: np.ndarray) -> np.ndarray:
        self.answers.append(np.asarray(self.policy.get_action(raw_state), dtype=np.float64))
        return self.answers[-1]

    def reset(self, episode_idx: int, seed: int) -> Any:
        self.reset_args = (episode_idx, seed)
        return self.env.reset(episode_idx, seed)

    def step(self, action: np.ndarray) -> Any:
        self.executed.append(np.array(action))
        observation, success = self.env.step(action)
        self.successes.append(success)
        return observation, success


def _run(out_dir: str) -> dict[str, Any]:
    """Runs in a fresh process, with one simulator: clean demonstration 1, then 1 with noise (through wrappers that
    see the expert's answers and the executed actions), then clean 1 again."""
    import metaworld.policies

    from prismatic.sim.metaworld.demos import run_demo
    from prismatic.sim.metaworld.env import MetaWorldTaskEnv

    def request(name: str, noise: float) -> DemoRequest:
        (Path(out_dir) / name).mkdir()
        return DemoRequest("reach-v3", (1,), 0, 32, False, noise, str(Path(out_dir) / name))

    out: dict[str, Any] = {}
    policy = metaworld.policies.SawyerReachV3Policy()
    with MetaWorldTaskEnv("MT50", 40, 32, shadows=False) as env:
        out["first"] = run_demo(env, policy, request("first", 0.0), 1)
        recording = _Recording(policy, env)
        out["noisy"] = run_demo(recording, recording, request("noisy", 0.3), 1)
        out["again"] = run_demo(env, policy, request("again", 0.0), 1)
    out["answers"], out["executed"] = recording.answers, recording.executed
    out["successes"], out["reset_args"] = recording.successes, recording.reset_args
    return out


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if MISSING:
        pytest.skip(f"Meta-World is not installed (missing {', '.join(MISSING)}): `make install`")
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_run, str(tmp_path_factory.mktemp("demos"))).result(timeout=300)


def test_expert_succeeds_and_the_episode_ends_there(demos: dict[str, Any]) -> None:
    for result in (demos["first"], demos["again"]):
        assert result.success and 0 < result.num_steps < 500
        assert Path(result.path).name == episode_file_name("reach-v3", result.demo_index)
        with np.load(result.path) as data:
            assert data["image"].shape == (result.num_steps, 32, 32, 3) and data["image"].dtype == np.uint8
            assert data["state"].shape == data["action"].shape == (result.num_steps, 4)
            assert data["action"].dtype == np.float32 and np.abs(data["action"]).max() <= 1
            assert str(data["instruction"]) == "Reach a goal position"
    successes = demos["successes"]
    assert successes[-1] and not any(successes[:-1])  # ended at the first success
    assert demos["reset_args"] == (DEMO_EPISODE_OFFSET + 1, 0)  # demonstrations are not evaluation episodes


def test_noise_is_executed_but_the_clean_action_is_recorded(demos: dict[str, Any]) -> None:
    noisy = demos["noisy"]
    answers, executed = np.array(demos["answers"]), np.array(demos["executed"])
    assert noisy.success and noisy.num_steps == len(answers) == len(executed)
    with np.load(noisy.path) as data:
        recorded, states = data["action"], data["state"]
    np.testing.assert_array_equal(recorded, np.clip(answers, -1, 1).astype(np.float32))
    noise = executed[:, :3] - np.clip(answers[:, :3], -1, 1)
    assert 0.1 < noise[np.abs(executed[:, :3]) < 1].std() < 0.5  # N(0, 0.3) where not clipped
    np.testing.assert_array_equal(
        executed[:, 3], np.clip(answers[:, 3], -1, 1)
    )  # the gripper is not perturbed
    with np.load(demos["first"].path) as data:
        assert data["state"].shape != states.shape or not np.array_equal(
            data["state"], states
        )  # another path


def test_an_episode_depends_only_on_its_request(demos: dict[str, Any]) -> None:
    with np.load(demos["again"].path) as a, np.load(demos["first"].path) as b:
        for key in ("image", "state", "action", "instruction"):
            assert a[key].tobytes() == b[key].tobytes(), key
