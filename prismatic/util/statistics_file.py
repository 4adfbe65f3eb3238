"""Reading a statistics JSON file (a run's `dataset_statistics.json`, OpenVLA's `norm_stats`, one dataset's cache)
and checking its layout: what the data pipeline (`prismatic.vla.datasets.rlds.statistics`, which computes and writes
them) and the model loaders (`prismatic.models.loading`, which read a run's) both need, kept below both.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from prismatic.util.errors import ConfigError

STAT_KEYS = ("mean", "std", "max", "min", "q01", "q99")  # the vectors of an `action` / `proprio` entry


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
