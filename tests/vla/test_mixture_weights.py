"""Mixture weights: transition-balanced sampling probabilities by hand, and the weights a mixture may hold."""

from __future__ import annotations

import numpy as np
import pytest

from prismatic.vla.datasets.rlds.mixtures import MIXTURES, balance_sample_weights, register_mixture


def test_balanced_weights_are_weight_times_size_normalised():
    """weights 0.5, 1, 2 and sizes 10, 30, 5: 5, 30, 10 out of 45."""
    out = balance_sample_weights([0.5, 1.0, 2.0], [10, 30, 5])
    np.testing.assert_allclose(out, [5 / 45, 30 / 45, 10 / 45], rtol=1e-12)


def test_small_products_are_valid_weights():
    """Products below 1 are fine (0.25 * 1 and 0.5 * 1): only non-positive ones are refused."""
    np.testing.assert_allclose(balance_sample_weights([0.25, 0.5], [1, 1]), [1 / 3, 2 / 3], rtol=1e-12)


@pytest.mark.parametrize(("weights", "sizes"), [([1.0, 0.0], [5, 5]), ([1.0, 1.0], [5, 0]), ([1.0], [5, 5])])
def test_zero_weight_zero_size_or_mismatched_lengths_are_refused(weights, sizes):
    with pytest.raises(ValueError, match="positive weight"):
        balance_sample_weights(weights, sizes)


@pytest.mark.parametrize("weight", [0.0, -0.5])
def test_registering_a_non_positive_weight_is_refused(weight):
    with pytest.raises(ValueError, match="must be > 0"):
        register_mixture("test_mixture_weights_refused", [("toy_push", weight)])
    assert "test_mixture_weights_refused" not in MIXTURES


def test_a_small_positive_weight_registers_as_a_float():
    try:
        spec = register_mixture("test_mixture_weights_small", [("toy_push", 0.1), ("toy_pick_place", 2)])
        assert spec == [("toy_push", 0.1), ("toy_pick_place", 2.0)] and isinstance(spec[1][1], float)
    finally:
        MIXTURES.pop("test_mixture_weights_small", None)


def test_a_dataset_name_is_a_one_dataset_mixture_of_weight_one():
    from prismatic.vla.datasets.rlds.mixtures import get_mixture

    assert get_mixture("toy_push") == [("toy_push", 1.0)]
    assert get_mixture("toy") == [("toy_pick_place", 1.0), ("toy_push", 1.0)]
    get_mixture("toy").append(("x", 1.0))  # a copy: the registry is not changed through it
    assert get_mixture("toy") == [("toy_pick_place", 1.0), ("toy_push", 1.0)]


@pytest.mark.parametrize("spec", [[], [("toy_push", 1.0), ("toy_push", 2.0)]])
def test_an_empty_mixture_or_a_dataset_listed_twice_is_refused(spec):
    with pytest.raises(ValueError, match="exactly once"):
        register_mixture("test_mixture_weights_bad", spec)
    assert "test_mixture_weights_bad" not in MIXTURES
