"""The LIBERO layer: suite tables and id checks, LIBERO's config and assets, the rendering back-end check, the
observation OpenVLA / OFT read, and real simulators in EnvPool's workers (robot axes, per-episode resets, the same
observations on either simulator and after any other episode).

The simulator tests need LIBERO (`make install`); they are skipped with the reason when it is missing. They share one
pool of two workers (building a LIBERO scene costs seconds of CPU) and render at 128 px (the resolution changes no
physics).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import yaml

from prismatic.sim import render
from prismatic.sim.libero import setup
from prismatic.sim.libero.benchmark import BENCHMARK as LIBERO
from prismatic.sim.libero.env import (
    LiberoObservation,
    LiberoTaskEnv,
    observation_from_libero,
    quat_to_axis_angle,
)
from prismatic.sim.libero.suites import (
    DUMMY_ACTION,
    LIBERO_SUITES,
    NUM_STEPS_WAIT,
    SUITE_TASK_COUNTS,
    check_suite,
    check_task_ids,
    suite_task_count,
    task_language,
)
from prismatic.sim.pool import EnvPool, EpisodeSpec
from prismatic.util.errors import ConfigError

needs_mujoco = pytest.mark.skipif(
    importlib.util.find_spec("mujoco") is None, reason="MuJoCo is not installed"
)
SPATIAL_0 = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate"  # LIBERO's task map
)


# ---- suites -------------------------------------------------------------------------------------------------------


def test_suite_tables_are_openvlas() -> None:
    """openvla/openvla run_libero_eval.py: max steps per suite, 10 settling steps, the dummy action."""
    assert LIBERO_SUITES == {
        "libero_spatial": 220,
        "libero_object": 280,
        "libero_goal": 300,
        "libero_10": 520,
        "libero_90": 400,
    }
    assert NUM_STEPS_WAIT == 10
    assert list(DUMMY_ACTION) == [0, 0, 0, 0, 0, 0, -1]
    assert [suite_task_count(s) for s in LIBERO_SUITES] == [10, 10, 10, 10, 90]


def test_unknown_suite_names_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        check_suite("libero_spatail")
    assert str(info.value) == (
        "Unknown LIBERO task suite 'libero_spatail'. Did you mean 'libero_spatial'? Valid choices: libero_spatial, "
        "libero_object, libero_goal, libero_10, libero_90."
    )
    with pytest.raises(ConfigError, match="Unknown LIBERO task suite 'libero_100'"):
        suite_task_count("libero_100")


def test_task_ids_out_of_range() -> None:
    check_task_ids("libero_spatial", [0, 9])
    check_task_ids("libero_90", [89])
    with pytest.raises(ConfigError) as info:
        check_task_ids("libero_spatial", [3, 10])
    assert str(info.value) == (
        "Task id 10 is not in LIBERO suite 'libero_spatial': it has 10 tasks, valid ids are 0-9."
    )
    with pytest.raises(
        ConfigError, match="Task id -1, 90 is not in LIBERO suite 'libero_90'.*valid ids are 0-89"
    ):
        check_task_ids("libero_90", [-1, 90])


# ---- config and assets ---------------------------------------------------------------------------------------------


def test_missing_assets_dir_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIBERO_CONFIG_PATH", "untouched")
    with pytest.raises(ConfigError) as info:
        setup.prepare_libero(tmp_path / "nope", config_root=tmp_path / "config")
    message = str(info.value)
    assert f"LIBERO assets folder {tmp_path / 'nope'} does not exist" in message
    assert "--libero_assets_dir" in message
    assert not (tmp_path / "config").exists()
    assert os.environ["LIBERO_CONFIG_PATH"] == "untouched"


def test_incomplete_assets_dir_lists_what_is_missing(tmp_path: Path) -> None:
    for name in ("scenes", "textures"):
        (tmp_path / "assets" / name).mkdir(parents=True)
    with pytest.raises(ConfigError) as info:
        setup.prepare_libero(tmp_path / "assets", config_root=tmp_path / "config")
    assert (
        f"LIBERO assets folder {tmp_path / 'assets'} lacks articulated_objects, stable_hope_objects, "
        "stable_scanned_objects, turbosquid_objects." in str(info.value)
    )


@pytest.mark.skipif(importlib.util.find_spec("libero") is None, reason="LIBERO is not installed")
def test_config_points_libero_at_the_given_assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIBERO_CONFIG_PATH", "")
    assets = tmp_path / "assets"
    for name in setup.ASSET_FOLDERS:  # (their names are pinned by the test above)
        (assets / name).mkdir(parents=True)
    folder = setup.prepare_libero(assets, config_root=tmp_path / "config")
    assert folder.parent == tmp_path / "config"
    assert os.environ["LIBERO_CONFIG_PATH"] == str(folder)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["assets"] == str(assets)
    for key in ("bddl_files", "init_states"):
        assert Path(config[key]).is_dir()
    again = setup.prepare_libero(assets, config_root=tmp_path / "config")
    assert again == folder  # same content, same folder

    # Without a folder: the asset wheels when installed, else LIBERO's own folder (which hf-libero downloads into).
    wheels = setup.wheel_assets_dir()
    default = yaml.safe_load(
        (setup.prepare_libero(config_root=tmp_path / "config") / "config.yaml").read_text()
    )
    assert default["assets"] == str(
        wheels if wheels is not None else Path(config["benchmark_root"]) / "assets"
    )
    monkeypatch.setattr(setup, "wheel_assets_dir", lambda: None)
    without = yaml.safe_load(
        (setup.prepare_libero(config_root=tmp_path / "config") / "config.yaml").read_text()
    )
    assert without["assets"] == str(Path(config["benchmark_root"]) / "assets")


# ---- rendering back-end -------------------------------------------------------------------------------------------


@needs_mujoco
def test_unknown_render_backend_names_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", "wgl")
    with pytest.raises(ConfigError) as info:
        render.check_render_backend()
    assert str(info.value) == (
        "MUJOCO_GL=wgl is not a headless rendering back-end MuJoCo can use. Valid choices: egl, osmesa; or unset "
        "MUJOCO_GL to take the first that works."
    )


@needs_mujoco
def test_missing_egl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without an EGL driver, simulated: glvnd finds no vendor library."""
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/nonexistent/egl_vendor.json")
    with pytest.raises(ConfigError) as info:
        render.check_render_backend()
    message = str(info.value)
    assert message.startswith("MUJOCO_GL=egl cannot render on this machine (")
    assert "apt-get install libegl1 libegl-mesa0" in message
    assert "set MUJOCO_GL=osmesa" in message


