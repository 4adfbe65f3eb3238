"""Per-dataset standardisation functions: raw RLDS trajectory -> standard layout (see `configs.py`).

Each function takes one trajectory as a dict of TensorFlow tensors with a leading time axis T (steps fields at
the top level, episode metadata broadcast to T under `traj["traj_metadata"]["episode_metadata"]`) and returns
it with `action` as float32[T, 7] (xyz delta, rpy delta, gripper absolute with 1 = open, 0 = closed), the state
keys the dataset config names in `observation`, and the instruction under the config's `language_key`.
They run inside `tf.data` graph code, so they use TensorFlow ops only. Register a new one with
`@register_standardize_fn("id")` and name the id in the dataset's config. Facts about the Open-X raw layouts
follow OpenVLA's `prismatic/vla/datasets/rlds/oxe/transforms.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
