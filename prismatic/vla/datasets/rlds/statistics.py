"""Per-dataset action / proprio statistics as OpenVLA computes them, cached beside the data.

OpenVLA (`get_dataset_statistics`) concatenates every step's float32 action / proprio and takes NumPy's
`mean(0)`, `std(0)`, `max(0)`, `min(0)` (float32 results, float32 accumulation in reading order) and
`quantile(0.01 / 0.99, axis=0)` of those arrays under its pinned NumPy 1.x (float64 results: `numpy1_quantile`);
`compute_statistics` computes the same on the same arrays.
Which frames: every split ("all") by default, as OpenVLA (`DataOptions.statistics_split`).

The cache file is `<data_root>/<name>/<version>/dataset_statistics_<hash>.json`, where the hash covers everything
the numbers depend on (`statistics_cache_key`: the data files' names, sizes and modification times, the dataset
config, the standardisation function's id and source, the statistics options and `STATS_FORMAT`). The key is
stored in the file, so a rebuild can say what changed. When the data folder is not writable the file goes to
`~/.cache/prismatic/` instead, and the log says so. Writes are atomic (`prismatic.util.files.atomic_write`), so
ranks computing the same statistics at once cannot leave a torn file. `save_dataset_statistics` writes a run's
`dataset_statistics.json` in OpenVLA's layout (the `norm_stats` HF OpenVLA checkpoints carry).

Statistics are never NaN: a non-finite value stops the computation with a `ConfigError` naming dataset, split,
episode, key and step (or, with `nonfinite="drop"`, its frame is left out and counted), and a cache or statistics
file that is not valid JSON of the expected layout is a `ConfigError` naming the file, never silently used.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.run_layout import DATASET_STATISTICS_FILE
from prismatic.util.errors import ConfigError
from prismatic.util.files import write_json_atomic
from prismatic.util.statistics_file import STAT_KEYS, check_statistics_layout, read_statistics_file  # noqa: F401
from prismatic.vla.datasets.rlds.configs import RLDSDatasetConfig

logger = logging.getLogger(__name__)

# Bump when the statistics computation changes, so old caches are not reused.
STATS_FORMAT = (
    4  # 4: OpenVLA's reductions (NumPy 1.x quantiles), every split by default, file-based cache key
)
FALLBACK_CACHE_DIR = Path("~/.cache/prismatic")
STATISTICS_CONFIG_FIELDS = ("name", "state_obs_keys", "action_encoding", "standardize_fn", "language_key")
CACHE_KEY_FIELD = "_cache_key"  # our bookkeeping inside a cache file; not part of OpenVLA's layout
COUNTS_FIELD = "_counts"  # frames / trajectories the pipeline treats specially, for the log
DATA_FILE_SUFFIXES = (".json", ".tfrecord")


def data_files_fingerprint(dataset_dir: Path) -> list[list[Any]]:
    """[name, size, mtime_ns] of every data / metadata file of a dataset folder (statistics caches excluded)."""
    entries = []
    for path in sorted(Path(dataset_dir).iterdir()):
        if not path.is_file() or path.name.startswith("dataset_statistics_"):
            continue
        if not any(suffix in path.name for suffix in DATA_FILE_SUFFIXES):
            continue
        stat = path.stat()
        entries.append([path.name, stat.st_size, stat.st_mtime_ns])
    return entries


def statistics_cache_key(
    config: RLDSDatasetConfig,
    version: str,
    standardize_fn: Mapping[str, str],
    data_files: list[list[Any]],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """Everything the statistics depend on, as a JSON object (its sha256 names the cache file)."""
    return {
        "format": STATS_FORMAT,
        "name": config.name,
        "version": version,
        # Only what the numbers depend on: a changed mask or normalisation type must not cost an OXE-scale pass.
        "config": {k: v for k, v in config.to_json_dict().items() if k in STATISTICS_CONFIG_FIELDS},
        "standardize_fn": dict(standardize_fn),
        "data_files": data_files,
        "options": dict(options),
    }


def statistics_hash(cache_key: Mapping[str, Any]) -> str:
    """sha256 of a cache key; any change gives a new cache file."""
    return hashlib.sha256(json.dumps(cache_key, sort_keys=True).encode()).hexdigest()


def describe_key_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two cache keys, in words (for the log line of a rebuild)."""
    changes = []
    if old.get("data_files") != new.get("data_files"):
        before = {name: (size, mtime) for name, size, mtime in old.get("data_files", [])}
        after = {name: (size, mtime) for name, size, mtime in new.get("data_files", [])}
        changed = sorted(n for n in before.keys() & after.keys() if before[n] != after[n])
        added, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
        parts = [
            f"{what} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            for what, names in (("modified", changed), ("added", added), ("removed", removed))
            if names
        ]
        changes.append("data files " + "; ".join(parts))
    for field in ("format", "version", "config", "standardize_fn", "options"):
        if old.get(field) != new.get(field):
            if field == "options":
                diff = {k: v for k, v in new["options"].items() if old.get("options", {}).get(k) != v}
                changes.append(f"options {diff}")
            else:
                changes.append(
                    {"format": "statistics format", "standardize_fn": "standardisation function"}.get(
                        field, field
                    )
                )
    return ", ".join(changes) or "unknown change"


