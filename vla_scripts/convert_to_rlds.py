"""Convert a folder of your own episodes (one `.npz` or `.hdf5` file per episode) into an RLDS dataset.

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

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

EPISODE_SUFFIXES = (".npz", ".hdf5", ".h5")


def load_episode(path: Path) -> dict[str, Any]:
    """One episode file -> {"images": {key: uint8[T,H,W,3]}, "state": float32[T,S] | None, "action":
    float32[T,A], "instruction": str}.

    Raises:
        ValueError: a required array is missing, or arrays disagree on T.
    """
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        attrs: dict[str, Any] = {}
    else:
        import h5py

        with h5py.File(path, "r") as f:
            arrays = {k: f[k][()] for k in f.keys() if isinstance(f[k], h5py.Dataset)}
            attrs = dict(f.attrs)
    for key in ("image", "action"):
        if key not in arrays:
            raise ValueError(f"{path}: no '{key}' array (found {sorted(arrays)}).")
    instruction = arrays.pop("instruction", attrs.get("instruction"))
    if instruction is None:
        raise ValueError(f"{path}: no 'instruction' (array or hdf5 attribute).")
    instruction = np.asarray(instruction).reshape(-1)[0]
    instruction = instruction.decode() if isinstance(instruction, bytes) else str(instruction)
    images = {k: np.asarray(v, np.uint8) for k, v in arrays.items() if k == "image" or k.endswith("_image")}
    action = np.asarray(arrays["action"], np.float32)
    state = np.asarray(arrays["state"], np.float32) if "state" in arrays else None
    lengths = {len(action), *(len(v) for v in images.values()), *([len(state)] if state is not None else [])}
    if len(lengths) != 1:
        raise ValueError(f"{path}: arrays have different numbers of steps {sorted(lengths)}.")
    for key, value in images.items():
        if value.ndim != 4 or value.shape[-1] != 3:
            raise ValueError(f"{path}: '{key}' must be uint8[T, H, W, 3], got shape {value.shape}.")
    return {"images": images, "state": state, "action": action, "instruction": instruction}


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

    The last `round(val_fraction * N)` episodes form the `val` split (with none, training reads the last 5% of
    `train` as validation). Image shapes, the state width and the action width come from the first episode.
    """
    paths = sorted(p for p in Path(episodes_dir).iterdir() if p.suffix in EPISODE_SUFFIXES)
    if not paths:
        raise ValueError(f"No {'/'.join(EPISODE_SUFFIXES)} episode files in '{episodes_dir}'.")
    first = load_episode(paths[0])
    num_val = round(val_fraction * len(paths))
    splits_paths = {"train": paths[: len(paths) - num_val]}
    if num_val:
        splits_paths["val"] = paths[len(paths) - num_val :]

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
            yield _to_rlds(load_episode(path), path)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes_dir", type=Path, required=True, help="folder of .npz / .hdf5 episodes")
    parser.add_argument(
        "--data_root_dir", type=Path, required=True, help="where <name>/<version>/ is written"
    )
    parser.add_argument("--name", required=True, help="dataset name (lowercase, digits, underscores)")
    parser.add_argument("--version", default="1.0.0")
    parser.add_argument("--val_fraction", type=float, default=0.0, help="last episodes kept for validation")
    parser.add_argument("--num_shards", type=int, default=1, help="tfrecord files per split")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing <name>/<version>/")
    args = parser.parse_args(argv)

    try:
        target = convert(
            args.episodes_dir,
            args.data_root_dir,
            args.name,
            version=args.version,
            val_fraction=args.val_fraction,
            num_shards=args.num_shards,
            overwrite=args.overwrite,
        )
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    first = load_episode(sorted(p for p in args.episodes_dir.iterdir() if p.suffix in EPISODE_SUFFIXES)[0])
    print(f"wrote {target}")
    print(
        "Add this entry to prismatic/vla/datasets/rlds/configs.py, then train with --vla.data_mix", args.name
    )
    print(registry_entry(args.name, list(first["images"]), first["state"] is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
