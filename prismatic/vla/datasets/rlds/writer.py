"""Write episodes held in memory as an RLDS dataset that `tfds.builder_from_directory` (and so the pipeline) reads.

`write_rlds_dataset` defines a throw-away tfds builder for one feature spec and prepares it under
`<data_root_dir>/<name>/<version>/`. Used by `vla_scripts/convert_to_rlds.py` (users' own data) and by the tests,
which write tiny datasets with the real raw feature spec of Open-X datasets.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from prismatic.util.tf import import_tensorflow

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
    overwrite: bool = False,
) -> Path:
    """Write `<data_root_dir>/<name>/<version>/` (tfrecord shards + dataset_info.json); return that folder.

    Args:
        make_features: `tfds -> tfds.features.FeaturesDict` of one episode ({"steps": Dataset(...), ...});
            a callable because tfds may only be imported once TensorFlow is (after torch).
        splits: split name -> a callable returning that split's episodes (generated lazily, so a large
            conversion streams instead of holding every episode in memory).
        num_shards: tfrecord files per split.
        overwrite: replace an existing version folder (otherwise it is kept and returned as is).
    """
    import_tensorflow()
    import tensorflow_datasets as tfds

    target = Path(data_root_dir) / name / version
    if (target / "dataset_info.json").exists():
        if not overwrite:
            return target
        shutil.rmtree(target)

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

    builder_cls = type(name, (_Builder,), {"name": name, "__module__": __name__}, skip_registration=True)
    download_dir = Path(tempfile.mkdtemp(prefix="rlds_writer_"))
    try:
        builder_cls(data_dir=str(data_root_dir)).download_and_prepare(
            download_dir=str(download_dir),
            download_config=tfds.download.DownloadConfig(try_download_gcs=False, num_shards=num_shards),
        )
    finally:
        shutil.rmtree(download_dir, ignore_errors=True)
    return target
