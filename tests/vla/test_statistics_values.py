"""Dataset statistics by hand: mean / std / min / max and OpenVLA's (NumPy 1.x) linear quantiles over every step of
every trajectory, proprio as zeros where a trajectory has none, the counts, and non-finite values refused or
dropped."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds.statistics import compute_statistics, numpy1_quantile, with_action_mask


def _trajectories():
    # action d0: 0, 1 | 2, 3   d1: 10, 10 | 10, 50   proprio: [1], [3] | absent (zeros)
    return [
        {
            "action": [[0.0, 10.0], [1.0, 10.0]],
            "proprio": [[1.0], [3.0]],
            "language_instruction": [b"a", b"a"],
        },
        {"action": [[2.0, 10.0], [3.0, 50.0]], "proprio": [[0.0], [0.0]], "language_instruction": [b"", b""]},
    ]


def test_linear_quantile_by_hand():
    """n = 10 values 0..9: q = 0.01 -> position 0.09 -> 0.09; q = 0.99 -> 8.91; q = 0.5 -> 4.5; q = 1 -> 9."""
    values = np.arange(10, dtype=np.float32).reshape(10, 1)
    for q, expected in [(0.01, 0.09), (0.99, 8.91), (0.5, 4.5), (0.3, 2.7), (1.0, 9.0), (0.0, 0.0)]:
        out = numpy1_quantile(values, q)
        assert out.dtype == np.float64 and out.shape == (1,)
        assert out[0] == pytest.approx(expected, rel=1e-12, abs=1e-12), q


def test_linear_quantile_interpolates_between_unsorted_neighbours():
    """Unsorted input, two columns: position 3 * 0.25 = 0.75 between the two smallest values."""
    values = np.array([[4.0, 0.0], [0.0, 8.0], [2.0, 4.0], [8.0, 2.0]], np.float32)
    np.testing.assert_allclose(numpy1_quantile(values, 0.25), [1.5, 1.5], rtol=1e-12)
    np.testing.assert_allclose(numpy1_quantile(values, 0.6), [3.6, 3.6], rtol=1e-6)


def test_statistics_over_all_steps_by_hand():
    stats = compute_statistics(_trajectories(), "toy")
    a = stats["action"]
    np.testing.assert_allclose(a["mean"], [1.5, 20.0], rtol=1e-6)
    np.testing.assert_allclose(a["std"], [np.sqrt(1.25), np.sqrt(300.0)], rtol=1e-6)  # population std
    assert a["max"] == [3.0, 50.0] and a["min"] == [0.0, 10.0]
    # n = 4: q01 at position 0.03, q99 at 2.97 (between the 3rd and 4th smallest)
    np.testing.assert_allclose(a["q01"], [0.03, 10.0], rtol=1e-6)
    np.testing.assert_allclose(a["q99"], [2.97, 48.8], rtol=1e-6)
    p = stats["proprio"]
    assert p["max"] == [3.0] and p["min"] == [0.0] and p["mean"] == [1.0]
    assert stats["num_transitions"] == 4 and stats["num_trajectories"] == 2
    assert stats["_counts"] == {"unlabeled_trajectories": 1, "nonfinite_frames_dropped": 0}


def test_missing_proprio_counts_as_zeros_of_the_actions_shape():
    trajs = [
        {"action": [[1.0, 2.0], [3.0, 4.0]], "proprio": [[4.0, 4.0], [8.0, 8.0]]},
        {"action": [[5.0, 6.0]]},
    ]
    stats = compute_statistics(trajs)
    assert stats["proprio"]["mean"] == [4.0, 4.0] and stats["proprio"]["min"] == [0.0, 0.0]
    assert (
        stats["_counts"]["unlabeled_trajectories"] == 0
    )  # no language_instruction: not counted as unlabeled


def test_an_empty_trajectory_counts_but_adds_no_steps():
    trajs = [*_trajectories(), {"action": np.zeros((0, 2), np.float32), "proprio": np.zeros((0, 1))}]
    stats = compute_statistics(trajs)
    assert stats["num_trajectories"] == 3 and stats["num_transitions"] == 4


def test_no_steps_at_all_is_refused():
    with pytest.raises(ConfigError, match="no steps"):
        compute_statistics([{"action": np.zeros((0, 2), np.float32)}], "toy")


def test_nonfinite_values_are_refused_naming_episode_and_step():
    trajs = [{"action": [[0.0, 1.0], [np.nan, 1.0]], "episode_id": np.array([b"ep7", b"ep7"])}]
    with pytest.raises(ConfigError, match=r"episode 'ep7'.*'action'.*step 1"):
        compute_statistics(trajs, "toy")
    trajs = [{"action": [[0.0, 1.0]]}, {"action": [[1.0, 1.0]], "proprio": [[np.inf, 0.0]]}]
    with pytest.raises(ConfigError, match=r"episode #1 .*'proprio'.*step 0"):
        compute_statistics(trajs, "toy")


def test_nonfinite_frames_are_dropped_when_asked():
    trajs = [{"action": [[0.0, 1.0], [np.nan, 1.0], [2.0, 3.0]], "proprio": [[0.0], [0.0], [np.inf]]}]
    stats = compute_statistics(trajs, nonfinite="drop")
    assert stats["num_transitions"] == 1 and stats["action"]["max"] == [0.0, 1.0]
    assert stats["_counts"]["nonfinite_frames_dropped"] == 2


def test_cached_layout_keeps_public_keys_and_adds_the_action_mask():
    stats = compute_statistics(_trajectories())
    out = with_action_mask(stats, SimpleNamespace(action_normalization_mask=(True, False)))
    assert out["action"]["mask"] == [True, False]
    assert "_counts" not in out and out["num_transitions"] == 4
    assert "mask" not in stats["action"]  # the input is not modified


def test_linear_quantile_at_exactly_half_interpolates_down_from_the_upper_neighbour():
    """NumPy 1.x's `_lerp`: from t >= 0.5 on it computes high - diff (1 - t). With float32 values 1e-8 and 1,
    diff rounds to 1.0 in float32, so the median is 1 - 0.5 = 0.5 exactly (low + diff / 2 would be 0.5 + 1e-8)."""
    values = np.array([[1e-8], [1.0]], np.float32)
    assert numpy1_quantile(values, 0.5)[0] == 0.5


def test_a_one_step_episode_is_named_in_the_error():
    trajs = [{"action": [[np.inf, 0.0]], "episode_id": np.array([b"solo"])}]
    with pytest.raises(ConfigError, match=r"episode 'solo'.*'action' holds NaN or inf at step 0"):
        compute_statistics(trajs, "toy")


def test_linear_quantile_below_half_interpolates_up_from_the_lower_neighbour():
    """t = 0.25 < 0.5: low + diff t = float32(1e-8) + 0.25 in float64 (high - diff (1 - t) would give 0.25)."""
    values = np.array([[1e-8], [1.0]], np.float32)
    assert numpy1_quantile(values, 0.25)[0] == float(np.float32(1e-8)) + 0.25


def test_unlabeled_trajectories_are_those_whose_every_instruction_is_empty():
    trajs = [
        {"action": [[0.0]], "language_instruction": [b""]},
        {"action": [[0.0], [1.0]], "language_instruction": [b"", b""]},
        {"action": [[0.0]], "language_instruction": [b"pick"]},
    ]
    assert compute_statistics(trajs)["_counts"]["unlabeled_trajectories"] == 2
