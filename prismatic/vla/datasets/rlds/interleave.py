"""The `tf.data` pipeline: RLDS datasets on disk -> one deterministic, rank-sharded stream of training frames.

Per dataset (`<data_root_dir>/<name>/<highest version>/`, read with `tfds.builder_from_directory`):
    read this rank's share of the trajectories (images stay JPEG bytes; train: forever, file order reshuffled
    every epoch) -> standardise (`transforms.py`) -> restructure to the common frame format (`trajectories.py`)
    -> normalise action + proprio with the cached statistics (`reading.dataset_statistics`) -> drop unlabeled
    trajectories -> chunk (optional, `chunking.py`) -> drop idle frames (DROID, `filters.py`) -> flatten
    trajectories into frames. The order, the statistics and the arithmetic are
    OpenVLA's (`DataOptions` in `prismatic/conf/data.py` names each choice; docs/data_pipeline.md).
Then across datasets: weighted `sample_from_datasets` (weights balanced by size, `mixtures.py`) -> frame-level
window shuffle (train; `shuffle.py`, its RAM checked by `buffer.py`) -> skip `start_sample` frames -> decode +
resize (+ augment) the images (`images.py`). What is built is one `StreamSpec`
(`prismatic/vla/datasets/stream_spec.py`).

Frames are shuffled while their images are still encoded (a buffer of JPEG bytes is ~50x smaller), and skipped
before decoding, so resuming at frame N by skipping costs reading, not decoding, the first N frames: linear in N.
Resuming in bounded time instead restores the tf.data iterator's state (`RLDSDataset.save_stream_state` /
`resume_from`). The pipeline runs under symbolic checkpointing (`experimental_symbolic_checkpoint`): every op
saves cursors, never buffered elements (in-flight decoded frames are recomputed on restore), and the shuffle
saves the readers' cursors from before its current window plus the index in it, because its order is a function
of positions alone (`shuffle.py`); a restore re-reads that window. So a snapshot is tens of KB, not the buffer.
The iterator must be restored into the stream built with the `start_sample` it was saved from
(`RLDSPipeline.from_sample`): tf.data drops a `skip(0)`, so the pipeline's shape depends on it.

Determinism: every random choice is seeded from (seed, rank) and image augmentation uses stateless ops keyed by
the frame's position in the stream, so a given (seed, rank, world_size) always yields the same frames (also
when the same dataset object is iterated again), and `start_sample=N` yields exactly that stream minus its
first N frames. Parallel maps keep their order (`options.deterministic = True`).

Damaged data is named, not dumped as a TensorFlow traceback: a dataset folder without its version folder or
with unreadable metadata is a `ConfigError` naming the folder, and a corrupt, truncated or missing TFRecord file
met while reading (`discovery.tfrecord_errors`) is a `ConfigError` naming that file.

Each yielded frame (as NumPy via `.as_numpy_iterator()`):
    {"observation": {"image_primary": uint8[H, W, 3]},
     "task": {"language_instruction": bytes}, "action": float32[7] (normalised), "dataset_name": bytes}
plus "observation.proprio" (float32[P], the config's state keys) with `options.load_proprio`, and "raw_action"
(the standardised action before normalisation, same shape) when `spec.keep_raw_action`.
Camera views: `spec.image_views` (default ("primary",)) names the cameras carried, each as "observation.image_<view>"
uint8[H, W, 3] (views: primary, secondary, wrist; e.g. ("primary", "wrist") adds "observation.image_wrist"), all
decoded and resized alike, augmented alike but with a draw of their own. A dataset whose config has no camera for
a view gets an all-zero (black) image there, never augmented, as OpenVLA pads missing views.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.conf.data import DataOptions
from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.buffer import (
    check_shuffle_buffer_fits,
    estimate_frame_bytes,
    shuffle_buffer_budget,
)
from prismatic.vla.datasets.rlds.chunking import chunk_trajectory
from prismatic.vla.datasets.rlds.configs import CAMERA_VIEWS, RLDSDatasetConfig
from prismatic.vla.datasets.rlds.discovery import (
    check_image_views,
    import_tfds,
    load_builder,
    resolve_mixture_dirs,
    split_name,
)
from prismatic.vla.datasets.rlds.filters import (
    drop_nonfinite_frames,
    drop_zero_action_frames,
    is_labeled,
    zero_action_reference,
)
from prismatic.vla.datasets.rlds.images import frame_image_decoder
from prismatic.vla.datasets.rlds.mixtures import balance_sample_weights
from prismatic.vla.datasets.rlds.normalization import normalize_tf
from prismatic.vla.datasets.rlds.reading import dataset_statistics
from prismatic.vla.datasets.rlds.shuffle import window_shuffle
from prismatic.vla.datasets.rlds.statistics import COUNTS_FIELD, with_action_mask
from prismatic.vla.datasets.rlds.trajectories import TRAJECTORY_PARALLEL_CALLS, graph_only, trajectory_dataset
from prismatic.vla.datasets.stream_spec import StreamSpec

logger = logging.getLogger(__name__)

AUTOTUNE_RAM_BUDGET_BYTES = 256 * 2**20


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


def _seed(seed: int, rank: int, purpose: int, index: int = 0) -> int:
    """A 31-bit seed for one random choice, derived from (seed, rank): ranks and purposes never share one."""
    return int(np.random.SeedSequence([seed, rank, purpose, index]).generate_state(1)[0] >> 1)


_PURPOSE_FILES, _PURPOSE_SAMPLE, _PURPOSE_SHUFFLE, _PURPOSE_AUGMENT = range(4)


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


@dataclass
class _DatasetFrames:
    """One dataset's share of the stream, before mixing: its frames and what the mixture needs to know of it."""

    frames: Any  # tf.data.Dataset of this rank's (normalised, filtered, possibly chunked) frames
    statistics: dict[str, Any]  # with `action.mask`
    frame_bytes: float  # estimated shuffle-buffer bytes per frame (train only, else 0)
    proprio_width: (
        int | None
    )  # with `options.load_proprio`: the proprio vector's width (None: unknown / none)


