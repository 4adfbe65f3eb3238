"""A flow-matching action expert (π0 / SmolVLA family): the training rule and the Euler sampler (`matching.py`), and
the expert network they drive as a velocity function (`expert.py`).
"""

from prismatic.models.action_heads.flow.expert import (
    FlowExpert,
    FlowExpertBlock,
    FlowExpertOptions,
    PrefixCache,
    shard_flow_expert,
    time_embedding,
)
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
    "FlowExpert",
    "FlowExpertBlock",
    "FlowExpertOptions",
    "PrefixCache",
    "VelocityFn",
    "flow_matching_loss",
    "noisy_actions_and_target",
    "sample",
    "sample_noise",
    "sample_time",
    "shard_flow_expert",
    "time_embedding",
]
