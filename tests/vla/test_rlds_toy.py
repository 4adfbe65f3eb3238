"""Toy RLDS builder: layout on disk, determinism in the seed, idempotent builds, the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scripts import import_script

from prismatic.vla.datasets.rlds.toy import (
    NUM_EPISODES,
    TOY_DATASET_NAMES,
    TOY_SPECS,
    build_toy_datasets,
    generate_toy_episode,
    toy_dataset_dir,
)


def _examples(dataset_dir: Path) -> dict[str, list[bytes]]:
    """Every record as a deterministically re-serialised tf.train.Example (proto map order is not stable)."""
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    out = {}
    for path in sorted(dataset_dir.glob("*.tfrecord-*")):
        records = tf.data.TFRecordDataset(str(path)).as_numpy_iterator()
        out[path.name] = [
            tf.train.Example.FromString(r).SerializeToString(deterministic=True) for r in records
        ]
    return out


def test_layout_on_disk(toy_data_root: Path) -> None:
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    assert sorted(p.name for p in toy_data_root.iterdir()) == sorted(TOY_DATASET_NAMES)
    for name in TOY_DATASET_NAMES:
        builder = tfds.builder_from_directory(str(toy_dataset_dir(toy_data_root, name)))
        assert str(builder.info.version) == "1.0.0"
        assert {s: builder.info.splits[s].num_examples for s in ("train", "val")} == NUM_EPISODES
        episode = next(iter(tfds.as_numpy(builder.as_dataset(split="val"))))
        steps = list(episode["steps"])
        assert len(steps) == TOY_SPECS[name].num_steps
        assert [s["is_first"] for s in steps].count(True) == 1 and steps[-1]["is_last"]
        image_key = "image" if name == "toy_pick_place" else "agentview_rgb"
        assert steps[0]["observation"][image_key].shape == (64, 64, 3)
        assert episode["episode_metadata"]["file_path"].startswith(f"toy://{name}/val/".encode())
    # The two raw layouts differ: flat action + per-step instruction vs. action dict + metadata instruction.
    assert "language_instruction" in generate_toy_episode("toy_pick_place", "train", 0)["steps"][0]
    push = generate_toy_episode("toy_push", "train", 0)
    assert set(push["steps"][0]["action"]) == {"world_vector", "rotation_delta", "gripper_closedness_action"}
    assert push["episode_metadata"]["instruction"] == TOY_SPECS["toy_push"].tasks[0].instruction


def test_build_is_deterministic_in_the_seed(toy_data_root: Path, tmp_path: Path) -> None:
    build_toy_datasets(tmp_path, seed=0)
    for name in TOY_DATASET_NAMES:
        assert _examples(toy_dataset_dir(tmp_path, name)) == _examples(toy_dataset_dir(toy_data_root, name))
    a, b = (
        generate_toy_episode("toy_push", "train", 3, seed=0),
        generate_toy_episode("toy_push", "train", 3, seed=1),
    )
    assert not np.array_equal(
        a["steps"][0]["observation"]["robot_state"], b["steps"][0]["observation"]["robot_state"]
    )


def test_build_is_idempotent(toy_data_root: Path) -> None:
    files = sorted(toy_data_root.rglob("*.tfrecord-*"))
    mtimes = [f.stat().st_mtime_ns for f in files]
    assert build_toy_datasets(toy_data_root, seed=123) == list(TOY_DATASET_NAMES)
    assert [f.stat().st_mtime_ns for f in files] == mtimes


def test_cli_builds_into_data_root(toy_data_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = import_script("build_toy_dataset")
    assert module.main(["--data_root_dir", str(toy_data_root)]) == 0
    assert str(toy_dataset_dir(toy_data_root, "toy_push")) in capsys.readouterr().out


def test_actions_are_a_smooth_function_of_task_and_time() -> None:
    # Same task (index 0 and 4), different episodes: arm actions differ only by the small noise.
    a = np.stack([s["action"] for s in generate_toy_episode("toy_pick_place", "train", 0)["steps"]])
    b = np.stack([s["action"] for s in generate_toy_episode("toy_pick_place", "train", 4)["steps"]])
    c = np.stack([s["action"] for s in generate_toy_episode("toy_pick_place", "train", 1)["steps"]])
    assert np.abs(a[:, :6] - b[:, :6]).max() < 0.02
    assert np.abs(a[:, :6] - c[:, :6]).max() > 0.02
    assert np.array_equal(a[:, 6], b[:, 6]) and set(np.unique(a[:, 6])) == {0.0, 1.0}
