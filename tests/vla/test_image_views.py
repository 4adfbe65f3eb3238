"""Extra camera views (`image_views`): frames carry `observation.image_<view>` for each requested camera.

Expected images come from the raw episodes on disk, decoded by tfds and resized here as OpenVLA's dlimp
`resize_image` does (lanczos3, antialiased, rounded, clipped), never by the pipeline under test.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets import RLDSDataset
from prismatic.vla.datasets.rlds.configs import get_dataset_config
from prismatic.vla.datasets.rlds.discovery import check_image_views
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.rlds.toy import generate_toy_episode, toy_dataset_dir
from prismatic.vla.datasets.stream_spec import StreamSpec

RES = (32, 32)
VAL = {"resize_resolution": RES, "shuffle_buffer_size": 1, "train": False, "keep_raw_action": True}
TRAIN = {"resize_resolution": RES, "shuffle_buffer_size": 32, "seed": 5, "image_aug": True}
WRIST = ("primary", "wrist")


def _dataset(root: Path, **kwargs: Any) -> RLDSDataset:
    """Mixture "toy" built with `kwargs`, frames untransformed; shared by the tests (a build costs seconds)."""
    return _built(root, tuple(sorted(kwargs.items())))


@functools.cache
def _built(root: Path, kwargs: tuple) -> RLDSDataset:
    return RLDSDataset(StreamSpec(root, "toy", **dict(kwargs)), lambda frame: frame)


def _frames(root: Path, count: int | None = None, **kwargs: Any) -> list[dict]:
    """The first `count` frames (all when None) of the plain tf.data stream of `_dataset(root, **kwargs)`."""
    return _taken(_dataset(root, **kwargs), count)


@functools.cache
def _taken(dataset: RLDSDataset, count: int | None) -> list[dict]:
    return list(itertools.islice(dataset.dataset.as_numpy_iterator(), count))


def _resize(image: np.ndarray) -> np.ndarray:
    """OpenVLA's (dlimp's) `resize_image`: tf.image.resize lanczos3 with antialiasing, rounded and clipped."""
    from prismatic.util.tf import import_tensorflow

    tf = import_tensorflow()
    resized = tf.image.resize(image, RES, method="lanczos3", antialias=True)
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8).numpy()


@functools.cache
def _raw_val_steps(root: Path) -> dict[bytes, dict[str, np.ndarray]]:
    """toy_pick_place's val steps read with tfds (images decoded by tfds), keyed by their action's bytes."""
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(toy_dataset_dir(root, "toy_pick_place")))
    steps = {}
    for episode in tfds.as_numpy(builder.as_dataset(split="val", shuffle_files=False)):
        for step in episode["steps"]:
            steps[step["action"].tobytes()] = {
                "wrist": step["observation"]["wrist_image"],
                "primary": step["observation"]["image"],
            }
    return steps


def test_toy_pick_place_has_a_wrist_camera_unlike_its_primary(toy_data_root: Path) -> None:
    steps = list(_raw_val_steps(toy_data_root).values())
    assert len(steps) == 4 * 20
    built = [s for i in range(4) for s in generate_toy_episode("toy_pick_place", "val", i)["steps"]]
    wrist_built = {s["action"].tobytes(): s["observation"]["wrist_image"] for s in built}
    for action, step in _raw_val_steps(toy_data_root).items():
        assert step["wrist"].shape == (64, 64, 3) and step["wrist"].dtype == np.uint8
        # The JPEG of the builder's own array (lossy: close, not equal), and not a copy of the primary camera.
        assert np.abs(step["wrist"].astype(int) - wrist_built[action]).mean() < 4.0
        assert np.abs(step["wrist"].astype(int) - step["primary"]).mean() > 40.0


def test_frames_carry_the_resized_wrist_image_of_their_step(toy_data_root: Path) -> None:
    frames = _frames(toy_data_root, image_views=WRIST, **VAL)
    raw = _raw_val_steps(toy_data_root)
    names = [f["dataset_name"] for f in frames]
    assert names.count(b"toy_pick_place") == 80 and names.count(b"toy_push") == 64  # the whole val split
    for frame in frames:
        observation = frame["observation"]
        assert set(observation) == {"image_primary", "image_wrist"}
        wrist = observation["image_wrist"]
        assert wrist.shape == (*RES, 3) and wrist.dtype == np.uint8
        if frame["dataset_name"] == b"toy_push":  # no wrist camera in its config: OpenVLA's black padding
            assert not wrist.any()
            continue
        step = raw[frame["raw_action"].tobytes()]  # toy_pick_place's standardisation keeps actions as stored
        np.testing.assert_array_equal(wrist, _resize(step["wrist"]))
        np.testing.assert_array_equal(observation["image_primary"], _resize(step["primary"]))


def test_default_views_are_primary_only_and_unchanged(toy_data_root: Path) -> None:
    plain = _frames(toy_data_root, **VAL)
    with_wrist = _frames(toy_data_root, image_views=WRIST, **VAL)
    assert len(plain) == len(with_wrist)
    for a, b in zip(plain, with_wrist, strict=True):
        assert set(a["observation"]) == {"image_primary"}
        assert a["dataset_name"] == b["dataset_name"] and a["action"].tobytes() == b["action"].tobytes()
        np.testing.assert_array_equal(a["observation"]["image_primary"], b["observation"]["image_primary"])


def test_wrist_images_are_augmented_and_padding_stays_black(toy_data_root: Path) -> None:
    augmented = _frames(toy_data_root, 41, image_views=WRIST, **TRAIN)
    plain = _frames(toy_data_root, 41, image_views=WRIST, **{**TRAIN, "image_aug": False})
    primary_only = _frames(toy_data_root, 41, **TRAIN)
    changed = 0
    for aug, raw, single in zip(augmented, plain, primary_only, strict=True):
        assert aug["action"].tobytes() == raw["action"].tobytes()  # augmentation never changes which frames
        # Adding a view leaves the primary camera's augmentation (and so existing streams) as it was.
        np.testing.assert_array_equal(
            aug["observation"]["image_primary"], single["observation"]["image_primary"]
        )
        if aug["dataset_name"] == b"toy_push":
            assert not aug["observation"]["image_wrist"].any()
        else:
            changed += not np.array_equal(
                aug["observation"]["image_wrist"], raw["observation"]["image_wrist"]
            )
    assert changed > 0.9 * sum(f["dataset_name"] == b"toy_pick_place" for f in plain)


def test_chunked_frames_carry_a_window_of_wrist_images(toy_data_root: Path) -> None:
    frames = _frames(toy_data_root, 40, image_views=WRIST, future_action_window_size=2, **VAL)
    raw = _raw_val_steps(toy_data_root)
    for frame in frames:
        wrist = frame["observation"]["image_wrist"]
        assert wrist.shape == (1, *RES, 3) and wrist.dtype == np.uint8
        if frame["dataset_name"] == b"toy_pick_place":
            np.testing.assert_array_equal(wrist[0], _resize(raw[frame["raw_action"][0].tobytes()]["wrist"]))
        else:
            assert not wrist.any()


def test_shuffle_buffer_estimate_counts_the_wrist_images(toy_data_root: Path) -> None:
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    plain, wrist = _dataset(toy_data_root, **TRAIN), _dataset(toy_data_root, image_views=WRIST, **TRAIN)
    # Mean encoded wrist image of toy_pick_place's train split, read as stored (bytes, not decoded).
    builder = tfds.builder_from_directory(str(toy_dataset_dir(toy_data_root, "toy_pick_place")))
    decoders = {"steps": {"observation": {"wrist_image": tfds.decode.SkipDecoding()}}}
    lengths = [
        len(step["observation"]["wrist_image"])
        for episode in tfds.as_numpy(builder.as_dataset(split="train", decoders=decoders))
        for step in episode["steps"]
    ]
    # Per buffered frame: the wrist bytes of a toy_pick_place frame (none for toy_push), with the allocator's
    # 15% overhead; the estimate samples two trajectories, hence the tolerance.
    weight = wrist.sample_weights["toy_pick_place"]
    expected_gb = TRAIN["shuffle_buffer_size"] * weight * np.mean(lengths) * 1.15 / 2**30
    assert wrist.shuffle_buffer_gb - plain.shuffle_buffer_gb == pytest.approx(expected_gb, rel=0.1)


def test_a_view_no_dataset_has_is_refused(toy_data_root: Path) -> None:
    with pytest.raises(ConfigError) as error:
        make_interleaved_dataset(
            StreamSpec(
                toy_data_root, "toy_push", resize_resolution=RES, shuffle_buffer_size=8, image_views=WRIST
            )
        )
    message = str(error.value)
    assert "'wrist'" in message and "'toy_push'" in message and "toy_push: primary" in message


@pytest.mark.parametrize(
    ("views", "problem"),
    [(("primary", "left_wrist"), "'left_wrist'"), (("primary", "primary"), "twice"), ((), "no view")],
)
def test_bad_view_names_are_refused_with_the_choices(toy_data_root: Path, views: tuple, problem: str) -> None:
    with pytest.raises(ConfigError, match=r"primary, secondary, wrist") as error:
        make_interleaved_dataset(
            StreamSpec(toy_data_root, "toy", resize_resolution=RES, shuffle_buffer_size=8, image_views=views)
        )
    assert problem in str(error.value)


def test_missing_views_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="prismatic.vla.datasets.rlds.discovery")
    configs = [get_dataset_config("toy_pick_place"), get_dataset_config("toy_push")]
    assert check_image_views(["wrist", "primary"], configs, "toy") == ("wrist", "primary")
    padded = [r.getMessage() for r in caplog.records if "black images" in r.getMessage()]
    assert len(padded) == 1 and "toy_push (wrist)" in padded[0] and "toy_pick_place" not in padded[0]


def test_stream_resume_keeps_the_wrist_view(toy_data_root: Path, tmp_path: Path) -> None:
    writer = _dataset(toy_data_root, image_views=WRIST, **TRAIN)
    list(itertools.islice(iter(writer), 21))
    writer.save_stream_state(tmp_path)
    # The views are part of the stream's identity: a stream of other views never restores this snapshot.
    (meta,) = tmp_path.glob("*.json")
    assert json.loads(meta.read_text())["fingerprint"]["image_views"] == ["primary", "wrist"]

    expected = _frames(toy_data_root, 41, image_views=WRIST, **TRAIN)[21:]
    reader = RLDSDataset(StreamSpec(toy_data_root, "toy", image_views=WRIST, **TRAIN), lambda frame: frame)
    assert reader.resume_from(21, tmp_path) == "snapshot"
    for got, want in zip(itertools.islice(iter(reader), 20), expected, strict=True):
        for key in ("image_primary", "image_wrist"):
            np.testing.assert_array_equal(got["observation"][key], want["observation"][key])
        assert got["action"].tobytes() == want["action"].tobytes()
