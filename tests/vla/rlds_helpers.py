"""Test helpers: read toy RLDS episodes straight from disk and standardise them in NumPy, independently of the
pipeline under test."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def raw_actions_and_proprio(dataset_dir: Path, split: str) -> list[dict[str, np.ndarray]]:
    """Per episode of a toy dataset: the standardised action [T, 7] and proprio [T, 8], computed in NumPy."""
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(dataset_dir))
    episodes = []
    for episode in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
        steps = list(episode["steps"])
        if builder.info.name == "toy_pick_place":
            action = np.stack([s["action"] for s in steps])
            proprio = np.stack([s["observation"]["state"] for s in steps])
        else:
            world = np.stack([s["action"]["world_vector"] for s in steps])
            rotation = np.stack([s["action"]["rotation_delta"] for s in steps])
            closedness = np.stack([s["action"]["gripper_closedness_action"] for s in steps])
            action = np.concatenate([world, rotation, (1.0 - closedness) / 2.0], axis=1)
            state = np.stack([s["observation"]["robot_state"] for s in steps])
            proprio = np.concatenate([state[:, :6], np.zeros((len(steps), 1)), state[:, 6:7]], axis=1)
        episodes.append({"action": action.astype(np.float32), "proprio": proprio.astype(np.float32)})
    return episodes


def q99_normalize(x: np.ndarray, low: np.ndarray, high: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BOUNDS_Q99 written out independently of `normalization.py` (constant dims, low == high, map to 0)."""
    out = np.clip(2.0 * (x - low) / (high - low + 1e-8) - 1.0, -1.0, 1.0)
    out = np.where(low == high, 0.0, out)
    return np.where(mask, out, x)


def frame_key(frame: dict) -> tuple:
    """Everything that identifies a pipeline frame, hashable (for stream comparisons)."""
    return (
        frame["dataset_name"],
        frame["task"]["language_instruction"],
        frame["action"].tobytes(),
        frame["observation"].get("proprio", np.zeros(0)).tobytes(),
        frame["observation"]["image_primary"].tobytes(),
    )
