"""Per-dataset standardisation functions: raw RLDS trajectory -> standard layout (see `configs.py`).

Each function takes one trajectory as a dict of TensorFlow tensors with a leading time axis T (steps fields at
the top level, episode metadata broadcast to T under `traj["traj_metadata"]["episode_metadata"]`) and returns
it with `action` as float32[T, 7] (xyz delta, rpy delta, gripper absolute with 1 = open, 0 = closed), the state
keys the dataset config names in `observation`, and the instruction under the config's `language_key`.
They run inside `tf.data` graph code, traced as written (without AutoGraph, which OpenVLA's transforms never
needed and which cost seconds of every start-up), so they use TensorFlow ops only and branch on a tensor's value
with tf.cond / tf.where, not a Python `if` (that is a `ConfigError` naming the function when the pipeline is
built). Register a new one with `@register_standardize_fn("id")` and name the id in the dataset's config. Facts about the Open-X raw layouts
follow OpenVLA's `prismatic/vla/datasets/rlds/oxe/transforms.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from prismatic.util.errors import lookup
from prismatic.util.tf import import_tensorflow

Trajectory = dict[str, Any]
StandardizeFn = Callable[[Trajectory], Trajectory]

STANDARDIZE_FNS: dict[str, StandardizeFn] = {}


def register_standardize_fn(fn_id: str) -> Callable[[StandardizeFn], StandardizeFn]:
    """Decorator: register a standardisation function under `fn_id` (unique)."""

    def register(fn: StandardizeFn) -> StandardizeFn:
        if fn_id in STANDARDIZE_FNS:
            raise ValueError(f"Standardisation function '{fn_id}' is already registered.")
        STANDARDIZE_FNS[fn_id] = fn
        return fn

    return register


def get_standardize_fn(fn_id: str) -> StandardizeFn:
    """Registry look-up; an unknown id raises `ConfigError`."""
    return lookup(STANDARDIZE_FNS, fn_id, "standardisation function")


# === Gripper / action helpers (TensorFlow, graph-safe) ===


def binarize_gripper_actions(actions: Any) -> Any:
    """Continuous gripper command in [0, 1] -> exactly 0 / 1 (float32[T]).

    Values > 0.95 are open, < 0.05 closed; an in-between value takes the state reached *after* it (the gripper
    is moving towards it), so the scan runs backwards; a trajectory ending in between keeps its last value.
    """
    tf = import_tensorflow()
    actions = tf.cast(actions, tf.float32)
    is_open, is_closed = actions > 0.95, actions < 0.05
    settled = tf.logical_or(is_open, is_closed)
    open_value = tf.cast(is_open, tf.float32)

    def step(carry: Any, i: Any) -> Any:
        return tf.where(settled[i], open_value[i], carry)

    last = tf.reduce_sum(actions[-1:])  # the last value, or 0 for an empty trajectory (no indexing error)
    return tf.scan(step, tf.range(tf.shape(actions)[0]), initializer=last, reverse=True)


def rel2abs_gripper_actions(actions: Any) -> Any:
    """Relative gripper commands (+1 close, -1 open, ~0 no change) -> absolute state (1 open, 0 closed).

    Before the first command the gripper is assumed to be in the opposite state of that command (closing
    implies it was open); with no command at all it is open throughout.
    """
    tf = import_tensorflow()
    actions = tf.convert_to_tensor(actions)
    if not actions.dtype.is_floating:  # thresholds are compared in the raw float dtype, as OpenVLA does
        actions = tf.cast(actions, tf.float32)
    # +1 = open, -1 = closed, 0 = keep.
    command = tf.where(actions < -0.1, 1, tf.where(actions > 0.1, -1, 0))
    padded = tf.concat([command, [0]], axis=0)  # so that an empty trajectory needs no special case
    first = padded[tf.argmax(tf.cast(padded != 0, tf.int32), axis=0)]
    start = tf.where(first == 0, 1, -first)

    def step(carry: Any, i: Any) -> Any:
        return tf.where(command[i] == 0, carry, command[i])

    state = tf.scan(step, tf.range(tf.shape(actions)[0]), initializer=start)
    return tf.cast(state, tf.float32) / 2.0 + 0.5


def relabel_bridge_actions(traj: Trajectory) -> Trajectory:
    """Bridge's recorded deltas are noisy: use the reached change in EEF state instead; drops the last step."""
    tf = import_tensorflow()
    movement = traj["observation"]["state"][1:, :6] - traj["observation"]["state"][:-1, :6]
    truncated = tf.nest.map_structure(lambda x: x[:-1], traj)
    truncated["action"] = tf.concat([movement, traj["action"][:-1, -1:]], axis=1)
    return truncated


