"""The Meta-World layer: task tables against Meta-World's own registries and LeRobot's ids, the benchmark's protocol
facts, the suite / task checks, and one real simulator (upright image, 4-d state, reproducible fresh positions).

The simulator runs in a spawned process (the test process may hold TensorFlow, beside which MuJoCo's software
rendering crashes) at 64 px; it is skipped when Meta-World is not installed (`make install` installs it).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np
import pytest

from prismatic.sim.benchmark import get_benchmark, parse_tasks
from prismatic.sim.metaworld import tasks
from prismatic.sim.metaworld.benchmark import BENCHMARK, metaworld_unnorm_key
from prismatic.sim.metaworld.env import MetaWorldTaskEnv, episode_seed, observation_from_metaworld
from prismatic.util.errors import ConfigError

MISSING = [name for name in ("metaworld", "mujoco") if importlib.util.find_spec(name) is None]
needs_metaworld = pytest.mark.skipif(
    bool(MISSING), reason=f"Meta-World is not installed (missing {', '.join(MISSING)}): `make install`"
)
REACH = 40  # reach-v3's id in LeRobot's TASK_NAME_TO_ID


# ---- tables --------------------------------------------------------------------------------------------------------


def test_ids_and_instructions_are_lerobots() -> None:
    """Spot checks of LeRobot's TASK_NAME_TO_ID and TASK_DESCRIPTIONS (huggingface/lerobot envs/metaworld.py)."""
    names = tasks.suite_tasks("MT50")
    assert len(names) == len(set(names)) == 50
    expected_ids = {
        "assembly-v3": 0,
        "drawer-open-v3": 18,
        "faucet-close-v3": 19,
        "push-v3": 38,
        "reach-v3": 40,
    }
    expected_ids |= {"window-open-v3": 48, "window-close-v3": 49}
    assert {name: names.index(name) for name in expected_ids} == expected_ids
    assert BENCHMARK.task_language("MT50", REACH) == "Reach a goal position"
    assert BENCHMARK.task_language("MT50", 38) == "Push the puck to a goal"
    assert BENCHMARK.task_language("easy", 1) == "Press a button from the top"  # easy's second task
    assert BENCHMARK.task_language("MT10", 4) == "Open a drawer"
    sizes = {suite: len(BENCHMARK.task_names(suite)) for suite in BENCHMARK.suites}
    assert sizes == {"MT50": 50, "MT10": 10, "easy": 28, "medium": 11, "hard": 6, "very_hard": 5}
    groups = [name for suite in ("easy", "medium", "hard", "very_hard") for name in tasks.SUITES[suite]]
    assert sorted(groups) == sorted(names)  # the difficulty groups partition the 50 tasks


@needs_metaworld
def test_tables_match_metaworlds_registries() -> None:
    import metaworld
    import metaworld.policies

    observable = metaworld.env_dict.ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
    assert sorted(name.removesuffix("-goal-observable") for name in observable) == sorted(tasks.MT50_TASKS)
    # metaworld.MT10().train_classes is this dict (building MT10 samples 500 goals: seconds, for the same keys).
    assert list(metaworld.env_dict.MT10_V3) == BENCHMARK.task_names("MT10")
    for name in tasks.MT50_TASKS:
        assert hasattr(metaworld.policies, tasks.expert_policy_name(name)), name
        assert metaworld.env_dict.ALL_V3_ENVIRONMENTS[name].max_path_length == BENCHMARK.max_steps("MT50")
    assert tasks.expert_policy_name("peg-insert-side-v3") == "SawyerPegInsertionSideV3Policy"
    assert tasks.expert_policy_name("button-press-topdown-v3") == "SawyerButtonPressTopdownV3Policy"


