"""Inference: the trained policy (`load_policy` -> `VLAPolicy`), batched decoding, the server and evaluation.

    from prismatic.inference import load_policy
    policy = load_policy("runs/demo")
    action = policy.predict_action(image, "pick up the red block", unnorm_key="toy_pick_place")

Importing this package loads nothing heavy; torch and transformers load with the first name used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.inference.policy import (
        DecodedActions,
        PolicyInputError,
        VLAPolicy,
        load_policy,
        unnormalize_actions,
    )

_LAZY = {
    name: "prismatic.inference.policy"
    for name in ("DecodedActions", "PolicyInputError", "VLAPolicy", "load_policy", "unnormalize_actions")
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = ["DecodedActions", "PolicyInputError", "VLAPolicy", "load_policy", "unnormalize_actions"]