def _drop_first_step(traj: Trajectory) -> Trajectory:
    # Bridge V2's first step carries an all-zero action.
    tf = import_tensorflow()
    return tf.nest.map_structure(lambda x: x[1:], traj)


# === Toy datasets ===


@register_standardize_fn("toy_pick_place")
def toy_pick_place_transform(traj: Trajectory) -> Trajectory:
    """Raw layout is already standard (action[7] with 1 = open gripper, `language_instruction` per step)."""
    return traj


@register_standardize_fn("toy_push")
def toy_push_transform(traj: Trajectory) -> Trajectory:
    """Action is a dict with the gripper in [-1, 1] (+1 = close); the instruction lives in episode metadata."""
    tf = import_tensorflow()
    closedness = traj["action"]["gripper_closedness_action"]
    gripper_open = tf.clip_by_value((1.0 - closedness) / 2.0, 0.0, 1.0)
    traj["action"] = tf.concat(
        [traj["action"]["world_vector"], traj["action"]["rotation_delta"], gripper_open], axis=-1
    )
    traj["observation"]["EEF_state"] = traj["observation"]["robot_state"][:, :6]
    traj["observation"]["gripper_state"] = traj["observation"]["robot_state"][:, 6:7]
    traj["language_instruction"] = traj["traj_metadata"]["episode_metadata"]["instruction"]
    return traj


# === Open-X Embodiment ===


@register_standardize_fn("bridge_orig")
def bridge_orig_transform(traj: Trajectory) -> Trajectory:
    """Bridge V2 (project website release): flat action[7], state[7], binarised gripper, relabelled deltas."""
    tf = import_tensorflow()
    traj = _drop_first_step(traj)
    traj["action"] = tf.concat(
        [traj["action"][:, :6], binarize_gripper_actions(traj["action"][:, -1])[:, None]], axis=1
    )
    traj = relabel_bridge_actions(traj)
    traj["observation"]["EEF_state"] = traj["observation"]["state"][:, :6]
    traj["observation"]["gripper_state"] = traj["observation"]["state"][:, -1:]
    return traj


@register_standardize_fn("bridge_oxe")
def bridge_oxe_transform(traj: Trajectory) -> Trajectory:
    """Bridge V2 (Open-X release): action dict with a boolean `open_gripper`, instruction in observation."""
    tf = import_tensorflow()
    traj = _drop_first_step(traj)
    traj["action"] = tf.concat(
        [
            traj["action"]["world_vector"],
            traj["action"]["rotation_delta"],
            tf.cast(traj["action"]["open_gripper"][:, None], tf.float32),
        ],
        axis=-1,
    )
    traj["language_instruction"] = traj["observation"]["natural_language_instruction"]
    traj = relabel_bridge_actions(traj)
    traj["observation"]["EEF_state"] = traj["observation"]["state"][:, :6]
    traj["observation"]["gripper_state"] = traj["observation"]["state"][:, -1:]
    return traj


@register_standardize_fn("rt1")
def rt1_transform(traj: Trajectory) -> Trajectory:
    """RT-1 (fractal): relative gripper closedness -> absolute open/close; instruction in observation."""
    tf = import_tensorflow()
    gripper = rel2abs_gripper_actions(traj["action"]["gripper_closedness_action"][:, 0])
    traj["action"] = tf.concat(
        [traj["action"]["world_vector"], traj["action"]["rotation_delta"], gripper[:, None]], axis=-1
    )
    traj["language_instruction"] = traj["observation"]["natural_language_instruction"]
    return traj


# === Helpers shared by the Open-X standardisations below ===


def invert_gripper_actions(actions: Any) -> Any:
    """Gripper in [0, 1] with 1 = closed -> 1 = open (in the input's dtype; the pipeline casts to float32)."""
    return 1 - actions


def _clip01(x: Any) -> Any:
    """Clip to [0, 1] in the raw dtype: OpenVLA clips (and inverts) before its final float32 cast, which rounds
    differently from casting first when a dataset stores float64."""
    tf = import_tensorflow()
    return tf.clip_by_value(x, 0, 1)


