"""Standardisation parity with OpenVLA (`prismatic/vla/datasets/rlds/oxe/transforms.py` + `configs.py`).

One case per dataset that a *shared* standardisation function (or shared helper) serves: a tiny raw trajectory in
that dataset's raw layout (the keys OpenVLA's function for it reads) goes through our function, and the action, the
proprio the config's `state_obs_keys` give (concatenated by the pipeline's `proprio_of`) and the instruction must
equal values written here: hand-computed constants, or a numpy restatement of OpenVLA's formula for that dataset.
Nothing expected is computed by our transforms or by OpenVLA's code. Also: the gripper helpers' edge cases, the
quaternion -> Euler convention (tensorflow-graphics', which OpenVLA uses), and every Open-X config's camera / depth /
state keys against OpenVLA's `OXE_DATASET_CONFIGS` (copied below as data).

The values are multiples of 1/8 (or 1/16), so every operation here (slicing, 1 - x, clipping, subtraction of
states) is exact in float32 and the comparisons are exact, except the Euler angles (see `_EULER_ATOL`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, get_dataset_config
from prismatic.vla.datasets.rlds.trajectories import proprio_of
from prismatic.vla.datasets.rlds.transforms import (
    binarize_gripper_actions,
    get_standardize_fn,
    invert_gripper_actions,
    quaternion_to_euler,
    rel2abs_gripper_actions,
    relabel_bridge_actions,
)

tf = import_tensorflow()

INSTRUCTION = "open the top drawer"
F32 = np.float32


def _const(values: Any, dtype: Any = F32) -> Any:
    return tf.constant(np.asarray(values, dtype))


def _grid(num_steps: int, width: int, offset: float = 0.0) -> np.ndarray:
    """[T, width] distinct values k / 8 + offset (exact in float32)."""
    return (np.arange(num_steps * width, dtype=F32).reshape(num_steps, width) / 8 + offset).astype(F32)


def _text(num_steps: int) -> Any:
    return tf.constant([INSTRUCTION] * num_steps)


def _metadata(num_steps: int) -> dict[str, Any]:
    return {"episode_metadata": {"file_path": tf.constant(["episode_0"] * num_steps)}}


def _zeros(num_steps: int, width: int = 1) -> np.ndarray:
    return np.zeros((num_steps, width), F32)


def _col(values: list[float]) -> np.ndarray:
    return np.asarray(values, F32)[:, None]


def _standardize(name: str, raw: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[bytes], Any]:
    """Our standardisation of `raw` as the pipeline uses it: float32 action, proprio, instruction."""
    config = get_dataset_config(name)
    out = get_standardize_fn(config.standardize_fn)(raw)
    action = tf.cast(out["action"], tf.float32)  # the pipeline's cast (OpenVLA casts the same way)
    proprio = proprio_of(out["observation"], config, tf.shape(action)[0])
    return action.numpy(), proprio.numpy(), list(out[config.language_key].numpy()), out["action"].dtype


# === Per-dataset cases: name -> () -> (raw trajectory, expected action, expected proprio, expected instruction) ===

Case = tuple[dict[str, Any], np.ndarray, np.ndarray, list[str]]
CASES: dict[str, Callable[[], Case]] = {}


def _case(*names: str) -> Callable[[Callable[[str], Case]], Callable[[str], Case]]:
    def register(build: Callable[[str], Case]) -> Callable[[str], Case]:
        for name in names:
            CASES[name] = lambda name=name: build(name)
        return build

    return register


@_case("bridge_orig", "bridge_dataset")
def _bridge(name: str) -> Case:
    # OpenVLA: drop step 0 (all-zero action), binarise the gripper, relabel the arm with the reached state change
    # (state[t+1, :6] - state[t, :6]) and drop the last step.
    state = _grid(5, 7)
    state[:, 6] = [0.0, 1.0, 0.875, 0.125, 0.0]
    gripper = [
        0.0,
        1.0,
        0.625,
        0.0,
        0.375,
    ]  # after dropping step 0: 1, 0.625 -> next settled (0), 0, 0.375 (end)
    raw_action = np.concatenate([_grid(5, 6, offset=3.0), _col(gripper)], axis=1)
    raw = {
        "observation": {
            "image_0": tf.constant(["a"] * 5),
            "image_1": tf.constant(["b"] * 5),
            "state": _const(state),
        },
        "action": _const(raw_action),
        "language_instruction": tf.constant([f"step {t}" for t in range(5)]),
        "discount": _const(np.ones(5)),
        "traj_metadata": _metadata(5),
    }
    kept = state[1:4]  # steps 1, 2, 3 survive
    movement = state[2:5, :6] - state[1:4, :6]  # = 7 / 8 in every dim (state rows step by 7 / 8)
    np.testing.assert_array_equal(movement, np.full((3, 6), 0.875, F32))
    action = np.concatenate([movement, _col([1.0, 0.0, 0.0])], axis=1)
    proprio = np.concatenate([kept[:, :6], _zeros(3), kept[:, 6:7]], axis=1)
    return raw, action, proprio, ["step 1", "step 2", "step 3"]


@_case("fractal20220817_data", "nyu_door_opening_surprising_effectiveness")
def _rt1(name: str) -> Case:
    # Relative gripper (+1 close, -1 open, |x| <= 0.1 no change) -> absolute; before the first command the gripper
    # is in the opposite state (first command = close at t=1 -> open at t=0).
    world, rotation = _grid(5, 3), _grid(5, 3, offset=-1.0)
    closedness = [[0.0625], [1.0], [0.0], [-0.5], [0.0]]
    observation = {"image": tf.constant(["x"] * 5), "natural_language_instruction": _text(5)}
    pose, closed = _grid(5, 7, offset=2.0), _col([0.0, 0.0, 1.0, 1.0, 0.0])
    if name == "fractal20220817_data":
        observation |= {"base_pose_tool_reached": _const(pose), "gripper_closed": _const(closed)}
        proprio = np.concatenate([pose, closed], axis=1)
    else:  # no proprio in OpenVLA's config: 8 zero pads
        proprio = _zeros(5, 8)
    raw = {
        "observation": observation,
        "action": {
            "world_vector": _const(world),
            "rotation_delta": _const(rotation),
            "gripper_closedness_action": _const(closedness),
        },
        "traj_metadata": _metadata(5),
    }
    action = np.concatenate([world, rotation, _col([1.0, 0.0, 0.0, 1.0, 1.0])], axis=1)
    return raw, action, proprio, [INSTRUCTION] * 5


@_case("roboturk", "viola")
def _rtx_inverted(name: str) -> Case:
    # Absolute closedness (1 = closed): clip to [0, 1], then 1 - x. roboturk stores it as [T, 1], viola as [T].
    world, rotation = _grid(4, 3), _grid(4, 3, offset=0.5)
    closedness = np.asarray([-0.5, 0.0, 0.25, 1.5], F32)
    observation = {"natural_language_instruction": _text(4)}
    if name == "roboturk":
        closedness = closedness[:, None]
        observation["front_rgb"] = tf.constant(["x"] * 4)
        proprio = _zeros(4, 8)
    else:
        joints, fingers = _grid(4, 7), _col([0.125, 0.25, 0.375, 0.5])
        observation |= {"agentview_rgb": tf.constant(["x"] * 4), "joint_states": _const(joints)}
        observation["gripper_states"] = _const(fingers)
        proprio = np.concatenate([joints, fingers], axis=1)
    raw = {
        "observation": observation,
        "action": {
            "world_vector": _const(world),
            "rotation_delta": _const(rotation),
            "gripper_closedness_action": _const(closedness),
        },
        "traj_metadata": _metadata(4),
    }
    action = np.concatenate([world, rotation, _col([1.0, 1.0, 0.75, 0.0])], axis=1)
    return raw, action, proprio, [INSTRUCTION] * 4


def _flat(action: np.ndarray, observation: dict[str, np.ndarray]) -> dict[str, Any]:
    num_steps = len(action)
    return {
        "observation": {
            "image": tf.constant(["x"] * num_steps),
            **{k: _const(v) for k, v in observation.items()},
        },
        "action": _const(action),
        "language_instruction": _text(num_steps),
        "traj_metadata": _metadata(num_steps),
    }


@_case(
    "cmu_franka_exploration_dataset_converted_externally_to_rlds",
    "imperialcollege_sawyer_wrist_cam",
)
def _drop_last_action_dim(name: str) -> Case:
    # action[..., :-1]: the 8th entry is a terminate flag.
    raw_action = np.concatenate([_grid(4, 7), _col([0.0, 0.0, 0.0, 1.0])], axis=1)
    if name == "imperialcollege_sawyer_wrist_cam":  # state keys: 7 pads, then `state`
        state = _col([0.5, 0.25, 0.125, 0.0])
        return (
            _flat(raw_action, {"state": state}),
            _grid(4, 7),
            np.concatenate([_zeros(4, 7), state], 1),
            [INSTRUCTION] * 4,
        )
    return _flat(raw_action, {}), _grid(4, 7), _zeros(4, 8), [INSTRUCTION] * 4


def _inverted_clipped_gripper_action() -> tuple[np.ndarray, np.ndarray]:
    """Raw [T, 7] with the gripper in [-1 open, +1 close] (some beyond), and OpenVLA's 1 - clip(g, 0, 1)."""
    raw = np.concatenate([_grid(5, 6, offset=-2.0), _col([-1.0, -0.25, 0.0, 0.625, 1.5])], axis=1)
    expected = np.concatenate([raw[:, :6], _col([1.0, 1.0, 1.0, 0.375, 0.0])], axis=1)
    return raw, expected


