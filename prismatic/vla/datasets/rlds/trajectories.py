"""Reading one dataset's trajectories into tf.data: episodes -> standardised trajectories in the frame format.

Per dataset: read this rank's share of the episodes (images stay JPEG bytes; training reads forever, the file
order reshuffled every epoch) -> batch each episode's steps into one trajectory -> standardise (`transforms.py`)
-> restructure to the common frame format (camera views, proprio, instruction, action, dataset name), still
un-normalised. Every pipeline function is traced without AutoGraph (`graph_only`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig
from prismatic.vla.datasets.rlds.discovery import import_tfds
from prismatic.vla.datasets.rlds.transforms import get_standardize_fn

READ_CYCLE_LENGTH = 4  # shard files of one dataset read at once
READ_BUFFER_BYTES = 2**20  # read-ahead per open shard file
TRAJECTORY_PARALLEL_CALLS = 2  # per dataset: trajectories being standardised at once


def _skip_image_decoding(features: Any) -> Any:
    """A tfds `decoders` tree that keeps every Image feature as encoded bytes (decoded later, after shuffling)."""
    tfds = import_tfds()

    if isinstance(features, tfds.features.Image):
        return tfds.decode.SkipDecoding()
    if isinstance(features, tfds.features.Dataset):
        return _skip_image_decoding(features.feature)
    if isinstance(features, tfds.features.FeaturesDict):
        decoders = {k: _skip_image_decoding(v) for k, v in features.items()}
        return {k: v for k, v in decoders.items() if v is not None} or None
    return None


def graph_only(fn: Callable) -> Callable:
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


def restructure(
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


def trajectory_dataset(
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
    steps in OpenVLA's order on the same machine; `with_ids` adds episode ids and timesteps (`restructure`).

    `repeat_seed=None`: one pass, in file order. Otherwise: forever, with the file order reshuffled every epoch
    from (repeat_seed, epoch). The epoch index is part of the graph, so iterating the returned dataset again
    replays the same stream; a `reshuffle_each_iteration` shuffle would draw new orders on every iteration.
    """
    tf = import_tensorflow()
    tfds = import_tfds()

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
            # A sequential interleave: the stream runs under symbolic checkpointing, whose per-element save of a
            # *parallel* interleave races with its reader threads and now and then crashes the process (seen with
            # tensorflow 2.21: a segfault in `ParallelInterleaveIterator::WriteElement`). The order is the same
            # (the parallel one is deterministic); reading is light, and the decoding after it stays parallel.
            num_parallel_calls_for_interleave_files=None,
        )
        with (
            warnings.catch_warnings()
        ):  # tfds passes `deterministic` to the interleave; sequential, it is moot
            warnings.filterwarnings("ignore", message="The `deterministic` argument has no effect")
            return builder.as_dataset(
                split=split,
                shuffle_files=shuffle_seed is not None,
                decoders=decoders,
                read_config=read_config,
            )

    if repeat_seed is None:
        ds = read(None)
    else:
        read_epoch = graph_only(lambda epoch: read(repeat_seed + epoch))
        ds = tf.data.Dataset.counter().flat_map(read_epoch)
    # Whole trajectories (every camera of every step) are large: a fixed, small number are in flight per dataset,
    # so host memory does not grow with the mixture's size; the heavy per-frame work is parallelised later.
    calls = (os.cpu_count() or 1) if openvla_order else TRAJECTORY_PARALLEL_CALLS
    ds = ds.map(graph_only(_episode_to_trajectory), num_parallel_calls=calls)
    return ds.map(
        graph_only(lambda traj: restructure(traj, config, options, with_ids, image_views)),
        num_parallel_calls=calls,
    )