def quaternion_to_euler(quat_xyzw: Any) -> Any:
    """Quaternion (x, y, z, w) -> Euler angles (roll about x, pitch about y, yaw about z; R = Rz Ry Rx).

    Restates, operation by operation and in the input's dtype, `tensorflow_graphics.geometry.transformation.
    euler.from_quaternion` (release 2021.12.3, the one OpenVLA pins), so that the few Open-X datasets with
    quaternion actions need no tensorflow-graphics yet get OpenVLA's numbers: the products are shrunk by
    (1 - 2 machine eps), the atan2 denominators are nudged away from zero by 2 eps, and within 1e-6 of gimbal
    lock (|r20| = 1) the whole rotation about x goes to roll, with pitch = +-pi/2 and yaw = 0.
    """
    tf = import_tensorflow()
    q = tf.convert_to_tensor(quat_xyzw)
    eps = 2.0 * float(np.finfo(q.dtype.as_numpy_dtype).eps)  # tfg's select_eps_for_addition
    eps_t = tf.constant(eps, dtype=q.dtype)

    def shrink(v: Any) -> Any:  # tfg's safe_shrink (its range assertion is off by default)
        return v * (1.0 - eps_t)

    def nonzero_sign(v: Any) -> Any:
        one = tf.ones_like(v)
        return tf.where(tf.greater_equal(v, 0.0), one, -one)

    x, y, z, w = tf.unstack(q, axis=-1)
    tx, ty, tz = shrink(2.0 * x), shrink(2.0 * y), shrink(2.0 * z)
    twx, twy, twz = tx * w, ty * w, tz * w
    txx, txy, txz = tx * x, ty * x, tz * x
    tyy, tyz, tzz = ty * y, tz * y, tz * z
    r00 = shrink(1.0 - (tyy + tzz))
    r10 = shrink(txy + twz)
    r21 = shrink(tyz + twx)
    r22 = shrink(1.0 - (txx + tyy))
    r20 = shrink(txz - twy)
    r01 = shrink(txy - twz)
    r02 = shrink(txz + twy)

    # General case.
    pitch = -tf.asin(r20)
    sign_cos_pitch = nonzero_sign(tf.cos(pitch))
    r00_safe = nonzero_sign(r00) * eps + r00
    r22_safe = nonzero_sign(r22) * eps + r22
    yaw = tf.atan2(r10 * sign_cos_pitch, r00_safe * sign_cos_pitch)
    roll = tf.atan2(r21 * sign_cos_pitch, r22_safe * sign_cos_pitch)
    general = tf.stack((roll, pitch, yaw), axis=-1)

    # Gimbal lock.
    sign_r20 = nonzero_sign(r20)
    r02_safe = nonzero_sign(r02) * eps + r02
    lock_roll = tf.atan2(-sign_r20 * r01, -sign_r20 * r02_safe)
    lock_pitch = -sign_r20 * tf.constant(math.pi / 2.0, dtype=r20.dtype)
    lock = tf.stack((lock_roll, lock_pitch, tf.zeros_like(lock_roll)), axis=-1)

    is_lock = tf.less(tf.abs(tf.abs(r20) - 1.0), 1.0e-6)
    return tf.where(tf.stack((is_lock, is_lock, is_lock), axis=-1), lock, general)


def _rtx_action(action: dict[str, Any], gripper: Any) -> Any:
    """The RT-X action dict's world_vector (3) + rotation_delta (3) + a [T, 1] gripper column."""
    tf = import_tensorflow()
    parts = [action["world_vector"], action["rotation_delta"], tf.reshape(gripper, [-1, 1])]
    return tf.concat([tf.cast(part, tf.float32) for part in parts], axis=-1)


def _instruction_from_observation(traj: Trajectory) -> Trajectory:
    traj["language_instruction"] = traj["observation"]["natural_language_instruction"]
    return traj


def _arm6_and_gripper(traj: Trajectory, gripper: Any) -> Trajectory:
    """action := raw action[:, :6] + the given [T, 1] gripper column (1 = open), as float32.

    Both parts are cast after they are computed (in the raw dtype), which gives OpenVLA's values: it concatenates
    in the raw dtype and casts the whole action to float32 afterwards.
    """
    tf = import_tensorflow()
    arm = tf.cast(traj["action"][:, :6], tf.float32)
    traj["action"] = tf.concat([arm, tf.cast(gripper, tf.float32)], axis=-1)
    return traj


