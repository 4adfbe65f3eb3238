"""How the pipeline reads, filters and normalises data beyond each dataset's registry entry (`--data.*` flags).

The defaults reproduce OpenVLA's pipeline (openvla/openvla `prismatic/vla/datasets/rlds/`) so that statistics,
normalised actions and action tokens equal OpenVLA's for the same data; each alternative is a documented
choice for users who want something else (docs/data_pipeline.md lists them with OpenVLA's code they follow).
Everything here that changes the statistics is part of the statistics cache key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prismatic.util.errors import ConfigError

STATISTICS_SPLITS = ("all", "train")
NONFINITE_CHOICES = ("error", "drop")
UNUSED_DIMS_CHOICES = ("zero", "zero_normalized")
ZERO_ACTION_BOUNDS_CHOICES = ("openvla", "statistics")
CHUNK_END_CHOICES = ("pad", "drop")


@dataclass(frozen=True)
class DataOptions:
    """Pipeline-wide data choices; defaults as OpenVLA.

    Attributes:
        statistics_split: "all" computes statistics over every split, as OpenVLA does (its validation frames
            included); "train" over the frames training reads only (`train`, or `train[:95%]` without a val split).
        skip_unlabeled: drop trajectories whose instructions are all empty (OpenVLA's `skip_unlabeled=True`);
            statistics still include them, as in OpenVLA.
        nonfinite: "error" stops the statistics pass at the first NaN / inf action or proprio value, naming
            dataset, split, episode, key and step; "drop" removes such frames from statistics and training and
            logs how many.
        load_proprio: put the proprio vector (exactly the dataset config's state keys, one zero per `None`) into
            the frames and compute its statistics; off, as in OpenVLA's VLA training, the frames carry none and
            the proprio statistics are zeros of the action's width (OpenVLA's `tf.zeros_like(action)`).
        unused_dims: "zero" maps every dimension whose min == max to 0 after normalisation, normalised or not
            (OpenVLA: a gripper that never moves becomes 0); "zero_normalized" only the normalised ones.
        zero_action_bounds: the bounds the zero-action filter (DROID) normalises 0 with: "openvla" uses the
            DROID q01 / q99 constants of OpenVLA's `zero_action_filter`; "statistics" the dataset's own.
        chunk_end: with action chunks, "pad" keeps every frame and pads actions past the episode's end (relative
            dims 0 in normalised space, absolute dims repeat the last action: OpenVLA's `chunk_act_obs`); "drop"
            drops the frames whose chunk would run past the end (OpenVLA-OFT's `chunk_act_obs`).
    """

    statistics_split: str = "all"  # all (every split, as OpenVLA) or train (the frames training reads)
    skip_unlabeled: bool = (
        True  # drop trajectories whose instructions are all empty (OpenVLA's skip_unlabeled)
    )
    nonfinite: str = (
        "error"  # NaN / inf in action or proprio: error (name the episode) or drop (those frames)
    )
    load_proprio: bool = False  # frames carry proprio (the config's state keys) and it gets real statistics
    unused_dims: str = (
        "zero"  # min == max dims -> 0: zero (all, OpenVLA) or zero_normalized (normalised dims)
    )
    zero_action_bounds: str = (
        "openvla"  # DROID idle-frame filter bounds: openvla (its constants) or statistics
    )
    chunk_end: str = "pad"  # chunks past an episode's end: pad (OpenVLA) or drop those frames (OpenVLA-OFT)

    def __post_init__(self) -> None:
        for name, choices in (
            ("statistics_split", STATISTICS_SPLITS),
            ("nonfinite", NONFINITE_CHOICES),
            ("unused_dims", UNUSED_DIMS_CHOICES),
            ("zero_action_bounds", ZERO_ACTION_BOUNDS_CHOICES),
            ("chunk_end", CHUNK_END_CHOICES),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(
                    f"--data.{name} '{value}' is not one of the valid choices: {', '.join(choices)} "
                    f"(default '{choices[0]}', as OpenVLA; see docs/data_pipeline.md)."
                )

    def statistics_key(self) -> dict[str, Any]:
        """The options the statistics depend on (part of the cache key)."""
        return {
            "statistics_split": self.statistics_split,
            "nonfinite": self.nonfinite,
            "load_proprio": self.load_proprio,
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