@needs_mujoco
def test_render_backend_falls_back_to_osmesa(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):
        monkeypatch.setenv(name, "")  # unset for the check; restored afterwards
    monkeypatch.setattr(render, "probe_render_backend", {"egl": "no EGL display", "osmesa": None}.get)
    assert render.check_render_backend() == "osmesa"
    assert (os.environ["MUJOCO_GL"], os.environ["PYOPENGL_PLATFORM"]) == ("osmesa", "osmesa")

    monkeypatch.setenv("MUJOCO_GL", "")
    monkeypatch.setattr(
        render, "probe_render_backend", {"egl": "no EGL display", "osmesa": "no libOSMesa"}.get
    )
    with pytest.raises(ConfigError) as info:
        render.check_render_backend()
    assert str(info.value).startswith(
        "No MuJoCo rendering back-end works on this machine (MUJOCO_GL=egl fails with: no EGL display; "
        "MUJOCO_GL=osmesa fails with: no libOSMesa). The simulators render their cameras off-screen with MuJoCo: install "
        "Mesa's EGL (`apt-get install libegl1 libegl-mesa0"
    )


# ---- observation ---------------------------------------------------------------------------------------------------


def axis_angle_quat(axis: np.ndarray, angle: float) -> np.ndarray:
    """(x, y, z, w) quaternion of a rotation by `angle` about the unit `axis`."""
    return np.concatenate([np.asarray(axis) * math.sin(angle / 2), [math.cos(angle / 2)]])


