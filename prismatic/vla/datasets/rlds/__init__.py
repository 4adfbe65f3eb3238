"""RLDS data: dataset / mixture / standardisation registries, statistics, the tf.data pipeline, toy datasets.

The pipeline, one module per job: `discovery` (folders, builders, splits, mixture members) -> `trajectories`
(read + standardise) -> `reading` (the statistics pass; the public read API) -> `filters` / `chunking` ->
`buffer` (shuffle-buffer RAM) -> `images` (decode, resize, augment) -> `interleave` (`make_interleaved_dataset`).

Nothing here imports TensorFlow at import time; the functions that need it call `import_tensorflow()`.
"""

from prismatic.vla.datasets.rlds.configs import (
    DATASET_CONFIGS,
    ActionEncoding,
    NormalizationType,
    RLDSDatasetConfig,
    StateEncoding,
    get_dataset_config,
    register_dataset,
)
from prismatic.vla.datasets.rlds.discovery import find_dataset_dir, resolve_mixture_dirs
from prismatic.vla.datasets.rlds.interleave import RLDSPipeline, make_interleaved_dataset
from prismatic.vla.datasets.rlds.mixtures import (
    MIXTURES,
    balance_sample_weights,
    get_mixture,
    register_mixture,
)
from prismatic.vla.datasets.rlds.normalization import normalize_np, normalize_tf, unnormalize_np
from prismatic.vla.datasets.rlds.reading import mixture_statistics
from prismatic.vla.datasets.rlds.statistics import save_dataset_statistics
from prismatic.vla.datasets.rlds.toy import TOY_DATASET_NAMES, build_toy_datasets
from prismatic.vla.datasets.rlds.transforms import (
    STANDARDIZE_FNS,
    get_standardize_fn,
    register_standardize_fn,
)
from prismatic.vla.datasets.rlds.writer import write_rlds_dataset

__all__ = [
    "DATASET_CONFIGS",
    "MIXTURES",
    "STANDARDIZE_FNS",
    "TOY_DATASET_NAMES",
    "ActionEncoding",
    "NormalizationType",
    "RLDSDatasetConfig",
    "RLDSPipeline",
    "StateEncoding",
    "balance_sample_weights",
    "build_toy_datasets",
    "find_dataset_dir",
    "get_dataset_config",
    "get_mixture",
    "get_standardize_fn",
    "make_interleaved_dataset",
    "mixture_statistics",
    "normalize_np",
    "normalize_tf",
    "register_dataset",
    "register_mixture",
    "register_standardize_fn",
    "resolve_mixture_dirs",
    "save_dataset_statistics",
    "unnormalize_np",
    "write_rlds_dataset",
]