def _check_finite(values: np.ndarray, dataset_name: str, split: str, episode: str, key: str) -> None:
    """Refuse NaN / inf: they would make the statistics, and so every normalised value, NaN."""
    finite = np.isfinite(values)
    if not finite.all():
        steps, dims = np.nonzero(~finite)
        raise ConfigError(
            f"Dataset '{dataset_name}', split '{split}', episode {episode}: '{key}' holds NaN or inf at step "
            f"{int(steps[0])} (dimension(s) {sorted({int(d) for d in dims})}; {len(set(steps.tolist()))} step(s) "
            "in this episode), so its statistics and normalisation would be NaN. Fix or drop those steps (in the "
            "data, or in the dataset's standardize_fn), or pass --data.nonfinite drop to leave such frames out of "
            "statistics and training."
        )


def numpy1_quantile(values: np.ndarray, q: float) -> np.ndarray:
    """`np.quantile(values, q, axis=0)` of a float32 [N, D] array as NumPy 1.x computes it (OpenVLA pins
    tensorflow 2.15, hence NumPy < 2): the neighbours' difference in float32, the interpolation in float64, a
    float64 result. NumPy 2 interpolates and returns float32, which moves q01 / q99 in their last bits and so
    some normalised values and action tokens. Method "linear" (NumPy >= 1.22's `_lerp`)."""
    n = values.shape[0]
    ordered = np.sort(values, axis=0)
    virtual = np.float64(n - 1) * np.float64(q)
    below = int(np.floor(virtual))
    above = min(below + 1, n - 1)
    gamma = np.array([virtual - below], np.float64)  # an array, as NumPy 1.x had it: float64 promotion
    low, high = ordered[below], ordered[above]
    diff = high - low  # float32
    if gamma[0] >= 0.5:
        return high - diff * (1 - gamma)
    return low + diff * gamma


def _summary(values: np.ndarray) -> dict[str, list[float]]:
    """OpenVLA's reductions of a float32 [N, D] array (under its NumPy 1.x), as lists of floats."""
    return {
        "mean": values.mean(0).tolist(),
        "std": values.std(0).tolist(),
        "max": values.max(0).tolist(),
        "min": values.min(0).tolist(),
        "q01": numpy1_quantile(values, 0.01).tolist(),
        "q99": numpy1_quantile(values, 0.99).tolist(),
    }


def compute_statistics(
    trajectories: Iterable[Mapping[str, Any]],
    dataset_name: str = "dataset",
    *,
    split: str = "all",
    nonfinite: str = "error",
) -> dict[str, Any]:
    """Statistics of `action` and `proprio` over all steps of `trajectories`, as OpenVLA computes them.

    Each trajectory is a dict of [T, D] arrays `action` and (optional) `proprio`; a trajectory without `proprio`
    counts zeros of the action's shape, as OpenVLA does when proprio is not loaded. Optional `episode_id` names
    the episode in errors; optional `language_instruction` ([T] bytes) lets the result count unlabeled
    trajectories. Values are kept as float32 (4 bytes per value and dimension, as OpenVLA).

    Returns:
        {"action": {mean, std, max, min, q01, q99}, "proprio": {...}, "num_transitions", "num_trajectories",
        "_counts": {"unlabeled_trajectories", "nonfinite_frames_dropped"}}, vectors as lists of floats.
    Raises:
        ConfigError: a value is NaN or inf and `nonfinite="error"` (naming dataset, split, episode, key, step),
            or there are no steps.
    """
    actions, proprios = [], []
    num_trajectories = unlabeled = dropped = 0
    for index, traj in enumerate(trajectories):
        action = np.asarray(traj["action"], np.float32)
        proprio = np.asarray(traj["proprio"], np.float32) if "proprio" in traj else np.zeros_like(action)
        episode = traj.get("episode_id")
        if isinstance(episode, np.ndarray):  # the pipeline passes the step-broadcast id's first element
            episode = episode[0] if episode.size else None
        episode = (
            f"'{episode.decode() if isinstance(episode, bytes) else episode}'"
            if episode is not None
            else (f"#{index} (in reading order)")
        )
        if nonfinite == "error":
            _check_finite(action, dataset_name, split, episode, "action")
            _check_finite(proprio, dataset_name, split, episode, "proprio")
        else:
            keep = np.isfinite(action).all(1) & np.isfinite(proprio).all(1)
            dropped += int((~keep).sum())
            action, proprio = action[keep], proprio[keep]
        if "language_instruction" in traj and not any(len(s) for s in traj["language_instruction"]):
            unlabeled += 1
        num_trajectories += 1  # every trajectory read, an empty one too (OpenVLA counts them alike)
        actions.append(action)
        proprios.append(proprio)
    if not sum(len(a) for a in actions):
        raise ConfigError(
            f"Dataset '{dataset_name}': cannot compute statistics of split '{split}': it has no steps."
        )
    action_values, proprio_values = np.concatenate(actions), np.concatenate(proprios)
    return {
        "action": _summary(action_values),
        "proprio": _summary(proprio_values),
        "num_transitions": int(action_values.shape[0]),
        "num_trajectories": num_trajectories,
        COUNTS_FIELD: {"unlabeled_trajectories": unlabeled, "nonfinite_frames_dropped": dropped},
    }


