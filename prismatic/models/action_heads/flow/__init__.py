"""A flow-matching action expert (π0 / SmolVLA family): the training rule and the Euler sampler (`matching.py`) that
an expert module plugs into as a velocity function.
"""

from prismatic.models.action_heads.flow.matching import (
    DEFAULT_NUM_STEPS,
    VelocityFn,
    flow_matching_loss,
    noisy_actions_and_target,
    sample,
    sample_noise,
    sample_time,
)

__all__ = [
    "DEFAULT_NUM_STEPS",
    "VelocityFn",
    "flow_matching_loss",
    "noisy_actions_and_target",
    "sample",
    "sample_noise",
    "sample_time",
]
