"""A flow-matching action expert (π0 / SmolVLA family): the training rule and the Euler sampler (`matching.py`), the
expert network they drive as a velocity function (`expert.py`), the head that wires them to the VLM (`head.py`,
`--vla.action_head flow`) and its options (`options.py`, torch-free: the config reads them). Names load lazily, so
the config reads the options without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prismatic.util.lazy import lazy_getattr

if TYPE_CHECKING:
    from prismatic.models.action_heads.flow.expert import (
        FlowExpert,
        FlowExpertBlock,
        PrefixCache,
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
    from prismatic.models.action_heads.flow.options import FlowExpertOptions, FlowOptions

_EXPERT = "prismatic.models.action_heads.flow.expert"
_MATCHING = "prismatic.models.action_heads.flow.matching"
_OPTIONS = "prismatic.models.action_heads.flow.options"
_LAZY = {
    **dict.fromkeys(("FlowExpert", "FlowExpertBlock", "PrefixCache", "time_embedding"), _EXPERT),
    **dict.fromkeys(
        (
            "DEFAULT_NUM_STEPS",
            "VelocityFn",
            "flow_matching_loss",
            "noisy_actions_and_target",
            "sample",
            "sample_noise",
            "sample_time",
        ),
        _MATCHING,
    ),
    **dict.fromkeys(("FlowExpertOptions", "FlowOptions"), _OPTIONS),
    "FlowActionHead": "prismatic.models.action_heads.flow.head",
}

__getattr__ = lazy_getattr(__name__, _LAZY)

__all__ = [
    "DEFAULT_NUM_STEPS",
    "FlowActionHead",
    "FlowExpert",
    "FlowExpertBlock",
    "FlowExpertOptions",
    "FlowOptions",
    "PrefixCache",
    "VelocityFn",
    "flow_matching_loss",
    "noisy_actions_and_target",
    "sample",
    "sample_noise",
    "sample_time",
    "time_embedding",
]
