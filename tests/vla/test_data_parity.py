"""Same data, same numbers as OpenVLA: statistics, normalisation, filters, proprio, chunks, NaN, cache, read API.

Every expected value is computed here from the hand-built episodes, re-stating OpenVLA's code in NumPy
(openvla/openvla `prismatic/vla/datasets/rlds/utils/data_utils.py`: `get_dataset_statistics`,
`normalize_action_and_proprio`; `traj_transforms.py`: `chunk_act_obs`; `oxe/utils/droid_utils.py`:
`zero_action_filter`), never by calling the code under test.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds.configs import (
    DATASET_CONFIGS,
    ActionEncoding,
    NormalizationType,
    RLDSDatasetConfig,
    StateEncoding,
)
from prismatic.vla.datasets.stream_spec import StreamSpec

NAME, NAN_NAME = "parity_libero_like", "parity_nan"
RES = {"resize_resolution": (8, 8), "shuffle_buffer_size": 4}
# LIBERO's state layout in OpenVLA's config: EEF_state (6), None (one zero), gripper_state (2) -> 9 dims.
CONFIG = RLDSDatasetConfig(
    name=NAME,
    image_obs_keys={"primary": "image", "secondary": None, "wrist": None},
    state_obs_keys=("EEF_state", None, "gripper_state"),
    state_encoding=StateEncoding.POS_EULER,
    action_encoding=ActionEncoding.EEF_POS,
    standardize_fn="identity",
)
# (split, steps, instruction); "" = an unlabeled trajectory (OpenVLA's skip_unlabeled drops it).
EPISODES = {
    "train": [(6, "pick the cup"), (5, ""), (7, "open the drawer"), (4, "pick the cup")],
    "val": [(5, "push the block"), (3, "")],
}


def _episode_arrays(split: str, index: int, steps: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([7, ord(split[0]), index])
    action = rng.normal(0.0, 0.3, size=(steps, 7)).astype(np.float32)
    action[:, 5] = 0.0  # an unused dimension: min == max == 0
    action[:, 6] = (np.arange(steps) % 3 != 0).astype(np.float32)  # gripper 0 / 1, absolute
    action[1, :6] = 0.0  # an idle step: zero arm action
    eef = rng.normal(0.0, 1.0, size=(steps, 6)).astype(np.float32)
    gripper = rng.uniform(0.0, 0.04, size=(steps, 2)).astype(np.float32)
    return {"action": action, "EEF_state": eef, "gripper_state": gripper}


def _features(tfds) -> object:
    from prismatic.vla.datasets.rlds.writer import rlds_step_features

    f = tfds.features
    step = {
        "observation": f.FeaturesDict(
            {
                "image": f.Image(shape=(8, 8, 3), dtype=np.uint8, encoding_format="png"),
                "EEF_state": f.Tensor(shape=(6,), dtype=np.float32),
                "gripper_state": f.Tensor(shape=(2,), dtype=np.float32),
            }
        ),
        "action": f.Tensor(shape=(7,), dtype=np.float32),
        "language_instruction": f.Text(),
        **rlds_step_features(f),
    }
    return f.FeaturesDict({"steps": f.Dataset(step)})


def _episodes(split: str, arrays: dict) -> list[dict]:
    from prismatic.vla.datasets.rlds.writer import rlds_step_flags

    out = []
    for index, (steps, instruction) in enumerate(EPISODES[split]):
        a = arrays[(split, index)]
        out.append(
            {
                "steps": [
                    {
                        "observation": {
                            "image": np.full((8, 8, 3), 10 * t, np.uint8),
                            "EEF_state": a["EEF_state"][t],
                            "gripper_state": a["gripper_state"][t],
                        },
                        "action": a["action"][t],
                        "language_instruction": instruction,
                        **rlds_step_flags(t, steps),
                    }
                    for t in range(steps)
                ]
            }
        )
    return out


@pytest.fixture(scope="module")
def parity_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A data_root_dir with the hand-built dataset (train + val) and its arrays, by (split, episode index)."""
    from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

    arrays = {
        (split, i): _episode_arrays(split, i, steps)
        for split, episodes in EPISODES.items()
        for i, (steps, _) in enumerate(episodes)
    }
    root = tmp_path_factory.mktemp("parity")
    write_rlds_dataset(root, NAME, _features, {s: (lambda s=s: _episodes(s, arrays)) for s in EPISODES})
    return root, arrays


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DATASET_CONFIGS, NAME, CONFIG)
    monkeypatch.setitem(DATASET_CONFIGS, NAN_NAME, dataclasses.replace(CONFIG, name=NAN_NAME))