@_case(
    "austin_sailor_dataset_converted_externally_to_rlds", "austin_sirius_dataset_converted_externally_to_rlds"
)
def _austin_pos_quat(name: str) -> Case:
    raw_action, action = _inverted_clipped_gripper_action()
    state = _grid(5, 8, offset=1.0)
    return _flat(raw_action, {"state": state}), action, state, [INSTRUCTION] * 5


@_case("austin_buds_dataset_converted_externally_to_rlds", "utaustin_mutex")
def _austin_joint(name: str) -> Case:
    # Same gripper rule; the state keeps its first 8 entries.
    raw_action, action = _inverted_clipped_gripper_action()
    state = _grid(5, 24)
    return _flat(raw_action, {"state": state}), action, state[:, :8], [INSTRUCTION] * 5


@_case(*(f"libero_{suite}_no_noops" for suite in ("spatial", "object", "goal", "10")))
def _libero(name: str) -> Case:
    # Gripper as austin's; EEF_state = state[:, :6], gripper_state = state[:, -2:] (2-D), concatenated without
    # OpenVLA's one-zero pad: OpenVLA-OFT's 8-d layout, the state its LIBERO evaluation sends.
    raw_action, action = _inverted_clipped_gripper_action()
    state = _grid(5, 8, offset=0.5)
    proprio = np.concatenate([state[:, :6], state[:, 6:8]], axis=1)
    return _flat(raw_action, {"state": state}), action, proprio, [INSTRUCTION] * 5


