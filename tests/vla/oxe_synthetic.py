"""Tiny synthetic Open-X datasets with the *real* raw feature spec of eight datasets of different layouts, and
the standard frames the pipeline must turn them into, written out by hand.

Every dataset has 6 steps per episode, 2 identical train episodes and 1 identical val episode, so the train
statistics are exact: each arm dimension j is `scale_j * P[t]`, with its minimum and maximum appearing at least
twice, so q01 / q99 are exactly the min / max and BOUNDS_Q99 maps the pattern back onto itself. Each camera is a
solid colour derived from its raw key, so a frame's image says which raw key it came from.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.vla.datasets.rlds.writer import rlds_step_features, rlds_step_flags

NUM_STEPS = 6
IMAGE_SIZE = 16
P = np.array([-1.0, 0.0, 1.0, 0.5, -0.5, 1.0], np.float32)  # the arm pattern over time
SCALE = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], np.float32)  # per arm dim
INSTRUCTION = "put the carrot in the pot"


def color(key: str) -> tuple[int, int, int]:
    """Solid colour of camera `key` (well separated across keys, survives JPEG)."""
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    return tuple(int(c) for c in rng.integers(0, 6, size=3) * 50)


def image(key: str) -> np.ndarray:
    return np.full((IMAGE_SIZE, IMAGE_SIZE, 3), color(key), np.uint8)


def arm(pattern: np.ndarray = P) -> np.ndarray:
    """[T, 6] raw arm values: scale_j * pattern[t]."""
    return (pattern[:, None] * SCALE[None, :]).astype(np.float32)


@dataclass(frozen=True)
class SyntheticSpec:
    """One synthetic dataset: its raw features, one raw episode, and the hand-written expected frames."""

    name: str
    features: Callable[
        [Any], dict[str, Any]
    ]  # tfds -> {"steps": {...}, "episode_metadata": {...}} feature dicts
    episode: Callable[[], dict[str, Any]]  # one raw episode (steps as a list)
    expected_action: np.ndarray  # [T', 7] after standardisation + normalisation (val frames, file order)
    primary_keys: tuple[str, ...]  # raw key(s) the primary image may come from


def _rlds_step(t: int) -> dict[str, Any]:
    return rlds_step_flags(t, NUM_STEPS)


def _img(f: Any) -> Any:
    return f.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8, encoding_format="jpeg")


def _vec(f: Any, n: int, dtype: Any = np.float32) -> Any:
    return f.Tensor(shape=(n,), dtype=dtype)


def _episode(steps: list[dict[str, Any]], **metadata: Any) -> dict[str, Any]:
    return {"steps": steps, "episode_metadata": {"file_path": "synthetic", **metadata}}


def _features(f: Any, observation: dict, action: Any, extra: dict | None = None, metadata=None) -> Any:
    step = {
        "observation": f.FeaturesDict(observation),
        "action": action,
        **rlds_step_features(f),
        **(extra or {}),
    }
    return f.FeaturesDict(
        {
            "steps": f.Dataset(step),
            "episode_metadata": f.FeaturesDict({"file_path": f.Text(), **(metadata or {})}),
        }
    )


def _with_gripper(arm_normalised: np.ndarray, gripper: list[float]) -> np.ndarray:
    return np.concatenate([arm_normalised, np.asarray(gripper, np.float32)[:, None]], axis=1)


# --- bridge_orig: flat action, continuous gripper binarised, arm relabelled from the state, first + last step
# dropped. The reached state moves by SCALE * M between kept steps, M = [0, 1, 0.5, -0.5]; normalising M with
# q01 = -0.5, q99 = 1 gives [-1/3, 1, 1/3, -1].
_BRIDGE_M = np.array(
    [0.0, 0.0, 1.0, 0.5, -0.5, 0.0], np.float32
)  # movement from step t to t+1 (t = 1..4 used)


def _bridge_episode() -> dict[str, Any]:
    pose = np.concatenate([np.zeros((1, 6)), np.cumsum(arm(_BRIDGE_M), 0)[:-1]], 0).astype(np.float32)
    state = np.concatenate([pose, np.ones((NUM_STEPS, 1), np.float32)], 1)
    gripper = np.array([1.0, 1.0, 0.5, 0.0, 0.0, 1.0], np.float32)  # raw: 1 = open, continuous
    action = np.concatenate([np.full((NUM_STEPS, 6), 9.0, np.float32), gripper[:, None]], 1)  # arm ignored
    steps = [
        {
            "observation": {"image_0": image("image_0"), "image_1": image("image_1"), "state": state[t]},
            "action": action[t],
            "language_instruction": INSTRUCTION,
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


BRIDGE = SyntheticSpec(
    name="bridge_orig",
    features=lambda f: _features(
        f,
        {"image_0": _img(f), "image_1": _img(f), "state": _vec(f, 7)},
        _vec(f, 7),
        {"language_instruction": f.Text()},
    ),
    episode=_bridge_episode,
    # kept steps 1..4: gripper after binarising [1, 0, 0, 0] (0.5 takes the next settled value, 0)
    expected_action=_with_gripper(np.repeat([[-1 / 3], [1.0], [1 / 3], [-1.0]], 6, axis=1), [1, 0, 0, 0]),
    primary_keys=("image_0",),
)


# --- fractal20220817_data (RT-1): action dict, relative gripper (+1 close, -1 open), instruction in observation.
def _fractal_episode() -> dict[str, Any]:
    closedness = [0.0, 1.0, 0.0, 0.0, -1.0, 0.0]
    a = arm()
    steps = [
        {
            "observation": {
                "image": image("image"),
                "natural_language_instruction": INSTRUCTION,
                "base_pose_tool_reached": np.full(7, 0.5, np.float32),
                "gripper_closed": np.zeros(1, np.float32),
            },
            "action": {
                "world_vector": a[t, :3],
                "rotation_delta": a[t, 3:],
                "gripper_closedness_action": np.float32([closedness[t]]),
                "terminate_episode": np.int32([1, 0, 0]),
                "base_displacement_vector": np.zeros(2, np.float32),
                "base_displacement_vertical_rotation": np.zeros(1, np.float32),
            },
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


FRACTAL = SyntheticSpec(
    name="fractal20220817_data",
    features=lambda f: _features(
        f,
        {
            "image": _img(f),
            "natural_language_instruction": f.Text(),
            "base_pose_tool_reached": _vec(f, 7),
            "gripper_closed": _vec(f, 1),
        },
        f.FeaturesDict(
            {
                "world_vector": _vec(f, 3),
                "rotation_delta": _vec(f, 3),
                "gripper_closedness_action": _vec(f, 1),
                "terminate_episode": _vec(f, 3, np.int32),
                "base_displacement_vector": _vec(f, 2),
                "base_displacement_vertical_rotation": _vec(f, 1),
            }
        ),
    ),
    episode=_fractal_episode,
    # close at t=1, open at t=4; before the first command the gripper is open
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [1, 0, 0, 0, 1, 1]),
    primary_keys=("image",),
)


# --- kuka: like RT-1, but the state is zlib-compressed float32 bytes.
def _kuka_episode() -> dict[str, Any]:
    closedness = [1.0, 0.0, 0.0, -1.0, 0.0, 1.0]
    a = arm()
    steps = [
        {
            "observation": {
                "image": image("image"),
                "natural_language_instruction": INSTRUCTION,
                "clip_function_input/base_pose_tool_reached": zlib.compress(
                    np.full(7, 0.25, np.float32).tobytes()
                ),
                "gripper_closed": zlib.compress(np.zeros(1, np.float32).tobytes()),
            },
            "action": {
                "world_vector": a[t, :3],
                "rotation_delta": a[t, 3:],
                "gripper_closedness_action": np.float32([closedness[t]]),
            },
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


def _kuka_features(f: Any) -> Any:
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    return _features(
        f,
        {
            "image": _img(f),
            "natural_language_instruction": f.Text(),
            "clip_function_input/base_pose_tool_reached": f.Tensor(shape=(), dtype=tf.string),
            "gripper_closed": f.Tensor(shape=(), dtype=tf.string),
        },
        f.FeaturesDict(
            {
                "world_vector": _vec(f, 3),
                "rotation_delta": _vec(f, 3),
                "gripper_closedness_action": _vec(f, 1),
            }
        ),
    )


KUKA = SyntheticSpec(
    name="kuka",
    features=_kuka_features,
    episode=_kuka_episode,
    # close at t=0 (so open before: none, starts closed), open at t=3, close at t=5
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [0, 0, 0, 1, 1, 0]),
    primary_keys=("image",),
)


# --- taco_play: rel_actions_world with gripper in {-1 close, +1 open}; static + gripper cameras, depth.
def _taco_episode() -> dict[str, Any]:
    gripper = [1.0, -1.0, -1.0, 1.0, 1.0, -1.0]
    a = arm()
    steps = [
        {
            "observation": {
                "rgb_static": image("rgb_static"),
                "rgb_gripper": image("rgb_gripper"),
                "depth_static": np.ones((4, 4), np.float32),
                "robot_obs": np.arange(15, dtype=np.float32),
                "natural_language_instruction": INSTRUCTION,
            },
            "action": {
                "rel_actions_world": np.concatenate([a[t], [gripper[t]]]).astype(np.float32),
                "actions": np.zeros(7, np.float32),
            },
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


TACO = SyntheticSpec(
    name="taco_play",
    features=lambda f: _features(
        f,
        {
            "rgb_static": _img(f),
            "rgb_gripper": _img(f),
            "depth_static": f.Tensor(shape=(4, 4), dtype=np.float32),
            "robot_obs": _vec(f, 15),
            "natural_language_instruction": f.Text(),
        },
        f.FeaturesDict({"rel_actions_world": _vec(f, 7), "actions": _vec(f, 7)}),
    ),
    episode=_taco_episode,
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [1, 0, 0, 1, 1, 0]),
    primary_keys=("rgb_static",),
)


# --- language_table: 2-D action, instruction as zero-padded int32 unicode code points, no gripper.
def _language_table_episode() -> dict[str, Any]:
    codes = np.zeros(512, np.int32)
    codes[: len(INSTRUCTION)] = [ord(c) for c in INSTRUCTION]
    a = arm()
    steps = [
        {
            "observation": {
                "rgb": image("rgb"),
                "instruction": codes,
                "effector_translation": np.zeros(2, np.float32),
                "effector_target_translation": np.zeros(2, np.float32),
            },
            "action": a[t, :2],
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


LANGUAGE_TABLE = SyntheticSpec(
    name="language_table",
    features=lambda f: _features(
        f,
        {
            "rgb": _img(f),
            "instruction": _vec(f, 512, np.int32),
            "effector_translation": _vec(f, 2),
            "effector_target_translation": _vec(f, 2),
        },
        _vec(f, 2),
    ),
    episode=_language_table_episode,
    # xy follow the pattern; the padded z / rotation never vary -> 0; gripper always open (1)
    expected_action=_with_gripper(
        np.concatenate([np.repeat(P[:, None], 2, 1), np.zeros((NUM_STEPS, 4))], 1), [1] * NUM_STEPS
    ),
    primary_keys=("rgb",),
)


# --- droid: action_dict, continuous gripper position (1 = closed) inverted, two exterior cameras swapped per
# episode, a wrist camera.
def _droid_episode() -> dict[str, Any]:
    gripper_position = [0.0, 0.0, 1.0, 1.0, 0.25, 0.0]
    a = arm()
    steps = [
        {
            "observation": {
                "exterior_image_1_left": image("exterior_image_1_left"),
                "exterior_image_2_left": image("exterior_image_2_left"),
                "wrist_image_left": image("wrist_image_left"),
                "cartesian_position": np.zeros(6, np.float32),
                "gripper_position": np.float32([gripper_position[t]]),
                "joint_position": np.zeros(7, np.float32),
            },
            "action_dict": {
                "cartesian_velocity": a[t],
                "gripper_position": np.float32([gripper_position[t]]),
                "joint_velocity": np.zeros(7, np.float32),
            },
            "action": np.zeros(7, np.float32),
            "language_instruction": INSTRUCTION,
            "language_instruction_2": "",
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps, recording_folderpath="synthetic")


DROID = SyntheticSpec(
    name="droid",
    features=lambda f: _features(
        f,
        {
            "exterior_image_1_left": _img(f),
            "exterior_image_2_left": _img(f),
            "wrist_image_left": _img(f),
            "cartesian_position": _vec(f, 6),
            "gripper_position": _vec(f, 1),
            "joint_position": _vec(f, 7),
        },
        _vec(f, 7),
        {
            "action_dict": f.FeaturesDict(
                {
                    "cartesian_velocity": _vec(f, 6),
                    "gripper_position": _vec(f, 1),
                    "joint_velocity": _vec(f, 7),
                }
            ),
            "language_instruction": f.Text(),
            "language_instruction_2": f.Text(),
        },
        {"recording_folderpath": f.Text()},
    ),
    episode=_droid_episode,
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [1, 1, 0, 0, 0.75, 1]),
    primary_keys=("exterior_image_1_left", "exterior_image_2_left"),
)


# --- libero_spatial_no_noops: flat action, gripper in [-1 open, +1 close], agent + wrist cameras, state[8].
def _libero_episode() -> dict[str, Any]:
    gripper = [-1.0, -1.0, 1.0, 1.0, -1.0, -1.0]
    a = arm()
    steps = [
        {
            "observation": {
                "image": image("image"),
                "wrist_image": image("wrist_image"),
                "state": np.arange(8, dtype=np.float32),
                "joint_state": np.zeros(7, np.float32),
            },
            "action": np.concatenate([a[t], [gripper[t]]]).astype(np.float32),
            "language_instruction": INSTRUCTION,
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


LIBERO = SyntheticSpec(
    name="libero_spatial_no_noops",
    features=lambda f: _features(
        f,
        {"image": _img(f), "wrist_image": _img(f), "state": _vec(f, 8), "joint_state": _vec(f, 7)},
        _vec(f, 7),
        {"language_instruction": f.Text()},
    ),
    episode=_libero_episode,
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [1, 1, 0, 0, 1, 1]),
    primary_keys=("image",),
)


# --- viola: joint-space proprio, wrist camera, absolute closedness (1 = closed) as a scalar.
def _viola_episode() -> dict[str, Any]:
    closedness = [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    a = arm()
    steps = [
        {
            "observation": {
                "agentview_rgb": image("agentview_rgb"),
                "eye_in_hand_rgb": image("eye_in_hand_rgb"),
                "joint_states": np.zeros(7, np.float32),
                "gripper_states": np.zeros(2, np.float32),
                "natural_language_instruction": INSTRUCTION,
            },
            "action": {
                "world_vector": a[t, :3],
                "rotation_delta": a[t, 3:],
                "gripper_closedness_action": np.float32(closedness[t]),
            },
            **_rlds_step(t),
        }
        for t in range(NUM_STEPS)
    ]
    return _episode(steps)


VIOLA = SyntheticSpec(
    name="viola",
    features=lambda f: _features(
        f,
        {
            "agentview_rgb": _img(f),
            "eye_in_hand_rgb": _img(f),
            "joint_states": _vec(f, 7),
            "gripper_states": _vec(f, 2),
            "natural_language_instruction": f.Text(),
        },
        f.FeaturesDict(
            {
                "world_vector": _vec(f, 3),
                "rotation_delta": _vec(f, 3),
                "gripper_closedness_action": f.Scalar(np.float32),
            }
        ),
    ),
    episode=_viola_episode,
    expected_action=_with_gripper(np.repeat(P[:, None], 6, 1), [1, 1, 0, 0, 1, 1]),
    primary_keys=("agentview_rgb",),
)

SPECS = {spec.name: spec for spec in (BRIDGE, FRACTAL, KUKA, TACO, LANGUAGE_TABLE, DROID, LIBERO, VIOLA)}


def build_synthetic_open_x(root: Path) -> Path:
    """Write every dataset of `SPECS` under `root` (2 train episodes, 1 val episode each)."""
    from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

    for spec in SPECS.values():
        write_rlds_dataset(
            root,
            spec.name,
            lambda tfds, s=spec: s.features(tfds.features),
            {"train": lambda s=spec: [s.episode(), s.episode()], "val": lambda s=spec: [s.episode()]},
        )
    return root