def _split_state(traj: Trajectory, source: Any, eef: slice, gripper: slice) -> Trajectory:
    """observation/eef_state and observation/gripper_state from slices of one raw state vector."""
    traj["observation"]["eef_state"] = source[:, eef]
    traj["observation"]["gripper_state"] = source[:, gripper]
    return traj


def _xyz_pad_gripper(action: Any, num_xyz: int = 3) -> Any:
    """Raw [xyz(num_xyz) ..., gripper] -> xyz + zero rotation (pad to 6) + gripper."""
    tf = import_tensorflow()
    return tf.concat([action[:, :num_xyz], tf.zeros_like(action[:, : 6 - num_xyz]), action[:, -1:]], axis=-1)


# === Open-X Embodiment: RT-X action-dict datasets ===


@register_standardize_fn("kuka")
def kuka_transform(traj: Trajectory) -> Trajectory:
    """RT-X action dict, relative gripper; the state is stored as zlib-compressed float32 bytes."""
    tf = import_tensorflow()
    gripper = rel2abs_gripper_actions(traj["action"]["gripper_closedness_action"][:, 0])
    traj["action"] = _rtx_action(traj["action"], gripper)
    obs = traj["observation"]

    def decompress(key: str, width: int) -> Any:
        if obs[key].dtype != tf.string:  # some releases store the plain float vector
            return tf.reshape(tf.cast(obs[key], tf.float32), [-1, width])
        raw = tf.io.decode_compressed(obs[key], compression_type="ZLIB")
        return tf.reshape(tf.io.decode_raw(raw, tf.float32), [-1, width])

    obs["clip_function_input/base_pose_tool_reached"] = decompress(
        "clip_function_input/base_pose_tool_reached", 7
    )
    obs["gripper_closed"] = decompress("gripper_closed", 1)
    return _instruction_from_observation(traj)


@register_standardize_fn("taco_play")
def taco_play_transform(traj: Trajectory) -> Trajectory:
    """`rel_actions_world` [T, 7] with the gripper in {-1 close, +1 open}: clip to [0, 1]."""
    obs = traj["observation"]
    obs["state_eef"] = obs["robot_obs"][:, :6]
    obs["state_gripper"] = obs["robot_obs"][:, 7:8]
    raw = traj["action"]["rel_actions_world"]
    traj["action"] = raw
    traj = _arm6_and_gripper(traj, _clip01(raw[:, -1:]))
    return _instruction_from_observation(traj)


@register_standardize_fn("jaco_play")
def jaco_play_transform(traj: Trajectory) -> Trajectory:
    """Translation only (rotation zero-padded), relative gripper."""
    tf = import_tensorflow()
    obs = traj["observation"]
    obs["state_eef"] = obs["end_effector_cartesian_pos"][:, :6]
    obs["state_gripper"] = obs["end_effector_cartesian_pos"][:, -1:]
    gripper = rel2abs_gripper_actions(traj["action"]["gripper_closedness_action"][:, 0])
    world = traj["action"]["world_vector"]
    traj["action"] = tf.concat([world, tf.zeros_like(world), gripper[:, None]], axis=-1)
    return _instruction_from_observation(traj)


@register_standardize_fn("berkeley_cable_routing")
def berkeley_cable_routing_transform(traj: Trajectory) -> Trajectory:
    """No gripper command (the cable is held throughout): gripper column 0, as OpenVLA does."""
    tf = import_tensorflow()
    traj["action"] = _rtx_action(traj["action"], tf.zeros_like(traj["action"]["world_vector"][:, :1]))
    return _instruction_from_observation(traj)


@register_standardize_fn("rtx_invert_gripper")
def rtx_invert_gripper_transform(traj: Trajectory) -> Trajectory:
    """RT-X action dict with an absolute closedness in [0, 1] (1 = closed): clip, invert (roboturk, viola)."""
    tf = import_tensorflow()
    closed = tf.reshape(traj["action"]["gripper_closedness_action"], [-1, 1])
    traj["action"] = _rtx_action(traj["action"], invert_gripper_actions(_clip01(closed)))
    return _instruction_from_observation(traj)