def test_protocol_facts() -> None:
    """LeRobot's MetaworldEnv: 4-d action and state, one 480 px view, no wait steps, 500 steps, any-step success."""
    assert get_benchmark("metaworld") is BENCHMARK
    facts = (BENCHMARK.action_dim, BENCHMARK.proprio_dim, BENCHMARK.num_views, BENCHMARK.num_steps_wait)
    assert facts == (4, 4, 1, 0)
    assert BENCHMARK.default_resolution == 480 and BENCHMARK.max_steps("hard") == 500
    assert BENCHMARK.max_episodes_per_task("MT10") is None
    actions = np.array([[0.5, -1.5, 2.0, -0.2]], dtype=np.float32)
    executed = BENCHMARK.action_to_env(actions)
    assert executed.dtype == np.float64 and np.array_equal(executed, [[0.5, -1.0, 1.0, np.float32(-0.2)]])
    executed[0, 0] = 9.0
    assert actions[0, 0] == 0.5  # a copy


def test_unnorm_key_rule() -> None:
    assert metaworld_unnorm_key("MT10", ["metaworld_mt10", "metaworld"]) == "metaworld_mt10"
    assert metaworld_unnorm_key("MT10", ["bridge_orig", "metaworld"]) == "metaworld"
    assert metaworld_unnorm_key("easy", ["my_demos"]) == "my_demos"  # one dataset: its statistics
    with pytest.raises(ConfigError, match="looked for 'metaworld_hard' and 'metaworld'.*a, b"):
        metaworld_unnorm_key("hard", ["b", "a"])


def test_unknown_suites_and_tasks_are_named() -> None:
    with pytest.raises(ConfigError) as info:
        BENCHMARK.task_names("MT51")
    assert str(info.value) == (
        "Unknown Meta-World task suite 'MT51'. Did you mean 'MT50'? Valid choices: MT50, MT10, easy, medium, hard, "
        "very_hard."
    )
    with pytest.raises(
        ConfigError, match="'reach-v2' is not a task id of this suite.*Did you mean 'reach-v3'"
    ):
        parse_tasks(BENCHMARK, "MT50", "reach-v2")
    assert parse_tasks(BENCHMARK, "MT10", "push-v3,0") == [0, 1]
    with pytest.raises(ConfigError, match="Task id 10 is not in Meta-World suite 'MT10': it has 10 tasks"):
        BENCHMARK.task_language("MT10", 10)
    with pytest.raises(
        ConfigError, match="Unknown Meta-World task 'drawer-opn-v3'. Did you mean 'drawer-open-v3'"
    ):
        tasks.expert_policy_name("drawer-opn-v3")


def test_missing_simulator_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "metaworld" else real(name))
    with pytest.raises(ConfigError, match=r"metaworld is not installed\. pip install -e '\.\[sim\]'"):
        BENCHMARK.check_install()


def test_observation_is_upright_and_lerobots_state() -> None:
    raw_state = np.arange(39, dtype=np.float64) / 10
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    observation = observation_from_metaworld(raw_state, image)
    assert np.array_equal(observation.views[0], image[::-1, ::-1])  # LeRobot's np.flip(image, (0, 1))
    expected = np.array([0, 0.1, 0.2, 0.3], dtype=np.float32)
    assert observation.proprio.dtype == np.float32 and np.array_equal(observation.proprio, expected)
    assert observation.eef_pos.dtype == np.float64 and np.array_equal(observation.eef_pos, [0, 0.1, 0.2])
    assert np.array_equal(observation.raw_state, raw_state)


def test_episode_seeds_differ_by_task_episode_and_seed() -> None:
    seeds = {episode_seed(name, i, s) for name in ("reach-v3", "push-v3") for i in (0, 1) for s in (0, 7)}
    assert len(seeds) == 8
    assert episode_seed("reach-v3", 3, 0) == episode_seed("reach-v3", 3, 0)