@_case(
    "utokyo_pr2_opening_fridge_converted_externally_to_rlds",
    "utokyo_pr2_tabletop_manipulation_converted_externally_to_rlds",
)
def _utokyo_pr2(name: str) -> Case:
    state, raw_action = _grid(4, 7), _grid(4, 8, offset=1.0)
    proprio = np.concatenate([state[:, :6], _zeros(4), state[:, 6:7]], axis=1)
    return _flat(raw_action, {"state": state}), raw_action[:, :7], proprio, [INSTRUCTION] * 4


@_case("tokyo_u_lsmo_converted_externally_to_rlds", "stanford_robocook_converted_externally_to_rlds")
def _eef_state_6_gripper_last(name: str) -> Case:
    state, raw_action = _grid(4, 7, offset=-1.0), _grid(4, 7, offset=2.0)
    proprio = np.concatenate([state[:, :6], _zeros(4), state[:, 6:7]], axis=1)
    return _flat(raw_action, {"state": state}), raw_action, proprio, [INSTRUCTION] * 4


@_case(
    "utokyo_xarm_pick_and_place_converted_externally_to_rlds",
    "berkeley_mvp_converted_externally_to_rlds",
    "berkeley_rpt_converted_externally_to_rlds",
    "dlr_sara_pour_converted_externally_to_rlds",
)
def _identity(name: str) -> Case:
    # OpenVLA's functions for these return the trajectory unchanged.
    if name.startswith("utokyo_xarm"):
        pose, action = _grid(4, 6), _grid(4, 7, offset=1.0)
        return (
            _flat(action, {"end_effector_pose": pose}),
            action,
            np.concatenate([pose, _zeros(4, 2)], 1),
            [INSTRUCTION] * 4,
        )
    if name.startswith("berkeley_mvp"):
        pose, gripper, action = _grid(4, 7), _col([0.0, 1.0, 1.0, 0.0]), _grid(4, 8, offset=-1.0)
        return (
            _flat(action, {"pose": pose, "gripper": gripper}),
            action,
            np.concatenate([pose, gripper], 1),
            [INSTRUCTION] * 4,
        )
    if name.startswith("berkeley_rpt"):
        joints, gripper, action = _grid(4, 7, offset=2.0), _col([1.0, 0.0, 0.0, 1.0]), _grid(4, 8)
        observation = {"joint_pos": joints, "gripper": gripper}
        return _flat(action, observation), action, np.concatenate([joints, gripper], 1), [INSTRUCTION] * 4
    state, action = _grid(4, 6, offset=0.25), _grid(4, 7, offset=-0.5)
    return (
        _flat(action, {"state": state}),
        action,
        np.concatenate([state, _zeros(4, 2)], 1),
        [INSTRUCTION] * 4,
    )