@register_standardize_fn("berkeley_autolab_ur5")
def berkeley_autolab_ur5_transform(traj: Trajectory) -> Trajectory:
    """Relative gripper; the EEF pose (xyz + quaternion + gripper) is robot_state[6:14]."""
    obs = traj["observation"]
    obs["state"] = obs["robot_state"][:, 6:14]
    if "image_with_depth" in obs:
        obs["depth"] = obs.pop("image_with_depth")
    gripper = rel2abs_gripper_actions(traj["action"]["gripper_closedness_action"])
    traj["action"] = _rtx_action(traj["action"], gripper)
    return _instruction_from_observation(traj)


@register_standardize_fn("rtx_open_gripper")
def rtx_open_gripper_transform(traj: Trajectory) -> Trajectory:
    """RT-X action dict with a boolean `open_gripper` (toto)."""
    traj["action"] = _rtx_action(traj["action"], traj["action"]["open_gripper"])
    return _instruction_from_observation(traj)


@register_standardize_fn("rtx_absolute_gripper")
def rtx_absolute_gripper_transform(traj: Trajectory) -> Trajectory:
    """RT-X action dict whose gripper value is used as stored (columbia_cairlab_pusht_real)."""
    traj["action"] = _rtx_action(traj["action"], traj["action"]["gripper_closedness_action"])
    return _instruction_from_observation(traj)


@register_standardize_fn("language_table")
def language_table_transform(traj: Trajectory) -> Trajectory:
    """2-D planar action -> xy + zero padding, gripper always open; instruction is zero-padded int32 UTF-8."""
    tf = import_tensorflow()
    action = tf.cast(traj["action"], tf.float32)
    zeros = tf.zeros_like(action[:, :1])
    traj["action"] = tf.concat([action, zeros, zeros, zeros, zeros, tf.ones_like(zeros)], axis=-1)
    encoded = tf.strings.unicode_encode(traj["observation"]["instruction"], output_encoding="UTF-8")
    traj["language_instruction"] = tf.strings.split(encoded, "\x00")[:, :1].to_tensor()[:, 0]
    return traj


@register_standardize_fn("bc_z")
def bc_z_transform(traj: Trajectory) -> Trajectory:
    """Residual xyz + axis-angle (first of the future steps), `target_close` inverted to 1 = open."""
    tf = import_tensorflow()
    action = traj["action"]
    close = tf.cast(action["future/target_close"][:, :1], tf.float32)
    traj["action"] = tf.concat(
        [
            action["future/xyz_residual"][:, :3],
            action["future/axis_angle_residual"][:, :3],
            invert_gripper_actions(close),
        ],
        axis=-1,
    )
    return _instruction_from_observation(traj)


# === Open-X Embodiment: flat-action datasets ===


@register_standardize_fn("identity")
def identity_transform(traj: Trajectory) -> Trajectory:
    """Raw layout already matches the config (flat action, gripper 1 = open, `language_instruction`)."""
    return traj


@register_standardize_fn("invert_clip_gripper")
def invert_clip_gripper_transform(traj: Trajectory) -> Trajectory:
    """Flat action[:, :6] + gripper in [-1, 1] or [0, 1] with 1 = closed: clip to [0, 1] and invert
    (austin_sailor, austin_sirius)."""
    return _arm6_and_gripper(traj, invert_gripper_actions(_clip01(traj["action"][:, -1:])))


@register_standardize_fn("austin_buds")
def austin_buds_transform(traj: Trajectory) -> Trajectory:
    """Like `invert_clip_gripper`; the state keeps its first 8 entries (7 joints + gripper)."""
    traj["observation"]["state"] = traj["observation"]["state"][:, :8]
    return invert_clip_gripper_transform(traj)


@register_standardize_fn("utaustin_mutex")
def utaustin_mutex_transform(traj: Trajectory) -> Trajectory:
    """Same layout as austin_buds."""
    return austin_buds_transform(traj)


@register_standardize_fn("stanford_hydra")
def stanford_hydra_transform(traj: Trajectory) -> Trajectory:
    """Gripper 1 = closed: invert; EEF xyz = state[0:3], euler = state[7:10], gripper = state[-3]."""
    tf = import_tensorflow()
    traj = _arm6_and_gripper(traj, invert_gripper_actions(traj["action"][:, -1:]))
    state = traj["observation"]["state"]
    traj["observation"]["eef_state"] = tf.concat([state[:, :3], state[:, 7:10]], axis=-1)
    traj["observation"]["gripper_state"] = state[:, -3:-2]
    return traj


