"""Action chunking: OpenVLA's `chunk_act_obs` on a normalised trajectory (observation history, future actions)."""

from __future__ import annotations

from typing import Any

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig


def chunk_trajectory(
    traj: dict[str, Any],
    window_size: int,
    future_action_window_size: int,
    config: RLDSDatasetConfig,
    chunk_end: str,
) -> dict[str, Any]:
    """OpenVLA's `chunk_act_obs` on a normalised trajectory: per step t, observations [t - W + 1, t] and actions
    [t - W + 1, t + F] (W + F of them), with pad masks.

    History before the episode's start repeats its first observation / action (`observation.pad_mask` False).
    `chunk_end="pad"`: actions past the last step are neutral, i.e. 0 in normalised space for relative
    dimensions and the last action for absolute ones (the gripper stays where it was), `action_pad_mask` False
    there. `chunk_end="drop"`: only the first T - F steps are kept, so no chunk runs past the end (OpenVLA-OFT).
    """
    tf = import_tensorflow()
    num_steps = tf.shape(traj["action"])[0]
    kept = num_steps - future_action_window_size if chunk_end == "drop" else num_steps
    kept = tf.maximum(kept, 0)
    t = tf.range(kept)[:, None]
    history = t + tf.range(-window_size + 1, 1)[None, :]  # [T', W]
    action_steps = t + tf.range(-window_size + 1, future_action_window_size + 1)[None, :]  # [T', W + F]
    gather_steps = tf.minimum(tf.maximum(action_steps, 0), num_steps - 1)
    traj["observation"] = tf.nest.map_structure(
        lambda x: tf.gather(x, tf.maximum(history, 0)), traj["observation"]
    )
    traj["observation"]["pad_mask"] = history >= 0
    real = action_steps < num_steps
    absolute = tf.constant(config.absolute_action_mask)[None, None, :]
    for key in ("action", "raw_action"):
        if key in traj:
            actions = tf.gather(traj[key], gather_steps)  # [T', W + F, A]
            traj[key] = tf.where(tf.logical_or(real[..., None], absolute), actions, tf.zeros_like(actions))
    traj["action_pad_mask"] = real
    for key in ("task", "dataset_name"):
        traj[key] = tf.nest.map_structure(lambda x: x[:kept], traj[key])
    return traj
