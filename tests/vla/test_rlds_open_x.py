"""Open-X datasets end to end: real raw layouts -> standard frames; mixtures; missing datasets; memory guard;
image augmentation."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from oxe_synthetic import INSTRUCTION, SPECS, color

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds import mixtures
from prismatic.vla.datasets.rlds.buffer import SHUFFLE_BUFFER_RAM_ENV
from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec

RES = {"resize_resolution": (16, 16)}


def _closest_key(image: np.ndarray, keys: list[str]) -> str:
    mean = image.reshape(-1, 3).mean(0)
    return min(keys, key=lambda k: np.abs(mean - np.asarray(color(k))).sum())


@pytest.mark.parametrize("name", sorted(SPECS))
def test_raw_layout_becomes_the_expected_standard_frame(open_x_root: Path, name: str) -> None:
    spec = SPECS[name]
    # Gripper dims that never move stay as standardised (OpenVLA's default zeroes them): this test is about layout.
    options = DataOptions(unused_dims="zero_normalized")
    pipeline = make_interleaved_dataset(
        StreamSpec(open_x_root, name, train=False, shuffle_buffer_size=1, options=options, **RES)
    )
    frames = list(pipeline.dataset.as_numpy_iterator())

    np.testing.assert_allclose(np.stack([f["action"] for f in frames]), spec.expected_action, atol=1e-4)
    assert {f["task"]["language_instruction"] for f in frames} == {INSTRUCTION.encode()}
    assert {f["dataset_name"] for f in frames} == {name.encode()}
    assert all("proprio" not in f["observation"] for f in frames)  # only with --data.load_proprio
    # The primary image comes from the configured raw key (DROID: either exterior camera, one per episode).
    every_camera = [k for k in _all_image_keys(spec)]
    sources = {_closest_key(f["observation"]["image_primary"], every_camera) for f in frames}
    assert len(sources) == 1 and sources <= set(spec.primary_keys), sources
    stats = pipeline.dataset_statistics[name]
    assert stats["action"]["mask"] == [True] * 6 + [False]
    assert stats["num_transitions"] == 3 * len(spec.expected_action)  # every split, as OpenVLA


def _all_image_keys(spec) -> list[str]:
    steps = spec.episode()["steps"][0]
    return [k for k, v in steps["observation"].items() if isinstance(v, np.ndarray) and v.ndim == 3]


def test_mixture_frequencies_match_balanced_weights(
    open_x_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = [("fractal20220817_data", 2.0), ("viola", 1.0), ("libero_spatial_no_noops", 0.5)]
    monkeypatch.setitem(mixtures.MIXTURES, "synthetic_mix", spec)
    pipeline = make_interleaved_dataset(
        StreamSpec(open_x_root, "synthetic_mix", shuffle_buffer_size=64, seed=1, **RES)
    )
    expected = {"fractal20220817_data": 24 / 42, "viola": 12 / 42, "libero_spatial_no_noops": 6 / 42}
    assert pipeline.sample_weights == pytest.approx(expected)
    names = [f["dataset_name"].decode() for f in itertools.islice(pipeline.dataset.as_numpy_iterator(), 3000)]
    for name, weight in expected.items():
        assert names.count(name) / len(names) == pytest.approx(weight, abs=0.03)


def test_every_openvla_mixture_is_registered() -> None:
    expected = {
        "bridge", "bridge_rt_1", "rtx", "rtx_franka", "oxe_magic_soup", "oxe_magic_soup_plus",
        "oxe_magic_soup_plus_minus", "droid_wipe", "libero_spatial_no_noops", "libero_object_no_noops",
        "libero_goal_no_noops", "libero_10_no_noops", "libero_mix",
        *(f"tdroid_{task}" for task in ("carrot_in_bowl", "pour_corn_in_pot", "flip_pot_upright",
                                        "move_object_onto_plate", "knock_object_over", "cover_object_with_towel")),
    }  # fmt: skip
    assert expected <= set(mixtures.MIXTURES)
    soup = dict(mixtures.get_mixture("oxe_magic_soup_plus"))
    assert len(soup) == 27 and soup["droid"] == 0.06 and soup["fractal20220817_data"] == 0.54087122203


def test_missing_datasets_are_named_or_skipped(open_x_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"Mixture 'rtx': 'jaco_play', 'berkeley_cable_routing', 'roboturk'.*"
                                          r"'toto' not found under.*skip_missing_datasets"):  # fmt: skip
        make_interleaved_dataset(StreamSpec(open_x_root, "rtx", shuffle_buffer_size=8, **RES))
    with caplog.at_level(logging.WARNING):
        pipeline = make_interleaved_dataset(
            StreamSpec(open_x_root, "rtx", shuffle_buffer_size=8, skip_missing_datasets=True, **RES)
        )
    assert set(pipeline.sample_weights) == {
        "fractal20220817_data",
        "kuka",
        "bridge_orig",
        "taco_play",
        "viola",
    }
    assert "'toto' is missing" in caplog.text


def test_memory_guard_refuses_a_buffer_that_does_not_fit(
    open_x_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"largest shuffle_buffer_size that fits is (\d+)") as error:
        make_interleaved_dataset(
            StreamSpec(open_x_root, "viola", shuffle_buffer_size=100_000, shuffle_buffer_ram_gb=0.01, **RES)
        )
    largest = int(re.search(r"fits is (\d+)", str(error.value)).group(1))
    assert 1000 < largest < 100_000
    make_interleaved_dataset(
        StreamSpec(open_x_root, "viola", shuffle_buffer_size=largest, shuffle_buffer_ram_gb=0.01, **RES)
    )
    monkeypatch.setenv(SHUFFLE_BUFFER_RAM_ENV, "0.01")
    with pytest.raises(ConfigError, match=SHUFFLE_BUFFER_RAM_ENV):
        make_interleaved_dataset(StreamSpec(open_x_root, "viola", shuffle_buffer_size=100_000, **RES))


def _images(root: Path, **kwargs: object) -> list[np.ndarray]:
    pipeline = make_interleaved_dataset(
        StreamSpec(root, "toy", resize_resolution=(32, 32), shuffle_buffer_size=16, **kwargs)
    )
    return [
        f["observation"]["image_primary"] for f in itertools.islice(pipeline.dataset.as_numpy_iterator(), 24)
    ]


def test_image_augmentation_is_seeded_and_off_by_default(toy_data_root: Path) -> None:
    augmented = _images(toy_data_root, seed=3, image_aug=True)
    assert all(
        np.array_equal(a, b)
        for a, b in zip(augmented, _images(toy_data_root, seed=3, image_aug=True), strict=True)
    )
    # Another seed: other frames *and* other augmentations; compare the same frames (same stream, aug seed only).
    plain = _images(toy_data_root, seed=3)
    assert not any(np.array_equal(a, b) for a, b in zip(plain, augmented, strict=True))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(plain, _images(toy_data_root, seed=3, image_aug=False), strict=True)
    )
    other = _images(toy_data_root, seed=4, image_aug=True)
    assert not all(np.array_equal(a, b) for a, b in zip(augmented, other, strict=True))


def test_history_and_action_chunks_with_pad_masks(open_x_root: Path) -> None:
    spec = SPECS["fractal20220817_data"]  # 6 steps; arm = P (normalised), gripper [1, 0, 0, 0, 1, 1]
    pipeline = make_interleaved_dataset(
        StreamSpec(
            open_x_root,
            spec.name,
            train=False,
            shuffle_buffer_size=1,
            window_size=2,
            future_action_window_size=2,
            options=DataOptions(
                unused_dims="zero_normalized", load_proprio=True
            ),  # the constant gripper stays 1
            **RES,
        ),
    )
    frames = list(pipeline.dataset.as_numpy_iterator())
    assert len(frames) == 6
    for t, frame in enumerate(frames):
        assert frame["observation"]["image_primary"].shape == (2, 16, 16, 3)
        assert frame["observation"]["proprio"].shape[0] == 2
        assert frame["observation"]["pad_mask"].tolist() == [t >= 1, True]
        # OpenVLA's chunk: actions t-1 .. t+2 (the one before the start repeats the first).
        assert frame["action_pad_mask"].tolist() == [t + k < 6 for k in range(-1, 3)]
        # Past the end: relative dims are 0 in normalised space, the absolute gripper repeats its last value.
        expected = np.stack(
            [spec.expected_action[max(t + k, 0)] if t + k < 6 else [0] * 6 + [1] for k in range(-1, 3)]
        )
        np.testing.assert_allclose(frame["action"], expected, atol=1e-4)
    with pytest.raises(ConfigError, match="window_size"):
        make_interleaved_dataset(
            StreamSpec(open_x_root, spec.name, shuffle_buffer_size=1, window_size=0, **RES)
        )


def test_droid_training_drops_idle_frames(open_x_root: Path) -> None:
    # Step 1 of every synthetic episode has a zero arm action (P[1] = 0), which normalises to 0 here.
    def arms(name: str, bounds: str = "openvla") -> np.ndarray:
        options = DataOptions(zero_action_bounds=bounds)
        pipeline = make_interleaved_dataset(
            StreamSpec(open_x_root, name, shuffle_buffer_size=8, seed=0, options=options, **RES)
        )
        frames = itertools.islice(pipeline.dataset.as_numpy_iterator(), 40)
        return np.stack([f["action"][:6] for f in frames])

    assert not np.any(np.all(np.abs(arms("droid", "statistics")) < 1e-6, axis=1))
    # OpenVLA's filter compares with DROID's own normalised zero (its q01 / q99 constants), which is not this
    # synthetic data's: nothing is dropped, as in OpenVLA.
    assert np.any(np.all(np.abs(arms("droid")) < 1e-6, axis=1))
    assert np.any(np.all(np.abs(arms("libero_spatial_no_noops", "statistics")) < 1e-6, axis=1))  # no filter
