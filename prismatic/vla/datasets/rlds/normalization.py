"""Action / proprio normalisation, in TensorFlow (for the pipeline) and NumPy (for tests and inference).

BOUNDS_Q99 (OpenVLA's default): `clip(2 * (x - q01) / (q99 - q01 + 1e-8) - 1, -1, 1)`; BOUNDS uses min/max
instead of the quantiles; NORMAL: `(x - mean) / (std + 1e-8)`. Only dimensions where the mask is True change;
masked-off dimensions (the 0/1 gripper) pass through, so the action tokenizer sees them as they are.

Unused dimensions (min == max over the train split, e.g. the zero rotation padded onto translation-only
datasets) map to 0 under the two bounds types, as in OpenVLA. Unlike OpenVLA this applies only to normalised
dimensions: a dataset whose gripper never moves keeps its 1 = open instead of becoming 0 (= closed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import NormalizationType

EPS = 1e-8


def _bounds(
    stats: Mapping[str, Sequence[float]], norm_type: NormalizationType
) -> tuple[np.ndarray, np.ndarray]:
    low_key, high_key = ("q01", "q99") if norm_type is NormalizationType.BOUNDS_Q99 else ("min", "max")
    return np.asarray(stats[low_key], np.float32), np.asarray(stats[high_key], np.float32)


def _unused(stats: Mapping[str, Sequence[float]]) -> np.ndarray:
    """Dimensions that never vary in the train split (min == max)."""
    return np.asarray(stats["min"], np.float32) == np.asarray(stats["max"], np.float32)


def normalize_np(
    x: np.ndarray,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
) -> np.ndarray:
    """Normalise `x[..., D]` with per-dimension `stats` (keys mean/std/min/max/q01/q99); see module docstring."""
    x = np.asarray(x, np.float32)
    mask_arr = np.ones(x.shape[-1], bool) if mask is None else np.asarray(mask, bool)
    if norm_type is NormalizationType.NORMAL:
        mean, std = np.asarray(stats["mean"], np.float32), np.asarray(stats["std"], np.float32)
        out = (x - mean) / (std + EPS)
    else:
        low, high = _bounds(stats, norm_type)
        out = np.clip(2 * (x - low) / (high - low + EPS) - 1, -1, 1)
        out = np.where(_unused(stats), 0.0, out)
    return np.where(mask_arr, out, x).astype(np.float32)


def unnormalize_np(
    x: np.ndarray,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
) -> np.ndarray:
    """Inverse of `normalize_np` (up to clipping): model-space actions back to robot units."""
    x = np.asarray(x, np.float32)
    mask_arr = np.ones(x.shape[-1], bool) if mask is None else np.asarray(mask, bool)
    if norm_type is NormalizationType.NORMAL:
        mean, std = np.asarray(stats["mean"], np.float32), np.asarray(stats["std"], np.float32)
        out = x * (std + EPS) + mean
    else:
        low, high = _bounds(stats, norm_type)
        out = (x + 1) / 2 * (high - low + EPS) + low
    return np.where(mask_arr, out, x).astype(np.float32)


def normalize_tf(
    x: Any,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
) -> Any:
    """TensorFlow twin of `normalize_np` (same formula, float32), used inside the `tf.data` pipeline."""
    tf = import_tensorflow()
    x = tf.cast(x, tf.float32)
    dim = int(np.asarray(stats["mean"]).shape[-1])
    mask_t = tf.constant(np.ones(dim, bool) if mask is None else np.asarray(mask, bool))
    if norm_type is NormalizationType.NORMAL:
        mean = tf.constant(np.asarray(stats["mean"], np.float32))
        std = tf.constant(np.asarray(stats["std"], np.float32))
        out = (x - mean) / (std + EPS)
    else:
        low, high = (tf.constant(v) for v in _bounds(stats, norm_type))
        out = tf.clip_by_value(2 * (x - low) / (high - low + EPS) - 1, -1, 1)
        out = tf.where(tf.constant(_unused(stats)), tf.zeros_like(out), out)
    return tf.where(mask_t, out, x)
