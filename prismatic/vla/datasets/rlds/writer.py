"""Write episodes held in memory as an RLDS dataset that `tfds.builder_from_directory` (and so the pipeline) reads.

`write_rlds_dataset` defines a throw-away tfds builder for one feature spec and prepares it under
`<data_root_dir>/<name>/<version>/`. Used by `vla_scripts/convert_to_rlds.py` (users' own data) and by the tests,
which write tiny datasets with the real raw feature spec of Open-X datasets.

The dataset is prepared in a hidden temporary folder beside its target and moved into place when complete, so
an error, a Ctrl-C or a full disk leaves neither a half-written dataset nor (with `overwrite`) a lost old one.
A folder that cannot be written is a `ConfigError` naming it. tfds' own lines about downloading ("Downloading and
preparing dataset Unknown size ...") are replaced by one log line each: nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.errors import ConfigError
from prismatic.util.files import check_dir_writable, make_dirs, write_error
from prismatic.util.tf import import_tensorflow
from prismatic.vla.datasets.rlds.discovery import import_tfds

logger = logging.getLogger(__name__)

IF_EXISTS_CHOICES = ("keep", "replace", "refuse")
Episode = dict[str, Any]  # {"steps": [step dict, ...], "episode_metadata": {...}} (plus any episode fields)


def rlds_step_features(f: Any) -> dict[str, Any]:
    """The RLDS bookkeeping fields of a step's feature spec (`f` is `tfds.features`)."""
    return {
        "is_first": f.Scalar(dtype=np.bool_),
        "is_last": f.Scalar(dtype=np.bool_),
        "is_terminal": f.Scalar(dtype=np.bool_),
        "reward": f.Scalar(dtype=np.float32),
        "discount": f.Scalar(dtype=np.float32),
    }


def rlds_episode_features(f: Any, step: dict[str, Any], metadata: dict[str, Any] | None = None) -> Any:
    """An RLDS episode's feature spec: its `steps` (each `step`, which should include `rlds_step_features`) and
    `episode_metadata` (`metadata`, default just the episode's `file_path`)."""
    metadata = metadata if metadata is not None else {"file_path": f.Text()}
    return f.FeaturesDict({"steps": f.Dataset(step), "episode_metadata": f.FeaturesDict(metadata)})


def rlds_step_flags(t: int, num_steps: int) -> dict[str, Any]:
    """Values of those fields for step `t` of an episode that succeeds at its last step (reward 1 there)."""
    last = t == num_steps - 1
    return {
        "is_first": t == 0,
        "is_last": last,
        "is_terminal": last,
        "reward": np.float32(last),
        "discount": np.float32(1.0),
    }


def write_rlds_dataset(
    data_root_dir: Path,
    name: str,
    make_features: Callable[[Any], Any],
    splits: Mapping[str, Callable[[], Iterable[Episode]]],
    *,
    version: str = "1.0.0",
    num_shards: int = 1,
    description: str = "",
    if_exists: str = "keep",
) -> Path:
    """Write `<data_root_dir>/<name>/<version>/` (tfrecord shards + dataset_info.json); return that folder.

    Args:
        make_features: `tfds -> tfds.features.FeaturesDict` of one episode ({"steps": Dataset(...), ...});
            a callable because tfds may only be imported once TensorFlow is (after torch).
        splits: split name -> a callable returning that split's episodes (generated lazily, so a large
            conversion streams instead of holding every episode in memory).
        num_shards: tfrecord files per split.
        if_exists: what to do when the version folder already holds a dataset: "keep" returns it as is (tests,
            benchmarks: build once); "replace" writes a new one in its place (only once the new one is complete);
            "refuse" raises (a user's conversion must not report old data as written).

    Raises:
        ConfigError: the version folder exists and `if_exists` is "refuse"; or the folder cannot be written (a
            file in its path, read-only or full disk); the target is then unchanged.
        ValueError: `if_exists` is not one of `IF_EXISTS_CHOICES`.
    """
    tf = import_tensorflow()
    tfds = import_tfds()

    if if_exists not in IF_EXISTS_CHOICES:
        raise ValueError(f"if_exists must be one of {', '.join(IF_EXISTS_CHOICES)}, got {if_exists!r}.")
    data_root_dir = Path(data_root_dir)
    target = data_root_dir / name / version
    if (target / "dataset_info.json").exists() and if_exists != "replace":
        if if_exists == "keep":
            return target
        raise ConfigError(
            f"'{target}' already holds an RLDS dataset. Pass --overwrite to replace it (the old one is kept until "
            "the new one is complete), or choose another --name or --version."
        )
    check_dir_writable(target.parent, "RLDS dataset folder")
    make_dirs(target.parent, "RLDS dataset")

    class _Builder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
        VERSION = tfds.core.Version(version)
        RELEASE_NOTES = {version: "Written by prismatic.vla.datasets.rlds.writer."}
        code_path = None  # nothing downloaded: no checksums file to look for beside the code

        def _info(self) -> Any:
            return tfds.core.DatasetInfo(builder=self, description=description, features=make_features(tfds))

        def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
            return {split: self._generate_examples(split) for split in splits}

        def _generate_examples(self, split: str) -> Any:
            for index, episode in enumerate(splits[split]()):
                yield f"{split}_{index:06d}", episode

        # tfds prints these to stdout for catalog downloads ("Downloading and preparing dataset Unknown size ...",
        # then the staging folder): misleading for local episodes, so they become our own log lines.
        def _log_download_bytes(self) -> None:
            logger.info("Writing RLDS dataset '%s' (splits: %s) to %s", name, ", ".join(splits), target)

        def _log_download_done(self) -> None:
            logger.info("RLDS dataset '%s' written; moving it into place", name)

    builder_cls = type(name, (_Builder,), {"name": name, "__module__": __name__}, skip_registration=True)
    staging = target.parent / f".{version}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    download_dir = Path(tempfile.mkdtemp(prefix="rlds_writer_"))
    try:
        builder_cls(data_dir=str(staging)).download_and_prepare(
            download_dir=str(download_dir),
            download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=num_shards),
        )
        _move_into_place(staging / name / version, target)
    except OSError as e:
        raise write_error(target, "RLDS dataset", e) from e
    except tf.errors.OpError as e:  # tfds writes through tf.io.gfile
        raise ConfigError(
            f"Could not write the RLDS dataset to '{target}': {e.message.strip()}. Nothing was written there (a "
            "previous dataset of that name is unchanged). Free space, or choose a writable --data_root_dir."
        ) from e
    finally:
        shutil.rmtree(download_dir, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):  # a `<name>/` made for a conversion that failed
            target.parent.rmdir()
    return target


def _move_into_place(new: Path, target: Path) -> None:
    """Rename the complete `new` folder to `target`, replacing an old one only after the new one is in place."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
