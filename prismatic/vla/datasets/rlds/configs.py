"""Dataset registry: how each RLDS dataset's raw keys map onto the common frame format.

One `RLDSDatasetConfig` per dataset says which raw observation keys hold the cameras and the proprioceptive
state, how actions and state are encoded, which standardisation function (`transforms.py`) turns a raw
trajectory into the standard layout, and how actions are normalised. Adding a dataset = one `register_dataset`
call here (plus a standardisation function if its raw layout needs one). Raw keys of the Open-X entries follow
OpenVLA's `prismatic/vla/datasets/rlds/oxe/configs.py`.

After standardisation every trajectory holds (leading time axis T on every leaf):
    observation: {<image keys>, <state keys>, ...}   raw keys named by the config
    action:      float32[T, action_dim]               for EEF_POS: xyz delta (3) + rpy delta (3) + gripper (1),
                                                      gripper absolute, 1 = open, 0 = closed
    <language_key>: string[T]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from prismatic.util.errors import lookup

CAMERA_VIEWS = ("primary", "secondary", "wrist")


class StateEncoding(IntEnum):
    """Layout of the proprioceptive state vector (always 8-dim after padding, as in OpenVLA)."""

    NONE = -1  # no proprioception: 8 zero pads
    POS_EULER = 1  # EEF xyz (3) + roll-pitch-yaw (3) + <pad> (1) + gripper open/close (1)
    POS_QUAT = 2  # EEF xyz (3) + quaternion (4) + gripper open/close (1)
    JOINT = 3  # joint angles (7, padded if fewer) + gripper open/close (1)


class ActionEncoding(IntEnum):
    """Layout of the action vector."""

    EEF_POS = 1  # EEF delta xyz (3) + delta roll-pitch-yaw (3) + absolute gripper open/close (1)
    JOINT_POS = 2  # joint delta position (7) + gripper open/close (1)


ACTION_DIM = {ActionEncoding.EEF_POS: 7, ActionEncoding.JOINT_POS: 8}


class NormalizationType(str, Enum):
    """How actions / proprio are mapped to the range the action tokenizer bins ([-1, 1])."""

    NORMAL = "normal"  # (x - mean) / std
    BOUNDS = "bounds"  # [min, max] -> [-1, 1], clipped
    BOUNDS_Q99 = "bounds_q99"  # [q01, q99] -> [-1, 1], clipped (OpenVLA's default: robust to outliers)


def _default_absolute_mask(encoding: ActionEncoding) -> tuple[bool, ...]:
    # Arm deltas are relative; the gripper command is absolute (matters when padding past an episode's end).
    return (False,) * (ACTION_DIM[encoding] - 1) + (True,)


def _default_normalization_mask(encoding: ActionEncoding) -> tuple[bool, ...]:
    # The gripper is already 0/1, so it is left as is; every other dimension is normalised.
    return (True,) * (ACTION_DIM[encoding] - 1) + (False,)


@dataclass(frozen=True)
class RLDSDatasetConfig:
    """How to read one RLDS dataset.

    Attributes:
        name: the dataset's folder name under `data_root_dir` (`<data_root_dir>/<name>/<version>/`).
        image_obs_keys: camera view ("primary", "secondary", "wrist") -> raw observation key, or None.
        depth_obs_keys: same for depth images.
        state_obs_keys: raw observation keys concatenated into the 8-dim proprio vector; None inserts one zero.
        state_encoding: layout of that proprio vector.
        action_encoding: layout of the standardised action vector.
        standardize_fn: id of the function in `transforms.STANDARDIZE_FNS` applied to each raw trajectory.
        language_key: key of the instruction in the *standardised* trajectory.
        action_normalization_type: how actions and proprio are normalised.
        absolute_action_mask: which action dims are absolute (default: the gripper).
        action_normalization_mask: which action dims are normalised (default: all but the gripper).
    """

    name: str
    image_obs_keys: Mapping[str, str | None]
    state_obs_keys: tuple[str | None, ...]
    state_encoding: StateEncoding
    action_encoding: ActionEncoding
    standardize_fn: str
    depth_obs_keys: Mapping[str, str | None] = field(
        default_factory=lambda: {"primary": None, "secondary": None, "wrist": None}
    )
    language_key: str = "language_instruction"
    action_normalization_type: NormalizationType = NormalizationType.BOUNDS_Q99
    absolute_action_mask: tuple[bool, ...] | None = None
    action_normalization_mask: tuple[bool, ...] | None = None

    def __post_init__(self) -> None:
        # Internal invariants of registry entries (a bad entry is a bug in this file, not user input).
        for what, keys in (("image_obs_keys", self.image_obs_keys), ("depth_obs_keys", self.depth_obs_keys)):
            if set(keys) != set(CAMERA_VIEWS):
                raise ValueError(f"{self.name}: {what} must name exactly {CAMERA_VIEWS}, got {sorted(keys)}.")
        if self.absolute_action_mask is None:
            object.__setattr__(self, "absolute_action_mask", _default_absolute_mask(self.action_encoding))
        if self.action_normalization_mask is None:
            object.__setattr__(
                self, "action_normalization_mask", _default_normalization_mask(self.action_encoding)
            )
        for what in ("absolute_action_mask", "action_normalization_mask"):
            if len(getattr(self, what)) != self.action_dim:
                raise ValueError(f"{self.name}: {what} must have {self.action_dim} entries.")

    @property
    def action_dim(self) -> int:
        return ACTION_DIM[self.action_encoding]

    def to_json_dict(self) -> dict:
        """Plain, JSON-serialisable form (enums by name): what the statistics cache hash covers."""

        def plain(value: object) -> object:
            if isinstance(value, Enum):
                return value.name
            if isinstance(value, Mapping):
                return {k: plain(v) for k, v in sorted(value.items())}
            if isinstance(value, tuple | list):
                return [plain(v) for v in value]
            return value

        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


DATASET_CONFIGS: dict[str, RLDSDatasetConfig] = {}


def register_dataset(config: RLDSDatasetConfig) -> RLDSDatasetConfig:
    """Add `config` to the registry; names are unique."""
    if config.name in DATASET_CONFIGS:
        raise ValueError(f"Dataset '{config.name}' is already registered.")
    DATASET_CONFIGS[config.name] = config
    return config


def get_dataset_config(name: str) -> RLDSDatasetConfig:
    """Registry look-up; an unknown name raises `ConfigError` with a did-you-mean."""
    return lookup(DATASET_CONFIGS, name, "RLDS dataset")


def _cams(
    primary: str | None, secondary: str | None = None, wrist: str | None = None
) -> dict[str, str | None]:
    return {"primary": primary, "secondary": secondary, "wrist": wrist}


# === Toy datasets (built by `toy.py`; the CPU presets and the tests train on them) ===
register_dataset(
    RLDSDatasetConfig(
        name="toy_pick_place",
        image_obs_keys=_cams("image"),
        state_obs_keys=("state",),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="toy_pick_place",
    )
)
register_dataset(
    RLDSDatasetConfig(
        name="toy_push",
        image_obs_keys=_cams("agentview_rgb"),
        state_obs_keys=("EEF_state", None, "gripper_state"),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="toy_push",
    )
)

# === Open-X Embodiment datasets ===
register_dataset(  # Bridge V2 as released on the project website (OpenVLA's default Bridge)
    RLDSDatasetConfig(
        name="bridge_orig",
        image_obs_keys=_cams("image_0", "image_1"),
        state_obs_keys=("EEF_state", None, "gripper_state"),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="bridge_orig",
    )
)
register_dataset(  # Bridge V2 as stored in the Open-X bucket
    RLDSDatasetConfig(
        name="bridge_oxe",
        image_obs_keys=_cams("image", "image_1"),
        state_obs_keys=("EEF_state", None, "gripper_state"),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="bridge_oxe",
    )
)
register_dataset(  # Google RT-1 robot data
    RLDSDatasetConfig(
        name="fractal20220817_data",
        image_obs_keys=_cams("image"),
        state_obs_keys=("base_pose_tool_reached", "gripper_closed"),
        state_encoding=StateEncoding.POS_QUAT,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="rt1",
    )
)