def _openvla_order(root: Path, name: str, split: str = "all") -> list[dict[str, np.ndarray]]:
    """The episodes as OpenVLA's statistics pass reads them: dlimp's `from_rlds(builder, split, shuffle=False)`,
    i.e. tfds with an AUTOTUNE file interleave (records of several files alternate in blocks). Read with tfds
    directly; float32 sums depend on this order."""
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(root / name / "1.0.0"))
    read_config = tfds.ReadConfig(
        skip_prefetch=True,
        num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
        interleave_cycle_length=tf.data.AUTOTUNE,
    )
    episodes = []
    for episode in tfds.as_numpy(
        builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
    ):
        steps = list(episode["steps"])
        a = {
            "action": np.stack([s["action"] for s in steps]),
            "EEF_state": np.stack([s["observation"]["EEF_state"] for s in steps]),
            "gripper_state": np.stack([s["observation"]["gripper_state"] for s in steps]),
        }
        episodes.append({**a, "proprio": _proprio(a)})
    return episodes


def _concat(episodes: list[dict], key: str) -> np.ndarray:
    return np.concatenate([e[key] for e in episodes])


def _proprio(a: dict) -> np.ndarray:
    return np.concatenate(
        [a["EEF_state"], np.zeros((len(a["action"]), 1), np.float32), a["gripper_state"]], 1
    )


def _quantile_numpy1(x: np.ndarray, q: float) -> np.ndarray:
    """np.quantile(x, q, axis=0) of float32 data under NumPy 1.x (OpenVLA's pinned NumPy): neighbours'
    difference in float32, then interpolated in float64 (its `_lerp`, from the upper neighbour when the weight is
    >= 0.5). Pinned to NumPy 1.26.4's own output by `test_quantiles_are_numpy1s`."""
    columns = np.sort(x, axis=0)
    position = (x.shape[0] - 1) * q
    i = int(position)
    weight = position - i
    lower, upper = columns[i], columns[min(i + 1, len(columns) - 1)]
    step = (upper - lower).astype(np.float64)
    if weight >= 0.5:
        return upper.astype(np.float64) - step * (1 - weight)
    return lower.astype(np.float64) + step * weight


def _openvla_summary(x: np.ndarray) -> dict[str, list[float]]:
    """OpenVLA's get_dataset_statistics on a float32 [N, D] array."""
    return {
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "max": x.max(0).tolist(),
        "min": x.min(0).tolist(),
        "q01": _quantile_numpy1(x, 0.01).tolist(),
        "q99": _quantile_numpy1(x, 0.99).tolist(),
    }


# np.quantile(x, q, axis=0) printed by NumPy 1.26.4 (float64 results) for the array of `_golden_array`.
NUMPY1_GOLDEN = {
    0.01: [
        "-0x1.9af2c75c28f5cp-1",
        "-0x1.7c4cbd851eb85p+1",
        "-0x1.bfb3ddae147aep-7",
        "-0x1.6666673333333p+3",
    ],
    0.99: ["0x1.e8121970a3d72p-2", "0x1.98a7c9d70a3d7p+1", "0x1.e7460a8f5c28fp-7", "0x1.4f3b6451eb852p+3"],
}


def _golden_array() -> np.ndarray:
    rng = np.random.RandomState(3)  # the legacy generator: the same numbers under NumPy 1 and 2
    x = (rng.standard_normal((37, 4)) * np.array([0.3, 1.7, 0.01, 5.0])).astype(np.float32)
    x[:, 3] = np.round(x[:, 3], 1)  # ties
    return x