def _check_statistics(stats: dict[str, Any], config: RLDSDatasetConfig, options: DataOptions) -> None:
    counts = stats.get(COUNTS_FIELD, {})
    if options.skip_unlabeled and counts.get("unlabeled_trajectories") == stats["num_trajectories"]:
        raise ConfigError(
            f"Dataset '{config.name}': all {stats['num_trajectories']} trajectories have only empty "
            "instructions, and unlabeled trajectories are skipped (as OpenVLA does), so it would yield no "
            "frames and training would wait forever. Check its language key (config "
            f"'{config.language_key}') and standardize_fn, or pass --data.skip_unlabeled false."
        )


def _check_split(builder: Any, split: str, config: RLDSDatasetConfig, world_size: int) -> None:
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


def _dataset_frames(
    spec: StreamSpec, index: int, config: RLDSDatasetConfig, dataset_dir: Path, image_views: tuple[str, ...]
) -> _DatasetFrames:
    """This rank's frames of one dataset of the mixture (the `index`-th), in OpenVLA's order: read, drop
    non-finite frames, normalise, drop unlabeled trajectories, chunk, drop idle frames, flatten."""
    tfds = import_tfds()
    options = spec.options
    builder = load_builder(dataset_dir)
    stats = dataset_statistics(builder, dataset_dir, config, options, recompute=spec.recompute_stats)
    _check_statistics(stats, config, options)
    split = split_name(builder, spec.train)
    _check_split(builder, split, config, spec.world_size)
    frame_bytes = 0.0
    if spec.train:
        frame_bytes = spec.window_size * estimate_frame_bytes(
            builder, split, config, options=options, image_views=image_views
        )
    trajectories = trajectory_dataset(
        builder,
        tfds.even_splits(split, n=spec.world_size)[spec.rank],
        config,
        options,
        repeat_seed=_seed(spec.seed, spec.rank, _PURPOSE_FILES, index) if spec.train else None,
        image_views=image_views,
    )
    calls = TRAJECTORY_PARALLEL_CALLS
    if options.nonfinite == "drop":
        trajectories = trajectories.map(graph_only(drop_nonfinite_frames), num_parallel_calls=calls)
    normalize = functools.partial(
        _normalize, statistics=stats, config=config, options=options, keep_raw_action=spec.keep_raw_action
    )
    trajectories = trajectories.map(graph_only(normalize), num_parallel_calls=calls)
    if options.skip_unlabeled:
        trajectories = trajectories.filter(graph_only(is_labeled))
    if spec.windowed:
        chunk = functools.partial(
            chunk_trajectory,
            window_size=spec.window_size,
            future_action_window_size=spec.future_action_window_size,
            config=config,
            chunk_end=options.chunk_end,
        )
        trajectories = trajectories.map(graph_only(chunk), num_parallel_calls=calls)
    if config.drop_zero_action_frames:
        dims, reference = zero_action_reference(stats, config, options.zero_action_bounds)
        drop_idle = functools.partial(drop_zero_action_frames, dims=dims, reference=reference)
        trajectories = trajectories.map(graph_only(drop_idle), num_parallel_calls=calls)
    proprio_width = None
    if options.load_proprio:
        proprio = trajectories.element_spec["observation"].get("proprio")
        proprio_width = None if proprio is None else proprio.shape[-1]
    # `unbatch` (not `flat_map(from_tensor_slices)`): same frames, less per-frame overhead (~15% more frames/s).
    return _DatasetFrames(trajectories.unbatch(), with_action_mask(stats, config), frame_bytes, proprio_width)