def statistics_cache_paths(dataset_dir: Path, stats_hash: str) -> tuple[Path, Path]:
    """(beside the data, fallback under ~/.cache/prismatic) for one statistics hash."""
    filename = f"dataset_statistics_{stats_hash}.json"
    return Path(dataset_dir) / filename, FALLBACK_CACHE_DIR.expanduser() / filename


def _previous_cache_key(dataset_dir: Path) -> tuple[dict[str, Any], Path] | None:
    """The key stored in the newest other cache file beside the data, if any (to say why we rebuild)."""
    caches = sorted(Path(dataset_dir).glob("dataset_statistics_*.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(caches):
        try:
            key = json.loads(path.read_text(encoding="utf-8")).get(CACHE_KEY_FIELD)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(key, dict):
            return key, path
    return None


def load_or_compute_statistics(
    dataset_dir: Path,
    cache_key: Mapping[str, Any],
    compute: Callable[[], dict[str, Any]],
    *,
    recompute: bool = False,
    dataset_name: str = "dataset",
) -> tuple[dict[str, Any], Path]:
    """Return cached statistics for `cache_key`, or run `compute()` once and cache its result (with the key).

    `recompute=True` ignores an existing cache and overwrites it. The log names the cache read, or why the
    statistics were computed (no cache yet, what changed since the previous one, or `recompute`), and says so
    when the per-user fallback location is used.

    Returns:
        (statistics, path of the cache file read or written).
    Raises:
        ConfigError: a cache file is malformed (it names the file: delete it to recompute), or neither cache
            location can be written.
    """
    stats_hash = statistics_hash(cache_key)
    primary, fallback = statistics_cache_paths(dataset_dir, stats_hash)
    if not recompute:
        for path in (primary, fallback):
            if path.is_file():
                statistics = read_statistics_file(path, "statistics cache", per_dataset=False)
                where = (
                    "" if path == primary else " (the per-user fallback: the data folder was not writable)"
                )
                logger.info("Statistics of '%s': read from cache %s%s", dataset_name, path, where)
                return statistics, path
    if recompute:
        reason = "--recompute_stats"
    elif (previous := _previous_cache_key(dataset_dir)) is not None:
        reason = f"{describe_key_change(previous[0], cache_key)} since {previous[1].name}"
    else:
        reason = "no cache yet"
    logger.info("Statistics of '%s': computing (%s)", dataset_name, reason)
    statistics = {**compute(), CACHE_KEY_FIELD: dict(cache_key)}
    try:
        write_json_atomic(primary, statistics, "statistics cache")
        return statistics, primary
    except (
        ConfigError
    ):  # read-only data folder (shared cluster storage, mounted bucket): cache per user instead
        logger.warning(
            "Statistics of '%s': the data folder %s is not writable; caching them in %s instead.",
            dataset_name,
            dataset_dir,
            fallback,
        )
        write_json_atomic(fallback, statistics, "statistics cache")
        return statistics, fallback


def with_action_mask(statistics: Mapping[str, Any], config: RLDSDatasetConfig) -> dict[str, Any]:
    """OpenVLA's layout of cached `statistics`: its keys only, with `action.mask` (which dims are normalised)."""
    out = {k: json.loads(json.dumps(v)) for k, v in statistics.items() if not k.startswith("_")}
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
    path = Path(run_dir) / DATASET_STATISTICS_FILE
    write_json_atomic(path, _to_jsonable(statistics), "dataset statistics")
    return path