def test_quantiles_are_numpy1s() -> None:
    from prismatic.vla.datasets.rlds.statistics import numpy1_quantile

    x = _golden_array()
    for q, golden in NUMPY1_GOLDEN.items():
        expected = [float.fromhex(h) for h in golden]
        assert numpy1_quantile(x, q).tolist() == expected
        assert _quantile_numpy1(x, q).tolist() == expected
        assert np.quantile(x, q, axis=0).tolist() != expected  # NumPy 2's float32 result differs


def _openvla_normalize(x: np.ndarray, stats: dict, mask: np.ndarray) -> np.ndarray:
    """OpenVLA's BOUNDS_Q99 with its statistics as float64 arrays applied to a float32 tensor (TF casts the
    float64 operands to float32: `x - q01` uses f32(q01), the denominator is f32(q99 - q01 + 1e-8))."""
    low, high = np.array(stats["q01"]), np.array(stats["q99"])
    out = np.clip(
        np.float32(2) * (x - low.astype(np.float32)) / (high - low + 1e-8).astype(np.float32) - np.float32(1),
        -1,
        1,
    )
    out = np.where(mask, out, x)
    return np.where(np.array(stats["min"]) == np.array(stats["max"]), np.float32(0), out).astype(np.float32)


# === 1. Statistics ===


def test_statistics_equal_openvlas_over_all_splits(parity_root: tuple[Path, dict]) -> None:
    from prismatic.vla.datasets.rlds.reading import compute_dataset_statistics

    root, _ = parity_root
    stats = compute_dataset_statistics(root, NAME, options=DataOptions(load_proprio=True))
    # OpenVLA reads split "all" and counts every trajectory, the unlabeled ones included.
    episodes = _openvla_order(root, NAME)
    action, proprio = _concat(episodes, "action"), _concat(episodes, "proprio")
    assert stats["num_transitions"] == 6 + 5 + 7 + 4 + 5 + 3 == 30
    assert stats["num_trajectories"] == 6
    assert {k: stats["action"][k] for k in _openvla_summary(action)} == _openvla_summary(action)
    assert stats["proprio"] == _openvla_summary(proprio)
    assert len(stats["proprio"]["mean"]) == 9 and stats["proprio"]["max"][6] == 0.0  # the None column
    assert stats["action"]["mask"] == [True] * 6 + [False]
    # float32 reductions, as OpenVLA: the mean is the float32 result, not the float64 one rounded.
    assert stats["action"]["mean"] == action.mean(0).tolist()
    float64_mean = action.astype(np.float64).mean(0).tolist()
    assert any(a != b for a, b in zip(stats["action"]["mean"], float64_mean, strict=True))


def test_statistics_train_only_and_without_proprio(parity_root: tuple[Path, dict]) -> None:
    from prismatic.vla.datasets.rlds.reading import compute_dataset_statistics

    root, _ = parity_root
    train_only = compute_dataset_statistics(root, NAME, options=DataOptions(statistics_split="train"))
    action = _concat(_openvla_order(root, NAME, "train"), "action")
    assert train_only["num_transitions"] == 22 and train_only["num_trajectories"] == 4
    assert train_only["action"]["q99"] == _quantile_numpy1(action, 0.99).tolist()
    # Without proprio (OpenVLA's VLA training: load_proprio=False) its statistics are those of zeros_like(action).
    assert train_only["proprio"] == {k: [0.0] * 7 for k in ("mean", "std", "max", "min", "q01", "q99")}


# === 2. Normalisation arithmetic ===


def test_normalisation_uses_openvlas_mixed_precision() -> None:
    from prismatic.vla.datasets.rlds.normalization import normalize_np, normalize_tf

    stats = {
        "q01": [0.1, 0.2, 0.0],
        "q99": [0.9000001, 1.3, 1.0],
        "min": [0.0, 0.0, 1.0],
        "max": [1.0, 2.0, 1.0],
    }
    x = np.array([[0.3, 0.7, 1.0], [0.55, 1.05, 1.0], [0.95, 0.1, 1.0]], np.float32)
    mask = np.array([True, True, False])
    expected = _openvla_normalize(x, stats, mask)
    got_np = normalize_np(x, stats, NormalizationType.BOUNDS_Q99, mask)
    got_tf = normalize_tf(x, stats, NormalizationType.BOUNDS_Q99, mask).numpy()
    np.testing.assert_array_equal(got_np, expected)
    np.testing.assert_array_equal(got_tf, expected)
    # The float64 denominators matter: all-float32 arithmetic gives another value for some element.
    low32, high32 = np.float32(stats["q01"]), np.float32(stats["q99"])
    all_f32 = np.clip(np.float32(2) * (x - low32) / (high32 - low32 + np.float32(1e-8)) - 1, -1, 1)
    assert (all_f32[:, :2] != expected[:, :2]).any()
    # min == max: 0 after normalising, also for the masked-off dimension (OpenVLA: a gripper that never moves).
    assert (got_np[:, 2] == 0).all()
    kept = normalize_np(x, stats, NormalizationType.BOUNDS_Q99, mask, unused_dims="zero_normalized")
    assert (kept[:, 2] == 1.0).all()


