r"""Convert your own episodes (one `.npz` / `.hdf5` file each) or a LeRobot dataset into an RLDS dataset.

    python vla_scripts/convert_to_rlds.py --episodes_dir my_episodes/ --data_root_dir data/rlds \
        --name my_robot [--version 1.0.0] [--val_fraction 0.05] [--val_split per_instruction] [--num_shards 4]
    python vla_scripts/convert_to_rlds.py --lerobot_dir ~/.cache/huggingface/lerobot/lerobot/pusht \
        --data_root_dir data/rlds --name pusht [--lerobot_cameras observation.image] [--val_fraction 0.05] \
        [--action_space joint_positions]

Each episode file holds, per step t of T (same names in `.npz` arrays or `.hdf5` datasets at the file's root):
    image          uint8[T, H, W, 3]   main camera (required)
    wrist_image    uint8[T, H, W, 3]   wrist camera (optional; any further `*_image` array is kept as well)
    state          float[T, S]         proprioception (optional)
    action         float[T, A]         the action taken at step t (required)
    instruction    str                 the task in words (a 0-d string array / dataset, or an `.hdf5` attribute)

A LeRobot dataset folder (codebase v2.1 or v3.0: meta/info.json, data/*.parquet, videos/*.mp4) is read by
`prismatic/vla/datasets/rlds/lerobot.py`: its cameras, `observation.state`, `action` and per-frame task become the
same fields (docs/lerobot.md).

The result, `<data_root_dir>/<name>/<version>/`, is a standard RLDS tfds dataset (images JPEG-encoded; steps with
`observation/{<cameras>, state}`, `action`, `language_instruction`, is_first / is_last / is_terminal / reward /
discount; `episode_metadata/file_path`). Episodes are read one at a time, so the source can be larger than memory.
The script ends by writing `<data_root_dir>/<name>/<name>_dataset.py`, a plugin file that registers the dataset:
train with `--plugins <that file> --vla.data_mix <name>`. See docs/own_data.md and docs/lerobot.md.

What the actions mean decides the plugin's encoding and masks: `--action_space` states it (eef_delta,
eef_absolute, joint_deltas, joint_positions, eef_delta_xyz_gripper); by default it is inferred and printed (7
numbers: an EEF pose; 4 numbers of episode files: EEF xyz deltas + gripper, as Meta-World's; else joints; LeRobot
actions are absolute targets, joint positions when info.json names joints; episode files follow OpenVLA's deltas
with an absolute gripper). The val split holds the last episodes (`--val_split last`) or the last of every
instruction (`per_instruction`, episode files), so that validation covers every task.
"""

# No `from __future__ import annotations`: with it, @dataclass needs this module in sys.modules, which a test
# loading the file by path does not give; real annotations need nothing (Python >= 3.10).
import json
import logging
import re
import shutil
import sys
import textwrap
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError, did_you_mean
from prismatic.util.files import write_text_atomic

logger = logging.getLogger("vla_scripts.convert_to_rlds")

EPISODE_SUFFIXES = (".npz", ".hdf5", ".h5")


def _read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, hdf5 attributes) of one episode file; a `ConfigError` naming it when it cannot be read."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}, {}
        import h5py  # lazy: only .h5 episode files need it

        with h5py.File(path, "r") as f:
            arrays = {k: f[k][()] for k in f.keys() if isinstance(f[k], h5py.Dataset)}
            return arrays, dict(f.attrs)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        kind = ".npz archive" if path.suffix == ".npz" else "HDF5 file"
        raise ConfigError(
            f"Cannot read episode file '{path}': it is not a readable {kind} (truncated or damaged?), or it holds "
            f"Python objects (only plain arrays are read). Detail: {e}"
        ) from e


def load_episode(path: Path) -> dict[str, Any]:
    """One episode file -> {"images": {key: uint8[T,H,W,3]}, "state": float32[T,S] | None, "action":
    float32[T,A], "instruction": str}.

    Raises:
        ConfigError (naming the file and the array): the file cannot be read, a required array is missing,
            arrays disagree on T, an image is not uint8[T, H, W, 3], action / state are not [T, D] numbers or
            hold NaN / inf.
    """
    arrays, attrs = _read_arrays(path)
    for key in ("image", "action"):
        if key not in arrays:
            raise ConfigError(
                f"Episode file '{path}' has no '{key}' array (it has: {', '.join(sorted(arrays)) or 'none'}); "
                "every episode needs 'image', 'action' and 'instruction' (see docs/own_data.md)."
            )
    instruction = arrays.pop("instruction", attrs.get("instruction"))
    if instruction is None:
        raise ConfigError(
            f"Episode file '{path}' has no 'instruction' (a 0-d string array, or an .hdf5 file attribute)."
        )
    instruction = np.asarray(instruction).reshape(-1)[0]
    instruction = instruction.decode() if isinstance(instruction, bytes) else str(instruction)
    images = {}
    for key, value in arrays.items():
        if key == "image" or key.endswith("_image"):
            value = np.asarray(value)
            if value.dtype != np.uint8 or value.ndim != 4 or value.shape[-1] != 3:
                raise ConfigError(
                    f"Episode file '{path}': '{key}' must be uint8[T, H, W, 3] (RGB, 0-255), got {value.dtype}"
                    f"{list(value.shape)}."
                )
            images[key] = value
    numeric = {key: arrays[key] for key in ("action", "state") if key in arrays}
    for key, value in numeric.items():
        value = np.asarray(value)
        if value.ndim != 2 or not (np.issubdtype(value.dtype, np.number) or value.dtype == np.bool_):
            raise ConfigError(
                f"Episode file '{path}': '{key}' must be a [T, D] array of numbers, got {value.dtype}"
                f"{list(value.shape)}."
            )
        if not np.isfinite(value.astype(np.float64)).all():
            raise ConfigError(
                f"Episode file '{path}': '{key}' holds NaN or inf values (first at step "
                f"{int(np.nonzero(~np.isfinite(value.astype(np.float64)))[0][0])}); fix or drop those steps."
            )
    action = np.asarray(arrays["action"], np.float32)
    state = np.asarray(arrays["state"], np.float32) if "state" in arrays else None
    lengths = {"action": len(action), **{k: len(v) for k, v in images.items()}}
    if state is not None:
        lengths["state"] = len(state)
    if len(set(lengths.values())) != 1:
        described = ", ".join(f"{k}: {n}" for k, n in lengths.items())
        raise ConfigError(
            f"Episode file '{path}': arrays have different numbers of steps ({described}); every array holds "
            "one entry per step."
        )
    if len(action) == 0:
        raise ConfigError(f"Episode file '{path}' has no steps.")
    return {"images": images, "state": state, "action": action, "instruction": instruction}


