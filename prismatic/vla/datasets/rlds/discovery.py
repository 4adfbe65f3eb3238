"""Finding and opening RLDS datasets: folders, versions, tfds builders, splits, mixture members, camera views.

A dataset lives in `<data_root_dir>/<name>/<highest version>/` (read with `tfds.builder_from_directory`). Damaged
data is named, not dumped as a TensorFlow traceback: a dataset folder without its version folder or with
unreadable metadata is a `ConfigError` naming the folder, and a corrupt, truncated or missing TFRecord file met
while reading (`tfrecord_errors`) is a `ConfigError` naming that file.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from prismatic.util.errors import ConfigError
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.configs import CAMERA_VIEWS, RLDSDatasetConfig, get_dataset_config
from prismatic.vla.datasets.rlds.mixtures import get_mixture

logger = logging.getLogger(__name__)

_VERSION_RE = re.compile(r"\d+\.\d+\.\d+")


def import_tfds() -> ModuleType:
    """`tensorflow_datasets`, imported after TensorFlow (`import_tensorflow`: torch first, GPUs hidden)."""
    import_tensorflow()
    import tensorflow_datasets as tfds  # lazy: only after import_tensorflow(), and keeps imports TF-free

    return tfds


class DatasetNotFoundError(ConfigError):
    """No folder `<data_root_dir>/<name>/` at all (a mixture may skip such datasets when asked)."""


def _version_key(folder: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in folder.name.split("."))


def find_dataset_dir(data_root_dir: Path, name: str) -> Path:
    """`<data_root_dir>/<name>/<highest version>`, the folder tfds wrote.

    Raises:
        ConfigError: `data_root_dir` is missing; or `<name>/` exists but holds no prepared version folder (the
            message says what it holds and how to fix it).
        DatasetNotFoundError: there is no `<name>/` (the message lists the datasets that are there).
    """
    root = Path(data_root_dir)
    if not root.is_dir():
        raise ConfigError(
            f"RLDS data_root_dir '{root}' does not exist. Point it at a folder of RLDS datasets, or build the toy "
            f"datasets there with `python vla_scripts/build_toy_dataset.py --data_root_dir {root}`."
        )
    dataset_root = root / name
    if not dataset_root.is_dir():
        present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise DatasetNotFoundError(
            f"RLDS dataset '{name}' not found under data_root_dir '{root}' (expected '{dataset_root}/<version>/"
            f"dataset_info.json'). Datasets present: {', '.join(present) or 'none'}."
        )
    version_dirs = [d for d in dataset_root.iterdir() if d.is_dir() and _VERSION_RE.fullmatch(d.name)]
    versions = [d for d in version_dirs if (d / "dataset_info.json").is_file()]
    if versions:
        return max(versions, key=_version_key)
    entries = sorted(p.name for p in dataset_root.iterdir() if not p.name.startswith("."))
    shown = ", ".join(entries[:8]) + (f" and {len(entries) - 8} more" if len(entries) > 8 else "")
    if version_dirs:
        problem = (
            f"its version folder(s) {', '.join(sorted(d.name for d in version_dirs))} hold no dataset_info.json "
            "(an interrupted download or conversion?). Download or convert the dataset again."
        )
    elif any(".tfrecord" in e or e in ("dataset_info.json", "features.json") for e in entries):
        problem = (
            f"its files ({shown}) lie directly in it. Move them into a version folder named as in their "
            f"dataset_info.json, e.g. '{dataset_root}/1.0.0/'."
        )
    else:
        problem = f"it holds {shown or 'nothing'}."
    raise ConfigError(
        f"RLDS dataset folder '{dataset_root}' has no version folder: tfds datasets are read from "
        f"'<data_root_dir>/{name}/<version>/' (e.g. '1.0.0/', holding dataset_info.json, features.json and the "
        f".tfrecord files), but {problem}"
    )


def load_builder(dataset_dir: Path) -> Any:
    """`tfds.builder_from_directory(dataset_dir)`, with a `ConfigError` naming the folder when its metadata
    (dataset_info.json, features.json) cannot be read."""
    tfds = import_tfds()

    try:
        return tfds.builder_from_directory(str(dataset_dir))
    except Exception as e:  # noqa: BLE001 (json, protobuf, tf and tfds errors alike: damaged metadata)
        raise ConfigError(
            f"Cannot read the RLDS dataset metadata in '{dataset_dir}' (dataset_info.json / features.json: "
            f"{short_tf_message(e)}). Download or convert the dataset again."
        ) from e


def short_tf_message(error: BaseException) -> str:
    """TensorFlow's message without its op / function-node decorations."""
    text = getattr(error, "message", None) or str(error) or type(error).__name__
    text = re.sub(r"\{\{[^}]*\}\}", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\].*$", "", text, flags=re.S)
    return " ".join(text.split()).strip(" '")


def find_corrupt_tfrecords(dataset_dirs: Sequence[Path]) -> list[tuple[Path, str]]:
    """(file, TensorFlow's reason) for every TFRecord file of `dataset_dirs` that cannot be read to its end
    (truncated, corrupted, not a TFRecord). Reads every record: meant for the error path only."""
    tf = import_tensorflow()
    bad = []
    for folder in dataset_dirs:
        for path in sorted(Path(folder).glob("*.tfrecord*")):
            try:
                tf.data.TFRecordDataset(str(path)).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)
            except (tf.errors.DataLossError, tf.errors.OutOfRangeError) as e:
                bad.append((path, short_tf_message(e)))
    return bad