@_case("berkeley_gnm_recon", "berkeley_gnm_cory_hall", "berkeley_gnm_sac_son")
def _gnm(name: str) -> Case:
    # state := position (2) + zeros like state[:, :3] + yaw (1); action := xy + 4 zeros + gripper 0.
    position, yaw, state = _grid(4, 2), _col([0.25, -0.5, 0.75, -1.0]), _grid(4, 3, offset=9.0)
    raw_action = _grid(4, 2, offset=-0.5)
    raw = {
        "observation": {
            "image": tf.constant(["x"] * 4),
            "position": _const(position),
            "yaw": _const(yaw),
            "state": _const(state),
        },
        "action": _const(raw_action),
        "language_instruction": _text(4),
        "traj_metadata": _metadata(4),
    }
    action = np.concatenate([raw_action, _zeros(4, 5)], axis=1)
    proprio = np.concatenate([position, _zeros(4, 3), yaw, _zeros(4, 2)], axis=1)  # state key + 2 pads
    return raw, action, proprio, [INSTRUCTION] * 4


@_case(
    "tdroid_carrot_in_bowl",
    "tdroid_pour_corn_in_pot",
    "tdroid_flip_pot_upright",
    "tdroid_move_object_onto_plate",
    "tdroid_knock_object_over",
    "tdroid_cover_object_with_towel",
)
def _tdroid(name: str) -> Case:
    # Continuous gripper (1 = open) binarised: > 0.95 open, < 0.05 closed, in between = the next settled value,
    # trailing in-between values keep the last raw value (0.375).
    gripper = [0.0, 0.5, 1.0, 0.96875, 0.375]
    raw_action = np.concatenate([_grid(5, 6, offset=-1.0), _col(gripper)], axis=1)
    cartesian, finger = _grid(5, 6, offset=4.0), _col([0.0, 0.25, 0.5, 0.75, 1.0])
    raw = {
        "observation": {
            "static_image": tf.constant(["x"] * 5),
            "cartesian_position": _const(cartesian),
            "gripper_position": _const(finger),
        },
        "action": _const(raw_action),
        "language_instruction": _text(5),
        "traj_metadata": _metadata(5),
    }
    action = np.concatenate([raw_action[:, :6], _col([0.0, 1.0, 1.0, 1.0, 0.375])], axis=1)
    proprio = np.concatenate([cartesian, _zeros(5), finger], axis=1)
    return raw, action, proprio, [INSTRUCTION] * 5


# Quaternion actions (the shared Euler conversion): rotations built as Rz(yaw) Ry(pitch) Rx(roll), so the expected
# angles are known by construction. Row 4 is in gimbal lock (pitch = pi / 2): tensorflow-graphics (OpenVLA) then
# puts the whole rotation about x into roll (Rz(c) Ry(pi/2) Rx(a) = Ry(pi/2) Rx(a - c)) and yaw = 0; row 5 likewise
# at pitch = -pi/2 (roll = a + c).
_EULER = np.array(
    [
        [0.0, 0.0, 0.0],
        [math.pi / 3, 0.0, 0.0],
        [0.3, -0.4, 1.1],
        [0.5 - 0.2, math.pi / 2, 0.0],
        [0.5 + 0.2, -math.pi / 2, 0.0],
    ]
)
_EULER_BUILT_FROM = [
    (0, 0, 0),
    (math.pi / 3, 0, 0),
    (0.3, -0.4, 1.1),
    (0.5, math.pi / 2, 0.2),
    (0.5, -math.pi / 2, 0.2),
]
# float32 tolerance: tensorflow-graphics shrinks the quaternion products by (1 - 2^-22) and nudges the atan2
# denominators by 2^-22; with float32 asin / atan2 (~1 ulp) the angles land within ~5e-7 of the true ones. 1e-5
# allows that and still catches any convention error (those are >= 0.1 off, e.g. splitting a gimbal-lock rotation
# between roll and yaw).
_EULER_ATOL = 1e-5


def _quaternion_xyzw(roll: float, pitch: float, yaw: float) -> np.ndarray:
    def about(axis: int, angle: float) -> np.ndarray:
        q = np.zeros(4)
        q[axis], q[3] = math.sin(angle / 2), math.cos(angle / 2)
        return q

    def product(p: np.ndarray, r: np.ndarray) -> np.ndarray:
        (x1, y1, z1, w1), (x2, y2, z2, w2) = p, r
        return np.array(
            [
                w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
                w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
                w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
                w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            ]
        )

    return product(about(2, yaw), product(about(1, pitch), about(0, roll)))