def _check_proprio_widths(data_mix: str, proprio_widths: dict[str, int | None]) -> None:
    if len(set(proprio_widths.values())) > 1:
        widths = ", ".join(f"{name}: {width}" for name, width in proprio_widths.items())
        raise ConfigError(
            f"Datasets of mixture '{data_mix}' have proprio vectors of different widths ({widths}; each is its "
            "config's state_obs_keys concatenated, one zero per None; None: no state keys), so their frames cannot be batched together "
            "with --data.load_proprio true. Train them separately, give their configs state keys of one width, or "
            "leave proprio out (--data.load_proprio false, the default)."
        )


def _shuffle_buffer_gb(spec: StreamSpec, weights: np.ndarray, frame_bytes: list[float]) -> float:
    """Estimated GiB of the full shuffle buffer, refused (`ConfigError`) when over its RAM budget."""
    mean_frame_bytes = float(np.dot(weights, frame_bytes))
    budget_gb, budget_source = shuffle_buffer_budget(spec.shuffle_buffer_ram_gb)
    check_shuffle_buffer_fits(
        spec.shuffle_buffer_size, mean_frame_bytes, budget_gb, budget_source=budget_source
    )
    return spec.shuffle_buffer_size * mean_frame_bytes / 2**30


def _decoded_stream(
    numbered_from: Callable[[int], Any], spec: StreamSpec, image_views: tuple[str, ...]
) -> Callable[[int], Any]:
    """`from_sample(n)`: `numbered_from(n)`, the (index, encoded frame) pairs from frame n on, images decoded
    (and augmented)."""
    tf = import_tensorflow()
    # One seed per camera (by its index in CAMERA_VIEWS, so the primary's is the single-view pipeline's): the
    # views of a frame are augmented differently, as OpenVLA's `augment` (seed + i) does.
    augment_seeds = (
        {
            view: _seed(spec.seed, spec.rank, _PURPOSE_AUGMENT, CAMERA_VIEWS.index(view))
            for view in image_views
        }
        if spec.train and spec.image_aug
        else None
    )
    decode = frame_image_decoder(spec.resize_resolution, image_views, augment_seeds, spec.windowed)
    options = tf.data.Options()
    options.deterministic = True
    # Caps what tf.data's autotuner may spend on prefetch buffers (decoded frames are ~150 KB each at 224px).
    options.autotune.ram_budget = AUTOTUNE_RAM_BUDGET_BYTES
    # Iterator checkpoints (resume) refuse "stateful" ops in map functions by default. The pipeline has two, and
    # neither keeps state between calls: `get_single_element` of an episode's steps (`trajectories.py`) and the
    # fixed-seed generator of tfds' per-epoch file shuffle.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    # Checkpoints hold cursors, not buffered frames (see the module docstring).
    options.experimental_symbolic_checkpoint = True

    def from_sample(start: int) -> Any:
        if start < 0:
            raise ConfigError(f"start_sample must be >= 0, got {start}.")
        # Positions are counted before skipping, so frame i gets the same augmentation whatever the start is.
        stream = numbered_from(start)
        stream = stream.map(graph_only(decode), num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE
        )
        return stream.with_options(options)

    return from_sample