def test_normal_normalisation_as_openvla() -> None:
    from prismatic.vla.datasets.rlds.normalization import normalize_np, normalize_tf

    stats = {"mean": [0.1, 2.0], "std": [0.3000001, 0.0], "min": [0.0, 2.0], "max": [1.0, 2.0]}
    x = np.array([[0.7, 2.0], [-0.2, 2.0]], np.float32)
    mean, std = np.array(stats["mean"]), np.array(stats["std"])
    expected = (x - mean.astype(np.float32)) / (std + 1e-8).astype(np.float32)  # no zeroing under NORMAL
    np.testing.assert_array_equal(normalize_np(x, stats, NormalizationType.NORMAL), expected)
    np.testing.assert_array_equal(normalize_tf(x, stats, NormalizationType.NORMAL).numpy(), expected)


def _val_frames(root: Path, **options: object) -> list[dict]:
    from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset

    pipeline = make_interleaved_dataset(
        StreamSpec(root, NAME, train=False, options=DataOptions(**options), **RES)
    )
    return list(pipeline.dataset.as_numpy_iterator())


def test_val_frames_bit_identical_and_unlabeled_skipped(
    parity_root: tuple[Path, dict], caplog: pytest.LogCaptureFixture
) -> None:
    root, arrays = parity_root
    episodes = _openvla_order(root, NAME)
    action_stats = _openvla_summary(_concat(episodes, "action"))
    proprio_stats = _openvla_summary(_concat(episodes, "proprio"))
    with caplog.at_level(logging.INFO):
        frames = _val_frames(root, load_proprio=True)
    # The val split's second trajectory has no instruction: skipped; the first one's 5 frames remain.
    assert len(frames) == 5
    assert {f["task"]["language_instruction"] for f in frames} == {b"push the block"}
    mask = np.array([True] * 6 + [False])
    np.testing.assert_array_equal(
        np.stack([f["action"] for f in frames]),
        _openvla_normalize(arrays[("val", 0)]["action"], action_stats, mask),
    )
    proprio = np.stack([f["observation"]["proprio"] for f in frames])
    assert proprio.shape == (5, 9)
    np.testing.assert_array_equal(
        proprio, _openvla_normalize(_proprio(arrays[("val", 0)]), proprio_stats, True)
    )
    assert "2 of 6 trajectories" in caplog.text and "skip" in caplog.text
    # Kept on request; without proprio the frames carry none (OpenVLA's load_proprio=False).
    kept = _val_frames(root, skip_unlabeled=False)
    assert len(kept) == 8 and "proprio" not in kept[0]["observation"]


# === 5. Chunks ===


def test_chunks_pad_in_normalised_space_or_drop(parity_root: tuple[Path, dict]) -> None:
    from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset

    root, arrays = parity_root
    stats = _openvla_summary(_concat(_openvla_order(root, NAME), "action"))
    normalized = _openvla_normalize(arrays[("val", 0)]["action"], stats, np.array([True] * 6 + [False]))
    chunked = make_interleaved_dataset(
        StreamSpec(root, NAME, train=False, future_action_window_size=2, options=DataOptions(), **RES)
    )
    frames = list(chunked.dataset.as_numpy_iterator())
    assert len(frames) == 5
    for t, frame in enumerate(frames):
        expected = np.stack([normalized[min(t + k, 4)] for k in range(3)])
        past_end = [t + k > 4 for k in range(3)]
        expected[past_end, :6] = 0.0  # relative dims: 0 in normalised space (not the normalised raw 0)
        np.testing.assert_array_equal(frame["action"], expected)  # absolute gripper: the last action repeated
        assert frame["action_pad_mask"].tolist() == [not p for p in past_end]
    dropped = make_interleaved_dataset(
        StreamSpec(
            root, NAME, train=False, future_action_window_size=2, options=DataOptions(chunk_end="drop"), **RES
        )
    )
    frames = list(dropped.dataset.as_numpy_iterator())
    assert len(frames) == 3 and all(f["action_pad_mask"].all() for f in frames)
    np.testing.assert_array_equal(frames[2]["action"], normalized[2:5])