def _quaternion_action(gripper: list[float]) -> np.ndarray:
    quats = np.stack([_quaternion_xyzw(*angles) for angles in _EULER_BUILT_FROM])
    return np.concatenate([_grid(5, 3), quats, _col(gripper)], axis=1).astype(F32)


QUATERNION_DATASETS = (
    "furniture_bench_dataset_converted_externally_to_rlds",
    "iamlab_cmu_pickup_insert_converted_externally_to_rlds",
    "cmu_playing_with_food",
)


@_case(*QUATERNION_DATASETS)
def _quaternion_datasets(name: str) -> Case:
    if name.startswith("furniture_bench"):
        # Gripper in [-1, 1] with 1 = closed: 1 - clip(g, 0, 1); state := state[:, :7] + state[:, -1:].
        raw_action = _quaternion_action([-1.0, 1.0, 0.25, 0.0, 2.0])
        state = _grid(5, 35)
        gripper, proprio = [1.0, 0.0, 0.75, 1.0, 0.0], np.concatenate([state[:, :7], state[:, -1:]], axis=1)
    elif name.startswith("iamlab"):
        # Gripper (action[:, 7], 1 = open) kept; joint_state = state[:, :7], gripper_state = state[:, 7:8].
        raw_action = _quaternion_action([1.0, 0.0, 0.0, 1.0, 1.0])
        state = _grid(5, 20)
        gripper, proprio = [1.0, 0.0, 0.0, 1.0, 1.0], state[:, :8]
    else:
        # Gripper = action[:, -1] kept; state key `state` + 2 pads.
        raw_action = _quaternion_action([0.0, 1.0, 1.0, 0.0, 0.5])
        state = _grid(5, 6)
        gripper, proprio = [0.0, 1.0, 1.0, 0.0, 0.5], np.concatenate([state, _zeros(5, 2)], axis=1)
    action = np.concatenate([raw_action[:, :3], _EULER.astype(F32), _col(gripper)], axis=1)
    return _flat(raw_action, {"state": state}), action, proprio, [INSTRUCTION] * 5


def _shared_datasets() -> list[str]:
    """Every dataset whose standardisation function also serves another dataset."""
    by_fn: dict[str, list[str]] = {}
    for name, config in DATASET_CONFIGS.items():
        by_fn.setdefault(config.standardize_fn, []).append(name)
    return sorted(name for names in by_fn.values() if len(names) > 1 for name in names)


def test_every_dataset_of_a_shared_function_has_a_case() -> None:
    assert set(_shared_datasets()) <= set(CASES), sorted(set(_shared_datasets()) - set(CASES))


@pytest.mark.parametrize("name", sorted(CASES))
def test_standardisation_matches_openvla_for_the_dataset(name: str) -> None:
    raw, expected_action, expected_proprio, expected_instruction = CASES[name]()
    action, proprio, instruction, raw_dtype = _standardize(name, raw)
    assert raw_dtype == tf.float32  # OpenVLA's functions all produce float32 actions on float32 raw data
    assert action.shape == expected_action.shape
    if name in QUATERNION_DATASETS:
        np.testing.assert_array_equal(action[:, :3], expected_action[:, :3])
        np.testing.assert_allclose(action[:, 3:6], expected_action[:, 3:6], rtol=0, atol=_EULER_ATOL)
        np.testing.assert_array_equal(action[:, 6:], expected_action[:, 6:])
    else:
        np.testing.assert_array_equal(action, expected_action)
    np.testing.assert_array_equal(proprio, expected_proprio.astype(F32))
    assert instruction == [s.encode() for s in expected_instruction]


