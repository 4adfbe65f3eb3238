"""Hand-picked action statistics in OpenVLA's layout, shared by the inference fixtures and tests (a module of its
own: importing from a conftest depends on which conftest Python finds first)."""

from __future__ import annotations

from typing import Any


def hand_stats(action_dim: int = 7, shift: float = 0.0) -> dict[str, Any]:
    """Action statistics in OpenVLA's layout with distinct, hand-picked values per dimension (gripper unmasked)."""
    q01 = [-0.5 - 0.1 * d + shift for d in range(action_dim)]
    q99 = [0.25 + 0.2 * d + shift for d in range(action_dim)]
    return {
        "action": {
            "mean": [0.0] * action_dim,
            "std": [1.0] * action_dim,
            "min": [v - 1 for v in q01],
            "max": [v + 1 for v in q99],
            "q01": q01,
            "q99": q99,
            "mask": [True] * (action_dim - 1) + [False],
        },
        "proprio": {k: [0.0] * 8 for k in ("mean", "std", "min", "max", "q01", "q99")},
        "num_transitions": 100,
        "num_trajectories": 5,
    }