@contextlib.contextmanager
def tfrecord_errors(dataset_dirs: Sequence[Path]) -> Iterator[None]:
    """Within the block, a TFRecord that cannot be read becomes a `ConfigError` naming the file.

    TensorFlow's own error names a byte offset but not the file; on that (rare) path every TFRecord file of
    `dataset_dirs` is checked to find it.
    """
    tf = import_tensorflow()
    # Bound now: a generator left open is closed at interpreter exit, after `tf.errors` is torn down.
    not_found, data_loss = tf.errors.NotFoundError, tf.errors.DataLossError
    try:
        yield
    except not_found as e:
        reason = short_tf_message(e)
        raise ConfigError(
            f"An RLDS data file is missing: {reason}. It is listed in its dataset's dataset_info.json, so the "
            "download or conversion is incomplete: download or convert the dataset again."
        ) from e
    except data_loss as e:
        bad = find_corrupt_tfrecords(dataset_dirs)
        if not bad:
            raise ConfigError(
                f"A TFRecord file under {', '.join(repr(str(d)) for d in dataset_dirs)} could not be read "
                f"({short_tf_message(e)}). Download or convert the dataset again."
            ) from e
        files = "; ".join(f"'{path}' ({reason})" for path, reason in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise ConfigError(
            f"Corrupt or truncated TFRecord file{'s' if len(bad) > 1 else ''}: {files}{more}. An interrupted "
            "download or copy, or a full disk when it was written, leaves such files: download, copy or convert "
            "that dataset again."
        ) from e


def split_name(builder: Any, train: bool) -> str:
    """The tfds split the pipeline reads: `train` / `val`, or, for a dataset without a val split, the first 95% /
    last 5% of `train` (the held-out part, as OpenVLA does)."""
    if "val" in builder.info.splits:
        return "train" if train else "val"
    return "train[:95%]" if train else "train[95%:]"


def resolve_mixture_dirs(
    data_root_dir: Path, data_mix: str, *, skip_missing_datasets: bool = False
) -> list[tuple[RLDSDatasetConfig, float, Path]]:
    """(config, weight, dataset folder) for every dataset of `data_mix` present under `data_root_dir`.

    Raises:
        ConfigError: the mixture is unknown, `data_root_dir` is missing, or datasets of the mixture are missing
            (all of them are named) and `skip_missing_datasets` is False; or none is present at all; or a
            dataset's folder is there but holds no prepared version (never skipped: it needs fixing).
    """
    mixture = get_mixture(data_mix)
    root = Path(data_root_dir)
    if not root.is_dir():
        find_dataset_dir(root, mixture[0][0])  # raises the "data_root_dir does not exist" error
    found, missing = [], []
    for name, weight in mixture:
        try:
            found.append((get_dataset_config(name), weight, find_dataset_dir(root, name)))
        except DatasetNotFoundError:
            missing.append(name)
    if missing and (not skip_missing_datasets or not found):
        present = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
        raise ConfigError(
            f"Mixture '{data_mix}': {', '.join(repr(m) for m in missing)} not found under data_root_dir '{root}' "
            f"(each is read from '<data_root_dir>/<name>/<version>/dataset_info.json'). Datasets present: "
            f"{', '.join(present) or 'none'}. "
            + (
                "None of its datasets is present."
                if not found
                else "Download / convert them, or pass skip_missing_datasets=True to train on the rest."
            )
        )
    for name in missing:
        logger.warning("Mixture '%s': dataset '%s' is missing under '%s'; skipping it.", data_mix, name, root)
    return found


def check_image_views(
    image_views: Sequence[str], configs: Sequence[RLDSDatasetConfig], data_mix: str
) -> tuple[str, ...]:
    """The camera views to carry, validated against the mixture's dataset configs.

    A dataset without a camera for a requested view gets black images for it (OpenVLA pads with "" the same way);
    that is logged once per pipeline. A view that no dataset of the mixture has would only ever be black, so it is
    refused.

    Raises:
        ConfigError: no views, a repeated or unknown view (not one of `CAMERA_VIEWS`), or a view that no dataset
            of `data_mix` has (the message lists the views each dataset has).
    """
    if isinstance(image_views, str):
        image_views = (image_views,)
    views = tuple(image_views)
    unknown = [v for v in views if v not in CAMERA_VIEWS]
    if unknown or not views or len(set(views)) != len(views):
        problem = (
            f"unknown view(s) {', '.join(repr(v) for v in unknown)}"
            if unknown
            else ("no view" if not views else "a view named twice")
        )
        raise ConfigError(
            f"image_views={list(views)} has {problem}: frames carry one or more distinct camera views, each one "
            f"of {', '.join(CAMERA_VIEWS)} (as a dataset config's image_obs_keys name them), e.g. "
            "('primary', 'wrist')."
        )
    has = {c.name: [v for v in CAMERA_VIEWS if c.image_obs_keys[v] is not None] for c in configs}
    for view in views:
        if not any(c.image_obs_keys[view] is not None for c in configs):
            listing = "; ".join(f"{name}: {', '.join(vs) or 'none'}" for name, vs in has.items())
            raise ConfigError(
                f"Camera view '{view}' was requested (image_views={list(views)}), but no dataset of mixture "
                f"'{data_mix}' has a '{view}' camera, so every image of it would be black. Its datasets' views: "
                f"{listing}. Request only views these datasets have (fewer images), or add the camera key to the "
                "datasets' image_obs_keys in prismatic/vla/datasets/rlds/configs.py."
            )
    padded = [f"{c.name} ({view})" for c in configs for view in views if c.image_obs_keys[view] is None]
    if padded:
        logger.warning(
            "Mixture '%s': these datasets have no camera for a requested view, so their frames get black images "
            "for it (as OpenVLA pads missing views): %s.",
            data_mix,
            ", ".join(padded),
        )
    return views