# === Gripper helpers (OpenVLA's data_utils), edge cases ===


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([1.0, 0.625, 0.25, 0.0, 0.03125, 0.5, 0.96875, 0.375], [1, 0, 0, 0, 0, 1, 1, 0.375]),
        ([1.0, 0.5, 0.25], [1, 0.25, 0.25]),  # ends mid-transition: the tail keeps the last raw value
        ([0.5, 0.25], [0.25, 0.25]),  # never settles
        ([0.95, 0.05, 1.0], [1, 1, 1]),  # the thresholds are strict: 0.95 and 0.05 count as in between
        ([0.05, 0.0], [0, 0]),
        ([0.96, 0.04], [1, 0]),
        ([0.5], [0.5]),
        ([0.0], [0.0]),
    ],
)
def test_binarize_gripper_actions(raw: list[float], expected: list[float]) -> None:
    out = binarize_gripper_actions(_const(raw))
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), np.asarray(expected, F32))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([0.0, 0.0, 1.0, 0.0, 0.0, -1.0, 0.0], [1, 1, 0, 0, 0, 1, 1]),  # first command close: open before it
        ([0.0, -1.0, 0.0, 1.0], [0, 1, 1, 0]),  # first command open: closed before it
        ([1.0, 0.0, 0.0], [0, 0, 0]),  # command at t=0
        ([1.0, 1.0, -0.5], [0, 0, 1]),  # a repeated command changes nothing
        ([0.0, 0.0, 0.0], [1, 1, 1]),  # no command at all: open throughout
        ([0.1, -0.1, 0.0625], [1, 1, 1]),  # |x| <= 0.1 is "no change" (strict thresholds)
        ([0.0, 0.125, -0.125], [1, 0, 1]),  # just past the thresholds
    ],
)
def test_rel2abs_gripper_actions(raw: list[float], expected: list[float]) -> None:
    out = rel2abs_gripper_actions(_const(raw))
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), np.asarray(expected, F32))


def test_invert_gripper_actions_and_bridge_relabelling() -> None:
    np.testing.assert_array_equal(invert_gripper_actions(_const([0.0, 0.25, 1.0])).numpy(), [1.0, 0.75, 0.0])
    state = np.array([[0.0] * 6 + [1.0], [0.5] * 6 + [1.0], [0.75] * 6 + [0.0]], F32)
    traj = {
        "observation": {"state": _const(state)},
        "action": _const(np.full((3, 7), 9.0, F32) * np.array([1, 1, 1, 1, 1, 1, 0], F32)),
        "language_instruction": _text(3),
    }
    out = relabel_bridge_actions(traj)
    # Arm := reached state change (0.5, then 0.25); gripper := the recorded one (0); the last step is dropped.
    np.testing.assert_array_equal(out["action"].numpy(), [[0.5] * 6 + [0.0], [0.25] * 6 + [0.0]])
    np.testing.assert_array_equal(out["observation"]["state"].numpy(), state[:2])
    assert out["language_instruction"].shape == (2,)


def test_quaternion_to_euler_convention() -> None:
    quats = np.stack([_quaternion_xyzw(*angles) for angles in _EULER_BUILT_FROM]).astype(F32)
    out = quaternion_to_euler(_const(quats))
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy(), _EULER, rtol=0, atol=_EULER_ATOL)
    np.testing.assert_array_equal(out.numpy()[0], [0.0, 0.0, 0.0])
    assert quaternion_to_euler(_const(quats, np.float64)).dtype == tf.float64  # computed in the raw dtype


# === Config keys: OpenVLA's OXE_DATASET_CONFIGS (image, depth, state keys), copied as data ===

_NO_DEPTH = (None, None, None)
_NO_STATE = (None,) * 8
_EEF_GRIP = ("eef_state", None, "gripper_state")
_EEF_GRIP_UPPER = ("EEF_state", None, "gripper_state")
_TDROID = (("static_image", None, None), ("static_depth_image", None, None), _EEF_GRIP_UPPER)
# LIBERO: OpenVLA-OFT's state keys (openvla-oft prismatic/vla/datasets/rlds/oxe/configs.py); OpenVLA's own
# config pads a None between them, but OpenVLA never reads proprio and OFT's evaluation sends 8 numbers.
_LIBERO = (("image", None, "wrist_image"), _NO_DEPTH, ("EEF_state", "gripper_state"))
_GNM = ((None, None, "image"), _NO_DEPTH, ("state", None, None))

