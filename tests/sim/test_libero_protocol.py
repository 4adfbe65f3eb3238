"""OpenVLA's LIBERO protocol, pinned against OpenVLA's own lines restated here: the image the policy sees, the
centre crop, the gripper conversion, the statistics key and the success intervals. No simulator needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401  (torch before TensorFlow in every process)

from prismatic.sim.images import center_crop, policy_image
from prismatic.sim.libero.env import observation_from_libero
from prismatic.sim.libero.protocol import gripper_to_env, suite_unnorm_key
from prismatic.sim.report import format_table, wilson_interval
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow


def fixed_frame(seed: int = 3) -> np.ndarray:
    """A 256x256 render-like frame: smooth gradients (JPEG keeps them) plus noise (JPEG does not)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:256, 0:256]
    base = np.stack([x, y, (x + y) // 2], axis=-1).astype(np.float64)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def openvla_get_libero_image(obs: dict, resize_size: int) -> np.ndarray:
    """openvla/openvla experiments/robot/libero/libero_utils.py `get_libero_image` + `resize_image`, restated."""
    tf = import_tensorflow()
    img = obs["agentview_image"]
    img = img[::-1, ::-1]
    img = tf.image.encode_jpeg(img)
    img = tf.io.decode_image(img, expand_animations=False, dtype=tf.uint8)
    img = tf.image.resize(img, (resize_size, resize_size), method="lanczos3", antialias=True)
    img = tf.cast(tf.clip_by_value(tf.round(img), 0, 255), tf.uint8)
    return img.numpy()


def openvla_center_crop(image: np.ndarray) -> np.ndarray:
    """openvla/openvla experiments/robot/openvla_utils.py `get_vla_action` (center_crop=True) + `crop_and_resize`."""
    tf = import_tensorflow()
    image = tf.convert_to_tensor(image)
    orig_dtype = image.dtype
    image = tf.image.convert_image_dtype(image, tf.float32)
    image = tf.expand_dims(image, axis=0)
    new_heights = tf.reshape(tf.clip_by_value(tf.sqrt(0.9), 0, 1), shape=(1,))
    new_widths = tf.reshape(tf.clip_by_value(tf.sqrt(0.9), 0, 1), shape=(1,))
    height_offsets = (1 - new_heights) / 2
    width_offsets = (1 - new_widths) / 2
    boxes = tf.stack(
        [height_offsets, width_offsets, height_offsets + new_heights, width_offsets + new_widths], 1
    )
    image = tf.image.crop_and_resize(image, boxes, tf.range(1), (224, 224))[0]
    image = tf.clip_by_value(image, 0, 1)
    return tf.image.convert_image_dtype(image, orig_dtype, saturate=True).numpy()


def raw_observation(frame: np.ndarray) -> dict:
    """A LIBERO observation dict as robosuite returns it (only the keys the evaluation reads)."""
    return {
        "agentview_image": frame,
        "robot0_eye_in_hand_image": fixed_frame(11),
        "robot0_eef_pos": np.array([0.1, -0.2, 1.05]),
        "robot0_eef_quat": np.array([0.2, -0.1, 0.3, np.sqrt(1 - 0.14)]),  # x, y, z, w (unit)
        "robot0_gripper_qpos": np.array([0.039, -0.039]),
    }


def test_policy_image_equals_openvla_preprocessing() -> None:
    raw = raw_observation(fixed_frame())
    expected = openvla_get_libero_image(raw, 224)
    # The simulator layer rotates (env.py `observation_from_libero`); the protocol resizes.
    ours = policy_image(observation_from_libero(raw).full_image, (224, 224), crop=False)
    assert ours.dtype == np.uint8 and ours.shape == (224, 224, 3)
    assert np.array_equal(ours, expected)
    # The JPEG round trip is part of it: a plain Lanczos resize of the same frame differs.
    tf = import_tensorflow()
    rotated = raw["agentview_image"][::-1, ::-1]
    plain = tf.image.resize(rotated, (224, 224), "lanczos3", antialias=True)
    assert not np.array_equal(ours, tf.cast(tf.clip_by_value(tf.round(plain), 0, 255), tf.uint8).numpy())


def test_wrist_image_and_proprio_as_openvla_oft_builds_them() -> None:
    """openvla-oft experiments/robot/libero: `get_libero_wrist_image` (rotated 180 degrees) and the state of
    `prepare_observation`: eef position, `quat2axisangle(eef_quat)`, gripper qpos."""
    raw = raw_observation(fixed_frame())
    obs = observation_from_libero(raw)
    assert np.array_equal(obs.wrist_image, raw["robot0_eye_in_hand_image"][::-1, ::-1])
    quat = raw["robot0_eef_quat"].copy()
    den = np.sqrt(1.0 - quat[3] * quat[3])
    axis_angle = (quat[:3] * 2.0 * np.arccos(quat[3])) / den
    state = np.concatenate((raw["robot0_eef_pos"], axis_angle, raw["robot0_gripper_qpos"]))
    assert obs.proprio.dtype == np.float32 and obs.proprio.shape == (8,)
    assert np.array_equal(obs.proprio, state.astype(np.float32))


def test_center_crop_equals_openvla() -> None:
    resized = openvla_get_libero_image({"agentview_image": fixed_frame(5)}, 224)
    expected = openvla_center_crop(resized)
    assert np.array_equal(center_crop(resized), expected)
    assert np.array_equal(policy_image(fixed_frame(5)[::-1, ::-1], (224, 224), crop=True), expected)
    assert not np.array_equal(expected, resized)


# policy gripper (0 = close, 1 = open) -> LIBERO (-1 = open, +1 = close), binarised: OpenVLA's
# normalize_gripper_action(binarize=True) then invert_gripper_action.
GRIPPER_TABLE = [
    (0.0, 1.0),
    (0.2, 1.0),
    (0.49, 1.0),
    (0.5, 0.0),
    (0.51, -1.0),
    (0.8, -1.0),
    (1.0, -1.0),
    (1.3, -1.0),
]


@pytest.mark.parametrize(("policy_gripper", "env_gripper"), GRIPPER_TABLE)
def test_gripper_conversion_table(policy_gripper: float, env_gripper: float) -> None:
    action = np.array([0.1, -0.2, 0.3, 0.01, -0.02, 0.03, policy_gripper])
    out = gripper_to_env(action)
    assert out[-1] == env_gripper
    assert np.array_equal(out[:-1], action[:-1])  # only the gripper changes
    assert action[-1] == policy_gripper  # the input is not modified


def test_gripper_conversion_of_a_chunk() -> None:
    chunk = np.array([[0, 0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 0, 0.0]])
    assert gripper_to_env(chunk)[:, -1].tolist() == [-1.0, 1.0]


def test_suite_unnorm_key() -> None:
    assert suite_unnorm_key("libero_spatial", ["bridge_orig", "libero_spatial"]) == "libero_spatial"
    assert suite_unnorm_key("libero_spatial", ["libero_spatial_no_noops"]) == "libero_spatial_no_noops"
    # The suite's own name wins over its _no_noops variant, as in OpenVLA's check.
    assert suite_unnorm_key("libero_10", ["libero_10_no_noops", "libero_10"]) == "libero_10"
    with pytest.raises(ConfigError) as e:
        suite_unnorm_key("libero_goal", ["bridge_orig", "libero_spatial_no_noops"])
    text = str(e.value)
    assert "libero_goal" in text and "bridge_orig" in text and "libero_spatial_no_noops" in text


def test_wilson_interval() -> None:
    # Reference values: statsmodels' proportion_confint(count, nobs, method="wilson"), 95 %.
    low, high = wilson_interval(45, 50)
    assert round(low, 4) == 0.7864 and round(high, 4) == 0.9565
    low, high = wilson_interval(0, 50)
    assert low == 0.0 and round(high, 4) == 0.0713
    low, high = wilson_interval(50, 50)
    assert round(low, 4) == 0.9287 and high == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_format_table() -> None:
    summary = {
        "tasks": [
            {
                "task_id": 0,
                "instruction": "pick up the bowl",
                "successes": 45,
                "episodes": 50,
                "success_rate": 0.9,
                "ci95": [0.7864, 0.9565],
            },
        ],
        "overall": {"successes": 45, "episodes": 50, "success_rate": 0.9, "ci95": [0.7864, 0.9565]},
    }
    lines = format_table(summary).splitlines()
    assert lines[1].split() == ["0", "45/50", "90.0%", "[", "78.6,", "95.7]", "pick", "up", "the", "bowl"]
    assert lines[2].split()[:3] == ["all", "45/50", "90.0%"]