def _per_step_shapes(episode: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
    shapes: dict[str, tuple[int, ...] | None] = {k: v.shape[1:] for k, v in episode["images"].items()}
    shapes["action"] = episode["action"].shape[1:]
    shapes["state"] = None if episode["state"] is None else episode["state"].shape[1:]
    return shapes


def _check_like_first(
    episode: dict[str, Any], who: str, first: dict[str, tuple[int, ...] | None], first_who: str
) -> None:
    """Every episode must have the first one's cameras and per-step shapes (they define the dataset's features).

    `who` names the episode ("Episode file '<path>'"), `first_who` the first one; `first` is its per-step shapes.
    """
    mine = _per_step_shapes(episode)
    if mine == first:
        return

    def show(shapes: dict[str, tuple[int, ...] | None], key: str) -> str:
        return "absent" if shapes.get(key) is None else str(list(shapes[key]))

    differences = [
        f"'{key}' {show(mine, key)} here, {show(first, key)} there"
        for key in sorted(set(mine) | set(first))
        if mine.get(key) != first.get(key)
    ]
    raise ConfigError(
        f"{who} does not match the first episode {first_who} (per-step shapes: {'; '.join(differences)}). All "
        "episodes of a dataset need the same cameras, image sizes, state and action widths: resize or pad them "
        "before converting, or convert them as separate datasets."
    )


def _to_rlds(episode: dict[str, Any], file_path: str) -> dict[str, Any]:
    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds.writer import rlds_step_flags

    num_steps = len(episode["action"])
    instruction = episode[
        "instruction"
    ]  # one text, or one per step (a LeRobot task that changes mid-episode)
    instructions = [instruction] * num_steps if isinstance(instruction, str) else list(instruction)
    steps = []
    for t in range(num_steps):
        observation = {key: images[t] for key, images in episode["images"].items()}
        if episode["state"] is not None:
            observation["state"] = episode["state"][t]
        steps.append(
            {
                "observation": observation,
                "action": episode["action"][t],
                "language_instruction": instructions[t],
                **rlds_step_flags(t, num_steps),
            }
        )
    return {"steps": steps, "episode_metadata": {"file_path": file_path}}


@dataclass(frozen=True)
class _Source:
    """The episodes a conversion reads, in order: how to load, name and record each."""

    count: int
    load: Callable[[int], dict[str, Any]]  # i -> the episode dict of `load_episode`
    who: Callable[[int], str]  # i -> how errors name it ("Episode file '<path>'")
    first_who: str  # how "does not match the first episode ..." names the first one
    file_path: Callable[[int], str]  # i -> its episode_metadata/file_path
    description: str  # the dataset's tfds description
    # i -> the group `--val_split per_instruction` holds out from (its instruction); None: the source has none cheap
    group: Callable[[int], str] | None = None


@dataclass(frozen=True)
class Converted:
    """What a conversion wrote: the version folder, and the features its plugin file describes."""

    target: Path
    image_keys: list[str]  # observation keys of the cameras, the primary camera first
    state_dim: int | None
    action_dim: int


VAL_SPLITS = ("last", "per_instruction")  # --val_split: which episodes the val split holds


def _check_split_args(val_fraction: float, num_shards: int, val_split: str = "last") -> None:
    if not 0 <= val_fraction < 1:  # also refuses NaN
        raise ConfigError(
            f"--val_fraction {val_fraction} is outside [0, 1): it is the fraction of episodes held out for "
            "validation (e.g. 0.05; 0 = none, training then holds out the last 5% of train)."
        )
    if num_shards < 1:
        raise ConfigError(f"--num_shards {num_shards} must be at least 1 (tfrecord files per split).")
    if val_split not in VAL_SPLITS:
        raise ConfigError(
            f"--val_split '{val_split}' is not one of {', '.join(VAL_SPLITS)} (last: the last episodes by file "
            f"name; per_instruction: the last episodes of every instruction).{did_you_mean(val_split, VAL_SPLITS)}"
        )


def split_episodes(
    count: int, val_fraction: float, groups: Sequence[str] | None = None
) -> dict[str, list[int]]:
    """Episode indices (0 .. count - 1) of the train and val splits.

    Without `groups`, val holds the last `round(val_fraction * count)` episodes (at least one when `val_fraction >
    0`). With `groups` (one label per episode: its instruction, its task), it holds that share of every group, the
    group's last episodes, so that validation sees every task.

    Raises:
        ConfigError: the held-out share leaves no training episode (of a group, with `groups`).
    """

    def held_out(n: int) -> int:
        return max(1, round(val_fraction * n)) if val_fraction > 0 else 0

    if groups is None:
        members = {"all episodes": list(range(count))}
    else:
        members = {}
        for index, group in enumerate(groups):
            members.setdefault(group, []).append(index)
    val: list[int] = []
    for group, indices in members.items():
        num_val = held_out(len(indices))
        if num_val >= len(indices):
            where = "" if groups is None else f" of group '{group}'"
            raise ConfigError(
                f"--val_fraction {val_fraction} of {len(indices)} episode(s){where} leaves none for training; lower "
                "it or add episodes."
            )
        val += indices[len(indices) - num_val :]
    held = set(val)
    splits = {"train": [i for i in range(count) if i not in held]}
    if val:
        splits["val"] = sorted(val)
    return splits


def _write(
    source: _Source,
    data_root_dir: Path,
    name: str,
    *,
    version: str,
    val_fraction: float,
    num_shards: int,
    overwrite: bool,
    primary: str | None = None,
    val_split: str = "last",
) -> Converted:
    """Write `source`'s episodes as `<data_root_dir>/<name>/<version>` (see `convert`)."""
    target = Path(data_root_dir) / name / version
    if (target / "dataset_info.json").exists() and not overwrite:  # before reading any episode
        raise ConfigError(
            f"'{target}' already holds an RLDS dataset. Pass --overwrite to replace it (the old one is kept until "
            "the new one is complete), or choose another --name or --version."
        )
    first_episode = source.load(0)
    first = _per_step_shapes(first_episode)
    image_keys = list(first_episode["images"])
    if primary in image_keys:
        image_keys.remove(primary)
        image_keys.insert(0, primary)
    state_dim = None if first["state"] is None else int(first["state"][0])
    del first_episode  # only its shapes are kept: memory stays one episode

    groups = None
    if val_split == "per_instruction" and val_fraction > 0:
        if source.group is None:
            raise ConfigError(
                "--val_split per_instruction reads each episode's instruction before writing, which only episode "
                "files (--episodes_dir) give cheaply; use --val_split last for a LeRobot dataset."
            )
        groups = [source.group(i) for i in range(source.count)]
    splits = split_episodes(source.count, val_fraction, groups)
    smallest = min(len(r) for r in splits.values())
    if num_shards > smallest:
        logger.warning(
            "--num_shards %d is more than the %d episode(s) of the smallest split; writing %d shard(s) per split.",
            num_shards,
            smallest,
            smallest,
        )
        num_shards = smallest

    def make_features(tfds: Any) -> Any:
        f = tfds.features
        observation = {
            key: f.Image(shape=first[key], dtype=np.uint8, encoding_format="jpeg") for key in image_keys
        }
        if first["state"] is not None:
            observation["state"] = f.Tensor(shape=first["state"], dtype=np.float32)
        step = {
            "observation": f.FeaturesDict(observation),
            "action": f.Tensor(shape=first["action"], dtype=np.float32),
            "language_instruction": f.Text(),
            **rlds_step_features(f),
        }
        return rlds_episode_features(f, step)

    def episodes(split: str) -> Iterator[dict[str, Any]]:
        for i in splits[split]:
            episode = source.load(i)
            _check_like_first(episode, source.who(i), first, source.first_who)
            yield _to_rlds(episode, source.file_path(i))

    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds.writer import (
        rlds_episode_features,
        rlds_step_features,
        write_rlds_dataset,
    )

    target = write_rlds_dataset(
        data_root_dir,
        name,
        make_features,
        {split: (lambda s=split: episodes(s)) for split in splits},
        version=version,
        num_shards=num_shards,
        description=source.description,
        if_exists="replace" if overwrite else "refuse",
    )
    return Converted(target, image_keys, state_dim, int(first["action"][0]))


def read_instruction(path: Path) -> str:
    """The instruction of one episode file, without reading its images (what `--val_split per_instruction` groups
    by); a file without one gives "" (`load_episode` names the problem when the file is converted)."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                value = data["instruction"] if "instruction" in data.files else ""
        else:
            import h5py  # lazy: only .h5 episode files need it

            with h5py.File(path, "r") as f:
                value = f["instruction"][()] if "instruction" in f else f.attrs.get("instruction", "")
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        return ""  # unreadable: load_episode raises the full message for this file
    value = np.asarray(value).reshape(-1)[0] if np.asarray(value).size else ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _episode_paths_source(
    paths: Sequence[Path],
    description: str,
    groups: Sequence[str] | None = None,
    file_paths: Sequence[str] | None = None,
) -> _Source:
    paths = list(paths)
    return _Source(
        count=len(paths),
        load=lambda i: load_episode(paths[i]),
        who=lambda i: f"Episode file '{paths[i]}'",
        first_who=f"'{paths[0]}'",
        file_path=(lambda i: file_paths[i]) if file_paths is not None else (lambda i: str(paths[i])),
        description=description,
        group=(lambda i: groups[i]) if groups is not None else (lambda i: read_instruction(paths[i])),
    )


def _episode_files_source(episodes_dir: Path) -> _Source:
    episodes_dir = Path(episodes_dir)
    if not episodes_dir.is_dir():
        raise ConfigError(f"--episodes_dir '{episodes_dir}' does not exist or is not a folder.")
    paths = sorted(p for p in episodes_dir.iterdir() if p.suffix in EPISODE_SUFFIXES)
    if not paths:
        raise ConfigError(f"No {'/'.join(EPISODE_SUFFIXES)} episode files in '{episodes_dir}'.")
    return _episode_paths_source(paths, f"Converted from {episodes_dir} by vla_scripts/convert_to_rlds.py.")


def _convert_episode_files(episodes_dir: Path, data_root_dir: Path, name: str, **kwargs: Any) -> Converted:
    _check_split_args(kwargs["val_fraction"], kwargs["num_shards"], kwargs.get("val_split", "last"))
    return _write(_episode_files_source(episodes_dir), data_root_dir, name, primary="image", **kwargs)


def write_episode_files(
    paths: Sequence[Path],
    data_root_dir: Path,
    name: str,
    *,
    groups: Sequence[str] | None = None,
    file_paths: Sequence[str] | None = None,
    description: str,
    version: str = "1.0.0",
    val_fraction: float = 0.0,
    num_shards: int = 1,
    overwrite: bool = False,
) -> Converted:
    """Write the episode files `paths`, in that order, as `<data_root_dir>/<name>/<version>` (what `convert` does
    for a folder; `vla_scripts/collect_demos.py` writes its demonstrations through it).

    `groups` (one label per path, e.g. the task) makes the val split hold the last `val_fraction` of every group
    (`split_episodes`); without it, of every instruction. `file_paths` is what each episode's
    `episode_metadata/file_path` records (default: its path), e.g. a name that outlives a temporary folder.

    Raises:
        ConfigError: as `convert`.
    """
    if not paths:
        raise ConfigError(f"No episodes to write as the RLDS dataset '{name}'.")
    _check_split_args(val_fraction, num_shards, "per_instruction")
    source = _episode_paths_source(paths, description, groups, file_paths)
    return _write(
        source,
        data_root_dir,
        name,
        primary="image",
        version=version,
        val_fraction=val_fraction,
        num_shards=num_shards,
        overwrite=overwrite,
        val_split="per_instruction",
    )


def convert(
    episodes_dir: Path,
    data_root_dir: Path,
    name: str,
    *,
    version: str = "1.0.0",
    val_fraction: float = 0.0,
    num_shards: int = 1,
    overwrite: bool = False,
    val_split: str = "last",
) -> Path:
    """Convert every episode file of `episodes_dir` (sorted by name); return `<data_root_dir>/<name>/<version>`.

    The last `round(val_fraction * N)` episodes (at least one when `val_fraction > 0`) form the `val` split (with
    none, training reads the last 5% of `train` as validation); `val_split="per_instruction"` holds out that share
    of every instruction's episodes instead (at least one each), so validation covers every task. Image shapes, the
    state width and the action width come from the first episode; every other episode must match them.
    `num_shards` larger than a split's number of episodes is lowered to it, with a warning (tfds cannot write empty
    shards).

    Raises:
        ConfigError: a bad argument, no episode files, an episode file that is unreadable, incomplete or unlike
            the first (named), or an existing `<name>/<version>/` without `overwrite`.
    """
    kwargs = {
        "version": version,
        "val_fraction": val_fraction,
        "num_shards": num_shards,
        "overwrite": overwrite,
        "val_split": val_split,
    }
    return _convert_episode_files(episodes_dir, data_root_dir, name, **kwargs).target


def _convert_lerobot(
    lerobot_dir: Path, data_root_dir: Path, name: str, *, cameras: Sequence[str] | None = None, **kwargs: Any
) -> tuple[Converted, Any]:
    # lazy: pyarrow and PyAV, needed for LeRobot input only
    from prismatic.vla.datasets.rlds.lerobot import open_lerobot

    _check_split_args(kwargs["val_fraction"], kwargs["num_shards"], kwargs.get("val_split", "last"))
    lerobot = open_lerobot(Path(lerobot_dir), cameras)
    refs = lerobot.episodes
    source = _Source(
        count=len(refs),
        load=lambda i: lerobot.load_episode(refs[i]),
        who=lambda i: lerobot.describe(refs[i]).capitalize(),
        first_who=f"(episode {refs[0].index})",
        file_path=lambda i: f"{refs[i].data_file}#episode_index={refs[i].index}",
        description=f"Converted from the LeRobot {lerobot.version} dataset {lerobot.root} by "
        "vla_scripts/convert_to_rlds.py.",
    )
    primary = lerobot.observation_keys[lerobot.cameras[0]]
    return _write(source, data_root_dir, name, primary=primary, **kwargs), lerobot


def convert_lerobot(
    lerobot_dir: Path,
    data_root_dir: Path,
    name: str,
    *,
    cameras: Sequence[str] | None = None,
    version: str = "1.0.0",
    val_fraction: float = 0.0,
    num_shards: int = 1,
    overwrite: bool = False,
) -> Path:
    """Convert the LeRobot dataset folder `lerobot_dir` (codebase v2.1 or v3.0); return the version folder.

    Episodes are converted in episode_index order, the last ones held out as in `convert`. `cameras` picks and
    orders the LeRobot camera features (default: every RGB one, in meta/info.json's order; the first is the
    primary camera). See `prismatic.vla.datasets.rlds.lerobot` for what is read and how.

    Raises:
        ConfigError: as `convert`, and for a folder that is not a LeRobot dataset of a supported version, a
            missing file or column, an unknown camera (all named).
    """
    kwargs = {
        "version": version,
        "val_fraction": val_fraction,
        "num_shards": num_shards,
        "overwrite": overwrite,
    }
    return _convert_lerobot(lerobot_dir, data_root_dir, name, cameras=cameras, **kwargs)[0].target


# ==========================================================================================================
# The plugin file that registers the converted dataset
# ==========================================================================================================

# The pipeline's action encodings by width (configs.ACTION_DIM).
ACTION_DIMS = {7: "EEF_POS", 8: "JOINT_POS", 4: "EEF_XYZ_GRIPPER"}
ENCODING_WIDTHS = {encoding: width for width, encoding in ACTION_DIMS.items()}
# --action_space: what the action's numbers mean -> (encoding, every dimension absolute?, the plugin's comment).
# Absolute dimensions repeat their last value when a chunk is padded past an episode's end; deltas get zeros.
ACTION_SPACES = {
    "eef_delta": ("EEF_POS", False, "EEF deltas: xyz, roll-pitch-yaw, then the gripper (absolute)"),
    "eef_absolute": ("EEF_POS", True, "absolute EEF pose: xyz, roll-pitch-yaw, gripper"),
    "joint_deltas": ("JOINT_POS", False, "joint deltas, then the gripper (absolute)"),
    "joint_positions": ("JOINT_POS", True, "joint position targets, gripper last"),
    "eef_delta_xyz_gripper": (
        "EEF_XYZ_GRIPPER",
        False,
        "EEF xyz deltas, then the gripper (absolute), no rotation (Meta-World's layout)",
    ),
}
ACTION_SPACE_CHOICES = ("infer", *ACTION_SPACES)
# Words of LeRobot action names that make them joints (SO-100 / Koch "shoulder_pan", ALOHA "left_waist", ...).
_JOINT_WORDS = re.compile(
    r"joint|shoulder|elbow|waist|forearm|wrist_(flex|roll|angle|pitch|yaw)", re.IGNORECASE
)


@dataclass(frozen=True)
class ActionMeaning:
    """What the action numbers mean (decides the plugin's encoding and masks) and how that was decided."""

    space: str  # a key of ACTION_SPACES
    lerobot: bool = False  # a LeRobot source: its grippers are positions, so every dimension is normalised
    how: str = "stated by --action_space"

    @property
    def encoding(self) -> str:
        return ACTION_SPACES[self.space][0]

    @property
    def all_absolute(self) -> bool:
        return ACTION_SPACES[self.space][1]

    @property
    def note(self) -> str:
        return ACTION_SPACES[self.space][2]


def action_meaning(
    stated: str, action_dim: int, *, lerobot: bool = False, names: Sequence[str] = ()
) -> ActionMeaning:
    """The action's meaning: `stated` (an --action_space choice), or inferred when it is "infer".

    Inferred: 7 numbers are an EEF pose + gripper; 4 numbers of episode files EEF xyz deltas + gripper (Meta-World's
    layout, `collect_demos.py`'s); other widths joints + gripper; LeRobot actions are absolute targets (what lerobot
    records for its robots: joint positions when info.json names joints), episode files follow OpenVLA's deltas with
    an absolute gripper.

    Raises:
        ConfigError: an EEF meaning stated for actions of another width (7 numbers, or 4 for eef_delta_xyz_gripper).
    """
    if stated != "infer":
        encoding = ACTION_SPACES[stated][0]
        if encoding == "EEF_POS" and action_dim != 7:
            raise ConfigError(
                f"--action_space {stated} needs 7 action numbers (xyz, roll-pitch-yaw, gripper), but the actions "
                f"have {action_dim}. Pass joint_positions or joint_deltas (padded to 8), or map them in a "
                "standardisation function of the plugin file."
            )
        if encoding == "EEF_XYZ_GRIPPER" and action_dim != 4:
            raise ConfigError(
                f"--action_space {stated} needs 4 action numbers (xyz, gripper), but the actions have {action_dim}. "
                "Pass eef_delta for 7 (xyz, roll-pitch-yaw, gripper), joint_positions or joint_deltas otherwise."
            )
        return ActionMeaning(stated, lerobot)
    joints = [name for name in names if _JOINT_WORDS.search(name)]
    if lerobot and joints:
        space, why = "joint_positions", f"the joint names of meta/info.json ({', '.join(joints[:3])}, ...)"
    elif action_dim == 7:
        space = "eef_absolute" if lerobot else "eef_delta"
        why = "7 numbers; " + ("LeRobot actions are targets" if lerobot else "OpenVLA's EEF deltas + gripper")
    elif action_dim == 4 and not lerobot:
        space, why = "eef_delta_xyz_gripper", "4 numbers; EEF xyz deltas + gripper, as Meta-World's"
    else:
        space = "joint_positions" if lerobot else "joint_deltas"
        why = f"{action_dim} numbers; " + (
            "LeRobot actions are targets" if lerobot else "OpenVLA's JOINT_POS"
        )
    return ActionMeaning(space, lerobot, f"inferred from {why}; --action_space states it")


def camera_slots(image_keys: Sequence[str]) -> dict[str, str | None]:
    """The config's camera views: the first key is the primary camera, the first other key naming "wrist" the
    wrist camera, the first remaining one the secondary camera (only the primary one is read in training)."""
    rest = list(image_keys[1:])
    wrist = next((k for k in rest if "wrist" in k), None)
    secondary = next((k for k in rest if k != wrist), None)
    return {"primary": image_keys[0] if image_keys else None, "secondary": secondary, "wrist": wrist}


def standardize_fn_id(name: str, action_dim: int, encoding: str | None = None) -> str:
    """The plugin's standardize_fn: "identity" when the actions fill their encoding (7 for EEF_POS, 8 for
    JOINT_POS, 4 for EEF_XYZ_GRIPPER; default: the encoding of that many numbers) and for more than 8 (which the
    plugin refuses), else the padding function it defines (to JOINT_POS's 8)."""
    width = ENCODING_WIDTHS[encoding or ACTION_DIMS.get(action_dim, "JOINT_POS")]
    return "identity" if action_dim >= width else f"{name}_pad_actions"


def registry_entry(
    name: str,
    image_keys: Sequence[str],
    state_dim: int | None,
    action_dim: int,
    *,
    meaning: ActionMeaning | None = None,
) -> str:
    """The `register_dataset(...)` call that makes the converted dataset usable (in its plugin file, and printed).

    `meaning` (default: inferred for episode files) decides the encoding and the masks, and the comments say it."""
    meaning = meaning or action_meaning("infer", action_dim)
    slots = ", ".join(
        f'"{view}": {"None" if key is None else json.dumps(key)}'
        for view, key in camera_slots(image_keys).items()
    )
    encoding = meaning.encoding
    width = ENCODING_WIDTHS[encoding]
    if state_dim is None:
        state = "(None,) * 8,  # no state in the data: 8 zero columns (proprio is off unless you turn it on)"
        state_encoding = "NONE"
    else:
        state = f'("state",),  # observation/state, {state_dim} numbers per step'
        state_encoding = "JOINT" if meaning.lerobot else "POS_EULER"
        if encoding == "EEF_XYZ_GRIPPER" and state_dim == 4:
            state_encoding = "POS_GRIPPER"
    fn = standardize_fn_id(name, action_dim, encoding)
    action_note = f"action = {meaning.note}"
    if action_dim < width:
        action_note += f"; {action_dim} numbers, padded to 8 by {fn}()"
    if action_dim > 8:
        action_note = f"{action_dim} action numbers: map them onto 7 or 8 first (see the raise above)"
    masks = ""
    if meaning.lerobot:
        # LeRobot robots' grippers are usually positions, not OpenVLA's 0 / 1 command: normalise every dimension.
        masks += f"\n        action_normalization_mask=(True,) * {width},  # every dimension (a gripper position too)"
    if meaning.all_absolute:
        masks += (
            f"\n        absolute_action_mask=(True,) * {width},  # absolute targets: padding repeats them"
        )
    return f"""register_dataset(
    RLDSDatasetConfig(
        name="{name}",
        image_obs_keys={{{slots}}},
        state_obs_keys={state}
        state_encoding=StateEncoding.{state_encoding},  # metadata: POS_EULER / POS_QUAT / JOINT / POS_GRIPPER / NONE
        action_encoding=ActionEncoding.{encoding},  # {action_note}
        standardize_fn="{fn}",  # or your own @register_standardize_fn{masks}
    )
)"""


def dataset_plugin(
    name: str,
    image_keys: Sequence[str],
    state_dim: int | None,
    action_dim: int,
    *,
    data_root_dir: Path,
    origin: str,
    mapping: Sequence[str],
    meaning: ActionMeaning | None = None,
) -> str:
    """The text of `<data_root_dir>/<name>/<name>_dataset.py`: a plugin file registering the converted dataset.

    The action's `meaning` (default: inferred for episode files) picks the encoding: 7 numbers of an EEF meaning
    are EEF_POS, joint meanings JOINT_POS; actions narrower than their encoding are padded by a standardisation
    function the file defines (zeros before the last dimension, the gripper, as JOINT_POS pads joints), others
    registered as they are (standardize_fn "identity"); more than 8 fit no encoding the pipeline has, so the file
    then raises a `ConfigError` saying what to edit.
    """
    meaning = meaning or action_meaning("infer", action_dim)
    path = Path(data_root_dir) / name / f"{name}_dataset.py"
    mapped = "\n".join(
        f"    {line}"
        for line in [*mapping, f"action meaning: {meaning.space} = {meaning.note} ({meaning.how})"]
    )
    head = f'''"""Registers the RLDS dataset `{name}`, which vla_scripts/convert_to_rlds.py converted from
{origin}.

Every script reads it through this file, e.g.
    .venv/bin/torchrun --standalone --nnodes 1 --nproc-per-node 1 vla_scripts/train.py --vla.type <preset> \\
        --plugins {path} --vla.data_mix {name} --data_root_dir {data_root_dir} --run_root_dir runs

What the conversion mapped:
{mapped}

Edit it as you need (encodings, normalisation, a standardisation function): converting again with --overwrite
keeps an edited copy as {name}_dataset.py.bak.
"""
'''
    names = ["ActionEncoding", "RLDSDatasetConfig", "StateEncoding", "register_dataset"]
    fn = standardize_fn_id(name, action_dim, meaning.encoding)
    if fn != "identity":
        names.append("register_standardize_fn")
    imports = "from prismatic.vla.datasets.rlds import (\n" + "".join(f"    {n},\n" for n in names) + ")"
    entry = registry_entry(name, image_keys, state_dim, action_dim, meaning=meaning)
    if action_dim > 8:
        message = (
            f"{path}: dataset '{name}' has {action_dim}-dim actions, but the training pipeline's action encodings "
            "have 7 (ActionEncoding.EEF_POS) or 8 (ActionEncoding.JOINT_POS). Edit this file: register a "
            "standardisation function (@register_standardize_fn) that maps the actions onto one of them, name it "
            "in the entry below, and delete this raise."
        )
        wrapped = textwrap.wrap(message, 96)
        lines = "".join(
            f"    {json.dumps(line + ' ' * (i < len(wrapped) - 1))}\n" for i, line in enumerate(wrapped)
        )
        return (
            head
            + f"""
from prismatic.util.errors import ConfigError

raise ConfigError(
{lines})

{imports.replace("(", "(  # noqa: E402", 1)}

{entry}
"""
        )
    if fn == "identity":
        return head + f"\n{imports}\n\n{entry}\n"
    pad = 8 - action_dim
    return (
        head
        + f'''
from prismatic.util.tf import import_tensorflow

{imports}


@register_standardize_fn("{fn}")
def {name}_pad_actions(traj):
    """{action_dim} action numbers -> the 8 of ActionEncoding.JOINT_POS: {pad} zeros before the last one (the gripper,
    if the robot has one), as joint layouts pad unused joints. Predicted actions then hold 8 numbers; the
    robot's are `np.concatenate([action[:{action_dim - 1}], action[7:]])`."""
    tf = import_tensorflow()
    action = traj["action"]
    zeros = tf.zeros([tf.shape(action)[0], {pad}], action.dtype)
    traj["action"] = tf.concat([action[:, :-1], zeros, action[:, -1:]], axis=1)
    return traj


{entry}
'''
    )


def write_dataset_plugin(data_root_dir: Path, name: str, text: str) -> Path | None:
    """Write `<data_root_dir>/<name>/<name>_dataset.py`; an existing, different one is kept as `.bak`.

    Nothing is written (None is returned, with a warning) when `name` is already a registered dataset (built in,
    or from --plugins): a second registration of the name would fail.
    """
    # lazy: importing the dataset tables takes time, spared to --help and flag errors
    from prismatic.vla.datasets.rlds.configs import DATASET_CONFIGS

    path = Path(data_root_dir) / name / f"{name}_dataset.py"
    if name in DATASET_CONFIGS:
        logger.warning(
            "Dataset '%s' is already registered (built in, or by --plugins), so no plugin file was written to %s: "
            "training uses that registration, which must match the converted features.",
            name,
            path,
        )
        return None
    if path.is_file() and path.read_text() != text:
        shutil.copy2(path, path.with_name(path.name + ".bak"))
        logger.warning("%s differed from the new plugin file; the old one is kept as %s.bak", path, path.name)
    return write_text_atomic(path, text, "dataset plugin file")


def register_converted(
    converted: Converted,
    data_root_dir: Path,
    name: str,
    *,
    action_space: str,
    origin: str,
    mapping: Sequence[str],
    lerobot_action_names: Sequence[str] | None = None,
) -> Path | None:
    """Decide what the actions mean (`action_meaning`; printed), write the dataset's plugin file and print the
    flags that train on it and its registry entry. Returns the plugin file (None when the name is registered).

    `lerobot_action_names` is given for a LeRobot source (its action names; may be empty), None for episode files.
    """
    dims = (converted.image_keys, converted.state_dim, converted.action_dim)
    meaning = action_meaning(
        action_space,
        converted.action_dim,
        lerobot=lerobot_action_names is not None,
        names=lerobot_action_names or (),
    )
    print(f"action meaning: {meaning.space} = {meaning.note} ({meaning.how})")
    text = dataset_plugin(
        name, *dims, data_root_dir=data_root_dir, origin=origin, mapping=mapping, meaning=meaning
    )
    plugin = write_dataset_plugin(data_root_dir, name, text)
    print(f"wrote {converted.target}")
    if plugin is not None:
        print(
            f"wrote {plugin}, which registers the dataset: train on it with\n"
            f"    --plugins {plugin} --vla.data_mix {name} --data_root_dir {data_root_dir}\n"
            "Its entry (edit the file if your actions or state are laid out otherwise):"
        )
    if converted.action_dim > 8:
        logger.warning(
            "The actions have %d dimensions; the training pipeline's encodings have 4, 7 or 8. The plugin file "
            "refuses to load until you add a standardisation function mapping them (see the file).",
            converted.action_dim,
        )
    print(registry_entry(name, *dims, meaning=meaning))
    return plugin


@dataclass
class ConvertConfig:
    """Flags of this script (examples above)."""

    data_root_dir: Path  # where <name>/<version>/ (and the plugin file <name>/<name>_dataset.py) is written
    name: str  # dataset name: lowercase letters, digits and underscores, starting with a letter
    episodes_dir: Path | None = (
        None  # folder of .npz / .hdf5 episode files, one per episode (or --lerobot_dir)
    )
    lerobot_dir: Path | None = None  # a LeRobot dataset folder, v2.1 or v3.0 (meta/info.json, data/, videos/)
    lerobot_cameras: list[str] | None = (
        None  # LeRobot cameras to keep, the primary first (default: all RGB ones)
    )
    version: str = "1.0.0"  # dataset version, major.minor.patch
    val_fraction: float = 0.0  # fraction of episodes (the last ones) held out as the val split, in [0, 1)
    # which episodes val holds: last (the last by file name / episode index) or per_instruction (the last of every
    # instruction, so validation covers every task; episode files only)
    val_split: str = "last"
    num_shards: int = 1  # tfrecord files per split (>= 1)
    overwrite: bool = False  # replace an existing <name>/<version>/
    # what the actions mean, for the plugin's encoding and masks: infer (by width and source; printed), eef_delta,
    # eef_absolute, joint_deltas, joint_positions, eef_delta_xyz_gripper
    action_space: str = "infer"

    def __post_init__(self) -> None:
        # tfds would refuse these only after TensorFlow loads, with a traceback.
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ConfigError(
                f"--name '{self.name}' is not a dataset name: use lowercase letters, digits and underscores, "
                "starting with a letter (e.g. my_robot)."
            )
        if not re.fullmatch(r"\d+\.\d+\.\d+", self.version):
            raise ConfigError(f"--version '{self.version}' is not major.minor.patch, e.g. 1.0.0.")
        if (self.episodes_dir is None) == (self.lerobot_dir is None):
            given = "neither" if self.episodes_dir is None else "both"
            raise ConfigError(
                f"Pass exactly one of --episodes_dir (a folder of .npz / .hdf5 episode files) and --lerobot_dir (a "
                f"LeRobot dataset folder holding meta/info.json); got {given}."
            )
        if self.action_space not in ACTION_SPACE_CHOICES:
            raise ConfigError(
                f"--action_space '{self.action_space}' is not one of {', '.join(ACTION_SPACE_CHOICES)} (what the "
                "action's numbers mean: EEF deltas, an absolute EEF pose, joint deltas or joint position targets)."
                f"{did_you_mean(self.action_space, ACTION_SPACE_CHOICES)}"
            )
        if self.val_split not in VAL_SPLITS:
            _check_split_args(0.0, 1, self.val_split)
        if self.lerobot_cameras is not None and self.lerobot_dir is None:
            raise ConfigError(
                "--lerobot_cameras picks the cameras of a LeRobot dataset: it needs --lerobot_dir. Episode files "
                "name their cameras by their arrays ('image', '*_image')."
            )


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), convert, write the dataset's plugin file; a mistake exits 2."""
    cfg = parse_config(ConvertConfig, argv, doc=__doc__)
    kwargs = {
        "version": cfg.version,
        "val_fraction": cfg.val_fraction,
        "num_shards": cfg.num_shards,
        "overwrite": cfg.overwrite,
        "val_split": cfg.val_split,
    }
    if cfg.lerobot_dir is not None:
        converted, lerobot = _convert_lerobot(
            cfg.lerobot_dir, cfg.data_root_dir, cfg.name, cameras=cfg.lerobot_cameras, **kwargs
        )
        origin = f"the LeRobot {lerobot.version} dataset '{lerobot.root}'"
        mapping = [
            f"{camera} ({lerobot.features[camera]['dtype']}) -> observation/{lerobot.observation_keys[camera]}"
            for camera in lerobot.cameras
        ]
        if lerobot.state_dim is not None:
            mapping.append(f"observation.state [{lerobot.state_dim}] -> observation/state")
        mapping += [
            f"action [{lerobot.action_dim}] -> action",
            "task_index (its task text) -> language_instruction",
        ]
    else:
        converted = _convert_episode_files(cfg.episodes_dir, cfg.data_root_dir, cfg.name, **kwargs)
        origin = f"the episode files of '{cfg.episodes_dir}'"
        mapping = [f"{key} -> observation/{key}" for key in converted.image_keys]
        if converted.state_dim is not None:
            mapping.append(f"state [{converted.state_dim}] -> observation/state")
        mapping += [f"action [{converted.action_dim}] -> action", "instruction -> language_instruction"]
    register_converted(
        converted,
        cfg.data_root_dir,
        cfg.name,
        action_space=cfg.action_space,
        origin=origin,
        mapping=mapping,
        lerobot_action_names=lerobot.action_names if cfg.lerobot_dir is not None else None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