OPENVLA_KEYS: dict[str, tuple[tuple, tuple, tuple]] = {
    "fractal20220817_data": (("image", None, None), _NO_DEPTH, ("base_pose_tool_reached", "gripper_closed")),
    "kuka": (
        ("image", None, None),
        _NO_DEPTH,
        ("clip_function_input/base_pose_tool_reached", "gripper_closed"),
    ),
    "bridge_oxe": (("image", "image_1", None), _NO_DEPTH, _EEF_GRIP_UPPER),
    "bridge_orig": (("image_0", "image_1", None), _NO_DEPTH, _EEF_GRIP_UPPER),
    "bridge_dataset": (("image_0", "image_1", None), _NO_DEPTH, _EEF_GRIP_UPPER),
    "taco_play": (
        ("rgb_static", None, "rgb_gripper"),
        ("depth_static", None, "depth_gripper"),
        ("state_eef", None, "state_gripper"),
    ),
    "jaco_play": (("image", None, "image_wrist"), _NO_DEPTH, ("state_eef", None, "state_gripper")),
    "berkeley_cable_routing": (("image", "top_image", "wrist45_image"), _NO_DEPTH, ("robot_state", None)),
    "roboturk": (("front_rgb", None, None), _NO_DEPTH, _NO_STATE),
    "nyu_door_opening_surprising_effectiveness": ((None, None, "image"), _NO_DEPTH, _NO_STATE),
    "viola": (("agentview_rgb", None, "eye_in_hand_rgb"), _NO_DEPTH, ("joint_states", "gripper_states")),
    "berkeley_autolab_ur5": (("image", None, "hand_image"), ("depth", None, None), ("state",)),
    "toto": (("image", None, None), _NO_DEPTH, ("state", None)),
    "language_table": (("rgb", None, None), _NO_DEPTH, ("effector_translation",) + (None,) * 6),
    "columbia_cairlab_pusht_real": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("robot_state",) + (None,) * 6,
    ),
    "stanford_kuka_multimodal_dataset_converted_externally_to_rlds": (
        ("image", None, None),
        ("depth_image", None, None),
        ("ee_position", "ee_orientation", None),
    ),
    "nyu_rot_dataset_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "stanford_hydra_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        _EEF_GRIP,
    ),
    "austin_buds_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("state",),
    ),
    "nyu_franka_play_dataset_converted_externally_to_rlds": (
        ("image", "image_additional_view", None),
        ("depth", "depth_additional_view", None),
        ("eef_state", None, None),
    ),
    "maniskill_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        ("depth", None, "wrist_depth"),
        ("tcp_pose", "gripper_state"),
    ),
    "furniture_bench_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("state",),
    ),
    "cmu_franka_exploration_dataset_converted_externally_to_rlds": (
        ("highres_image", None, None),
        _NO_DEPTH,
        _NO_STATE,
    ),
    "ucsd_kitchen_dataset_converted_externally_to_rlds": (
        ("image", None, None),
        _NO_DEPTH,
        ("joint_state", None),
    ),
    "ucsd_pick_and_place_dataset_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "austin_sailor_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("state",),
    ),
    "austin_sirius_dataset_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("state",),
    ),
    "bc_z": (
        ("image", None, None),
        _NO_DEPTH,
        ("present/xyz", "present/axis_angle", None, "present/sensed_close"),
    ),
    "utokyo_pr2_opening_fridge_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "utokyo_pr2_tabletop_manipulation_converted_externally_to_rlds": (
        ("image", None, None),
        _NO_DEPTH,
        _EEF_GRIP,
    ),
    "utokyo_xarm_pick_and_place_converted_externally_to_rlds": (
        ("image", "image2", "hand_image"),
        _NO_DEPTH,
        ("end_effector_pose", None, None),
    ),
    "utokyo_xarm_bimanual_converted_externally_to_rlds": (
        ("image", None, None),
        _NO_DEPTH,
        ("pose_r", None, None),
    ),
    "robo_net": (("image", "image1", None), _NO_DEPTH, _EEF_GRIP),
    "berkeley_mvp_converted_externally_to_rlds": ((None, None, "hand_image"), _NO_DEPTH, ("pose", "gripper")),
    "berkeley_rpt_converted_externally_to_rlds": (
        (None, None, "hand_image"),
        _NO_DEPTH,
        ("joint_pos", "gripper"),
    ),
    "kaist_nonprehensile_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, ("state", None)),
    "stanford_mask_vit_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "tokyo_u_lsmo_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "dlr_sara_pour_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, ("state", None, None)),
    "dlr_sara_grid_clamp_converted_externally_to_rlds": (
        ("image", None, None),
        _NO_DEPTH,
        ("state", None, None),
    ),
    "dlr_edan_shared_control_converted_externally_to_rlds": (
        ("image", None, None),
        _NO_DEPTH,
        ("state", None),
    ),
    "asu_table_top_converted_externally_to_rlds": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "stanford_robocook_converted_externally_to_rlds": (
        ("image_1", "image_2", None),
        ("depth_1", "depth_2", None),
        _EEF_GRIP,
    ),
    "imperialcollege_sawyer_wrist_cam": (("image", None, "wrist_image"), _NO_DEPTH, (None,) * 7 + ("state",)),
    "iamlab_cmu_pickup_insert_converted_externally_to_rlds": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("joint_state", "gripper_state"),
    ),
    "uiuc_d3field": (("image_1", "image_2", None), ("depth_1", "depth_2", None), _NO_STATE),
    "utaustin_mutex": (("image", None, "wrist_image"), _NO_DEPTH, ("state",)),
    "berkeley_fanuc_manipulation": (
        ("image", None, "wrist_image"),
        _NO_DEPTH,
        ("joint_state", None, "gripper_state"),
    ),
    "cmu_playing_with_food": (("image", None, "finger_vision_1"), _NO_DEPTH, ("state", None, None)),
    "cmu_play_fusion": (("image", None, None), _NO_DEPTH, ("state",)),
    "cmu_stretch": (("image", None, None), _NO_DEPTH, _EEF_GRIP),
    "berkeley_gnm_recon": _GNM,
    "berkeley_gnm_cory_hall": _GNM,
    "berkeley_gnm_sac_son": _GNM,
    "droid": (
        ("exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"),
        _NO_DEPTH,
        ("proprio",),
    ),
    "fmb_dataset": (
        ("image_side_1", "image_side_2", "image_wrist_1"),
        ("image_side_1_depth", "image_side_2_depth", "image_wrist_1_depth"),
        ("proprio",),
    ),
    "dobbe": (("wrist_image", None, None), _NO_DEPTH, ("proprio",)),
    "roboset": (("image_left", "image_right", "image_wrist"), _NO_DEPTH, ("proprio",)),
    "rh20t": (("image_front", "image_side_right", "image_wrist"), _NO_DEPTH, ("proprio",)),
    "tdroid_carrot_in_bowl": _TDROID,
    "tdroid_pour_corn_in_pot": _TDROID,
    "tdroid_flip_pot_upright": _TDROID,
    "tdroid_move_object_onto_plate": _TDROID,
    "tdroid_knock_object_over": _TDROID,
    "tdroid_cover_object_with_towel": _TDROID,
    "droid_wipe": (("exterior_image_2_left", None, "wrist_image_left"), _NO_DEPTH, ("proprio",)),
    "libero_spatial_no_noops": _LIBERO,
    "libero_object_no_noops": _LIBERO,
    "libero_goal_no_noops": _LIBERO,
    "libero_10_no_noops": _LIBERO,
}


