"""Per-dataset action / proprio statistics: computed once over the train split, cached beside the data.

The cache file is `<data_root>/<name>/<version>/dataset_statistics_<hash>.json`, where the hash covers everything
the numbers depend on (dataset name and version, the split's size, the dataset config, the standardisation
function, and `STATS_FORMAT`); when that folder is not writable the file goes to `~/.cache/prismatic/`
instead. Writes are atomic (`prismatic.util.files.atomic_write`: temporary file + `os.replace`, the umask's
normal permissions), so ranks computing the same statistics at once cannot leave a torn file.
`save_dataset_statistics` writes a run's `dataset_statistics.json` in OpenVLA's layout (the same dict HF OpenVLA
checkpoints carry as `norm_stats`), which inference needs to un-normalise actions.

Statistics are never NaN: a non-finite action / proprio value stops the computation with a `ConfigError` naming
the dataset and key, and a cache or statistics file that is not valid JSON of the expected layout (hand-edited,
damaged) is a `ConfigError` naming the file (`read_statistics_file`), never silently used.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.errors import ConfigError
from prismatic.util.files import write_json_atomic
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig

# Bump when the statistics computation changes, so old caches are not reused.
STATS_FORMAT = 2  # 2: mean / std accumulated in float64
FALLBACK_CACHE_DIR = Path("~/.cache/prismatic")
STAT_KEYS = ("mean", "std", "max", "min", "q01", "q99")


def statistics_hash(
    config: RLDSDatasetConfig, version: str, standardize_fn_name: str, split_info: Mapping[str, Any]
) -> str:
    """sha256 over what the statistics depend on; any change gives a new cache file."""
    payload = {
        "format": STATS_FORMAT,
        "name": config.name,
        "version": version,
        "split": dict(split_info),
        "config": config.to_json_dict(),
        "standardize_fn": standardize_fn_name,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class RunningStatistics:
    """Statistics of a stream of [T, D] arrays, fed one trajectory at a time.

    Mean / std (float64, Chan et al.'s pairwise update), min and max are streaming. The 1% / 99% quantiles are
    exact (`np.quantile`'s linear interpolation), so they keep every value: 4 bytes per value as float32
    chunks, quantiled one dimension at a time in float64. Peak memory is about the values plus one dimension's
    column (DROID's 27M steps x 15 action + proprio dims: ~1.7 GB); images are never part of it.
    """

    def __init__(self) -> None:
        self.count = 0
        self._mean: np.ndarray | None = None
        self._m2: np.ndarray | None = None
        self._min: np.ndarray | None = None
        self._max: np.ndarray | None = None
        self._chunks: list[np.ndarray] = []

    def update(self, values: np.ndarray) -> None:
        x = np.asarray(values, np.float32)
        if x.ndim != 2:
            raise ValueError(f"RunningStatistics.update expects a [T, D] array, got shape {x.shape}.")
        if x.shape[0] == 0:  # an empty trajectory adds nothing
            return
        batch_mean = x.mean(0, dtype=np.float64)
        batch_m2 = ((x - batch_mean) ** 2).sum(0, dtype=np.float64)
        if self._mean is None:
            self._mean, self._m2 = batch_mean, batch_m2
            self._min, self._max = x.min(0), x.max(0)
        else:
            if x.shape[1] != self._mean.shape[0]:
                raise ValueError(f"Dimension changed mid-stream: {self._mean.shape[0]} -> {x.shape[1]}.")
            total = self.count + x.shape[0]
            delta = batch_mean - self._mean
            self._mean = self._mean + delta * (x.shape[0] / total)
            self._m2 = self._m2 + batch_m2 + delta**2 * (self.count * x.shape[0] / total)
            self._min, self._max = np.minimum(self._min, x.min(0)), np.maximum(self._max, x.max(0))
        self.count += x.shape[0]
        self._chunks.append(x)

    def summary(self) -> dict[str, list[float]]:
        """{mean, std, max, min, q01, q99}, each a list of D floats (std is the population std, as NumPy's)."""
        if self._mean is None:
            raise ValueError("No values to summarise.")
        q01, q99 = [], []
        for dim in range(self._mean.shape[0]):
            column = np.concatenate([c[:, dim] for c in self._chunks]).astype(np.float64)
            low, high = np.quantile(column, (0.01, 0.99), overwrite_input=True)
            q01.append(low)
            q99.append(high)
        values = {
            "mean": self._mean,
            "std": np.sqrt(self._m2 / self.count),
            "max": self._max,
            "min": self._min,
            "q01": q01,
            "q99": q99,
        }
        return {k: [float(v) for v in values[k]] for k in STAT_KEYS}


def _check_finite(values: np.ndarray, dataset_name: str, key: str, index: int) -> None:
    """Refuse NaN / inf: they would make the statistics, and so every normalised value, NaN."""
    finite = np.isfinite(values)
    if not finite.all():
        steps, dims = np.nonzero(~finite)
        raise ConfigError(
            f"Dataset '{dataset_name}': '{key}' holds NaN or inf values (trajectory {index} of the train split in "
            f"file order, step {int(steps[0])}, dimension(s) {sorted({int(d) for d in dims})}), so its statistics "
            "and normalisation would be NaN. Fix or drop those steps (in the data, or in the dataset's "
            "standardize_fn) before computing statistics or training."
        )


def compute_statistics(
    trajectories: Iterable[Mapping[str, np.ndarray]], dataset_name: str = "dataset"
) -> dict[str, Any]:
    """Statistics of `action` and `proprio` over all steps of `trajectories` (each a dict of [T, D] arrays),
    consumed one trajectory at a time (see `RunningStatistics`).

    Returns the cached layout: {"action": {mean, std, max, min, q01, q99}, "proprio": {...}, "num_transitions",
    "num_trajectories"}, every vector a list of floats.

    Raises:
        ConfigError: a value is NaN or inf (naming `dataset_name`, the key, trajectory, step and dimensions), or
            there are no trajectories.
    """
    action, proprio, num_trajectories = RunningStatistics(), RunningStatistics(), 0
    for index, traj in enumerate(trajectories):
        for key, running in (("action", action), ("proprio", proprio)):
            values = np.asarray(traj[key], np.float32)
            _check_finite(values, dataset_name, key, index)
            running.update(values)
        num_trajectories += 1
    if action.count == 0:
        raise ConfigError(
            f"Dataset '{dataset_name}': cannot compute statistics of a train split with no trajectories."
        )
    return {
        "action": action.summary(),
        "proprio": proprio.summary(),
        "num_transitions": action.count,
        "num_trajectories": num_trajectories,
    }


def check_statistics_layout(stats: Any, where: str, required: Mapping[str, tuple[str, ...]]) -> None:
    """Check one dataset's statistics: an object whose `action` / `proprio` vectors are lists of finite numbers
    of one length per key; `required` names the vectors that must be there ({"action": ("q01", "q99")}).

    Raises:
        ValueError: what is wrong, prefixed by `where` (callers turn it into a `ConfigError` naming the file).
    """
    if not isinstance(stats, Mapping):
        raise ValueError(f"{where}: not a JSON object")
    for key in ("action", "proprio"):
        if key not in stats and key not in required:
            continue
        entry = stats.get(key)
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: no '{key}' object")
        lengths = set()
        for name in STAT_KEYS:
            if name not in entry:
                if name in required.get(key, ()):
                    raise ValueError(f"{where}: no '{key}.{name}'")
                continue
            vector = entry[name]
            if not isinstance(vector, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in vector
            ):
                raise ValueError(f"{where}: '{key}.{name}' is not a list of numbers")
            if not all(math.isfinite(v) for v in vector):
                raise ValueError(f"{where}: '{key}.{name}' holds NaN or inf")
            lengths.add(len(vector))
        if len(lengths) > 1:
            raise ValueError(f"{where}: the vectors of '{key}' have different lengths {sorted(lengths)}")


def read_statistics_file(path: Path, what: str, *, per_dataset: bool) -> dict[str, Any]:
    """Read a statistics JSON file and check its layout.

    Args:
        path: the file.
        what: how the user knows it, for the message ("--dataset_statistics file", "statistics cache").
        per_dataset: True for a run's `dataset_statistics.json` / norm_stats ({dataset_name: statistics}, each
            with `action.q01` / `action.q99`, what un-normalising needs); False for one dataset's cache file.

    Raises:
        ConfigError: the file cannot be read, is not JSON, or does not have the layout; naming the file and the
            first problem.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else "it is not UTF-8 text"
        raise ConfigError(f"Cannot read the {what} '{path}': {reason}.") from e
    hint = (
        "Delete it and it will be computed again."
        if not per_dataset
        else "Point to a dataset_statistics.json written by a training run or vla_scripts/dataset_stats.py."
    )

    def reject_constant(name: str) -> float:
        raise ValueError(f"{name} is not a valid statistic")

    try:
        data = json.loads(text, parse_constant=reject_constant)
    except ValueError as e:
        detail = (
            f"line {e.lineno}, column {e.colno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e)
        )
        raise ConfigError(f"The {what} '{path}' is not valid JSON ({detail}). {hint}") from e
    try:
        if per_dataset:
            if not isinstance(data, Mapping) or not data:
                raise ValueError("the top level is not an object of {dataset_name: statistics}")
            for name, stats in data.items():
                check_statistics_layout(stats, f"dataset '{name}'", {"action": ("q01", "q99")})
        else:
            check_statistics_layout(data, "the statistics", {})
    except ValueError as e:
        raise ConfigError(f"The {what} '{path}' does not hold dataset statistics: {e}. {hint}") from e
    return data


def statistics_cache_paths(dataset_dir: Path, stats_hash: str) -> tuple[Path, Path]:
    """(beside the data, fallback under ~/.cache/prismatic) for one statistics hash."""
    filename = f"dataset_statistics_{stats_hash}.json"
    return Path(dataset_dir) / filename, FALLBACK_CACHE_DIR.expanduser() / filename


def load_or_compute_statistics(
    dataset_dir: Path, stats_hash: str, compute: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], Path]:
    """Return cached statistics for `stats_hash`, or run `compute()` once and cache its result.

    Returns:
        (statistics, path of the cache file read or written).
    Raises:
        ConfigError: a cache file is malformed (it names the file: delete it to recompute), or neither cache
            location can be written.
    """
    primary, fallback = statistics_cache_paths(dataset_dir, stats_hash)
    for path in (primary, fallback):
        if path.is_file():
            return read_statistics_file(path, "statistics cache", per_dataset=False), path
    statistics = compute()
    try:
        write_json_atomic(primary, statistics, "statistics cache")
        return statistics, primary
    except (
        ConfigError
    ):  # read-only data folder (shared cluster storage, mounted bucket): cache per user instead
        write_json_atomic(fallback, statistics, "statistics cache")
        return statistics, fallback


def with_action_mask(statistics: Mapping[str, Any], config: RLDSDatasetConfig) -> dict[str, Any]:
    """Copy of cached `statistics` with `action.mask` (which dims are normalised) added, as OpenVLA stores it."""
    out = json.loads(json.dumps(statistics))
    out["action"]["mask"] = [bool(m) for m in config.action_normalization_mask]
    return out


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_to_jsonable(v) for v in value]
    return value


def save_dataset_statistics(statistics: Mapping[str, Any], run_dir: Path) -> Path:
    """Write `<run_dir>/dataset_statistics.json` (atomically) in OpenVLA's layout; return its path.

    Layout: {dataset_name: {"action": {"mean", "std", "max", "min", "q01", "q99", "mask"}, "proprio": {"mean",
    "std", "max", "min", "q01", "q99"}, "num_transitions": int, "num_trajectories": int}}, vectors as lists.
    Not collective: call it on one rank (rank 0).
    """
    path = Path(run_dir) / "dataset_statistics.json"
    write_json_atomic(path, _to_jsonable(statistics), "dataset statistics")
    return path
