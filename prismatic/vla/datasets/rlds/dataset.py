"""The `tf.data` pipeline: RLDS datasets on disk -> one deterministic, rank-sharded stream of training frames.

Per dataset (`<data_root_dir>/<name>/<highest version>/`, read with `tfds.builder_from_directory`):
    read this rank's share of the trajectories (images stay JPEG bytes; train: forever, file order reshuffled
    every epoch) -> standardise (`transforms.py`) -> restructure to the common frame format -> normalise
    action + proprio with the cached statistics -> drop unlabeled trajectories -> chunk (optional) -> drop
    idle frames (DROID) -> flatten trajectories into frames. The order, the statistics and the arithmetic are
    OpenVLA's (`DataOptions` in `prismatic/conf/data.py` names each choice; docs/data_pipeline.md).
Then across datasets: weighted `sample_from_datasets` (weights balanced by size, `mixtures.py`) -> frame-level
shuffle buffer (train) -> skip `start_sample` frames -> decode + resize (+ augment) the images.

Frames are shuffled while their images are still encoded (a buffer of JPEG bytes is ~50x smaller), and skipped
before decoding, so resuming at frame N by skipping costs reading, not decoding, the first N frames: linear in N.
Resuming in bounded time instead restores a checkpoint of the tf.data iterator (`RLDSDataset.save_stream_state`
/ `resume_from`): every op of the pipeline supports iterator checkpointing, which stores the readers' positions,
the shuffle buffer (so a snapshot is about `shuffle_buffer_size` encoded frames) and the in-flight decoded frames.
The iterator must be restored into the stream built with the `start_sample` it was saved from
(`RLDSPipeline.from_sample`): tf.data drops a `skip(0)`, so the pipeline's shape depends on it.

Determinism: every random choice is seeded from (seed, rank) and image augmentation uses stateless ops keyed by
the frame's position in the stream, so a given (seed, rank, world_size) always yields the same frames (also
when the same dataset object is iterated again), and `start_sample=N` yields exactly that stream minus its
first N frames. Parallel maps keep their order (`options.deterministic = True`).

Damaged data is named, not dumped as a TensorFlow traceback: a dataset folder without its version folder or
with unreadable metadata is a `ConfigError` naming the folder, and a corrupt, truncated or missing TFRecord file
met while reading (`tfrecord_errors`) is a `ConfigError` naming that file.

Each yielded frame (as NumPy via `.as_numpy_iterator()`):
    {"observation": {"image_primary": uint8[H, W, 3]},
     "task": {"language_instruction": bytes}, "action": float32[7] (normalised), "dataset_name": bytes}
plus "observation.proprio" (float32[P], the config's state keys) with `options.load_proprio`, and "raw_action"
(the standardised action before normalisation, same shape) when `keep_raw_action=True`.
Camera views: `image_views` (default ("primary",)) names the cameras carried, each as "observation.image_<view>"
uint8[H, W, 3] (views: primary, secondary, wrist; e.g. ("primary", "wrist") adds "observation.image_wrist"), all
decoded and resized alike, augmented alike but with a draw of their own. A dataset whose config has no camera for
a view gets an all-zero (black) image there, never augmented, as OpenVLA pads missing views.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import CAMERA_VIEWS, RLDSDatasetConfig, get_dataset_config
from prismatic.vla.datasets.rlds.mixtures import balance_sample_weights, get_mixture
from prismatic.vla.datasets.rlds.normalization import normalize_tf
from prismatic.vla.datasets.rlds.statistics import (
    COUNTS_FIELD,
    compute_statistics,
    data_files_fingerprint,
    load_or_compute_statistics,
    statistics_cache_key,
    with_action_mask,
)
from prismatic.vla.datasets.rlds.transforms import get_standardize_fn

logger = logging.getLogger(__name__)

# OpenVLA's `zero_action_filter` (droid_utils.py) normalises 0 with these DROID bounds of the 6 arm dimensions,
# whatever the dataset's own statistics are, and keeps a frame when any arm action of its chunk differs from
# that normalised 0 by more than the tolerance.
DROID_ZERO_FILTER_Q01 = (
    -0.7776297926902771,
    -0.5803514122962952,
    -0.5795090794563293,
    -0.6464047729969025,
    -0.7041108310222626,
    -0.8895104378461838,
)
DROID_ZERO_FILTER_Q99 = (
    0.7597932070493698,
    0.5726242214441299,
    0.7351000607013702,
    0.6705610305070877,
    0.6464948207139969,
    0.8897542208433151,
)
ZERO_ACTION_TOLERANCE = 1e-5
SHUFFLE_BUFFER_RAM_ENV = (
    "PRISMATIC_SHUFFLE_BUFFER_GB"  # overrides the default RAM budget of the shuffle buffer
)
DEFAULT_RAM_FRACTION = 0.5  # of physical RAM, shared by the ranks of one node (LOCAL_WORLD_SIZE)
# What tf.data keeps per buffered frame beyond the payload bytes: ~6 tensors (handles, shapes, allocations).
FRAME_OVERHEAD_BYTES = 1024
# RSS per buffered byte, from malloc's bookkeeping and fragmentation: measured 39-47 KB of RSS per 38 KB frame on
# Bridge-like data with the arena cap of `prismatic/util/malloc.py` (75 KB without it).
ALLOCATOR_OVERHEAD = 1.15
READ_CYCLE_LENGTH = 4  # shard files of one dataset read at once
READ_BUFFER_BYTES = 2**20  # read-ahead per open shard file
TRAJECTORY_PARALLEL_CALLS = 2  # per dataset: trajectories being standardised at once
AUTOTUNE_RAM_BUDGET_BYTES = 256 * 2**20
_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")
_AUGMENT_SCALE = 0.9  # random resized crop keeps 90% of the area, square (OpenVLA's settings)


@dataclass
class RLDSPipeline:
    """What `make_interleaved_dataset` builds.

    Attributes:
        dataset: the `tf.data.Dataset` of frames (see module docstring); infinite when training.
        dataset_statistics: {dataset_name: statistics in OpenVLA's layout, with `action.mask`}.
        sample_weights: {dataset_name: probability that a frame comes from it}.
        num_transitions: transitions of the statistics split (every split by default, as OpenVLA), summed over
            the mixture.
        dataset_length: OpenVLA's dataset length (one "epoch"): frames drawn until every dataset of weight 1.0
            has been seen once in expectation, `max(num_transitions_i / sample_weight_i)` over those datasets
            (all datasets when none has weight 1.0); the sum of transitions when all weights are 1.0.
        shuffle_buffer_gb: estimated host memory (GiB) of the full shuffle buffer; 0 when not training.
        dataset_dirs: the dataset folders read; iterate `dataset` inside `tfrecord_errors(dataset_dirs)` to have
            a damaged file named.
        from_sample: `from_sample(n)` is the same stream starting at frame n (as if built with `start_sample=n`),
            sharing everything upstream of the skip, so building it reads nothing.
        image_views: the camera views frames carry, in order (`observation.image_<view>`).
    """

    dataset: Any
    dataset_statistics: dict[str, dict[str, Any]]
    sample_weights: dict[str, float]
    num_transitions: int
    dataset_length: int = 0
    shuffle_buffer_gb: float = 0.0
    dataset_dirs: list[Path] = field(default_factory=list)
    from_sample: Callable[[int], Any] | None = None
    image_views: tuple[str, ...] = ("primary",)


# === Locating and reading datasets ===


class DatasetNotFoundError(ConfigError):
    """No folder `<data_root_dir>/<name>/` at all (a mixture may skip such datasets when asked)."""


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in folder.name.split("."))


def find_dataset_dir(data_root_dir: Path, name: str) -> Path:
    """`<data_root_dir>/<name>/<highest version>`, the folder tfds wrote.

    Raises:
        ConfigError: `data_root_dir` is missing; or `<name>/` exists but holds no prepared version folder (the
            message says what it holds and how to fix it).
        DatasetNotFoundError: there is no `<name>/` (the message lists the datasets that are there).
    """
    root = Path(data_root_dir)
    if not root.is_dir():
        raise ConfigError(
            f"RLDS data_root_dir '{root}' does not exist. Point it at a folder of RLDS datasets, or build the toy "
            f"datasets there with `python vla_scripts/build_toy_dataset.py --data_root_dir {root}`."
        )
    dataset_root = root / name
    if not dataset_root.is_dir():
        present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise DatasetNotFoundError(
            f"RLDS dataset '{name}' not found under data_root_dir '{root}' (expected '{dataset_root}/<version>/"
            f"dataset_info.json'). Datasets present: {', '.join(present) or 'none'}."
        )
    version_dirs = [d for d in dataset_root.iterdir() if d.is_dir() and _VERSION_RE.fullmatch(d.name)]
    versions = [d for d in version_dirs if (d / "dataset_info.json").is_file()]
    if versions:
        return max(versions, key=_version_key)
    entries = sorted(p.name for p in dataset_root.iterdir() if not p.name.startswith("."))
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    if version_dirs:
        problem = (
            f"its version folder(s) {', '.join(sorted(d.name for d in version_dirs))} hold no dataset_info.json "
            "(an interrupted download or conversion?). Download or convert the dataset again."
        )
    elif any(".tfrecord" in e or e in ("dataset_info.json", "features.json") for e in entries):
        problem = (
            f"its files ({shown}) lie directly in it. Move them into a version folder named as in their "
            f"dataset_info.json, e.g. '{dataset_root}/1.0.0/'."
        )
    else:
        problem = f"it holds {shown or 'nothing'}."
    raise ConfigError(
        f"RLDS dataset folder '{dataset_root}' has no version folder: tfds datasets are read from "
        f"'<data_root_dir>/{name}/<version>/' (e.g. '1.0.0/', holding dataset_info.json, features.json and the "
        f".tfrecord files), but {problem}"
    )


def load_builder(dataset_dir: Path) -> Any:
    """`tfds.builder_from_directory(dataset_dir)`, with a `ConfigError` naming the folder when its metadata
    (dataset_info.json, features.json) cannot be read."""
    import_tensorflow()
    import tensorflow_datasets as tfds

    try:
        return tfds.builder_from_directory(str(dataset_dir))
    except Exception as e:  # noqa: BLE001 (json, protobuf, tf and tfds errors alike: damaged metadata)
        raise ConfigError(
            f"Cannot read the RLDS dataset metadata in '{dataset_dir}' (dataset_info.json / features.json: "
            f"{_short_tf_message(e)}). Download or convert the dataset again."
        ) from e


def _short_tf_message(error: BaseException) -> str:
    """TensorFlow's message without its op / function-node decorations."""
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    text = re.sub(r"\{\{[^}]*\}\}", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S)
    return " ".join(text.split()).strip(" '")


def find_corrupt_tfrecords(dataset_dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    """(file, TensorFlow's reason) for every TFRecord file of `dataset_dirs` that cannot be read to its end
    (truncated, corrupted, not a TFRecord). Reads every record: meant for the error path only."""
    tf = import_tensorflow()
    bad = []
    for folder in dataset_dirs:
        for path in sorted(Path(folder).glob("*.tfrecord*")):
            try:
                tf.data.TFRecordDataset(str(path)).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
                bad.append((path, _short_tf_message(e)))
    return bad


@contextlib.contextmanager
def tfrecord_errors(dataset_dirs: Sequence[Path]) -> Iterator[None]:
    """Within the block, a TFRecord that cannot be read becomes a `ConfigError` naming the file.

    TensorFlow's own error names a byte offset but not the file; on that (rare) path every TFRecord file of
    `dataset_dirs` is checked to find it.
    """
    tf = import_tensorflow()
    # Bound now: a generator left open is closed at interpreter exit, after `tf.errors` is torn down.
    not_found, data_loss = tf.errors.NotFoundError, tf.errors.DataLossError
    try:
        yield
    except not_found as e:
        reason = _short_tf_message(e)
        raise ConfigError(
            f"An RLDS data file is missing: {reason}. It is listed in its dataset's dataset_info.json, so the "
            "download or conversion is incomplete: download or convert the dataset again."
        ) from e
    except data_loss as e:
        bad = find_corrupt_tfrecords(dataset_dirs)
        if not bad:
            raise ConfigError(
                f"A TFRecord file under {', '.join(repr(str(d)) for d in dataset_dirs)} could not be read "
                f"({_short_tf_message(e)}). Download or convert the dataset again."
            ) from e
        files = "; ".join(f"'{path}' ({reason})" for path, reason in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ConfigError(
            f"Corrupt or truncated TFRecord file{'s' if len(bad) > 1 else ''}: {files}{more}. An interrupted "
            "download or copy, or a full disk when it was written, leaves such files: download, copy or convert "
            "that dataset again."
        ) from e


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


def _graph_only(fn: Callable) -> Callable:
    """`fn` traced as written, without AutoGraph's source conversion: the pipeline's own functions branch with
    tf.cond / tf.where / tf.map_fn, and converting them cost about 1.5 s of every pipeline build on every rank
    (`make bench-data` prints the build time)."""
    return import_tensorflow().autograph.experimental.do_not_convert(fn)


def _episode_to_trajectory(episode: dict[str, Any]) -> dict[str, Any]:
    """RLDS episode -> trajectory: steps as [T, ...] tensors, other episode fields broadcast to T under
    `traj_metadata` (so that standardisation functions can slice every leaf along time)."""
    tf = import_tensorflow()
    batched = episode["steps"].batch(2**31 - 1)
    # An episode with no steps batches to nothing: give it one element of zero-length tensors (OpenVLA reads and
    # counts such episodes too) instead of failing on an empty dataset.
    empty = tf.data.Dataset.from_tensors(
        tf.nest.map_structure(
            lambda spec: tf.zeros([0, *[d or 0 for d in spec.shape.as_list()[1:]]], spec.dtype),
            batched.element_spec,
        )
    )
    steps = batched.concatenate(empty).take(1).get_single_element()
    num_steps = tf.shape(tf.nest.flatten(steps)[0])[0]
    metadata = {k: v for k, v in episode.items() if k != "steps"}
    steps["traj_metadata"] = tf.nest.map_structure(lambda x: tf.repeat(x[None], num_steps, axis=0), metadata)
    return steps


def _restructure(
    traj: dict[str, Any],
    config: RLDSDatasetConfig,
    options: DataOptions,
    with_ids: bool = False,
    image_views: Sequence[str] = ("primary",),
) -> dict[str, Any]:
    """Standardise one raw trajectory and keep what the frame format needs (still un-normalised).

    Each camera of `image_views` becomes `observation.image_<view>` (encoded bytes; "" where the config has no
    key for that view, as OpenVLA pads, later decoded to a black image). Proprio (with `options.load_proprio`)
    is the concatenation of the config's state keys, one zero column per `None`, as OpenVLA builds it.
    `with_ids` adds `episode_id` (tfds' record id: file and index) and `observation.timestep` for the read API.
    """
    tf = import_tensorflow()
    try:
        traj = get_standardize_fn(config.standardize_fn)(traj)
    except tf.errors.OperatorNotAllowedInGraphError:
        raise ConfigError(
            f"{config.name}: its standardize_fn '{config.standardize_fn}' uses a tensor as a Python bool (an `if`, "
            "`while` or `and` on a tensor's value). Pipeline functions are traced as written, without AutoGraph "
            "(OpenVLA's transforms never need it): use tf.cond / tf.where / tf.while_loop for value-dependent steps."
        ) from None
    for key in ("observation", "action", config.language_key):
        if key not in traj:
            raise ValueError(
                f"{config.name}: standardised trajectory has no '{key}' (check its standardize_fn)."
            )
    action = tf.ensure_shape(tf.cast(traj["action"], tf.float32), [None, config.action_dim])
    num_steps = tf.shape(action)[0]
    obs = traj["observation"]

    observation = {}
    for view in image_views:
        image_key = config.image_obs_keys[view]
        if image_key is None:
            image = tf.repeat("", num_steps)  # padding (OpenVLA's): decoded to a black image
        else:
            if image_key not in obs:
                raise ValueError(
                    f"{config.name}: the standardised observation has no '{image_key}' (its {view} camera); it "
                    f"holds {', '.join(sorted(obs))}."
                )
            image = obs[image_key]
            if image.dtype != tf.string:
                raise ValueError(f"{config.name}: image '{image_key}' must be an encoded tfds Image feature.")
        observation[f"image_{view}"] = image
    if options.load_proprio and config.state_obs_keys:  # OpenVLA: no state keys, no proprio
        observation["proprio"] = proprio_of(obs, config, num_steps)

    language = traj[config.language_key]
    if language.dtype != tf.string:
        raise ValueError(f"{config.name}: instruction '{config.language_key}' must be a string tensor.")
    out = {
        "observation": observation,
        "task": {"language_instruction": language},
        "action": action,
        "dataset_name": tf.repeat(config.name, num_steps),
    }
    if with_ids:
        observation["timestep"] = tf.range(num_steps)
        tfds_id = traj.get("traj_metadata", {}).get("tfds_id")
        out["episode_id"] = tfds_id if tfds_id is not None else tf.repeat("", num_steps)
    return out


def proprio_of(obs: dict[str, Any], config: RLDSDatasetConfig, num_steps: Any) -> Any:
    """float32[T, P]: the config's state keys concatenated, one zero column per `None` (OpenVLA's layout)."""
    tf = import_tensorflow()
    parts, width = [], 0
    for key in config.state_obs_keys:
        if key is None:
            parts.append(tf.zeros([num_steps, 1], tf.float32))
            width = None if width is None else width + 1
            continue
        value = tf.cast(obs[key], tf.float32)
        if value.shape.rank == 1:
            value = value[:, None]
        key_width = value.shape[-1]
        width = None if width is None or key_width is None else width + int(key_width)
        parts.append(value)
    if not parts:
        return tf.zeros([num_steps, 0], tf.float32)
    return tf.ensure_shape(tf.concat(parts, axis=1), [None, width])


def _read_trajectories(
    builder: Any,
    split: str,
    config: RLDSDatasetConfig,
    options: DataOptions,
    *,
    repeat_seed: int | None = None,
    openvla_order: bool = False,
    with_ids: bool = False,
    image_views: Sequence[str] = ("primary",),
) -> Any:
    """Restructured (un-normalised) trajectories of `split`, carrying the cameras of `image_views`.

    Training reads `READ_CYCLE_LENGTH` files at once, one record per turn, and standardises
    `TRAJECTORY_PARALLEL_CALLS` trajectories at once (memory per dataset stays small; decoding is where its cores
    go). `openvla_order=True` (statistics, the read API) reads as OpenVLA's statistics pass does (dlimp's
    `from_rlds(shuffle=False)`: tfds' interleave of AUTOTUNE files, 16 records per turn), so float32 sums see the
    steps in OpenVLA's order on the same machine; `with_ids` adds episode ids and timesteps (`_restructure`).

    `repeat_seed=None`: one pass, in file order. Otherwise: forever, with the file order reshuffled every epoch
    from (repeat_seed, epoch). The epoch index is part of the graph, so iterating the returned dataset again
    replays the same stream; a `reshuffle_each_iteration` shuffle would draw new orders on every iteration.
    """
    tf = import_tensorflow()
    import tensorflow_datasets as tfds

    decoders = _skip_image_decoding(builder.info.features)

    def read(shuffle_seed: Any) -> Any:
        if openvla_order:
            read_config = tfds.ReadConfig(
                skip_prefetch=True,
                num_parallel_calls_for_interleave_files=tf.data.AUTOTUNE,
                interleave_cycle_length=tf.data.AUTOTUNE,
                add_tfds_id=with_ids,
                try_autocache=False,
            )
            return builder.as_dataset(
                split=split, shuffle_files=False, decoders=decoders, read_config=read_config
            )
        read_config = tfds.ReadConfig(
            shuffle_seed=shuffle_seed,
            shuffle_reshuffle_each_iteration=False,
            add_tfds_id=False,
            try_autocache=False,  # small datasets would be cached in RAM, then dropped when a stream stops early
            # tfds' defaults (16 files at once, 16 records per file turn, 8 MiB read-ahead each) buffer ~0.4 GB of
            # whole episodes per dataset when training consumes slower than files are read; a mixture pays that
            # once per dataset. One record per turn over a few files keeps it at ~50 MB.
            interleave_cycle_length=READ_CYCLE_LENGTH,
            interleave_block_length=1,
            override_buffer_size=READ_BUFFER_BYTES,
        )
        return builder.as_dataset(
            split=split, shuffle_files=shuffle_seed is not None, decoders=decoders, read_config=read_config
        )

    if repeat_seed is None:
        ds = read(None)
    else:
        read_epoch = _graph_only(lambda epoch: read(repeat_seed + epoch))
        ds = tf.data.Dataset.counter().flat_map(read_epoch)
    # Whole trajectories (every camera of every step) are large: a fixed, small number are in flight per dataset,
    # so host memory does not grow with the mixture's size; the heavy per-frame work is parallelised later.
    calls = (os.cpu_count() or 1) if openvla_order else TRAJECTORY_PARALLEL_CALLS
    ds = ds.map(_graph_only(_episode_to_trajectory), num_parallel_calls=calls)
    return ds.map(
        _graph_only(lambda traj: _restructure(traj, config, options, with_ids, image_views)),
        num_parallel_calls=calls,
    )


def _split_name(builder: Any, train: bool) -> str:
    # Datasets without a val split hold out the last 5% of train (as OpenVLA does).
    if "val" in builder.info.splits:
        return "train" if train else "val"
    return "train[:95%]" if train else "train[95%:]"


def _statistics_split(builder: Any, options: DataOptions) -> str:
    return "all" if options.statistics_split == "all" else _split_name(builder, train=True)


def dataset_statistics(
    builder: Any,
    dataset_dir: Path,
    config: RLDSDatasetConfig,
    options: DataOptions,
    *,
    recompute: bool = False,
) -> dict[str, Any]:
    """Cached statistics of one dataset (over `options.statistics_split`, all of it, not a rank's share).

    Returns the cache's content: OpenVLA's layout plus our bookkeeping (`_counts`, `_cache_key`), which
    `with_action_mask` drops.
    """
    split = _statistics_split(builder, options)
    fn = get_standardize_fn(config.standardize_fn)
    try:
        source_hash = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):  # defined interactively: the qualified name has to do
        source_hash = ""
    cache_key = statistics_cache_key(
        config,
        version=str(builder.info.version),
        standardize_fn={
            "id": config.standardize_fn,
            "function": f"{fn.__module__}.{fn.__qualname__}",
            "source_sha256": source_hash,
        },
        data_files=data_files_fingerprint(dataset_dir),
        options={**options.statistics_key(), "split": split},
    )

    def compute() -> dict[str, Any]:
        trajectories = _read_trajectories(
            builder, split, config, options, openvla_order=True, with_ids=True
        ).map(
            _graph_only(
                lambda traj: {
                    "action": traj["action"],
                    **({"proprio": traj["observation"]["proprio"]} if options.load_proprio else {}),
                    "episode_id": traj["episode_id"][:1],  # [1] (or [0] for an empty episode)
                    "language_instruction": traj["task"]["language_instruction"],
                }
            )
        )
        with tfrecord_errors([dataset_dir]):
            return compute_statistics(
                trajectories.as_numpy_iterator(),
                dataset_name=config.name,
                split=split,
                nonfinite=options.nonfinite,
            )

    statistics, _ = load_or_compute_statistics(
        dataset_dir, cache_key, compute, recompute=recompute, dataset_name=config.name
    )
    counts = statistics.get(COUNTS_FIELD, {})
    if counts.get("unlabeled_trajectories") and options.skip_unlabeled:
        logger.info(
            "Dataset '%s': %d of %d trajectories of split '%s' (the statistics split) have only empty "
            "instructions; training and validation skip them (--data.skip_unlabeled false keeps them).",
            config.name,
            counts["unlabeled_trajectories"],
            statistics["num_trajectories"],
            split,
        )
    if counts.get("nonfinite_frames_dropped"):
        logger.warning(
            "Dataset '%s': %d frames hold NaN or inf in action / proprio (split '%s'); left out of statistics "
            "and training (--data.nonfinite drop).",
            config.name,
            counts["nonfinite_frames_dropped"],
            split,
        )
    return statistics


def _normalize(
    traj: dict[str, Any],
    statistics: dict[str, Any],
    config: RLDSDatasetConfig,
    options: DataOptions,
    keep_raw_action: bool = False,
) -> dict[str, Any]:
    """Normalise action (masked dims only) and proprio (every dim) with the dataset's statistics, as OpenVLA.

    `keep_raw_action`: also keep the action in robot units as `raw_action` (evaluation compares un-normalised
    predictions against it; un-normalising the clipped `action` would not give it back).
    """
    if keep_raw_action:
        traj["raw_action"] = traj["action"]
    norm = config.action_normalization_type
    traj["action"] = normalize_tf(
        traj["action"], statistics["action"], norm, config.action_normalization_mask, options.unused_dims
    )
    if "proprio" in traj["observation"]:
        traj["observation"]["proprio"] = normalize_tf(
            traj["observation"]["proprio"], statistics["proprio"], norm, unused_dims=options.unused_dims
        )
    return traj


def mixture_statistics(
    data_root_dir: Path,
    data_mix: str,
    *,
    skip_missing_datasets: bool = False,
    num_workers: int | None = None,
    options: DataOptions | None = None,
    recompute: bool = False,
) -> dict[str, dict[str, Any]]:
    """{dataset_name: statistics with `action.mask`} of every dataset of `data_mix`, in the layout of a run's
    `dataset_statistics.json`: read from each dataset's cache, or computed (and cached) as `options` say
    (`recompute`: ignore existing caches).

    Datasets are processed in `num_workers` threads (default: one per CPU core, at most one per dataset);
    TensorFlow releases the GIL, and each dataset's read already decodes in parallel inside tf.data.
    """
    import_tensorflow()
    options = options or DataOptions()
    members = resolve_mixture_dirs(data_root_dir, data_mix, skip_missing_datasets=skip_missing_datasets)

    # Builders are made here, in this thread: tensorflow_datasets imports its modules lazily on first use, and two
    # threads doing that at once deadlock on Python's import locks.
    builders = [load_builder(dataset_dir) for _, _, dataset_dir in members]

    def one(index: int) -> tuple[str, dict[str, Any]]:
        config, _, dataset_dir = members[index]
        stats = dataset_statistics(builders[index], dataset_dir, config, options, recompute=recompute)
        return config.name, with_action_mask(stats, config)

    workers = max(1, min(len(members), num_workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, range(len(members))))


# === Mixture membership and the shuffle buffer's memory ===


def resolve_mixture_dirs(
    data_root_dir: Path, data_mix: str, *, skip_missing_datasets: bool = False
) -> list[tuple[RLDSDatasetConfig, float, Path]]:
    """(config, weight, dataset folder) for every dataset of `data_mix` present under `data_root_dir`.

    Raises:
        ConfigError: the mixture is unknown, `data_root_dir` is missing, or datasets of the mixture are missing
            (all of them are named) and `skip_missing_datasets` is False; or none is present at all; or a
            dataset's folder is there but holds no prepared version (never skipped: it needs fixing).
    """
    mixture = get_mixture(data_mix)
    root = Path(data_root_dir)
    if not root.is_dir():
        find_dataset_dir(root, mixture[0][0])  # raises the "data_root_dir does not exist" error
    found, missing = [], []
    for name, weight in mixture:
        try:
            found.append((get_dataset_config(name), weight, find_dataset_dir(root, name)))
        except DatasetNotFoundError:
            missing.append(name)
    if missing and (not skip_missing_datasets or not found):
        present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise ConfigError(
            f"Mixture '{data_mix}': {', '.join(repr(m) for m in missing)} not found under data_root_dir '{root}' "
            f"(each is read from '<data_root_dir>/<name>/<version>/dataset_info.json'). Datasets present: "
            f"{', '.join(present) or 'none'}. "
            + (
                "None of its datasets is present."
                if not found
                else "Download / convert them, or pass skip_missing_datasets=True to train on the rest."
            )
        )
    for name in missing:
        logger.warning("Mixture '%s': dataset '%s' is missing under '%s'; skipping it.", data_mix, name, root)
    return found


def check_image_views(
    image_views: Sequence[str], configs: Sequence[RLDSDatasetConfig], data_mix: str
) -> tuple[str, ...]:
    """The camera views to carry, validated against the mixture's dataset configs.

    A dataset without a camera for a requested view gets black images for it (OpenVLA pads with "" the same way);
    that is logged once per pipeline. A view that no dataset of the mixture has would only ever be black, so it is
    refused.

    Raises:
        ConfigError: no views, a repeated or unknown view (not one of `CAMERA_VIEWS`), or a view that no dataset
            of `data_mix` has (the message lists the views each dataset has).
    """
    if isinstance(image_views, str):
        image_views = (image_views,)
    views = tuple(image_views)
    unknown = [v for v in views if v not in CAMERA_VIEWS]
    if unknown or not views or len(set(views)) != len(views):
        problem = (
            f"unknown view(s) {', '.join(repr(v) for v in unknown)}"
            if unknown
            else ("no view" if not views else "a view named twice")
        )
        raise ConfigError(
            f"image_views={list(views)} has {problem}: frames carry one or more distinct camera views, each one "
            f"of {', '.join(CAMERA_VIEWS)} (as a dataset config's image_obs_keys name them), e.g. "
            "('primary', 'wrist')."
        )
    has = {c.name: [v for v in CAMERA_VIEWS if c.image_obs_keys[v] is not None] for c in configs}
    for view in views:
        if not any(c.image_obs_keys[view] is not None for c in configs):
            listing = "; ".join(f"{name}: {', '.join(vs) or 'none'}" for name, vs in has.items())
            raise ConfigError(
                f"Camera view '{view}' was requested (image_views={list(views)}), but no dataset of mixture "
                f"'{data_mix}' has a '{view}' camera, so every image of it would be black. Its datasets' views: "
                f"{listing}. Request only views these datasets have (fewer images), or add the camera key to the "
                "datasets' image_obs_keys in prismatic/vla/datasets/rlds/configs.py."
            )
    padded = [f"{c.name} ({view})" for c in configs for view in views if c.image_obs_keys[view] is None]
    if padded:
        logger.warning(
            "Mixture '%s': these datasets have no camera for a requested view, so their frames get black images "
            "for it (as OpenVLA pads missing views): %s.",
            data_mix,
            ", ".join(padded),
        )
    return views


def default_shuffle_buffer_ram_gb() -> float:
    """RAM budget (GiB) of one rank's shuffle buffer: `$PRISMATIC_SHUFFLE_BUFFER_GB` if set, else half the
    machine's physical RAM divided among the node's ranks (`$LOCAL_WORLD_SIZE`, set by torchrun)."""
    value = os.environ.get(SHUFFLE_BUFFER_RAM_ENV)
    if value:
        try:
            budget = float(value)
        except ValueError:
            raise ConfigError(f"${SHUFFLE_BUFFER_RAM_ENV} must be a number of GiB, got '{value}'.") from None
        if budget <= 0:
            raise ConfigError(f"${SHUFFLE_BUFFER_RAM_ENV} must be > 0, got {budget}.")
        return budget
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    local_ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return DEFAULT_RAM_FRACTION * physical / local_ranks / 2**30


def estimate_frame_bytes(
    builder: Any,
    split: str,
    config: RLDSDatasetConfig,
    num_trajectories: int = 2,
    options: DataOptions | None = None,
    image_views: Sequence[str] = ("primary",),
) -> float:
    """Mean bytes one frame occupies in the shuffle buffer, measured on the first trajectories of `split`.

    Buffered frames hold the *encoded* images of `image_views`, the instruction, the dataset name, action and
    proprio (everything else was dropped by `_restructure`), plus `FRAME_OVERHEAD_BYTES` of tf.data bookkeeping,
    times the `ALLOCATOR_OVERHEAD` measured for those allocations.
    """
    total, count = 0, 0
    trajectories = _read_trajectories(
        builder, split, config, options or DataOptions(), image_views=image_views
    ).take(num_trajectories)
    with tfrecord_errors([Path(builder.data_dir)]):
        for traj in trajectories.as_numpy_iterator():
            num_steps = len(traj["action"])
            for view in image_views:
                total += sum(len(b) for b in traj["observation"][f"image_{view}"])
            total += sum(len(b) for b in traj["task"]["language_instruction"]) + num_steps * len(config.name)
            total += traj["action"].nbytes + traj["observation"].get("proprio", traj["action"][:, :0]).nbytes
            count += num_steps
    return (total / max(count, 1) + FRAME_OVERHEAD_BYTES) * ALLOCATOR_OVERHEAD


def check_shuffle_buffer_fits(
    shuffle_buffer_size: int, frame_bytes: float, budget_gb: float, *, budget_source: str
) -> None:
    """Refuse a shuffle buffer whose estimated size exceeds `budget_gb` GiB.

    Raises:
        ConfigError: naming the estimate, the budget (and where it came from) and the largest size that fits.
    """
    need_gb = shuffle_buffer_size * frame_bytes / 2**30
    if need_gb > budget_gb:
        largest = int(budget_gb * 2**30 // frame_bytes)
        raise ConfigError(
            f"shuffle_buffer_size={shuffle_buffer_size} would hold about {need_gb:.2f} GiB of frames "
            f"(~{frame_bytes / 1024:.1f} KiB each, images still encoded), more than the shuffle buffer's RAM budget "
            f"of {budget_gb:.2f} GiB ({budget_source}). The largest shuffle_buffer_size that fits is {largest}; "
            f"lower it, or raise the budget with shuffle_buffer_ram_gb=... or ${SHUFFLE_BUFFER_RAM_ENV}."
        )


def _drop_nonfinite_frames(traj: dict[str, Any]) -> dict[str, Any]:
    """Drop the steps whose action or proprio holds NaN / inf (`--data.nonfinite drop`), before normalising."""
    tf = import_tensorflow()
    keep = tf.reduce_all(tf.math.is_finite(traj["action"]), axis=1)
    if "proprio" in traj["observation"]:
        keep = tf.logical_and(keep, tf.reduce_all(tf.math.is_finite(traj["observation"]["proprio"]), axis=1))
    return tf.nest.map_structure(lambda x: tf.boolean_mask(x, keep), traj)


def _is_labeled(traj: dict[str, Any]) -> Any:
    """OpenVLA's `skip_unlabeled` predicate: some step has a non-empty instruction."""
    tf = import_tensorflow()
    return tf.reduce_any(traj["task"]["language_instruction"] != "")


def zero_action_reference(
    statistics: dict[str, Any], config: RLDSDatasetConfig, bounds: str
) -> tuple[list[int], Any]:
    """(arm dims, float32 normalised value of a zero action on them) for the zero-action filter.

    "openvla": OpenVLA's DROID constants, computed in float32 as its `zero_action_filter` does
    (`2 * (0 - q01) / (q99 - q01 + 1e-8) - 1`); "statistics": the same formula with the dataset's bounds
    (OpenVLA's normalisation arithmetic, `normalize_tf`), on every normalised dimension.
    """
    tf = import_tensorflow()
    if bounds == "openvla":
        q01 = tf.convert_to_tensor(DROID_ZERO_FILTER_Q01, tf.float32)
        q99 = tf.convert_to_tensor(DROID_ZERO_FILTER_Q99, tf.float32)
        zero = tf.zeros([len(DROID_ZERO_FILTER_Q01)], tf.float32)
        return list(range(len(DROID_ZERO_FILTER_Q01))), 2 * (zero - q01) / (q99 - q01 + 1e-8) - 1
    dims = [i for i, m in enumerate(config.action_normalization_mask) if m]
    zero = tf.zeros([1, config.action_dim], tf.float32)
    normalized = normalize_tf(
        zero, statistics["action"], config.action_normalization_type, config.action_normalization_mask
    )[0]
    return dims, tf.gather(normalized, dims)


def _drop_zero_action_frames(traj: dict[str, Any], dims: list[int], reference: Any) -> dict[str, Any]:
    """Keep the frames where some arm action of the (normalised) chunk differs from the normalised zero by more
    than `ZERO_ACTION_TOLERANCE`: OpenVLA's `zero_action_filter`, train and val alike."""
    tf = import_tensorflow()
    arm = tf.gather(traj["action"], dims, axis=-1)
    moved = tf.math.abs(arm - reference) > ZERO_ACTION_TOLERANCE
    keep = tf.reduce_any(moved, axis=list(range(1, moved.shape.rank)))
    return tf.nest.map_structure(lambda x: tf.boolean_mask(x, keep), traj)


def _chunk(
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
    skip_missing_datasets: bool = False,
    shuffle_buffer_ram_gb: float | None = None,
    window_size: int = 1,
    future_action_window_size: int = 0,
    keep_raw_action: bool = False,
    options: DataOptions | None = None,
    recompute_stats: bool = False,
    image_views: Sequence[str] = ("primary",),
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
        skip_missing_datasets: drop (with a warning) mixture datasets missing under `data_root_dir` instead of
            raising; weights are re-balanced over the rest.
        shuffle_buffer_ram_gb: RAM budget (GiB) of the shuffle buffer (train); None = `$PRISMATIC_SHUFFLE_BUFFER_GB`
            or half the physical RAM shared by the node's ranks (`default_shuffle_buffer_ram_gb`).
        window_size, future_action_window_size: observation history length and number of future actions per
            frame (action chunking; see `_chunk`). The defaults (1, 0) give OpenVLA's single-step frames in the
            format of the module docstring; otherwise each `image_<view>` is [W, H, W, 3], `proprio` [W, P],
            `observation.pad_mask` bool[W], `action` [W + F, A] and `action_pad_mask` bool[W + F], as OpenVLA's
            `chunk_act_obs` (the torch-side `RLDSBatchTransform` consumes single-step frames only).
        keep_raw_action: frames also carry `raw_action`, the standardised action before normalisation (for
            evaluation in robot units); off for training, where it would only cost buffer memory.
        options: statistics, filtering, proprio and chunking choices (`DataOptions`; defaults as OpenVLA).
        recompute_stats: compute every dataset's statistics again, ignoring (and overwriting) their caches.
        image_views: the camera views frames carry, in order, each as `observation.image_<view>` (views of
            `configs.CAMERA_VIEWS`: primary, secondary, wrist); a dataset without a camera for a view gets black
            images for it (OpenVLA's padding). See `check_image_views`.

    Raises:
        ConfigError: unknown mixture, missing data folder or dataset(s), a dataset with fewer trajectories than
            `world_size`, a shuffle buffer estimated not to fit its RAM budget, an unknown camera view or one no
            dataset of the mixture has, or an invalid argument.
    """
    tf = import_tensorflow()
    import tensorflow_datasets as tfds

    options = options or DataOptions()
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"Need 0 <= rank < world_size, got rank={rank}, world_size={world_size}.")
    if start_sample < 0:
        raise ConfigError(f"start_sample must be >= 0, got {start_sample}.")
    if train and shuffle_buffer_size < 1:
        raise ConfigError(f"shuffle_buffer_size must be >= 1, got {shuffle_buffer_size}.")
    if window_size < 1 or future_action_window_size < 0:
        raise ConfigError(
            f"Need window_size >= 1 and future_action_window_size >= 0, got {window_size}, "
            f"{future_action_window_size}."
        )
    windowed = window_size > 1 or future_action_window_size > 0
    if len(resize_resolution) != 2 or min(resize_resolution) < 1:
        raise ConfigError(f"resize_resolution must be (height, width), got {resize_resolution}.")
    resize_resolution = (int(resize_resolution[0]), int(resize_resolution[1]))

    members = resolve_mixture_dirs(data_root_dir, data_mix, skip_missing_datasets=skip_missing_datasets)
    configs = [config for config, _, _ in members]
    if len({c.action_dim for c in configs}) != 1:
        raise ConfigError(f"Datasets of mixture '{data_mix}' have different action dimensions.")
    image_views = check_image_views(image_views, configs, data_mix)

    datasets, statistics, frame_bytes, proprio_widths = [], {}, [], {}
    for index, (config, _, dataset_dir) in enumerate(members):
        builder = load_builder(dataset_dir)
        stats = dataset_statistics(builder, dataset_dir, config, options, recompute=recompute_stats)
        statistics[config.name] = with_action_mask(stats, config)
        counts = stats.get(COUNTS_FIELD, {})
        if options.skip_unlabeled and counts.get("unlabeled_trajectories") == stats["num_trajectories"]:
            raise ConfigError(
                f"Dataset '{config.name}': all {stats['num_trajectories']} trajectories have only empty "
                "instructions, and unlabeled trajectories are skipped (as OpenVLA does), so it would yield no "
                "frames and training would wait forever. Check its language key (config "
                f"'{config.language_key}') and standardize_fn, or pass --data.skip_unlabeled false."
            )

        split = _split_name(builder, train)
        num_trajectories = int(builder.info.splits[split].num_examples)
        if num_trajectories == 0 and split == "train[95%:]":
            total = int(builder.info.splits["train"].num_examples)
            raise ConfigError(
                f"Dataset '{config.name}' has no 'val' split, and the last 5% of its {total} 'train' trajectories "
                "(what is held out for validation then, as OpenVLA does) rounds to no trajectory at all. Write a 'val' split (convert_to_rlds.py --val_fraction), "
                "record more episodes, or run without evaluation (leave out --eval.interval)."
            )
        if num_trajectories < world_size:
            raise ConfigError(
                f"Dataset '{config.name}' has {num_trajectories} trajectories in split '{split}', fewer than "
                f"world_size={world_size}: some ranks would get no data. Use fewer ranks or more data."
            )
        if train:
            frame_bytes.append(
                window_size
                * estimate_frame_bytes(builder, split, config, options=options, image_views=image_views)
            )
        rank_split = tfds.even_splits(split, n=world_size)[rank]
        trajectories = _read_trajectories(
            builder,
            rank_split,
            config,
            options,
            repeat_seed=_seed(seed, rank, _PURPOSE_FILES, index) if train else None,
            image_views=image_views,
        )
        # OpenVLA's order: normalise, drop unlabeled trajectories, chunk, flatten, then the per-dataset frame filter.
        calls = TRAJECTORY_PARALLEL_CALLS
        if options.nonfinite == "drop":
            trajectories = trajectories.map(_graph_only(_drop_nonfinite_frames), num_parallel_calls=calls)
        normalize = functools.partial(
            _normalize, statistics=stats, config=config, options=options, keep_raw_action=keep_raw_action
        )
        trajectories = trajectories.map(_graph_only(normalize), num_parallel_calls=calls)
        if options.skip_unlabeled:
            trajectories = trajectories.filter(_graph_only(_is_labeled))
        if windowed:
            chunk = functools.partial(
                _chunk,
                window_size=window_size,
                future_action_window_size=future_action_window_size,
                config=config,
                chunk_end=options.chunk_end,
            )
            trajectories = trajectories.map(_graph_only(chunk), num_parallel_calls=calls)
        if config.drop_zero_action_frames:
            dims, reference = zero_action_reference(stats, config, options.zero_action_bounds)
            drop_idle = functools.partial(_drop_zero_action_frames, dims=dims, reference=reference)
            trajectories = trajectories.map(_graph_only(drop_idle), num_parallel_calls=calls)
        if options.load_proprio:
            spec = trajectories.element_spec["observation"].get("proprio")
            proprio_widths[config.name] = None if spec is None else spec.shape[-1]
        # `unbatch` (not `flat_map(from_tensor_slices)`): same frames, less per-frame overhead (~15% more frames/s).
        datasets.append(trajectories.unbatch())
    if len(set(proprio_widths.values())) > 1:
        widths = ", ".join(f"{name}: {width}" for name, width in proprio_widths.items())
        raise ConfigError(
            f"Datasets of mixture '{data_mix}' have proprio vectors of different widths ({widths}; each is its "
            "config's state_obs_keys concatenated, one zero per None; None: no state keys), so their frames cannot be batched together "
            "with --data.load_proprio true. Train them separately, give their configs state keys of one width, or "
            "leave proprio out (--data.load_proprio false, the default)."
        )

    sizes = [statistics[c.name]["num_transitions"] for c in configs]
    raw_weights = [w for _, w, _ in members]
    weights = balance_sample_weights(raw_weights, sizes)
    # OpenVLA's `make_interleaved_dataset`: the "primary" datasets are those of weight 1.0.
    primary = [i for i, w in enumerate(raw_weights) if w == 1.0] or list(range(len(sizes)))
    dataset_length = int((np.asarray(sizes, np.float64) / np.asarray(weights))[primary].max())
    shuffle_buffer_gb = 0.0
    if train:
        mean_frame_bytes = float(np.dot(weights, frame_bytes))
        shuffle_buffer_gb = shuffle_buffer_size * mean_frame_bytes / 2**30
        budget_source = "shuffle_buffer_ram_gb argument"
        if shuffle_buffer_ram_gb is None:
            shuffle_buffer_ram_gb = default_shuffle_buffer_ram_gb()
            budget_source = (
                f"${SHUFFLE_BUFFER_RAM_ENV}"
                if os.environ.get(SHUFFLE_BUFFER_RAM_ENV)
                else f"default: {DEFAULT_RAM_FRACTION:.0%} of physical RAM / local ranks"
            )
        check_shuffle_buffer_fits(
            shuffle_buffer_size,
            mean_frame_bytes,
            shuffle_buffer_ram_gb,
            budget_source=budget_source,
        )
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

    augment = train and image_aug
    # One seed per camera (by its index in CAMERA_VIEWS, so the primary's is the single-view pipeline's): the
    # views of a frame are augmented differently, as OpenVLA's `augment` (seed + i) does.
    augment_seeds = {
        view: _seed(seed, rank, _PURPOSE_AUGMENT, CAMERA_VIEWS.index(view)) for view in image_views
    }

    def decode_one(image_bytes: Any, position: Any, view: str) -> Any:
        image = _decode_and_resize(image_bytes, resize_resolution)
        if augment:  # one draw per frame position: every image of a history window gets the same augmentation
            view_seed = tf.stack([tf.constant(augment_seeds[view], tf.int64), position])
            # Padding images stay black (OpenVLA's `augment` skips them).
            image = tf.cond(
                tf.strings.length(image_bytes) > 0, lambda: _augment(image, view_seed), lambda: image
            )
        return image

    def decode(position: Any, frame: dict[str, Any]) -> dict[str, Any]:
        for view in image_views:
            key = f"image_{view}"
            images = frame["observation"][key]
            if windowed:
                frame["observation"][key] = tf.map_fn(
                    functools.partial(decode_one, position=position, view=view),
                    images,
                    fn_output_signature=tf.uint8,
                )
            else:
                frame["observation"][key] = decode_one(images, position, view)
        return frame

    options = tf.data.Options()
    options.deterministic = True
    # Caps what tf.data's autotuner may spend on prefetch buffers (decoded frames are ~150 KB each at 224px).
    options.autotune.ram_budget = AUTOTUNE_RAM_BUDGET_BYTES
    # Iterator checkpoints (resume) refuse "stateful" ops in map functions by default. The pipeline has two, and
    # neither keeps state between calls: `get_single_element` of an episode's steps (`_episode_to_trajectory`)
    # and the fixed-seed generator of tfds' per-epoch file shuffle.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    encoded = dataset

    def from_sample(start: int) -> Any:
        if start < 0:
            raise ConfigError(f"start_sample must be >= 0, got {start}.")
        # Positions are counted before skipping, so frame i gets the same augmentation whatever the start is.
        stream = encoded.enumerate().skip(start)
        stream = stream.map(_graph_only(decode), num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE
        )
        return stream.with_options(options)

    return RLDSPipeline(
        dataset=from_sample(start_sample),
        dataset_statistics=statistics,
        sample_weights={c.name: float(w) for c, w in zip(configs, weights, strict=True)},
        num_transitions=int(sum(sizes)),
        dataset_length=dataset_length,
        shuffle_buffer_gb=shuffle_buffer_gb,
        dataset_dirs=[dataset_dir for _, _, dataset_dir in members],
        from_sample=from_sample,
        image_views=image_views,
    )