def test_config_keys_equal_openvla() -> None:
    assert len(OPENVLA_KEYS) == 70
    assert set(DATASET_CONFIGS) - set(OPENVLA_KEYS) == {"toy_pick_place", "toy_push"}
    for name, (images, depths, state) in OPENVLA_KEYS.items():
        config = DATASET_CONFIGS[name]
        views = ("primary", "secondary", "wrist")
        assert tuple(config.image_obs_keys[v] for v in views) == images, name
        assert tuple(config.depth_obs_keys[v] for v in views) == depths, name
        assert config.state_obs_keys == state, name


@pytest.mark.parametrize("name", ["libero_spatial_no_noops", "viola", "berkeley_fanuc_manipulation"])
def test_float64_raw_gripper_is_inverted_before_the_float32_cast(name: str) -> None:
    # OpenVLA clips and inverts in the raw dtype and casts the action to float32 at the end; for 0.6 that order
    # matters: float32(1 - 0.6) = 0.4, but 1 - float32(0.6) = 0.39999998 in float32.
    raw_gripper = np.array([0.6, -0.5, 1.5, 0.0], np.float64)
    expected_gripper = (1 - np.clip(raw_gripper, 0, 1)).astype(F32)
    assert expected_gripper[0] != F32(1) - F32(0.6)
    arm = _grid(4, 6).astype(np.float64)
    if name == "viola":
        raw = {
            "observation": {"natural_language_instruction": _text(4)},
            "action": {
                "world_vector": _const(arm[:, :3], np.float64),
                "rotation_delta": _const(arm[:, 3:], np.float64),
                "gripper_closedness_action": _const(raw_gripper, np.float64),
            },
        }
    elif (
        name == "berkeley_fanuc_manipulation"
    ):  # no gripper action: the inverted gripper *state* (1 = closed)
        expected_gripper = (1 - raw_gripper).astype(F32)
        state = np.concatenate([arm, raw_gripper[:, None]], axis=1)
        raw = _flat(arm, {})
        raw["action"], raw["observation"]["state"] = _const(arm, np.float64), _const(state, np.float64)
    else:
        raw = _flat(arm, {"state": _grid(4, 8)})
        raw["action"] = _const(np.concatenate([arm, raw_gripper[:, None]], axis=1), np.float64)
    config = get_dataset_config(name)
    out = get_standardize_fn(config.standardize_fn)(raw)
    action = tf.cast(out["action"], tf.float32).numpy()
    np.testing.assert_array_equal(
        action, np.concatenate([arm.astype(F32), expected_gripper[:, None]], axis=1)
    )