def test_no_simulator_beside_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured: MuJoCo's first render after `import tensorflow` segfaults (Mesa's EGL); the env refuses first."""
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    with pytest.raises(RuntimeError, match="cannot run in a process that has imported TensorFlow"):
        MetaWorldTaskEnv("MT50", REACH, 64)


# ---- the simulator (in a spawned process) --------------------------------------------------------------------------


def _simulate() -> dict[str, Any]:
    """Runs in a fresh process: one reach-v3 simulator's observations, then a second simulator built after the first
    is closed (shadows on), for the checks below."""
    from prismatic.sim.metaworld.env import MetaWorldTaskEnv

    out: dict[str, Any] = {}
    env = MetaWorldTaskEnv("MT50", REACH, 64, shadows=False)
    out["language"], out["max_steps"] = env.language, env.max_steps
    first = env.reset(3, seed=0)
    out["raw_render"] = env._env.render()  # Meta-World's own render of the same state
    out["first"] = first
    observation = first
    for _ in range(5):
        observation, success = env.step(np.array([1.0, 0.0, 0.0, -1.0]))
        out.setdefault("successes", []).append(success)
    out["moved"] = observation
    out["again"] = env.reset(3, seed=0)
    out["episode_4"] = env.reset(4, seed=0)
    out["seed_1"] = env.reset(3, seed=1)
    try:
        env.step(np.zeros(3))
    except ValueError as error:
        out["bad_action"] = str(error)
    env.close()
    with MetaWorldTaskEnv("MT50", REACH, 64) as shadowed:
        out["shadowed"] = shadowed.reset(3, seed=0)
    return out


@pytest.fixture(scope="module")
def simulated() -> Iterator[dict[str, Any]]:
    if MISSING:
        pytest.skip(f"Meta-World is not installed (missing {', '.join(MISSING)}): `make install`")
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        yield pool.submit(_simulate).result(timeout=300)


def test_image_is_upright_and_state_is_the_first_four(simulated: dict[str, Any]) -> None:
    first = simulated["first"]
    assert first.views[0].shape == (64, 64, 3) and first.views[0].dtype == np.uint8
    assert np.array_equal(first.views[0], simulated["raw_render"][::-1, ::-1])  # corner2 renders upside down
    assert first.proprio.dtype == np.float32 and first.proprio.shape == (4,)
    assert np.array_equal(first.proprio, first.raw_state[:4].astype(np.float32))
    assert np.array_equal(first.eef_pos, first.raw_state[:3]) and first.raw_state.shape == (39,)
    assert 0.0 < first.proprio[3] <= 1.0  # the gripper opening
    assert simulated["language"] == "Reach a goal position" and simulated["max_steps"] == 500
    assert simulated["bad_action"] == "A Meta-World action has shape (4,), got (3,)."


def test_action_moves_the_hand(simulated: dict[str, Any]) -> None:
    moved = simulated["moved"].eef_pos - simulated["first"].eef_pos
    assert moved[0] > 0.02 and abs(moved[1]) < 0.5 * moved[0], moved  # +x at full scale: ~1 cm a step
    assert simulated["successes"] == [False] * 5


def test_reset_depends_only_on_task_episode_and_seed(simulated: dict[str, Any]) -> None:
    first, again = simulated["first"], simulated["again"]
    assert np.array_equal(first.raw_state, again.raw_state) and np.array_equal(first.views[0], again.views[0])
    goal = slice(36, 39)  # the goal position, the last three numbers of the goal-observable state
    for other in ("episode_4", "seed_1"):
        assert not np.allclose(simulated[other].raw_state[goal], first.raw_state[goal]), other
    # A second simulator (built after the first was closed) gives the same episode; its shadows change the pixels a
    # little, not the state, and it renders (MuJoCo's GL objects of the first were freed in their own context).
    shadowed = simulated["shadowed"]
    assert np.array_equal(shadowed.raw_state, first.raw_state)
    difference = np.abs(shadowed.views[0].astype(int) - first.views[0]).mean()
    assert 0.5 < difference < 20, difference
    assert shadowed.views[0].mean() > 40
