r"""Convert a folder of your own episodes (one `.npz` or `.hdf5` file per episode) into an RLDS dataset.

    python vla_scripts/convert_to_rlds.py --episodes_dir my_episodes/ --data_root_dir data/rlds \
        --name my_robot [--version 1.0.0] [--val_fraction 0.05] [--num_shards 4]

Each episode file holds, per step t of T (same names in `.npz` arrays or `.hdf5` datasets at the file's root):
    image          uint8[T, H, W, 3]   main camera (required)
    wrist_image    uint8[T, H, W, 3]   wrist camera (optional; any further `*_image` array is kept as well)
    state          float[T, S]         proprioception (optional)
    action         float[T, A]         the action taken at step t (required)
    instruction    str                 the task in words (a 0-d string array / dataset, or an `.hdf5` attribute)

The result, `<data_root_dir>/<name>/<version>/`, is a standard RLDS tfds dataset (images JPEG-encoded; steps with
`observation/{image, wrist_image, state}`, `action`, `language_instruction`, is_first / is_last / is_terminal /
reward / discount; `episode_metadata/file_path`). Episodes are read one at a time, so the folder can be larger
than memory. The script ends by printing the registry entry to add to `prismatic/vla/datasets/rlds/configs.py`;
see docs/own_data.md for a worked example.
"""

# No `from __future__ import annotations`: with it, @dataclass needs this module in sys.modules, which a test
# loading the file by path does not give; real annotations need nothing (Python >= 3.10).
import logging
import re
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.cli import entry_point, parse_config
from prismatic.util.errors import ConfigError

logger = logging.getLogger("vla_scripts.convert_to_rlds")

EPISODE_SUFFIXES = (".npz", ".hdf5", ".h5")