def test_quat_to_axis_angle() -> None:
    quarter_turn_z = axis_angle_quat(np.array([0.0, 0.0, 1.0]), math.pi / 2)
    np.testing.assert_allclose(quat_to_axis_angle(quarter_turn_z), [0.0, 0.0, math.pi / 2], atol=1e-12)
    axis = np.array([1.0, -2.0, 0.5]) / np.linalg.norm([1.0, -2.0, 0.5])
    quat = axis_angle_quat(axis, 2.5)
    before = quat.copy()
    np.testing.assert_allclose(quat_to_axis_angle(quat), axis * 2.5, atol=1e-12)
    assert np.array_equal(quat, before)
    assert np.array_equal(quat_to_axis_angle(np.array([0.0, 0.0, 0.0, 1.0])), np.zeros(3))


def test_observation_is_rotated_and_proprio_is_ofts_state() -> None:
    rng = np.random.default_rng(0)
    agent, wrist = (rng.integers(0, 256, (6, 5, 3), dtype=np.uint8) for _ in range(2))
    axis = np.array([0.0, 0.6, 0.8])
    raw = {
        "agentview_image": agent,
        "robot0_eye_in_hand_image": wrist,
        "robot0_eef_pos": np.array([0.1, -0.2, 1.1]),
        "robot0_eef_quat": axis_angle_quat(axis, 3.0),
        "robot0_gripper_qpos": np.array([0.03, -0.03]),
    }
    observation = observation_from_libero(raw)
    assert np.array_equal(observation.full_image, np.rot90(agent, 2))  # 180 degrees
    assert np.array_equal(observation.wrist_image, np.rot90(wrist, 2))
    expected = np.array([0.1, -0.2, 1.1, 0.0, 0.6 * 3.0, 0.8 * 3.0, 0.03, -0.03], dtype=np.float32)
    assert observation.proprio.dtype == np.float32
    np.testing.assert_allclose(observation.proprio, expected, rtol=1e-6)
    assert np.array_equal(observation.eef_pos, [0.1, -0.2, 1.1])


# ---- the simulator -------------------------------------------------------------------------------------------------
# In a worker process (EnvPool(1)): the test process may hold TensorFlow, beside which Mesa's rendering crashes.


@pytest.fixture(scope="module")
def spatial(libero_config: Path) -> Iterator[EnvPool]:
    """Two simulator workers for this module; a worker builds libero_spatial task 0 at 128 px at its first reset
    (seconds of CPU, and again at every reset: LIBERO rebuilds its scene). The tests use slot 0; the pool test both."""
    with EnvPool(LIBERO, 2, resolution=128) as pool:
        yield pool


def _reset(pool: EnvPool, episode_idx: int, seed: int = 0) -> LiberoObservation:
    return pool.reset([EpisodeSpec("libero_spatial", 0, episode_idx, seed)])[0]


def _step(pool: EnvPool, action: Sequence[float]) -> LiberoObservation:
    outcome = pool.step([np.array(action, dtype=np.float64)])[0]
    assert outcome.error is None
    return outcome.observation


ACTIONS = [  # a short scripted episode: move, turn, close the gripper
    np.array([0.6, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]),
    np.array([0.0, -0.4, 0.5, 0.0, 0.2, 0.0, -1.0]),
    np.array([0.0, 0.0, -0.3, 0.1, 0.0, -0.2, 1.0]),
]
FIELDS = ("full_image", "wrist_image", "proprio", "eef_pos")


def test_task_facts(libero_config: Path) -> None:
    """LIBERO's task table (the instruction a worker's simulator reads, and episode 49, are checked on the pool
    below)."""
    assert task_language("libero_spatial", 0) == SPATIAL_0
    from libero.libero import benchmark  # after libero_config: LIBERO reads its config at import

    assert {s: benchmark.get_benchmark_dict()[s]().n_tasks for s in LIBERO_SUITES} == SUITE_TASK_COUNTS
    wheels = setup.wheel_assets_dir()
    if wheels is not None:  # LIBERO takes its meshes from the wheels, not from a download
        import libero.libero

        assert Path(libero.libero.get_assets_path()) == wheels