@register_standardize_fn("nyu_franka_play")
def nyu_franka_play_transform(traj: Trajectory) -> Trajectory:
    """Action is 15-D: the EEF delta is [-8:-2], the gripper [-2] (already 1 = open, clipped)."""
    tf = import_tensorflow()
    traj["observation"]["eef_state"] = traj["observation"]["state"][:, -6:]
    raw = traj["action"]
    traj["action"] = tf.concat([raw[:, -8:-2], _clip01(raw[:, -2:-1])], axis=-1)
    return traj


@register_standardize_fn("nyu_rot")
def nyu_rot_transform(traj: Trajectory) -> Trajectory:
    traj = _split_state(traj, traj["observation"]["state"], slice(0, 6), slice(-1, None))
    traj["action"] = traj["action"][:, :7]
    return traj


@register_standardize_fn("maniskill")
def maniskill_transform(traj: Trajectory) -> Trajectory:
    traj["observation"]["gripper_state"] = traj["observation"]["state"][:, 7:8]
    return traj


@register_standardize_fn("furniture_bench")
def furniture_bench_transform(traj: Trajectory) -> Trajectory:
    """xyz + quaternion action -> xyz + euler; gripper in [-1, 1] with 1 = closed: clip, invert."""
    tf = import_tensorflow()
    state = traj["observation"]["state"]
    traj["observation"]["state"] = tf.concat([state[:, :7], state[:, -1:]], axis=-1)
    raw = traj["action"]
    traj["action"] = tf.concat(
        [raw[:, :3], quaternion_to_euler(raw[:, 3:7]), invert_gripper_actions(_clip01(raw[:, -1:]))], axis=-1
    )
    return traj


@register_standardize_fn("drop_last_action_dim")
def drop_last_action_dim_transform(traj: Trajectory) -> Trajectory:
    """Action's last entry is a terminate flag: drop it (cmu_franka_exploration, imperialcollege)."""
    traj["action"] = traj["action"][:, :-1]
    return traj


@register_standardize_fn("ucsd_kitchen")
def ucsd_kitchen_transform(traj: Trajectory) -> Trajectory:
    traj["observation"]["joint_state"] = traj["observation"]["state"][:, :7]
    return drop_last_action_dim_transform(traj)


@register_standardize_fn("ucsd_pick_and_place")
def ucsd_pick_and_place_transform(traj: Trajectory) -> Trajectory:
    """xyz velocity only: rotation zero-padded."""
    traj = _split_state(traj, traj["observation"]["state"], slice(0, 6), slice(-1, None))
    traj["action"] = _xyz_pad_gripper(traj["action"])
    return traj


@register_standardize_fn("utokyo_pr2")
def utokyo_pr2_transform(traj: Trajectory) -> Trajectory:
    traj = _split_state(traj, traj["observation"]["state"], slice(0, 6), slice(-1, None))
    return drop_last_action_dim_transform(traj)


@register_standardize_fn("last7_action")
def last7_action_transform(traj: Trajectory) -> Trajectory:
    """Bimanual action: keep the last 7 entries (one arm), as OpenVLA does (utokyo_xarm_bimanual)."""
    traj["action"] = traj["action"][:, -7:]
    return traj


@register_standardize_fn("stanford_kuka_multimodal")
def stanford_kuka_multimodal_transform(traj: Trajectory) -> Trajectory:
    """xyz velocity + gripper: rotation zero-padded."""
    traj["action"] = _xyz_pad_gripper(traj["action"])
    return traj


@register_standardize_fn("robo_net")
def robo_net_transform(traj: Trajectory) -> Trajectory:
    """xyz + yaw (4) -> pad to 6 with zeros, then gripper."""
    tf = import_tensorflow()
    state = traj["observation"]["state"]
    traj["observation"]["eef_state"] = tf.concat([state[:, :4], tf.zeros_like(state[:, :2])], axis=-1)
    traj["observation"]["gripper_state"] = state[:, -1:]
    traj["action"] = _xyz_pad_gripper(traj["action"], num_xyz=4)
    return traj


@register_standardize_fn("kaist_nonprehensile")
def kaist_nonprehensile_transform(traj: Trajectory) -> Trajectory:
    """No gripper: column 0 (as OpenVLA); state keeps its last 7 entries."""
    tf = import_tensorflow()
    traj["observation"]["state"] = traj["observation"]["state"][:, -7:]
    return _arm6_and_gripper(traj, tf.zeros_like(traj["action"][:, :1]))


