"""Dataset statistics (values, cache, saved layout) and action / proprio normalisation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from rlds_helpers import q99_normalize, raw_actions_and_proprio

from prismatic.conf.data import DataOptions
from prismatic.vla.datasets.rlds import reading as dataset_module
from prismatic.vla.datasets.rlds import statistics as statistics_module
from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS, NormalizationType
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.rlds.normalization import normalize_np, normalize_tf, unnormalize_np
from prismatic.vla.datasets.rlds.statistics import load_or_compute_statistics, save_dataset_statistics
from prismatic.vla.datasets.rlds.toy import toy_dataset_dir
from prismatic.vla.datasets.stream_spec import StreamSpec

PIPELINE = {"resize_resolution": (32, 32), "shuffle_buffer_size": 16}
# Train-split statistics with proprio: what these tests compare against the train episodes.
TRAIN_STATS = DataOptions(statistics_split="train", load_proprio=True)


def _numpy_stats(episodes: list[dict[str, np.ndarray]], key: str) -> dict[str, np.ndarray]:
    return _numpy_summary(np.concatenate([e[key] for e in episodes]).astype(np.float64))


def _numpy_summary(x: np.ndarray) -> dict[str, np.ndarray]:
    return {
        "mean": x.mean(0),
        "std": x.std(0),
        "max": x.max(0),
        "min": x.min(0),
        "q01": np.quantile(x, 0.01, axis=0),
        "q99": np.quantile(x, 0.99, axis=0),
    }


@pytest.mark.parametrize("name", ["toy_pick_place", "toy_push"])
def test_statistics_match_numpy_on_raw_episodes(toy_data_root: Path, name: str) -> None:
    stats = make_interleaved_dataset(
        StreamSpec(toy_data_root, name, options=TRAIN_STATS, **PIPELINE)
    ).dataset_statistics[name]
    episodes = raw_actions_and_proprio(toy_dataset_dir(toy_data_root, name), "train")
    assert stats["num_trajectories"] == 24
    assert (
        stats["num_transitions"]
        == sum(len(e["action"]) for e in episodes)
        == 24 * (20 if "pick" in name else 16)
    )
    for key in ("action", "proprio"):
        expected = _numpy_stats(episodes, key)
        for stat, value in expected.items():
            np.testing.assert_allclose(stats[key][stat], value, rtol=1e-4, atol=1e-6, err_msg=f"{key}.{stat}")
    assert stats["action"]["mask"] == [True] * 6 + [False]
    # Gripper after standardisation: absolute, 1 = open, 0 = closed (toy_push stored it as +1 = close in [-1, 1]).
    assert stats["action"]["min"][6] == 0.0 and stats["action"]["max"][6] == 1.0


def test_val_frames_are_bounds_q99_normalised(toy_data_root: Path) -> None:
    name = "toy_push"
    pipeline = make_interleaved_dataset(
        StreamSpec(toy_data_root, name, train=False, options=TRAIN_STATS, **PIPELINE)
    )
    frames = list(pipeline.dataset.as_numpy_iterator())
    train = raw_actions_and_proprio(toy_dataset_dir(toy_data_root, name), "train")
    val = raw_actions_and_proprio(toy_dataset_dir(toy_data_root, name), "val")
    action_stats, proprio_stats = _numpy_stats(train, "action"), _numpy_stats(train, "proprio")

    # The val pass reads the episodes in file order, flattened: compare frame by frame.
    expected_action = q99_normalize(
        np.concatenate([e["action"] for e in val]), action_stats["q01"], action_stats["q99"], np.arange(7) < 6
    )
    expected_proprio = q99_normalize(
        np.concatenate([e["proprio"] for e in val]),
        proprio_stats["q01"],
        proprio_stats["q99"],
        np.ones(8, bool),
    )
    got_action = np.stack([f["action"] for f in frames])
    assert got_action.shape == (4 * 16, 7)
    np.testing.assert_allclose(got_action, expected_action, atol=1e-4)
    np.testing.assert_allclose(
        np.stack([f["observation"]["proprio"] for f in frames]), expected_proprio, atol=1e-4
    )
    assert np.abs(got_action[:, :6]).max() <= 1.0
    assert set(np.unique(got_action[:, 6])) == {0.0, 1.0}  # masked-off gripper passes through


def test_normalization_formulas() -> None:
    stats = {"mean": [1.0, 2.0], "std": [2.0, 4.0], "min": [0.0, -1.0], "max": [2.0, 1.0], "q01": [0.5, -0.5],
             "q99": [1.5, 0.5]}  # fmt: skip
    x = np.array([[1.0, 0.25], [3.0, -2.0]], np.float32)
    np.testing.assert_allclose(
        normalize_np(x, stats, NormalizationType.BOUNDS_Q99), [[0.0, 0.5], [1.0, -1.0]], atol=1e-6
    )
    np.testing.assert_allclose(
        normalize_np(x, stats, NormalizationType.BOUNDS), [[0.0, 0.25], [1.0, -1.0]], atol=1e-6
    )
    np.testing.assert_allclose(
        normalize_np(x, stats, NormalizationType.NORMAL), [[0.0, -0.4375], [1.0, -1.0]], atol=1e-6
    )
    masked = normalize_np(x, stats, NormalizationType.NORMAL, mask=[True, False])
    np.testing.assert_allclose(masked[:, 1], x[:, 1])
    for norm in NormalizationType:
        np.testing.assert_allclose(
            normalize_tf(x, stats, norm, [True, False]).numpy(), normalize_np(x, stats, norm, [True, False])
        )
    y = normalize_np(np.array([[0.7, 0.1]], np.float32), stats, NormalizationType.BOUNDS_Q99)
    np.testing.assert_allclose(
        unnormalize_np(y, stats, NormalizationType.BOUNDS_Q99), [[0.7, 0.1]], atol=1e-6
    )


def test_statistics_are_cached_and_reused(toy_data_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    name = "toy_pick_place"
    dataset_dir = toy_dataset_dir(toy_data_root, name)
    first = make_interleaved_dataset(StreamSpec(toy_data_root, name, **PIPELINE)).dataset_statistics[name]
    cached = sorted(dataset_dir.glob("dataset_statistics_*.json"))
    assert cached, "statistics were not cached beside the data"

    def no_recompute(*args: object, **kwargs: object) -> None:
        raise AssertionError("statistics recomputed although a cache file exists")

    monkeypatch.setattr(dataset_module, "compute_statistics", no_recompute)
    assert (
        make_interleaved_dataset(StreamSpec(toy_data_root, name, **PIPELINE)).dataset_statistics[name]
        == first
    )

    # Config fields the numbers do not depend on (normalisation type, masks) reuse the cache...
    monkeypatch.undo()
    changed = dataclasses.replace(DATASET_CONFIGS[name], action_normalization_type=NormalizationType.NORMAL)
    monkeypatch.setitem(DATASET_CONFIGS, name, changed)
    make_interleaved_dataset(StreamSpec(toy_data_root, name, **PIPELINE))
    assert set(dataset_dir.glob("dataset_statistics_*.json")) == set(cached)
    # ... one they depend on (the state keys) is a different hash: computed again, into a new file.
    changed = dataclasses.replace(DATASET_CONFIGS[name], state_obs_keys=("state", None))
    monkeypatch.setitem(DATASET_CONFIGS, name, changed)
    make_interleaved_dataset(StreamSpec(toy_data_root, name, **PIPELINE))
    assert len(set(dataset_dir.glob("dataset_statistics_*.json")) - set(cached)) == 1


def test_statistics_fall_back_to_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(statistics_module, "FALLBACK_CACHE_DIR", tmp_path / "cache")
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")  # a file: nothing can be created below it
    key = {"name": "abc"}
    stats, path = load_or_compute_statistics(blocker / "data", key, lambda: {"num_transitions": 3})
    assert path.parent == tmp_path / "cache" and path.name.startswith("dataset_statistics_")
    assert json.loads(path.read_text()) == stats == {"num_transitions": 3, "_cache_key": key}
    again, _ = load_or_compute_statistics(blocker / "data", key, lambda: pytest.fail("recomputed"))
    assert again == stats


def test_save_dataset_statistics_layout(toy_data_root: Path, tmp_path: Path) -> None:
    statistics = make_interleaved_dataset(StreamSpec(toy_data_root, "toy", **PIPELINE)).dataset_statistics
    statistics["toy_push"]["action"]["q99"] = np.asarray(
        statistics["toy_push"]["action"]["q99"]
    )  # arrays are fine
    path = save_dataset_statistics(statistics, tmp_path)
    assert path == tmp_path / "dataset_statistics.json"
    saved = json.loads(path.read_text())
    assert sorted(saved) == ["toy_pick_place", "toy_push"]
    for stats in saved.values():
        assert set(stats) == {"action", "proprio", "num_transitions", "num_trajectories"}
        assert set(stats["action"]) == {"mean", "std", "max", "min", "q01", "q99", "mask"}
        assert set(stats["proprio"]) == {"mean", "std", "max", "min", "q01", "q99"}
        assert all(isinstance(v, float) for v in stats["action"]["q99"]) and len(stats["action"]["q99"]) == 7
        assert len(stats["proprio"]["q01"]) == 7 and isinstance(stats["num_transitions"], int)
        assert stats["proprio"]["q99"] == [0.0] * 7  # no proprio loaded: OpenVLA's zeros_like(action)
