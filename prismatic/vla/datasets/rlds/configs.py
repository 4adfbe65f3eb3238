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
    """Layout of the proprioceptive state vector (metadata, as in OpenVLA; the vector is the state keys' concat)."""

    NONE = -1  # no proprioception: zero pads
    POS_EULER = 1  # EEF xyz (3) + roll-pitch-yaw (3) + <pad> (1) + gripper open/close (1)
    POS_QUAT = 2  # EEF xyz (3) + quaternion (4) + gripper open/close (1)
    JOINT = 3  # joint angles (7, padded if fewer) + gripper open/close (1)
    POS_GRIPPER = 4  # EEF xyz (3) + gripper opening (1), e.g. Meta-World's 4-d state


class ActionEncoding(IntEnum):
    """Layout of the action vector."""

    EEF_POS = 1  # EEF delta xyz (3) + delta roll-pitch-yaw (3) + absolute gripper open/close (1)
    JOINT_POS = 2  # joint delta position (7) + gripper open/close (1)
    EEF_XYZ_GRIPPER = 3  # EEF delta xyz (3) + absolute gripper (1), no rotation: Meta-World's action


ACTION_DIM = {ActionEncoding.EEF_POS: 7, ActionEncoding.JOINT_POS: 8, ActionEncoding.EEF_XYZ_GRIPPER: 4}


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
        state_obs_keys: raw observation keys concatenated into the proprio vector; None inserts one zero (its
            width is exactly what these give, e.g. 9 for LIBERO's EEF_state (6), None, gripper_state (2)).
        state_encoding: layout of that proprio vector.
        action_encoding: layout of the standardised action vector.
        standardize_fn: id of the function in `transforms.STANDARDIZE_FNS` applied to each raw trajectory.
        language_key: key of the instruction in the *standardised* trajectory.
        action_normalization_type: how actions and proprio are normalised.
        absolute_action_mask: which action dims are absolute (default: the gripper).
        action_normalization_mask: which action dims are normalised (default: all but the gripper).
        drop_zero_action_frames: drop frames (train and val) whose normalised arm actions all equal a normalised
            zero action within 1e-5: idle steps (OpenVLA's `zero_action_filter` for DROID, with its DROID bounds
            unless `--data.zero_action_bounds statistics`). Statistics still cover every step.
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
    drop_zero_action_frames: bool = False

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
        image_obs_keys=_cams("image", None, "wrist_image"),
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
register_dataset(  # Bridge V2 under its tfds name `bridge_dataset` (same layout as bridge_orig)
    RLDSDatasetConfig(
        name="bridge_dataset",
        image_obs_keys=_cams("image_0", "image_1"),
        state_obs_keys=("EEF_state", None, "gripper_state"),
        state_encoding=StateEncoding.POS_EULER,
        action_encoding=ActionEncoding.EEF_POS,
        standardize_fn="bridge_orig",
    )
)

_E, _Q, _J, _N = StateEncoding.POS_EULER, StateEncoding.POS_QUAT, StateEncoding.JOINT, StateEncoding.NONE
# Fine-tuning datasets that also get a one-dataset mixture of their own (`mixtures.py`).
TDROID_DATASETS = (
    "tdroid_carrot_in_bowl",
    "tdroid_pour_corn_in_pot",
    "tdroid_flip_pot_upright",
    "tdroid_move_object_onto_plate",
    "tdroid_knock_object_over",
    "tdroid_cover_object_with_towel",
)
LIBERO_SUITES = ("spatial", "object", "goal", "10")
_EEF_GRIP = ("eef_state", None, "gripper_state")  # the most common state layout: EEF (6) + pad + gripper
_NO_STATE = (None,) * 8

# One row per Open-X dataset OpenVLA's config table knows:
#   name, (primary, secondary, wrist) image keys, state keys, state encoding, standardize_fn id,
#   optional extras: depth=(primary, secondary, wrist) depth keys, action=ActionEncoding.
# Image / state keys and the standardisation follow OpenVLA's `oxe/configs.py` and `oxe/transforms.py`.
_OXE_TABLE: tuple[tuple, ...] = (
    ("fractal20220817_data", ("image", None, None), ("base_pose_tool_reached", "gripper_closed"), _Q, "rt1"),
    (
        "kuka",
        ("image", None, None),
        ("clip_function_input/base_pose_tool_reached", "gripper_closed"),
        _Q,
        "kuka",
    ),
    (
        "taco_play",
        ("rgb_static", None, "rgb_gripper"),
        ("state_eef", None, "state_gripper"),
        _E,
        "taco_play",
        {"depth": ("depth_static", None, "depth_gripper")},
    ),
    ("jaco_play", ("image", None, "image_wrist"), ("state_eef", None, "state_gripper"), _E, "jaco_play"),
    (
        "berkeley_cable_routing",
        ("image", "top_image", "wrist45_image"),
        ("robot_state", None),
        _J,
        "berkeley_cable_routing",
    ),
    ("roboturk", ("front_rgb", None, None), _NO_STATE, _N, "rtx_invert_gripper"),
    ("nyu_door_opening_surprising_effectiveness", (None, None, "image"), _NO_STATE, _N, "rt1"),
    (
        "viola",
        ("agentview_rgb", None, "eye_in_hand_rgb"),
        ("joint_states", "gripper_states"),
        _J,
        "rtx_invert_gripper",
    ),
    (
        "berkeley_autolab_ur5",
        ("image", None, "hand_image"),
        ("state",),
        _Q,
        "berkeley_autolab_ur5",
        {"depth": ("depth", None, None)},
    ),
    ("toto", ("image", None, None), ("state", None), _J, "rtx_open_gripper"),
    (
        "language_table",
        ("rgb", None, None),
        ("effector_translation", None, None, None, None, None, None),
        _E,
        "language_table",
    ),
    (
        "columbia_cairlab_pusht_real",
        ("image", None, "wrist_image"),
        ("robot_state", None, None, None, None, None, None),
        _E,
        "rtx_absolute_gripper",
    ),
    (
        "stanford_kuka_multimodal_dataset_converted_externally_to_rlds",
        ("image", None, None),
        ("ee_position", "ee_orientation", None),
        _Q,
        "stanford_kuka_multimodal",
        {"depth": ("depth_image", None, None)},
    ),
    ("nyu_rot_dataset_converted_externally_to_rlds", ("image", None, None), _EEF_GRIP, _E, "nyu_rot"),
    (
        "stanford_hydra_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        _EEF_GRIP,
        _E,
        "stanford_hydra",
    ),
    (
        "austin_buds_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("state",),
        _J,
        "austin_buds",
    ),
    (
        "nyu_franka_play_dataset_converted_externally_to_rlds",
        ("image", "image_additional_view", None),
        ("eef_state", None, None),
        _E,
        "nyu_franka_play",
        {"depth": ("depth", "depth_additional_view", None)},
    ),
    (
        "maniskill_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("tcp_pose", "gripper_state"),
        _Q,
        "maniskill",
        {"depth": ("depth", None, "wrist_depth")},
    ),
    (
        "furniture_bench_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("state",),
        _Q,
        "furniture_bench",
    ),
    (
        "cmu_franka_exploration_dataset_converted_externally_to_rlds",
        ("highres_image", None, None),
        _NO_STATE,
        _N,
        "drop_last_action_dim",
    ),
    (
        "ucsd_kitchen_dataset_converted_externally_to_rlds",
        ("image", None, None),
        ("joint_state", None),
        _J,
        "ucsd_kitchen",
    ),
    (
        "ucsd_pick_and_place_dataset_converted_externally_to_rlds",
        ("image", None, None),
        _EEF_GRIP,
        _E,
        "ucsd_pick_and_place",
    ),
    (
        "austin_sailor_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("state",),
        _Q,
        "invert_clip_gripper",
    ),
    (
        "austin_sirius_dataset_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("state",),
        _Q,
        "invert_clip_gripper",
    ),
    (
        "bc_z",
        ("image", None, None),
        ("present/xyz", "present/axis_angle", None, "present/sensed_close"),
        _E,
        "bc_z",
    ),
    (
        "utokyo_pr2_opening_fridge_converted_externally_to_rlds",
        ("image", None, None),
        _EEF_GRIP,
        _E,
        "utokyo_pr2",
    ),
    (
        "utokyo_pr2_tabletop_manipulation_converted_externally_to_rlds",
        ("image", None, None),
        _EEF_GRIP,
        _E,
        "utokyo_pr2",
    ),
    (
        "utokyo_xarm_pick_and_place_converted_externally_to_rlds",
        ("image", "image2", "hand_image"),
        ("end_effector_pose", None, None),
        _E,
        "identity",
    ),
    (
        "utokyo_xarm_bimanual_converted_externally_to_rlds",
        ("image", None, None),
        ("pose_r", None, None),
        _E,
        "last7_action",
    ),
    ("robo_net", ("image", "image1", None), _EEF_GRIP, _E, "robo_net"),
    (
        "berkeley_mvp_converted_externally_to_rlds",
        (None, None, "hand_image"),
        ("pose", "gripper"),
        _Q,
        "identity",
        {"action": ActionEncoding.JOINT_POS},
    ),
    (
        "berkeley_rpt_converted_externally_to_rlds",
        (None, None, "hand_image"),
        ("joint_pos", "gripper"),
        _J,
        "identity",
        {"action": ActionEncoding.JOINT_POS},
    ),
    (
        "kaist_nonprehensile_converted_externally_to_rlds",
        ("image", None, None),
        ("state", None),
        _Q,
        "kaist_nonprehensile",
    ),
    (
        "stanford_mask_vit_converted_externally_to_rlds",
        ("image", None, None),
        _EEF_GRIP,
        _E,
        "stanford_mask_vit",
    ),
    (
        "tokyo_u_lsmo_converted_externally_to_rlds",
        ("image", None, None),
        _EEF_GRIP,
        _E,
        "eef_state_6_gripper_last",
    ),
    (
        "dlr_sara_pour_converted_externally_to_rlds",
        ("image", None, None),
        ("state", None, None),
        _E,
        "identity",
    ),
    (
        "dlr_sara_grid_clamp_converted_externally_to_rlds",
        ("image", None, None),
        ("state", None, None),
        _E,
        "dlr_sara_grid_clamp",
    ),
    (
        "dlr_edan_shared_control_converted_externally_to_rlds",
        ("image", None, None),
        ("state", None),
        _E,
        "invert_gripper",
    ),
    ("asu_table_top_converted_externally_to_rlds", ("image", None, None), _EEF_GRIP, _E, "asu_table_top"),
    (
        "stanford_robocook_converted_externally_to_rlds",
        ("image_1", "image_2", None),
        _EEF_GRIP,
        _E,
        "eef_state_6_gripper_last",
        {"depth": ("depth_1", "depth_2", None)},
    ),
    (
        "imperialcollege_sawyer_wrist_cam",
        ("image", None, "wrist_image"),
        (None,) * 7 + ("state",),
        _N,
        "drop_last_action_dim",
    ),
    (
        "iamlab_cmu_pickup_insert_converted_externally_to_rlds",
        ("image", None, "wrist_image"),
        ("joint_state", "gripper_state"),
        _J,
        "iamlab_cmu_pickup_insert",
    ),
    (
        "uiuc_d3field",
        ("image_1", "image_2", None),
        _NO_STATE,
        _N,
        "uiuc_d3field",
        {"depth": ("depth_1", "depth_2", None)},
    ),
    ("utaustin_mutex", ("image", None, "wrist_image"), ("state",), _J, "utaustin_mutex"),
    (
        "berkeley_fanuc_manipulation",
        ("image", None, "wrist_image"),
        ("joint_state", None, "gripper_state"),
        _J,
        "berkeley_fanuc",
    ),
    (
        "cmu_playing_with_food",
        ("image", None, "finger_vision_1"),
        ("state", None, None),
        _E,
        "cmu_playing_with_food",
    ),
    ("cmu_play_fusion", ("image", None, None), ("state",), _J, "cmu_play_fusion"),
    ("cmu_stretch", ("image", None, None), _EEF_GRIP, _E, "cmu_stretch"),
    ("berkeley_gnm_recon", (None, None, "image"), ("state", None, None), _E, "gnm"),
    ("berkeley_gnm_cory_hall", (None, None, "image"), ("state", None, None), _E, "gnm"),
    ("berkeley_gnm_sac_son", (None, None, "image"), ("state", None, None), _E, "gnm"),
    (
        "droid",
        ("exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"),
        ("proprio",),
        _Q,
        "droid",
        {"drop_zero_action_frames": True},
    ),
    (
        "fmb_dataset",
        ("image_side_1", "image_side_2", "image_wrist_1"),
        ("proprio",),
        _E,
        "fmb",
        {"depth": ("image_side_1_depth", "image_side_2_depth", "image_wrist_1_depth")},
    ),
    ("dobbe", ("wrist_image", None, None), ("proprio",), _E, "state_as_proprio"),
    (
        "roboset",
        ("image_left", "image_right", "image_wrist"),
        ("proprio",),
        _J,
        "roboset",
        {"action": ActionEncoding.JOINT_POS},
    ),
    ("rh20t", ("image_front", "image_side_right", "image_wrist"), ("proprio",), _E, "rh20t"),
    # T-DROID (OpenVLA's Franka fine-tuning tasks, 5 Hz)
    *(
        (
            name,
            ("static_image", None, None),
            ("EEF_state", None, "gripper_state"),
            _E,
            "tdroid",
            {"depth": ("static_depth_image", None, None)},
        )
        for name in TDROID_DATASETS
    ),
    ("droid_wipe", ("exterior_image_2_left", None, "wrist_image_left"), ("proprio",), _E, "droid_finetuning"),
    # LIBERO (OpenVLA's re-rendered, no-op-filtered versions)
    *(
        (
            f"libero_{suite}_no_noops",
            ("image", None, "wrist_image"),
            # OpenVLA-OFT's layout: EEF_state (6) + gripper_state (2) = the 8-d state its LIBERO evaluation
            # builds. OpenVLA's own config pads one zero between them (9-d), but OpenVLA never reads proprio.
            ("EEF_state", "gripper_state"),
            _E,
            "libero",
        )
        for suite in LIBERO_SUITES
    ),
)


def _register_table(table: tuple[tuple, ...]) -> None:
    for row in table:
        name, cams, state_keys, state_encoding, standardize_fn = row[:5]
        extras = row[5] if len(row) > 5 else {}
        register_dataset(
            RLDSDatasetConfig(
                name=name,
                image_obs_keys=_cams(*cams),
                depth_obs_keys=_cams(*extras.get("depth", (None, None, None))),
                state_obs_keys=tuple(state_keys),
                state_encoding=state_encoding,
                action_encoding=extras.get("action", ActionEncoding.EEF_POS),
                standardize_fn=standardize_fn,
                drop_zero_action_frames=extras.get("drop_zero_action_frames", False),
            )
        )


_register_table(_OXE_TABLE)
