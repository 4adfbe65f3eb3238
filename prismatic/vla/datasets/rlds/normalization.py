"""Action / proprio normalisation with OpenVLA's arithmetic, in TensorFlow (the pipeline) and NumPy (tests, tools).

OpenVLA (`normalize_action_and_proprio`) holds the statistics as float64 NumPy arrays and applies them to float32
tensors, so its arithmetic is mixed: the denominator `high - low + 1e-8` (or `std + 1e-8`) is computed in
float64 and rounded to float32 once, the offsets `low` / `mean` are rounded to float32, and the rest is float32.
We do the same, so normalised values, and the action tokens binned from them, are bit-identical:

    BOUNDS_Q99 (OpenVLA's default): clip(2 * (x - q01) / f32(q99 - q01 + 1e-8) - 1, -1, 1)
    BOUNDS: the same with min / max;  NORMAL: (x - mean) / f32(std + 1e-8)

Only dimensions where the mask is True change. Under the two bounds types, every dimension whose min == max
(unused, e.g. zero rotation padded onto translation-only data) then becomes 0, *including* masked-off ones: as in
OpenVLA, a gripper that never moves becomes 0. `unused_dims="zero_normalized"` limits that to normalised dims.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import NormalizationType

EPS = 1e-8


def _terms(
    stats: Mapping[str, Sequence[float]], norm_type: NormalizationType
) -> tuple[np.ndarray, np.ndarray]:
    """(offset, denominator) as float32, computed from float64 statistics the way OpenVLA's mixed arithmetic does."""
    if norm_type is NormalizationType.NORMAL:
        offset = np.asarray(stats["mean"], np.float64)
        denominator = np.asarray(stats["std"], np.float64) + EPS
    else:
        low_key, high_key = ("q01", "q99") if norm_type is NormalizationType.BOUNDS_Q99 else ("min", "max")
        offset = np.asarray(stats[low_key], np.float64)
        denominator = np.asarray(stats[high_key], np.float64) - offset + EPS
    return offset.astype(np.float32), denominator.astype(np.float32)


def _zero_dims(
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: np.ndarray,
    unused_dims: str,
) -> np.ndarray:
    """Dimensions set to 0 after normalising: min == max under the bounds types (see module docstring)."""
    if norm_type is NormalizationType.NORMAL:
        return np.zeros(mask.shape, bool)
    unused = np.asarray(stats["min"], np.float64) == np.asarray(stats["max"], np.float64)
    return unused if unused_dims == "zero" else unused & mask


def _mask(mask: Sequence[bool] | None, dim: int) -> np.ndarray:
    return np.ones(dim, bool) if mask is None else np.asarray(mask, bool)


def normalize_np(
    x: np.ndarray,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
    unused_dims: str = "zero",
) -> np.ndarray:
    """Normalise `x[..., D]` (float32) with per-dimension `stats`; bit-identical to `normalize_tf`."""
    x = np.asarray(x, np.float32)
    offset, denominator = _terms(stats, norm_type)
    mask_arr = _mask(mask, offset.shape[0])
    if norm_type is NormalizationType.NORMAL:
        out = (x - offset) / denominator
    else:
        out = np.clip(np.float32(2) * (x - offset) / denominator - np.float32(1), -1, 1)
    out = np.where(mask_arr, out, x)
    return np.where(_zero_dims(stats, norm_type, mask_arr, unused_dims), np.float32(0), out).astype(
        np.float32
    )


def unnormalize_np(
    x: np.ndarray,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
    dtype: DTypeLike = np.float32,
) -> np.ndarray:
    """Inverse of `normalize_np` up to clipping and rounding (float64 internally): model space -> robot units.

    For BOUNDS_Q99 this is OpenVLA's `predict_action` un-normalisation, `0.5 * (a + 1) * (q99 - q01) + q01`. The
    result is cast to `dtype`: float32 for the data side, float64 for the policy (OpenVLA returns float64 actions).
    """
    x = np.asarray(x, np.float64)
    mask_arr = _mask(mask, x.shape[-1])
    if norm_type is NormalizationType.NORMAL:
        out = x * (np.asarray(stats["std"], np.float64) + EPS) + np.asarray(stats["mean"], np.float64)
    else:
        low_key, high_key = ("q01", "q99") if norm_type is NormalizationType.BOUNDS_Q99 else ("min", "max")
        low, high = np.asarray(stats[low_key], np.float64), np.asarray(stats[high_key], np.float64)
        out = 0.5 * (x + 1) * (high - low) + low
    return np.where(mask_arr, out, x).astype(dtype)


def normalize_tf(
    x: Any,
    stats: Mapping[str, Sequence[float]],
    norm_type: NormalizationType,
    mask: Sequence[bool] | None = None,
    unused_dims: str = "zero",
) -> Any:
    """TensorFlow twin of `normalize_np` (same float32 terms, same op order), used inside the `tf.data` pipeline."""
    tf = import_tensorflow()
    x = tf.cast(x, tf.float32)
    offset, denominator = _terms(stats, norm_type)
    mask_arr = _mask(mask, offset.shape[0])
    if norm_type is NormalizationType.NORMAL:
        out = (x - offset) / denominator
    else:
        out = tf.clip_by_value(2 * (x - offset) / denominator - 1, -1, 1)
    out = tf.where(mask_arr, out, x)
    return tf.where(_zero_dims(stats, norm_type, mask_arr, unused_dims), tf.zeros_like(out), out)
