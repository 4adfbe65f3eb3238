"""Dataset / mixture / standardisation registries, weight balancing, and the gripper helpers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, get_dataset_config, register_dataset
from prismatic.vla.datasets.rlds.mixtures import (
    MIXTURES,
    balance_sample_weights,
    get_mixture,
    register_mixture,
)
from prismatic.vla.datasets.rlds.transforms import STANDARDIZE_FNS
from prismatic.vla.datasets.stream_spec import StreamSpec


def test_registries_are_consistent() -> None:
    for name, config in DATASET_CONFIGS.items():
        assert config.name == name
        assert config.standardize_fn in STANDARDIZE_FNS
        # Every arm dim is a normalised delta; the last (gripper) is absolute and left as is.
        arm = config.action_dim - 1
        assert config.action_normalization_mask == (True,) * arm + (False,)
        assert config.absolute_action_mask == (False,) * arm + (True,)
    for spec in MIXTURES.values():
        assert all(dataset in DATASET_CONFIGS for dataset, _ in spec)
    assert {"toy", "toy_pick_place", "bridge", "rt_1", "bridge_rt_1"} <= set(MIXTURES)
    assert get_dataset_config("bridge_orig").image_obs_keys["primary"] == "image_0"
    assert get_dataset_config("fractal20220817_data").state_obs_keys == (
        "base_pose_tool_reached",
        "gripper_closed",
    )


def test_unknown_names_raise_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'bridge_orgi'.*Did you mean 'bridge_orig'"):
        get_dataset_config("bridge_orgi")
    with pytest.raises(ConfigError, match=r"Unknown dataset mixture 'toyy'.*Did you mean 'toy'"):
        get_mixture("toyy")


def test_a_dataset_name_is_a_one_dataset_mixture() -> None:
    assert get_mixture("toy_push") == [("toy_push", 1.0)]
    assert get_mixture("toy") == [("toy_pick_place", 1.0), ("toy_push", 1.0)]


def test_registration_rejects_bad_entries() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_dataset(DATASET_CONFIGS["toy_push"])
    with pytest.raises(ValueError, match="unregistered dataset"):
        register_mixture("broken", [("no_such_dataset", 1.0)])
    with pytest.raises(ValueError, match="exactly once"):
        register_mixture("dup", [("toy_push", 1.0), ("toy_push", 2.0)])
    with pytest.raises(ValueError, match="action_normalization_mask"):
        dataclasses.replace(DATASET_CONFIGS["toy_push"], action_normalization_mask=(True,) * 3)
    assert "broken" not in MIXTURES and "dup" not in MIXTURES


def test_balance_sample_weights_by_transition_count() -> None:
    weights = balance_sample_weights([1.0, 1.0], [480, 384])
    np.testing.assert_allclose(weights, [480 / 864, 384 / 864])
    weights = balance_sample_weights([2.0, 1.0, 0.5], [100, 300, 400])
    np.testing.assert_allclose(weights, np.array([200, 300, 200]) / 700)
    with pytest.raises(ValueError):
        balance_sample_weights([1.0, 0.0], [10, 10])


def test_gripper_helpers() -> None:
    from prismatic.vla.datasets.rlds.transforms import binarize_gripper_actions, rel2abs_gripper_actions

    binary = binarize_gripper_actions(np.array([1.0, 0.6, 0.3, 0.0, 0.02, 0.5, 0.97, 0.4], np.float32))
    # In-between values take the next settled state; a trailing in-between value keeps itself.
    np.testing.assert_allclose(binary.numpy(), [1, 0, 0, 0, 0, 1, 1, 0.4])
    # +1 = close, -1 = open, 0 = keep; before the first command the gripper is in the opposite state.
    absolute = rel2abs_gripper_actions(np.array([0, 0, 1, 0, 0, -1, 0], np.float32))
    np.testing.assert_allclose(absolute.numpy(), [1, 1, 0, 0, 0, 1, 1])
    np.testing.assert_allclose(rel2abs_gripper_actions(np.zeros(3, np.float32)).numpy(), [1, 1, 1])


def _fake_raw_trajectory(name: str, num_steps: int) -> dict:
    """A raw trajectory with the real key layout of an Open-X dataset (values are arbitrary)."""
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    rng = np.random.default_rng(0)

    def floats(*shape: int) -> object:
        return tf.constant(rng.uniform(-1, 1, size=(num_steps, *shape)).astype(np.float32))

    strings = tf.constant(["jpeg bytes"] * num_steps)
    text = tf.constant(["put the spoon in the pot"] * num_steps)
    metadata = {"episode_metadata": {"file_path": tf.constant(["f"] * num_steps)}}
    if name == "bridge_orig":
        return {
            "observation": {"image_0": strings, "image_1": strings, "state": floats(7)},
            # Gripper in [0, 1]; the in-between 0.5 is binarised to the state reached next (0).
            "action": tf.concat([floats(6), tf.constant([[1.0], [1.0], [0.5], [0.0], [0.0], [1.0]])], axis=1),
            "language_instruction": text,
            "traj_metadata": metadata,
        }
    if name == "bridge_oxe":
        return {
            "observation": {
                "image": strings,
                "image_1": strings,
                "state": floats(7),
                "natural_language_instruction": text,
            },
            "action": {
                "world_vector": floats(3),
                "rotation_delta": floats(3),
                "open_gripper": tf.ones(num_steps, tf.bool),
            },
            "traj_metadata": metadata,
        }
    return {  # fractal20220817_data
        "observation": {
            "image": strings,
            "natural_language_instruction": text,
            "base_pose_tool_reached": floats(7),
            "gripper_closed": floats(1),
        },
        "action": {
            "world_vector": floats(3),
            "rotation_delta": floats(3),
            "gripper_closedness_action": tf.constant([[0.0], [1.0], [0.0], [0.0], [-1.0], [0.0]][:num_steps]),
        },
        "traj_metadata": metadata,
    }


@pytest.mark.parametrize(
    ("name", "num_frames"), [("bridge_orig", 4), ("bridge_oxe", 4), ("fractal20220817_data", 6)]
)
def test_open_x_standardisation_reaches_the_frame_format(name: str, num_frames: int) -> None:
    from prismatic.conf.data import DataOptions
    from prismatic.vla.datasets.rlds.trajectories import restructure

    # Bridge drops its all-zero first step and the last step (relabelled from the reached state).
    options = DataOptions(load_proprio=True)
    out = restructure(_fake_raw_trajectory(name, 6), get_dataset_config(name), options)
    assert out["action"].shape == (num_frames, 7) and out["observation"]["proprio"].shape == (num_frames, 8)
    assert out["observation"]["image_primary"].shape == (num_frames,)
    assert out["task"]["language_instruction"].numpy()[0] == b"put the spoon in the pot"
    assert set(np.unique(out["action"].numpy()[:, 6])) <= {0.0, 1.0}
    if (
        name == "bridge_orig"
    ):  # raw gripper after the dropped first step: 1, 0.5, 0, 0, (1: last step dropped)
        np.testing.assert_allclose(out["action"].numpy()[:, 6], [1, 0, 0, 0])
    if name == "fractal20220817_data":  # close at t=1, open at t=4 -> open before t=1
        np.testing.assert_allclose(out["action"].numpy()[:, 6], [1, 0, 0, 0, 1, 1])


def test_a_standardize_fn_branching_on_a_tensor_value_is_a_clear_error(
    toy_data_root, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pipeline functions are traced without AutoGraph: a Python `if` on a tensor names the function and the fix."""
    from prismatic.util.tf import import_tensorflow
    from prismatic.vla.datasets import RLDSDataset
    from prismatic.vla.datasets.rlds.transforms import get_standardize_fn

    tf = import_tensorflow()
    toy_push = get_standardize_fn(DATASET_CONFIGS["toy_push"].standardize_fn)

    def branchy(traj: dict) -> dict:
        traj = toy_push(traj)
        if tf.reduce_any(traj["action"] > 0.5):
            traj["action"] = traj["action"] * 0.5
        return traj

    monkeypatch.setitem(STANDARDIZE_FNS, "test_branchy", branchy)
    monkeypatch.setitem(
        DATASET_CONFIGS,
        "toy_push",
        dataclasses.replace(DATASET_CONFIGS["toy_push"], standardize_fn="test_branchy"),
    )
    with pytest.raises(ConfigError) as error:
        RLDSDataset(
            StreamSpec(toy_data_root, "toy_push", resize_resolution=(8, 8), shuffle_buffer_size=8),
            lambda frame: frame,
        )
    message = str(error.value)
    assert message.startswith("toy_push: its standardize_fn 'test_branchy' uses a tensor as a Python bool"), (
        message
    )
    assert "use tf.cond / tf.where / tf.while_loop" in message