def _read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, hdf5 attributes) of one episode file; a `ConfigError` naming it when it cannot be read."""
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as data:
                return {k: data[k] for k in data.files}, {}
        import h5py

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


def _check_like_first(episode: dict[str, Any], path: Path, first: dict[str, Any], first_path: Path) -> None:
    """Every episode must have the first one's cameras and per-step shapes (they define the dataset's features)."""
    mine, theirs = _per_step_shapes(episode), _per_step_shapes(first)
    if mine == theirs:
        return

    def show(shapes: dict[str, tuple[int, ...] | None], key: str) -> str:
        return "absent" if shapes.get(key) is None else str(list(shapes[key]))

    differences = [
        f"'{key}' {show(mine, key)} here, {show(theirs, key)} there"
        for key in sorted(set(mine) | set(theirs))
        if mine.get(key) != theirs.get(key)
    ]
    raise ConfigError(
        f"Episode file '{path}' does not match the first episode '{first_path}' (per-step shapes: "
        f"{'; '.join(differences)}). All episodes of a dataset need the same cameras, image sizes, state and "
        "action widths: resize or pad them before converting, or convert them as separate datasets."
    )


def _to_rlds(episode: dict[str, Any], path: Path) -> dict[str, Any]:
    from prismatic.vla.datasets.rlds.writer import rlds_step_flags

    num_steps = len(episode["action"])
    steps = []
    for t in range(num_steps):
        observation = {key: images[t] for key, images in episode["images"].items()}
        if episode["state"] is not None:
            observation["state"] = episode["state"][t]
        steps.append(
            {
                "observation": observation,
                "action": episode["action"][t],
                "language_instruction": episode["instruction"],
                **rlds_step_flags(t, num_steps),
            }
        )
    return {"steps": steps, "episode_metadata": {"file_path": str(path)}}


def convert(
    episodes_dir: Path,
    data_root_dir: Path,
    name: str,
    *,
    version: str = "1.0.0",
    val_fraction: float = 0.0,
    num_shards: int = 1,
    overwrite: bool = False,
) -> Path:
    """Convert every episode file of `episodes_dir` (sorted by name); return `<data_root_dir>/<name>/<version>`.

    The last `round(val_fraction * N)` episodes (at least one when `val_fraction > 0`) form the `val` split (with
    none, training reads the last 5% of `train` as validation). Image shapes, the state width and the action
    width come from the first episode; every other episode must match them. `num_shards` larger than a split's
    number of episodes is lowered to it, with a warning (tfds cannot write empty shards).

    Raises:
        ConfigError: a bad argument, no episode files, an episode file that is unreadable, incomplete or unlike
            the first (named), or an existing `<name>/<version>/` without `overwrite`.
    """
    if not 0 <= val_fraction < 1:  # also refuses NaN
        raise ConfigError(
            f"--val_fraction {val_fraction} is outside [0, 1): it is the fraction of episodes held out for "
            "validation (e.g. 0.05; 0 = none, training then holds out the last 5% of train)."
        )
    if num_shards < 1:
        raise ConfigError(f"--num_shards {num_shards} must be at least 1 (tfrecord files per split).")
    episodes_dir = Path(episodes_dir)
    if not episodes_dir.is_dir():
        raise ConfigError(f"--episodes_dir '{episodes_dir}' does not exist or is not a folder.")
    paths = sorted(p for p in episodes_dir.iterdir() if p.suffix in EPISODE_SUFFIXES)
    if not paths:
        raise ConfigError(f"No {'/'.join(EPISODE_SUFFIXES)} episode files in '{episodes_dir}'.")
    target = Path(data_root_dir) / name / version
    if (target / "dataset_info.json").exists() and not overwrite:  # before reading any episode
        raise ConfigError(
            f"'{target}' already holds an RLDS dataset. Pass --overwrite to replace it (the old one is kept until "
            "the new one is complete), or choose another --name or --version."
        )
    first = load_episode(paths[0])
    num_val = max(1, round(val_fraction * len(paths))) if val_fraction > 0 else 0
    if num_val >= len(paths):
        raise ConfigError(
            f"--val_fraction {val_fraction} of {len(paths)} episode(s) leaves none for training; lower it or add "
            "episodes."
        )
    splits_paths = {"train": paths[: len(paths) - num_val]}
    if num_val:
        splits_paths["val"] = paths[len(paths) - num_val :]
    smallest = min(len(p) for p in splits_paths.values())
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
            key: f.Image(shape=images.shape[1:], dtype=np.uint8, encoding_format="jpeg")
            for key, images in first["images"].items()
        }
        if first["state"] is not None:
            observation["state"] = f.Tensor(shape=first["state"].shape[1:], dtype=np.float32)
        step = {
            "observation": f.FeaturesDict(observation),
            "action": f.Tensor(shape=first["action"].shape[1:], dtype=np.float32),
            "language_instruction": f.Text(),
            **rlds_step_features(f),
        }
        return f.FeaturesDict(
            {"steps": f.Dataset(step), "episode_metadata": f.FeaturesDict({"file_path": f.Text()})}
        )

    def episodes(split: str) -> Iterator[dict[str, Any]]:
        for path in splits_paths[split]:
            episode = load_episode(path)
            _check_like_first(episode, path, first, paths[0])
            yield _to_rlds(episode, path)

    from prismatic.vla.datasets.rlds.writer import rlds_step_features, write_rlds_dataset

    return write_rlds_dataset(
        data_root_dir,
        name,
        make_features,
        {split: (lambda s=split: episodes(s)) for split in splits_paths},
        version=version,
        num_shards=num_shards,
        description=f"Converted from {episodes_dir} by vla_scripts/convert_to_rlds.py.",
        overwrite=overwrite,
        keep_existing=False,
    )


def registry_entry(name: str, image_keys: list[str], has_state: bool) -> str:
    """The `register_dataset(...)` call that makes the converted dataset usable (printed for the user)."""
    wrist = next((k for k in image_keys if "wrist" in k), None)
    state = '("state",)' if has_state else "(None,) * 8"
    return f"""register_dataset(
    RLDSDatasetConfig(
        name="{name}",
        image_obs_keys=_cams("image", None, {f'"{wrist}"' if wrist else None}),
        state_obs_keys={state},
        state_encoding=StateEncoding.POS_EULER,  # or POS_QUAT / JOINT / NONE: what your state holds
        action_encoding=ActionEncoding.EEF_POS,  # action = xyz delta, rpy delta, gripper (1 = open)
        standardize_fn="identity",  # or your own @register_standardize_fn in transforms.py
    )
)"""


@dataclass
class ConvertConfig:
    """Flags of this script (example above)."""

    episodes_dir: Path  # folder of .npz / .hdf5 episode files, one per episode
    data_root_dir: Path  # where <name>/<version>/ is written
    name: str  # dataset name: lowercase letters, digits and underscores, starting with a letter
    version: str = "1.0.0"  # dataset version, major.minor.patch
    val_fraction: float = 0.0  # fraction of episodes (the last ones) held out as the val split, in [0, 1)
    num_shards: int = 1  # tfrecord files per split (>= 1)
    overwrite: bool = False  # replace an existing <name>/<version>/

    def __post_init__(self) -> None:
        # tfds would refuse these only after TensorFlow loads, with a traceback.
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ConfigError(
                f"--name '{self.name}' is not a dataset name: use lowercase letters, digits and underscores, "
                "starting with a letter (e.g. my_robot)."
            )
        if not re.fullmatch(r"\d+\.\d+\.\d+", self.version):
            raise ConfigError(f"--version '{self.version}' is not major.minor.patch, e.g. 1.0.0.")


@entry_point
def main(argv: list[str] | None = None) -> int:
    """Parse the flags (`--help` lists them), convert, print the registry entry; a mistake exits 2."""
    cfg = parse_config(ConvertConfig, argv, doc=__doc__)
    target = convert(
        cfg.episodes_dir,
        cfg.data_root_dir,
        cfg.name,
        version=cfg.version,
        val_fraction=cfg.val_fraction,
        num_shards=cfg.num_shards,
        overwrite=cfg.overwrite,
    )
    first = load_episode(sorted(p for p in cfg.episodes_dir.iterdir() if p.suffix in EPISODE_SUFFIXES)[0])
    print(f"wrote {target}")
    print(
        f"Add this entry to prismatic/vla/datasets/rlds/configs.py, then train with --vla.data_mix {cfg.name}"
    )
    print(registry_entry(cfg.name, list(first["images"]), first["state"] is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