@register_standardize_fn("stanford_mask_vit")
def stanford_mask_vit_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    pose = traj["observation"]["end_effector_pose"]
    traj["observation"]["eef_state"] = tf.concat([pose[:, :4], tf.zeros_like(pose[:, :2])], axis=-1)
    traj["observation"]["gripper_state"] = pose[:, -1:]
    traj["action"] = _xyz_pad_gripper(traj["action"], num_xyz=4)
    return traj


@register_standardize_fn("eef_state_6_gripper_last")
def eef_state_6_gripper_last_transform(traj: Trajectory) -> Trajectory:
    """eef_state = state[:, :6], gripper_state = state[:, -1:] (tokyo_u_lsmo, stanford_robocook)."""
    return _split_state(traj, traj["observation"]["state"], slice(0, 6), slice(-1, None))


@register_standardize_fn("dlr_sara_grid_clamp")
def dlr_sara_grid_clamp_transform(traj: Trajectory) -> Trajectory:
    traj["observation"]["state"] = traj["observation"]["state"][:, :6]
    return traj


@register_standardize_fn("invert_gripper")
def invert_gripper_transform(traj: Trajectory) -> Trajectory:
    """Flat action with gripper 1 = closed (dlr_edan_shared_control)."""
    return _arm6_and_gripper(traj, invert_gripper_actions(traj["action"][:, -1:]))


@register_standardize_fn("asu_table_top")
def asu_table_top_transform(traj: Trajectory) -> Trajectory:
    traj["observation"]["eef_state"] = traj["ground_truth_states"]["EE"]
    traj["observation"]["gripper_state"] = traj["observation"]["state"][:, -1:]
    return traj


@register_standardize_fn("iamlab_cmu_pickup_insert")
def iamlab_cmu_pickup_insert_transform(traj: Trajectory) -> Trajectory:
    """xyz + quaternion + gripper (1 = open) -> xyz + euler + gripper."""
    tf = import_tensorflow()
    state = traj["observation"]["state"]
    traj["observation"]["joint_state"] = state[:, :7]
    traj["observation"]["gripper_state"] = state[:, 7:8]
    raw = traj["action"]
    traj["action"] = tf.concat([raw[:, :3], quaternion_to_euler(raw[:, 3:7]), raw[:, 7:8]], axis=-1)
    return traj


@register_standardize_fn("uiuc_d3field")
def uiuc_d3field_transform(traj: Trajectory) -> Trajectory:
    """xyz only: zero rotation, gripper 0 (as OpenVLA)."""
    tf = import_tensorflow()
    raw = tf.cast(traj["action"], tf.float32)
    traj["action"] = tf.concat([raw, tf.zeros_like(raw), tf.zeros_like(raw[:, :1])], axis=-1)
    return traj


@register_standardize_fn("berkeley_fanuc")
def berkeley_fanuc_transform(traj: Trajectory) -> Trajectory:
    """No gripper action is stored: use the gripper state (1 = closed), inverted (in the raw dtype)."""
    tf = import_tensorflow()
    state = traj["observation"]["state"]
    traj["observation"]["joint_state"] = state[:, :6]
    traj["observation"]["gripper_state"] = state[:, 6:7]
    gripper = invert_gripper_actions(state[:, 6:7])
    traj["action"] = tf.concat([tf.cast(traj["action"], tf.float32), tf.cast(gripper, tf.float32)], axis=-1)
    return traj


@register_standardize_fn("cmu_playing_with_food")
def cmu_playing_with_food_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    raw = traj["action"]
    traj["action"] = tf.concat([raw[:, :3], quaternion_to_euler(raw[:, 3:7]), raw[:, -1:]], axis=-1)
    return traj


@register_standardize_fn("cmu_play_fusion")
def cmu_play_fusion_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    traj["action"] = tf.concat([traj["action"][:, :3], traj["action"][:, -4:]], axis=-1)
    return traj


@register_standardize_fn("cmu_stretch")
def cmu_stretch_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    state = traj["observation"]["state"]
    traj["observation"]["eef_state"] = tf.concat([state[:, :3], tf.zeros_like(state[:, :3])], axis=-1)
    traj["observation"]["gripper_state"] = state[:, -1:]
    return drop_last_action_dim_transform(traj)


