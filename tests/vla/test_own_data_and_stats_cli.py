"""Users' own data (`vla_scripts/convert_to_rlds.py`) and statistics on demand (`vla_scripts/dataset_stats.py`)."""

from __future__ import annotations

import dataclasses
import json
import runpy
from pathlib import Path

import h5py
import numpy as np
import pytest
from scripts import import_script

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds import configs, transforms
from prismatic.vla.datasets.rlds.configs import ActionEncoding, RLDSDatasetConfig, StateEncoding
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec


def _episode(index: int, num_steps: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(index)
    action = rng.uniform(-1, 1, size=(num_steps, 7)).astype(np.float32)
    action[:, 6] = (np.arange(num_steps) % 2).astype(np.float32)  # gripper already 1 = open
    return {
        "image": np.full((num_steps, 24, 24, 3), 40 * index, np.uint8),
        "wrist_image": np.zeros((num_steps, 24, 24, 3), np.uint8),
        "state": rng.uniform(size=(num_steps, 8)).astype(np.float32),
        "action": action,
    }


def test_convert_own_episodes_and_train_on_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    episodes_dir = tmp_path / "episodes"
    episodes_dir.mkdir()
    for i in range(3):
        np.savez(episodes_dir / f"ep{i}.npz", instruction=np.array("stack the cups"), **_episode(i))
    with h5py.File(episodes_dir / "ep3.hdf5", "w") as f:
        for key, value in _episode(3).items():
            f[key] = value
        f.attrs["instruction"] = "stack the cups"

    convert = import_script("convert_to_rlds")
    root = tmp_path / "rlds"
    argv = ["--episodes_dir", str(episodes_dir), "--data_root_dir", str(root), "--name", "my_robot"]
    assert convert.main([*argv, "--val_fraction", "0.25"]) == 0
    printed = capsys.readouterr().out
    assert (root / "my_robot" / "1.0.0" / "dataset_info.json").is_file()
    assert 'name="my_robot"' in printed and '"wrist_image"' in printed

    # The one registry entry the docs ask for, then the standard pipeline reads it.
    entry = RLDSDatasetConfig(
        name="my_robot",
        image_obs_keys={"primary": "image", "secondary": None, "wrist": "wrist_image"},
        state_obs_keys=("state",),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="identity",
    )
    monkeypatch.setitem(configs.DATASET_CONFIGS, "my_robot", dataclasses.replace(entry))
    pipeline = make_interleaved_dataset(
        StreamSpec(root, "my_robot", resize_resolution=(24, 24), shuffle_buffer_size=4, train=False)
    )
    frames = list(pipeline.dataset.as_numpy_iterator())
    assert len(frames) == 5  # the hdf5 episode (last by name) is the val split
    assert {f["task"]["language_instruction"] for f in frames} == {b"stack the cups"}
    np.testing.assert_allclose([f["action"][6] for f in frames], _episode(3)["action"][:, 6])
    assert abs(int(frames[0]["observation"]["image_primary"].mean()) - 120) <= 3

    stats_cli = import_script("dataset_stats")
    assert (
        stats_cli.main(
            ["--data_root_dir", str(root), "--data_mix", "my_robot", "--output_dir", str(tmp_path)]
        )
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((tmp_path / "dataset_statistics.json").read_text())
    assert printed == saved == json.loads(json.dumps(pipeline.dataset_statistics))
    assert saved["my_robot"]["num_transitions"] == 20 and saved["my_robot"]["action"]["mask"][-1] is False


def test_four_number_actions_and_a_val_split_of_every_instruction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """xyz + gripper actions are their own encoding (4 numbers, not padded to 8), and `--val_split
    per_instruction` holds out the last episodes of every instruction, not the last files by name."""
    episodes_dir = tmp_path / "episodes"
    episodes_dir.mkdir()
    rng = np.random.default_rng(0)
    for task, instruction in (("a", "open the drawer"), ("b", "press the button")):
        for i in range(3):
            np.savez(
                episodes_dir / f"{task}_{i}.npz",
                image=np.full((3, 8, 8, 3), 10 * i, np.uint8),
                state=rng.uniform(size=(3, 4)).astype(np.float32),
                action=rng.uniform(-1, 1, size=(3, 4)).astype(np.float32),
                instruction=np.array(instruction),
            )
    convert = import_script("convert_to_rlds")
    root = tmp_path / "rlds"
    argv = ["--episodes_dir", str(episodes_dir), "--data_root_dir", str(root), "--name", "xyz_robot"]
    assert convert.main([*argv, "--val_fraction", "0.3", "--val_split", "per_instruction"]) == 0
    printed = capsys.readouterr().out
    assert "action meaning: eef_delta_xyz_gripper" in printed and "inferred from 4 numbers" in printed

    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(root / "xyz_robot" / "1.0.0"))
    names = {
        split: sorted(
            Path(e["episode_metadata"]["file_path"].decode()).name
            for e in tfds.as_numpy(builder.as_dataset(split=split))
        )
        for split in builder.info.splits
    }
    # round(0.3 * 3) = 1 episode of each instruction: the last of each, where "last" alone would take b_1, b_2.
    assert names == {"train": ["a_0.npz", "a_1.npz", "b_0.npz", "b_1.npz"], "val": ["a_2.npz", "b_2.npz"]}

    datasets, functions = set(configs.DATASET_CONFIGS), set(transforms.STANDARDIZE_FNS)
    runpy.run_path(str(root / "xyz_robot" / "xyz_robot_dataset.py"))
    entry = configs.DATASET_CONFIGS.pop("xyz_robot")
    assert (
        set(configs.DATASET_CONFIGS) == datasets and set(transforms.STANDARDIZE_FNS) == functions
    )  # no pad fn
    assert entry.action_encoding == ActionEncoding.EEF_XYZ_GRIPPER and entry.action_dim == 4
    assert entry.state_encoding == StateEncoding.POS_GRIPPER and entry.standardize_fn == "identity"
    assert entry.action_normalization_mask == (True, True, True, False)  # the gripper is left as recorded

    with pytest.raises(
        ConfigError, match="--action_space eef_delta_xyz_gripper needs 4 action numbers.*have 7"
    ):
        convert.action_meaning("eef_delta_xyz_gripper", 7)
    with pytest.raises(ConfigError, match="--val_split 'per_task' is not one of last, per_instruction"):
        convert.ConvertConfig(tmp_path, "x", episodes_dir=episodes_dir, val_split="per_task")
    with pytest.raises(ConfigError, match="of 1 episode\\(s\\) of group 'b' leaves none for training"):
        convert.split_episodes(3, 0.5, ["a", "a", "b"])
    assert convert.split_episodes(4, 0.25) == {"train": [0, 1, 2], "val": [3]}  # the default: the last ones