def make_interleaved_dataset(spec: StreamSpec) -> RLDSPipeline:
    """Build the frame stream of mixture `spec.data_mix` for one rank (see module docstring and `StreamSpec`).

    With `spec.window_size` / `spec.future_action_window_size` other than (1, 0), each `image_<view>` is
    [W, H, W, 3], `proprio` [W, P], `observation.pad_mask` bool[W], `action` [W + F, A] and `action_pad_mask`
    bool[W + F], as OpenVLA's `chunk_act_obs` (`chunking.py`).

    Raises:
        ConfigError: unknown mixture, missing data folder or dataset(s), a dataset with fewer trajectories than
            `world_size`, a shuffle buffer estimated not to fit its RAM budget, an unknown camera view or one no
            dataset of the mixture has.
    """
    tf = import_tensorflow()
    data_mix = spec.data_mix
    members = resolve_mixture_dirs(
        spec.data_root_dir, data_mix, skip_missing_datasets=spec.skip_missing_datasets
    )
    configs = [config for config, _, _ in members]
    if len({c.action_dim for c in configs}) != 1:
        raise ConfigError(f"Datasets of mixture '{data_mix}' have different action dimensions.")
    image_views = check_image_views(spec.image_views, configs, data_mix)

    parts = [
        _dataset_frames(spec, index, config, dataset_dir, image_views)
        for index, (config, _, dataset_dir) in enumerate(members)
    ]
    statistics = {config.name: part.statistics for config, part in zip(configs, parts, strict=True)}
    if spec.options.load_proprio:
        _check_proprio_widths(
            data_mix, {config.name: part.proprio_width for config, part in zip(configs, parts, strict=True)}
        )

    sizes = [statistics[c.name]["num_transitions"] for c in configs]
    raw_weights = [w for _, w, _ in members]
    weights = balance_sample_weights(raw_weights, sizes)
    # OpenVLA's `make_interleaved_dataset`: the "primary" datasets are those of weight 1.0.
    primary = [i for i, w in enumerate(raw_weights) if w == 1.0] or list(range(len(sizes)))
    dataset_length = int((np.asarray(sizes, np.float64) / np.asarray(weights))[primary].max())
    shuffle_buffer_gb = (
        _shuffle_buffer_gb(spec, weights, [p.frame_bytes for p in parts]) if spec.train else 0.0
    )
    if len(parts) == 1:
        dataset = parts[0].frames
    else:
        dataset = tf.data.Dataset.sample_from_datasets(
            [p.frames for p in parts],
            weights=[float(w) for w in weights],
            seed=_seed(spec.seed, spec.rank, _PURPOSE_SAMPLE),
            stop_on_empty_dataset=False,  # val: keep going until every dataset's pass is done
        )
    if spec.train:
        # Frames are still JPEG bytes here, so a large buffer stays cheap.
        numbered_from = functools.partial(
            window_shuffle, dataset, spec.shuffle_buffer_size, _seed(spec.seed, spec.rank, _PURPOSE_SHUFFLE)
        )
    else:
        numbered_from = dataset.enumerate().skip
    from_sample = _decoded_stream(numbered_from, spec, image_views)
    return RLDSPipeline(
        dataset=from_sample(spec.start_sample),
        dataset_statistics=statistics,
        sample_weights={c.name: float(w) for c, w in zip(configs, weights, strict=True)},
        num_transitions=int(sum(sizes)),
        dataset_length=dataset_length,
        shuffle_buffer_gb=shuffle_buffer_gb,
        dataset_dirs=[dataset_dir for _, _, dataset_dir in members],
        from_sample=from_sample,
        image_views=image_views,
    )
