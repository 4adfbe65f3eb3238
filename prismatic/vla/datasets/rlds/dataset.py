"""The `tf.data` pipeline: RLDS datasets on disk -> one deterministic, rank-sharded stream of training frames.

Per dataset (`<data_root_dir>/<name>/<highest version>/`, read with `tfds.builder_from_directory`):
    read this rank's share of the trajectories (images stay JPEG bytes; train: forever, file order reshuffled
    every epoch) -> standardise (`transforms.py`) -> restructure to the common frame format -> normalise
    action + proprio with the cached train statistics -> flatten trajectories into frames.
Then across datasets: weighted `sample_from_datasets` (weights balanced by size, `mixtures.py`) -> frame-level
shuffle buffer (train) -> skip `start_sample` frames -> decode + resize (+ augment) the images.

Frames are shuffled while their images are still encoded (a buffer of JPEG bytes is ~50x smaller), and skipped
before decoding, so resuming at frame N costs reading, not decoding, the first N frames.

Determinism: every random choice is seeded from (seed, rank) and image augmentation uses stateless ops keyed by
the frame's position in the stream, so a given (seed, rank, world_size) always yields the same frames (also
when the same dataset object is iterated again), and `start_sample=N` yields exactly that stream minus its
first N frames. Parallel maps keep their order (`options.deterministic = True`).

Each yielded frame (as NumPy via `.as_numpy_iterator()`):
    {"observation": {"image_primary": uint8[H, W, 3], "proprio": float32[8]},
     "task": {"language_instruction": bytes}, "action": float32[7] (normalised), "dataset_name": bytes}
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig, get_dataset_config
from prismatic.vla.datasets.rlds.mixtures import balance_sample_weights, get_mixture
from prismatic.vla.datasets.rlds.normalization import normalize_tf
from prismatic.vla.datasets.rlds.statistics import (
    compute_statistics,
    load_or_compute_statistics,
    statistics_hash,
    with_action_mask,
)
from prismatic.vla.datasets.rlds.transforms import get_standardize_fn

STATE_DIM = 8  # proprio is padded to 8 dims by every state encoding
_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")
_AUGMENT_SCALE = 0.9  # random resized crop keeps 90% of the area, square (OpenVLA's settings)


@dataclass
class RLDSPipeline:
    """What `make_interleaved_dataset` builds.

    Attributes:
        dataset: the `tf.data.Dataset` of frames (see module docstring); infinite when training.
        dataset_statistics: {dataset_name: statistics in OpenVLA's layout, with `action.mask`}.
        sample_weights: {dataset_name: probability that a frame comes from it}.
        num_transitions: train transitions summed over the mixture (one "epoch" of the mixture).
    """

    dataset: Any
    dataset_statistics: dict[str, dict[str, Any]]
    sample_weights: dict[str, float]
    num_transitions: int


# === Locating and reading datasets ===


def find_dataset_dir(data_root_dir: Path, name: str) -> Path:
    """`<data_root_dir>/<name>/<highest version>`, the folder tfds wrote.

    Raises:
        ConfigError: `data_root_dir` is missing, or holds no prepared version of `name` (the message lists what
            is there).
    """
    root = Path(data_root_dir)
    if not root.is_dir():
        raise ConfigError(
            f"RLDS data_root_dir '{root}' does not exist. Point it at a folder of RLDS datasets, or build the toy "
            f"datasets there with `python vla_scripts/build_toy_dataset.py --data_root_dir {root}`."
        )
    dataset_root = root / name
    versions = (
        [
            d
            for d in dataset_root.iterdir()
            if d.is_dir() and _VERSION_RE.fullmatch(d.name) and (d / "dataset_info.json").is_file()
        ]
        if dataset_root.is_dir()
        else []
    )
    if not versions:
        present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise ConfigError(
            f"RLDS dataset '{name}' not found under data_root_dir '{root}' (expected '{dataset_root}/<version>/"
            f"dataset_info.json'). Datasets present: {', '.join(present) or 'none'}."
        )
    return max(versions, key=lambda d: tuple(int(p) for p in d.name.split(".")))


def _skip_image_decoding(features: Any) -> Any:
    """A tfds `decoders` tree that keeps every Image feature as encoded bytes (decoded later, after shuffling)."""
    import_tensorflow()
    import tensorflow_datasets as tfds

    if isinstance(features, tfds.features.Image):
        return tfds.decode.SkipDecoding()
    if isinstance(features, tfds.features.Dataset):
        return _skip_image_decoding(features.feature)
    if isinstance(features, tfds.features.FeaturesDict):
        decoders = {k: _skip_image_decoding(v) for k, v in features.items()}
        return {k: v for k, v in decoders.items() if v is not None} or None
    return None


def _episode_to_trajectory(episode: dict[str, Any]) -> dict[str, Any]:
    """RLDS episode -> trajectory: steps as [T, ...] tensors, other episode fields broadcast to T under
    `traj_metadata` (so that standardisation functions can slice every leaf along time)."""
    tf = import_tensorflow()
    steps = episode["steps"].batch(2**31 - 1).get_single_element()
    num_steps = tf.shape(tf.nest.flatten(steps)[0])[0]
    metadata = {k: v for k, v in episode.items() if k != "steps"}
    steps["traj_metadata"] = tf.nest.map_structure(lambda x: tf.repeat(x[None], num_steps, axis=0), metadata)
    return steps


def _restructure(traj: dict[str, Any], config: RLDSDatasetConfig) -> dict[str, Any]:
    """Standardise one raw trajectory and keep what the frame format needs (still un-normalised)."""
    tf = import_tensorflow()
    traj = get_standardize_fn(config.standardize_fn)(traj)
    for key in ("observation", "action", config.language_key):
        if key not in traj:
            raise ValueError(
                f"{config.name}: standardised trajectory has no '{key}' (check its standardize_fn)."
            )
    action = tf.ensure_shape(tf.cast(traj["action"], tf.float32), [None, config.action_dim])
    num_steps = tf.shape(action)[0]
    obs = traj["observation"]

    image_key = config.image_obs_keys["primary"]
    if image_key is None:
        image = tf.repeat("", num_steps)  # padding: decoded to a black image
    else:
        image = obs[image_key]
        if image.dtype != tf.string:
            raise ValueError(f"{config.name}: image '{image_key}' must be an encoded tfds Image feature.")

    parts = [
        tf.zeros([num_steps, 1], tf.float32)
        if key is None
        else tf.reshape(tf.cast(obs[key], tf.float32), [num_steps, -1])
        for key in config.state_obs_keys
    ]
    proprio = tf.ensure_shape(tf.concat(parts, axis=1), [None, STATE_DIM])

    language = traj[config.language_key]
    if language.dtype != tf.string:
        raise ValueError(f"{config.name}: instruction '{config.language_key}' must be a string tensor.")
    return {
        "observation": {"image_primary": image, "proprio": proprio},
        "task": {"language_instruction": language},
        "action": action,
        "dataset_name": tf.repeat(config.name, num_steps),
    }


def _read_trajectories(
    builder: Any, split: str, config: RLDSDatasetConfig, *, repeat_seed: int | None = None
) -> Any:
    """Restructured (un-normalised) trajectories of `split`.

    `repeat_seed=None`: one pass, in file order. Otherwise: forever, with the file order reshuffled every epoch
    from (repeat_seed, epoch). The epoch index is part of the graph, so iterating the returned dataset again
    replays the same stream; a `reshuffle_each_iteration` shuffle would draw new orders on every iteration.
    """
    tf = import_tensorflow()
    import tensorflow_datasets as tfds

    decoders = _skip_image_decoding(builder.info.features)

    def read(shuffle_seed: Any) -> Any:
        read_config = tfds.ReadConfig(
            shuffle_seed=shuffle_seed,
            shuffle_reshuffle_each_iteration=False,
            add_tfds_id=False,
            try_autocache=False,  # small datasets would be cached in RAM, then dropped when a stream stops early
        )
        return builder.as_dataset(
            split=split, shuffle_files=shuffle_seed is not None, decoders=decoders, read_config=read_config
        )

    if repeat_seed is None:
        ds = read(None)
    else:
        read_epoch = tf.autograph.experimental.do_not_convert(lambda epoch: read(repeat_seed + epoch))
        ds = tf.data.Dataset.counter().flat_map(read_epoch)
    ds = ds.map(_episode_to_trajectory, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.map(lambda traj: _restructure(traj, config), num_parallel_calls=tf.data.AUTOTUNE)


def _split_name(builder: Any, train: bool) -> str:
    # Datasets without a val split hold out the last 5% of train (as OpenVLA does).
    if "val" in builder.info.splits:
        return "train" if train else "val"
    return "train[:95%]" if train else "train[95%:]"


def _dataset_statistics(builder: Any, dataset_dir: Path, config: RLDSDatasetConfig) -> dict[str, Any]:
    """Cached statistics of the standardised train split (computed over all of it, not a rank's share)."""
    split = _split_name(builder, train=True)
    split_info = builder.info.splits[split]
    fn = get_standardize_fn(config.standardize_fn)
    stats_hash = statistics_hash(
        config,
        version=str(builder.info.version),
        standardize_fn_name=f"{config.standardize_fn}:{fn.__module__}.{fn.__qualname__}",
        split_info={"split": split, "num_examples": int(split_info.num_examples)},
    )

    def compute() -> dict[str, Any]:
        trajectories = _read_trajectories(builder, split, config).map(
            lambda traj: {"action": traj["action"], "proprio": traj["observation"]["proprio"]}
        )
        return compute_statistics(trajectories.as_numpy_iterator())

    statistics, _ = load_or_compute_statistics(dataset_dir, stats_hash, compute)
    return statistics


def _normalize(traj: dict[str, Any], statistics: dict[str, Any], config: RLDSDatasetConfig) -> dict[str, Any]:
    """Normalise action (masked dims only) and proprio with the dataset's train statistics."""
    norm = config.action_normalization_type
    traj["action"] = normalize_tf(
        traj["action"], statistics["action"], norm, config.action_normalization_mask
    )
    traj["observation"]["proprio"] = normalize_tf(traj["observation"]["proprio"], statistics["proprio"], norm)
    return traj


# === Frame transforms ===


def _decode_and_resize(image_bytes: Any, resize_resolution: tuple[int, int]) -> Any:
    """JPEG/PNG bytes -> uint8[H, W, 3] at `resize_resolution` (lanczos3, antialiased); "" -> black image."""
    tf = import_tensorflow()
    height, width = resize_resolution

    def decode() -> Any:
        image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
        image.set_shape([None, None, 3])
        return image

    image = tf.cond(
        tf.strings.length(image_bytes) > 0, decode, lambda: tf.zeros([height, width, 3], tf.uint8)
    )
    shape = tf.shape(image)

    def resize() -> Any:
        resized = tf.image.resize(image, (height, width), method="lanczos3", antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)

    image = tf.cond(tf.logical_and(shape[0] == height, shape[1] == width), lambda: image, resize)
    return tf.ensure_shape(image, [height, width, 3])


def _augment(image: Any, seed: Any) -> Any:
    """Random resized crop (90% area, square) + brightness / contrast / saturation / hue jitter.

    Stateless ops keyed by `seed` (int64[2]): the same frame position always gets the same augmentation.
    """
    tf = import_tensorflow()
    seeds = tf.random.experimental.stateless_split(seed, num=5)
    height, width = image.shape[0], image.shape[1]
    x = tf.image.convert_image_dtype(image, tf.float32)

    side = math.sqrt(_AUGMENT_SCALE)
    offset = tf.random.stateless_uniform([2], seed=seeds[0], minval=0.0, maxval=1.0 - side)
    box = tf.stack([offset[0], offset[1], offset[0] + side, offset[1] + side])[None]
    x = tf.image.crop_and_resize(x[None], box, box_indices=[0], crop_size=(height, width))[0]
    x = tf.clip_by_value(tf.image.stateless_random_brightness(x, 0.2, seed=seeds[1]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_contrast(x, 0.8, 1.2, seed=seeds[2]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_saturation(x, 0.8, 1.2, seed=seeds[3]), 0.0, 1.0)
    x = tf.clip_by_value(tf.image.stateless_random_hue(x, 0.05, seed=seeds[4]), 0.0, 1.0)
    return tf.cast(tf.round(x * 255.0), tf.uint8)


def _seed(seed: int, rank: int, purpose: int, index: int = 0) -> int:
    """A 31-bit seed for one random choice, derived from (seed, rank): ranks and purposes never share one."""
    return int(np.random.SeedSequence([seed, rank, purpose, index]).generate_state(1)[0] >> 1)


_PURPOSE_FILES, _PURPOSE_SAMPLE, _PURPOSE_SHUFFLE, _PURPOSE_AUGMENT = range(4)


# === The pipeline ===


def make_interleaved_dataset(
    data_root_dir: Path,
    data_mix: str,
    *,
    resize_resolution: tuple[int, int],
    shuffle_buffer_size: int,
    train: bool = True,
    image_aug: bool = False,
    seed: int = 7,
    rank: int = 0,
    world_size: int = 1,
    start_sample: int = 0,
) -> RLDSPipeline:
    """Build the frame stream of mixture `data_mix` for one rank (see module docstring).

    Args:
        data_root_dir: folder holding `<name>/<version>/` for every dataset of the mixture.
        data_mix: a mixture name (`mixtures.py`) or a single registered dataset name.
        resize_resolution: (height, width) of the yielded images.
        shuffle_buffer_size: frames in the shuffle buffer (train only).
        train: True -> train split, shuffled, infinite; False -> val split, one deterministic pass, no shuffle,
            no augmentation.
        image_aug: augment images (train only).
        seed, rank, world_size: the stream is a deterministic function of these; ranks read disjoint
            trajectories.
        start_sample: skip this many frames of this rank's stream (resume).

    Raises:
        ConfigError: unknown mixture, missing data folder or dataset, a dataset with fewer trajectories than
            `world_size`, or an invalid argument.
    """
    tf = import_tensorflow()
    import tensorflow_datasets as tfds

    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"Need 0 <= rank < world_size, got rank={rank}, world_size={world_size}.")
    if start_sample < 0:
        raise ConfigError(f"start_sample must be >= 0, got {start_sample}.")
    if train and shuffle_buffer_size < 1:
        raise ConfigError(f"shuffle_buffer_size must be >= 1, got {shuffle_buffer_size}.")
    if len(resize_resolution) != 2 or min(resize_resolution) < 1:
        raise ConfigError(f"resize_resolution must be (height, width), got {resize_resolution}.")
    resize_resolution = (int(resize_resolution[0]), int(resize_resolution[1]))

    mixture = get_mixture(data_mix)
    configs = [get_dataset_config(name) for name, _ in mixture]
    if len({c.action_dim for c in configs}) != 1:
        raise ConfigError(f"Datasets of mixture '{data_mix}' have different action dimensions.")

    datasets, statistics = [], {}
    for index, config in enumerate(configs):
        dataset_dir = find_dataset_dir(data_root_dir, config.name)
        builder = tfds.builder_from_directory(str(dataset_dir))
        stats = _dataset_statistics(builder, dataset_dir, config)
        statistics[config.name] = with_action_mask(stats, config)

        split = _split_name(builder, train)
        num_trajectories = int(builder.info.splits[split].num_examples)
        if num_trajectories < world_size:
            raise ConfigError(
                f"Dataset '{config.name}' has {num_trajectories} trajectories in split '{split}', fewer than "
                f"world_size={world_size}: some ranks would get no data. Use fewer ranks or more data."
            )
        rank_split = tfds.even_splits(split, n=world_size)[rank]
        trajectories = _read_trajectories(
            builder,
            rank_split,
            config,
            repeat_seed=_seed(seed, rank, _PURPOSE_FILES, index) if train else None,
        )

        normalize = functools.partial(_normalize, statistics=stats, config=config)
        frames = trajectories.map(normalize, num_parallel_calls=tf.data.AUTOTUNE).flat_map(
            tf.data.Dataset.from_tensor_slices
        )
        datasets.append(frames)

    sizes = [statistics[c.name]["num_transitions"] for c in configs]
    weights = balance_sample_weights([w for _, w in mixture], sizes)
    if len(datasets) == 1:
        dataset = datasets[0]
    else:
        dataset = tf.data.Dataset.sample_from_datasets(
            datasets,
            weights=[float(w) for w in weights],
            seed=_seed(seed, rank, _PURPOSE_SAMPLE),
            stop_on_empty_dataset=False,  # val: keep going until every dataset's pass is done
        )
    if train:
        # Frames are still JPEG bytes here, so a large buffer stays cheap.
        dataset = dataset.shuffle(
            shuffle_buffer_size, seed=_seed(seed, rank, _PURPOSE_SHUFFLE), reshuffle_each_iteration=False
        )

    # Positions are counted before skipping, so frame i gets the same augmentation whatever `start_sample` is.
    dataset = dataset.enumerate().skip(start_sample)
    augment = train and image_aug
    augment_seed = _seed(seed, rank, _PURPOSE_AUGMENT)

    def decode(position: Any, frame: dict[str, Any]) -> dict[str, Any]:
        image = _decode_and_resize(frame["observation"]["image_primary"], resize_resolution)
        if augment:
            image = _augment(image, tf.stack([tf.constant(augment_seed, tf.int64), position]))
        frame["observation"]["image_primary"] = image
        return frame

    dataset = dataset.map(decode, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = True
    dataset = dataset.with_options(options)

    return RLDSPipeline(
        dataset=dataset,
        dataset_statistics=statistics,
        sample_weights={c.name: float(w) for c, w in zip(configs, weights, strict=True)},
        num_transitions=int(sum(sizes)),
    )