# === 6. Zero-action filter ===


def test_zero_action_filter_as_openvlas_droid_filter() -> None:
    from prismatic.util.tf import import_tensorflow
    from prismatic.vla.datasets.rlds.filters import drop_zero_action_frames, zero_action_reference

    q01 = np.array([-0.7776297926902771, -0.5803514122962952, -0.5795090794563293, -0.6464047729969025,
                    -0.7041108310222626, -0.8895104378461838], np.float32)  # fmt: skip
    q99 = np.array([0.7597932070493698, 0.5726242214441299, 0.7351000607013702, 0.6705610305070877,
                    0.6464948207139969, 0.8897542208433151], np.float32)  # fmt: skip
    norm0 = np.float32(2) * (np.float32(0) - q01) / (q99 - q01 + np.float32(1e-8)) - np.float32(1)
    idle = np.concatenate([norm0, [1.0]]).astype(np.float32)
    chunks = np.stack([np.stack([idle, idle]) for _ in range(4)])  # 4 frames, chunks of 2 actions
    chunks[1, 0, 2] += 2e-5  # beyond the 1e-5 tolerance: kept
    chunks[2, 1, 0] += 5e-6  # within it: dropped
    chunks[3, 1, 4] -= 1e-3  # the chunk's second action moves: kept
    chunks[0, :, 6] = 0.0  # the gripper does not count: dropped
    dims, reference = zero_action_reference({}, DATASET_CONFIGS["droid"], "openvla")
    tf = import_tensorflow()
    traj = {"action": tf.constant(chunks), "index": tf.range(4)}
    kept = drop_zero_action_frames(traj, dims, reference)
    assert kept["index"].numpy().tolist() == [1, 3]


def test_zero_action_filter_with_dataset_bounds_in_val(parity_root: tuple[Path, dict], monkeypatch) -> None:
    root, arrays = parity_root
    monkeypatch.setitem(DATASET_CONFIGS, NAME, dataclasses.replace(CONFIG, drop_zero_action_frames=True))
    frames = _val_frames(root, zero_action_bounds="statistics")
    # Step 1 of every episode has a zero arm action: gone from the val stream too; the others stay.
    raw = arrays[("val", 0)]["action"]
    assert len(frames) == 4
    stats = _openvla_summary(_concat(_openvla_order(root, NAME), "action"))
    expected = _openvla_normalize(raw[[0, 2, 3, 4]], stats, np.array([True] * 6 + [False]))
    np.testing.assert_array_equal(np.stack([f["action"] for f in frames]), expected)
    # With OpenVLA's DROID constants this dataset's normalised zero is not DROID's: nothing is dropped.
    assert len(_val_frames(root)) == 5


# === 7. Non-finite values ===


@pytest.fixture(scope="module")
def nan_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

    arrays = {("train", i): _episode_arrays("train", i, n) for i, (n, _) in enumerate(EPISODES["train"])}
    arrays.update({("val", i): _episode_arrays("val", i, n) for i, (n, _) in enumerate(EPISODES["val"])})
    arrays[("train", 2)]["action"][3, 1] = np.nan
    root = tmp_path_factory.mktemp("nan")
    write_rlds_dataset(root, NAN_NAME, _features, {s: (lambda s=s: _episodes(s, arrays)) for s in EPISODES})
    return root, arrays