def test_robot_axes(spatial: EnvPool) -> None:
    """LIBERO's OSC controller takes end-effector deltas in the world frame: +x moves +x, +z moves up."""
    observation = _reset(spatial, 0)
    assert observation.full_image.shape == observation.wrist_image.shape == (128, 128, 3)
    assert observation.full_image.dtype == np.uint8
    np.testing.assert_allclose(observation.proprio[:3], observation.eef_pos, rtol=1e-6)
    for axis in (0, 2):  # x, then z (up)
        action = [0.0] * 6 + [-1.0]
        action[axis] = 1.0
        start = _step(spatial, DUMMY_ACTION).eef_pos
        for _ in range(6):
            end = _step(spatial, action).eef_pos
        moved = end - start
        assert moved[axis] > 0.03, f"axis {axis}: {moved}"  # up to 5 cm a step at full scale
        # The others drift by the controller's tracking error (~1 cm here); a swapped axis would move ~0.
        assert np.all(np.abs(np.delete(moved, axis)) < 0.4 * moved[axis]), f"axis {axis}: {moved}"
    # An action of the wrong size is refused before it reaches the simulator.
    with pytest.raises(ValueError, match=r"A LIBERO action has shape \(7,\), got \(6,\) for slot 0"):
        spatial.step([np.zeros(6)])


def test_an_episode_depends_only_on_itself_not_on_the_simulator_or_what_ran_before(spatial: EnvPool) -> None:
    """EnvPool: two episodes side by side on two simulators, then one after the other in the other order on one of
    them (which ran the other episode just before) give the same observations at every step. This is why an
    evaluation's table is the same for any `--num_envs` (tests/sim/test_eval_libero.py compares 1 and 2 end to
    end)."""
    episodes = [
        EpisodeSpec("libero_spatial", 0, episode_idx=0),
        EpisodeSpec("libero_spatial", 0, episode_idx=49),  # the last of the task's 50 fixed initial states
    ]

    def trace(first: LiberoObservation, outcomes: list) -> list[LiberoObservation]:
        assert all(o.error is None and not o.success for o in outcomes)
        return [first] + [o.observation for o in outcomes]

    firsts = spatial.reset(episodes)  # slot 0: episode 0, slot 1: episode 49
    steps = [spatial.step([action, action]) for action in ACTIONS]
    together = [trace(firsts[slot], [step[slot] for step in steps]) for slot in (0, 1)]
    assert spatial.language("libero_spatial", 0) == SPATIAL_0  # as the workers' simulators read it
    alone = {}
    for index in (1, 0):  # on slot 0 alone: episode 49 after episode 0, then episode 0 after episode 49
        first = spatial.reset({0: episodes[index]})[0]
        alone[index] = trace(first, [spatial.step({0: action})[0] for action in ACTIONS])
    with pytest.raises(ConfigError, match="Episode 99 has no fixed initial state"):  # raised in the worker
        spatial.reset({0: EpisodeSpec("libero_spatial", 0, episode_idx=99)})

    for index in (0, 1):
        for step, (a, b) in enumerate(zip(together[index], alone[index], strict=True)):
            for name in FIELDS:
                assert np.array_equal(getattr(a, name), getattr(b, name)), (index, step, name)
    # Another fixed initial state: another scene from the first frame on.
    assert not np.array_equal(together[0][0].full_image, together[1][0].full_image)
    assert not np.array_equal(together[0][-1].full_image, together[1][-1].full_image)


def test_bad_episode(spatial: EnvPool) -> None:
    with pytest.raises(ConfigError) as info:
        _reset(spatial, 50)
    assert str(info.value) == (
        "Episode 50 has no fixed initial state: LIBERO's libero_spatial task 0 has 50 (episodes 0-49); ask for at "
        "most 50 trials per task."
    )


def test_no_simulator_beside_tensorflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow", types.ModuleType("tensorflow"))
    with pytest.raises(RuntimeError, match="cannot run in a process that has imported TensorFlow"):
        LiberoTaskEnv("libero_spatial", 0)
