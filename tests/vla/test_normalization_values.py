"""Normalised and un-normalised values by hand for the three normalisation types, the mask and the handling of
unused (min == max) dimensions, for the NumPy functions and their TensorFlow twin.

Statistics per dimension (d0 ordinary, d1 ordinary, d2 unused: min == max, d3 degenerate quantiles q01 == q99):
    q01 [-1, 0, 2, 1]   q99 [1, 4, 2, 1]   min [-2, -1, 2, 0]   max [2, 5, 2, 2]   mean [0.5, 1, 2, 1]   std [2, 0.5, 0, 1]
"""

from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: F401  (torch before tensorflow in one process)

from prismatic.vla.datasets.rlds.configs import NormalizationType
from prismatic.vla.datasets.rlds.normalization import normalize_np, normalize_tf, unnormalize_np

STATS = {
    "q01": [-1.0, 0.0, 2.0, 1.0],
    "q99": [1.0, 4.0, 2.0, 1.0],
    "min": [-2.0, -1.0, 2.0, 0.0],
    "max": [2.0, 5.0, 2.0, 2.0],
    "mean": [0.5, 1.0, 2.0, 1.0],
    "std": [2.0, 0.5, 0.0, 1.0],
}
X = np.array([[0.5, 3.0, 7.0, 1.5], [5.0, -3.0, 2.0, 0.0]], np.float32)
Q99, BOUNDS, NORMAL = NormalizationType.BOUNDS_Q99, NormalizationType.BOUNDS, NormalizationType.NORMAL

# By hand: 2 (x - low) / (high - low) - 1, clipped; d2 -> 0 (unused); d3: (x - 1) / 1e-8 saturates to +-1.
EXPECTED_Q99 = [[0.5, 0.5, 0.0, 1.0], [1.0, -1.0, 0.0, -1.0]]
EXPECTED_BOUNDS = [[0.25, 1 / 3, 0.0, 0.5], [1.0, -1.0, 0.0, -1.0]]
# (x - mean) / (std + 1e-8): d2 divides by 1e-8 (float32 1e-8), nothing is clipped or zeroed.
EXPECTED_NORMAL = [[0.0, 4.0, 5.0 / np.float32(1e-8), 0.5], [2.25, -8.0, 0.0, -1.0]]


@pytest.mark.parametrize(
    ("norm", "expected"), [(Q99, EXPECTED_Q99), (BOUNDS, EXPECTED_BOUNDS), (NORMAL, EXPECTED_NORMAL)]
)
def test_normalize_np_by_hand(norm, expected):
    out = normalize_np(X, STATS, norm)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.array(expected, np.float32), rtol=1e-6, atol=1e-6)


def test_mask_leaves_masked_off_dims_but_unused_dims_still_become_zero():
    """OpenVLA: masked-off dims keep their value, except min == max dims, which become 0 under "zero"."""
    out = normalize_np(X, STATS, Q99, mask=[True, False, False, True])
    np.testing.assert_allclose(out, [[0.5, 3.0, 0.0, 1.0], [1.0, -3.0, 0.0, -1.0]], rtol=1e-6, atol=1e-6)


def test_zero_normalized_only_zeroes_unused_dims_that_are_normalised():
    out = normalize_np(X, STATS, Q99, mask=[True, True, False, True], unused_dims="zero_normalized")
    np.testing.assert_allclose(out, [[0.5, 0.5, 7.0, 1.0], [1.0, -1.0, 2.0, -1.0]], rtol=1e-6, atol=1e-6)
    out = normalize_np(X, STATS, Q99, unused_dims="zero_normalized")
    assert out[0, 2] == 0.0 and out[1, 2] == 0.0


def test_normal_never_zeroes_dims():
    out = normalize_np(X, STATS, NORMAL, mask=[False, True, True, True])
    assert out[0, 0] == 0.5 and out[1, 0] == 5.0  # masked off: unchanged
    assert out[1, 2] == 0.0 and out[0, 2] > 1e8


@pytest.mark.parametrize(
    ("norm", "model_space"),
    [(Q99, [0.5, 0.5, 0.0, -1.0]), (BOUNDS, [0.25, 1 / 3, 0.0, 0.5]), (NORMAL, [0.0, 4.0, 0.0, 0.5])],
)
def test_unnormalize_np_by_hand(norm, model_space):
    """Q99: 0.5 (a + 1)(q99 - q01) + q01; BOUNDS: same with min / max; NORMAL: a (std + 1e-8) + mean."""
    out = unnormalize_np(np.array(model_space), STATS, norm)
    assert out.dtype == np.float32
    robot = {Q99: [0.5, 3.0, 2.0, 1.0], BOUNDS: [0.5, 3.0, 2.0, 1.5], NORMAL: [0.5, 3.0, 2.0, 1.5]}[norm]
    np.testing.assert_allclose(out, robot, rtol=1e-6, atol=1e-6)


def test_unnormalize_leaves_masked_off_dims():
    out = unnormalize_np(np.array([[0.5, 0.25, 0.0, 0.0]]), STATS, Q99, mask=[True, False, True, True])
    np.testing.assert_allclose(out, [[0.5, 0.25, 2.0, 1.0]], rtol=1e-6)


@pytest.mark.parametrize(
    ("norm", "mask", "unused", "expected"),
    [
        (Q99, None, "zero", EXPECTED_Q99),
        (BOUNDS, None, "zero", EXPECTED_BOUNDS),
        (NORMAL, None, "zero", EXPECTED_NORMAL),
        (Q99, [True, False, False, True], "zero", [[0.5, 3.0, 0.0, 1.0], [1.0, -3.0, 0.0, -1.0]]),
        (Q99, [True, True, False, True], "zero_normalized", [[0.5, 0.5, 7.0, 1.0], [1.0, -1.0, 2.0, -1.0]]),
    ],
)
def test_normalize_tf_by_hand(norm, mask, unused, expected):
    out = normalize_tf(X, STATS, norm, mask, unused).numpy()
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.array(expected, np.float32), rtol=1e-6, atol=1e-6)


def test_normal_unnormalize_inverts_normalize_even_on_a_constant_dimension():
    """std = 0 (d2): normalising divides by 1e-8, un-normalising multiplies by the same 1e-8, so 7 comes back."""
    back = unnormalize_np(normalize_np(X, STATS, NORMAL), STATS, NORMAL)
    np.testing.assert_allclose(back, X, rtol=1e-6, atol=1e-7)


def test_unnormalize_a_batch_of_actions():
    """[B, D] with B != D and no mask: every row un-normalised on its own (Q99: 0.5 (a + 1)(q99 - q01) + q01)."""
    out = unnormalize_np(np.array([[0.5, 0.5, 0.0, -1.0], [-1.0, 1.0, 0.0, 1.0]]), STATS, Q99)
    np.testing.assert_allclose(out, [[0.5, 3.0, 2.0, 1.0], [-1.0, 4.0, 2.0, 1.0]], rtol=1e-6)