def test_nan_stops_statistics_naming_the_episode_or_is_dropped(nan_root: tuple[Path, dict]) -> None:
    from prismatic.vla.datasets.rlds.reading import compute_dataset_statistics

    root, arrays = nan_root
    with pytest.raises(ConfigError) as error:
        compute_dataset_statistics(root, NAN_NAME)
    message = str(error.value)
    episode = "episode 'parity_nan-train.tfrecord-00000-of-00001__"
    for part in (f"'{NAN_NAME}'", "split 'all'", episode, "'action'", "step 3", "dimension(s) [1]"):
        assert part in message, (part, message)
    stats = compute_dataset_statistics(root, NAN_NAME, options=DataOptions(nonfinite="drop"))
    action = _concat(_openvla_order(root, NAN_NAME), "action")
    action = action[np.isfinite(action).all(1)]
    assert (
        stats["num_transitions"] == 29 and stats["action"]["q01"] == _quantile_numpy1(action, 0.01).tolist()
    )
    assert all(np.isfinite(v).all() for v in stats["action"].values())


# === 8. Cache ===


def test_cache_key_covers_data_files_and_recompute(
    parity_root: tuple[Path, dict], caplog: pytest.LogCaptureFixture
) -> None:
    from prismatic.vla.datasets.rlds.reading import compute_dataset_statistics

    root, _ = parity_root
    options = DataOptions(statistics_split="train")
    first = compute_dataset_statistics(root, NAME, options=options)
    with caplog.at_level(logging.INFO):
        assert compute_dataset_statistics(root, NAME, options=options) == first
    assert "read from cache" in caplog.text
    caplog.clear()
    shard = next((root / NAME / "1.0.0").glob("*train.tfrecord*"))
    stat = shard.stat()
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, newer file: not trusted
    with caplog.at_level(logging.INFO):
        assert compute_dataset_statistics(root, NAME, options=options) == first
    assert "computing (data files modified " + shard.name in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO):
        compute_dataset_statistics(root, NAME, options=options, recompute=True)
    assert "computing (--recompute_stats)" in caplog.text


# === 9. Read API ===


def test_read_trajectories_gives_standardised_steps_with_ids(parity_root: tuple[Path, dict]) -> None:
    from prismatic.vla.datasets.rlds.reading import read_trajectories

    root, arrays = parity_root
    trajectories = list(read_trajectories(root, NAME, split="val"))
    assert sorted(t["episode_id"] for t in trajectories) == [
        f"{NAME}-val.tfrecord-00000-of-00001__{i}" for i in range(2)
    ]
    by_instruction = {instruction: i for i, (_, instruction) in enumerate(EPISODES["val"])}
    for traj in trajectories:
        i = by_instruction[traj["language_instruction"][0]]
        np.testing.assert_array_equal(traj["action"], arrays[("val", i)]["action"])
        np.testing.assert_array_equal(traj["proprio"], _proprio(arrays[("val", i)]))
        assert traj["timestep"].tolist() == list(range(EPISODES["val"][i][0]))
        assert traj["language_instruction"] == [EPISODES["val"][i][1]] * EPISODES["val"][i][0]
    with pytest.raises(ConfigError, match="valid choices are train, val, all"):
        next(read_trajectories(root, NAME, split="test"))


def test_a_dataset_with_no_labeled_trajectory_is_an_error(tmp_path: Path, monkeypatch) -> None:
    """OpenVLA's filter would leave nothing and training would wait forever: say so instead."""
    from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
    from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

    name = "parity_unlabeled"
    monkeypatch.setitem(DATASET_CONFIGS, name, dataclasses.replace(CONFIG, name=name))
    arrays = {("train", i): _episode_arrays("train", i, n) for i, (n, _) in enumerate(EPISODES["train"])}
    monkeypatch.setitem(EPISODES, "train", [(n, "") for n, _ in EPISODES["train"]])
    write_rlds_dataset(tmp_path, name, _features, {"train": lambda: _episodes("train", arrays)})
    with pytest.raises(
        ConfigError, match="all 4 trajectories have only empty instructions.*skip_unlabeled false"
    ):
        make_interleaved_dataset(StreamSpec(tmp_path, name, **RES))
    kept = make_interleaved_dataset(
        StreamSpec(tmp_path, name, options=DataOptions(skip_unlabeled=False), **RES)
    )
    assert next(kept.dataset.as_numpy_iterator())["task"]["language_instruction"] == b""