@register_standardize_fn("gnm")
def gnm_transform(traj: Trajectory) -> Trajectory:
    """Navigation (2-D position action): xy + zeros, gripper 0; state = position + zeros + yaw."""
    tf = import_tensorflow()
    obs = traj["observation"]
    obs["state"] = tf.concat([obs["position"], tf.zeros_like(obs["state"][:, :3]), obs["yaw"]], axis=-1)
    raw = tf.cast(traj["action"], tf.float32)
    traj["action"] = tf.concat([raw, tf.zeros_like(raw), tf.zeros_like(raw), tf.zeros_like(raw[:, :1])], -1)
    return traj


@register_standardize_fn("fmb")
def fmb_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    obs = traj["observation"]
    obs["proprio"] = tf.concat([obs["eef_pose"], obs["state_gripper_pose"][..., None]], axis=-1)
    return traj


@register_standardize_fn("state_as_proprio")
def state_as_proprio_transform(traj: Trajectory) -> Trajectory:
    """observation/proprio := observation/state (dobbe)."""
    traj["observation"]["proprio"] = traj["observation"]["state"]
    return traj


@register_standardize_fn("roboset")
def roboset_transform(traj: Trajectory) -> Trajectory:
    """Joint-space action (7) + gripper in [-1, 1] with 1 = closed: clip, invert."""
    tf = import_tensorflow()
    traj["observation"]["proprio"] = traj["observation"]["state"]
    raw = traj["action"]
    traj["action"] = tf.concat([raw[:, :7], invert_gripper_actions(_clip01(raw[:, -1:]))], axis=-1)
    return traj


@register_standardize_fn("rh20t")
def rh20t_transform(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    obs = traj["observation"]
    traj["action"] = tf.concat(
        [traj["action"]["tcp_base"], tf.cast(traj["action"]["gripper"][:, None], tf.float32)], axis=-1
    )
    obs["proprio"] = tf.concat([obs["tcp_base"], obs["gripper_width"][..., None]], axis=-1)
    return traj


@register_standardize_fn("tdroid")
def tdroid_transform(traj: Trajectory) -> Trajectory:
    """Flat action with a continuous gripper in [0, 1] (1 = open): binarised."""
    traj = _arm6_and_gripper(traj, binarize_gripper_actions(traj["action"][:, -1])[:, None])
    obs = traj["observation"]
    obs["EEF_state"] = obs["cartesian_position"][:, :6]
    obs["gripper_state"] = obs["gripper_position"][:, -1:]
    return traj


def _droid_action_and_proprio(traj: Trajectory) -> Trajectory:
    tf = import_tensorflow()
    action, obs = traj["action_dict"], traj["observation"]
    # DROID's gripper_position is 1 = closed.
    traj["action"] = tf.concat(
        [action["cartesian_velocity"][:, :6], invert_gripper_actions(action["gripper_position"])], axis=-1
    )
    obs["proprio"] = tf.concat([obs["cartesian_position"], obs["gripper_position"]], axis=-1)
    return traj


@register_standardize_fn("droid")
def droid_transform(traj: Trajectory) -> Trajectory:
    """Base-frame cartesian velocity + inverted gripper; the two exterior cameras are swapped for half of
    the episodes (so "primary" sees both viewpoints). OpenVLA draws the swap at random; here it is a hash of
    the episode's first image, so the stream stays a deterministic function of the seed."""
    tf = import_tensorflow()
    traj = _droid_action_and_proprio(traj)
    obs = traj["observation"]
    first, second = obs["exterior_image_1_left"], obs["exterior_image_2_left"]
    swap = tf.equal(tf.strings.to_hash_bucket_fast(first[0], 2), 1)
    obs["exterior_image_1_left"], obs["exterior_image_2_left"] = tf.cond(
        swap, lambda: (second, first), lambda: (first, second)
    )
    return traj


@register_standardize_fn("droid_finetuning")
def droid_finetuning_transform(traj: Trajectory) -> Trajectory:
    """DROID-layout fine-tuning sets (droid_wipe): like `droid`, no camera swap."""
    return _droid_action_and_proprio(traj)


@register_standardize_fn("libero")
def libero_transform(traj: Trajectory) -> Trajectory:
    """Gripper in [-1 open, +1 close]: clip to [0, 1], invert; EEF_state = state[:6], 2-D gripper state."""
    traj = invert_clip_gripper_transform(traj)
    obs = traj["observation"]
    obs["EEF_state"] = obs["state"][:, :6]
    obs["gripper_state"] = obs["state"][:, -2:]
    return traj
