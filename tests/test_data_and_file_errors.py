"""Damaged data and unwritable files end in one `ConfigError` that names the file, never a library traceback.

Covers: corrupt / truncated / missing TFRecord files, a dataset folder without its version folder, malformed or
non-finite statistics (the cache beside the data, a `--dataset_statistics` file, a statistics pass over NaN
actions), random-bytes / truncated checkpoints, folders that are files, read-only or full disks (nothing
half-written left behind), the converter's argument and episode checks, and refusing to resume a checkpoint as
another experiment. Data comes from the session's toy datasets (`toy_data_root`), copied where it is damaged.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import resource
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from scripts import import_script

from prismatic.training.checkpointing import (
    atomic_torch_save,
    load_checkpoint_file,
    saved_train_state,
)
from prismatic.training.run_folder import check_resume_compatible
from prismatic.util.errors import ConfigError
from prismatic.util.files import atomic_write, check_dir_writable, make_dirs, write_text_atomic
from prismatic.vla.datasets.rlds import (
    make_interleaved_dataset,
    mixture_statistics,
    resolve_mixture_dirs,
)
from prismatic.vla.datasets.rlds.statistics import (
    compute_statistics,
    read_statistics_file,
    save_dataset_statistics,
)
from prismatic.vla.datasets.stream_spec import StreamSpec

TOY = "toy_push"  # the smaller toy dataset: 4 train + 4 val shard files
VERSION = "1.0.0"
INTERNALS = ("Traceback", "PytorchStreamReader", "zipfile", "mmap", "pickle", "{{function_node", "[Op:")


def _copy_toy(toy_data_root: Path, tmp_path: Path, keep_cache: bool) -> tuple[Path, Path]:
    """(data root, version folder) of a private copy of the toy dataset, with or without its statistics cache."""
    root = tmp_path / "data"
    shutil.copytree(toy_data_root / TOY, root / TOY)
    version_dir = root / TOY / VERSION
    if not keep_cache:
        for cache in version_dir.glob("dataset_statistics_*.json"):
            cache.unlink()
    return root, version_dir


def _assert_clean(message: str) -> None:
    for internal in INTERNALS:
        assert internal not in message, f"{internal!r} leaked into: {message}"


# === TFRecords and dataset folders ===


def test_corrupt_and_truncated_tfrecords_are_named(toy_data_root: Path, tmp_path: Path) -> None:
    root, version_dir = _copy_toy(toy_data_root, tmp_path, keep_cache=False)
    truncated = version_dir / f"{TOY}-train.tfrecord-00001-of-00004"
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    garbage = version_dir / f"{TOY}-train.tfrecord-00003-of-00004"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))

    with pytest.raises(ConfigError) as error:  # the statistics pass is the first to read every train record
        mixture_statistics(root, TOY)
    message = str(error.value)
    assert str(truncated) in message and str(garbage) in message and "truncated" in message
    assert "download, copy or convert" in message
    _assert_clean(message)


def test_damaged_val_file_is_named_while_iterating(toy_data_root: Path, tmp_path: Path) -> None:
    """Statistics cached, so only iterating the stream reads the damaged / missing file."""
    from prismatic.vla.datasets import RLDSDataset

    root, version_dir = _copy_toy(toy_data_root, tmp_path, keep_cache=True)
    mixture_statistics(root, TOY)  # cache present (computed now if the session had not yet)
    damaged = version_dir / f"{TOY}-val.tfrecord-00000-of-00004"
    # Damaged in place, same size and time: the cache key (names, sizes, times) cannot see it, reading does.
    stat, data = damaged.stat(), bytearray(damaged.read_bytes())
    data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)
    damaged.write_bytes(bytes(data))
    os.utime(damaged, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    dataset = RLDSDataset(StreamSpec(root, TOY, (16, 16), 4, train=False), lambda frame: frame)
    with pytest.raises(ConfigError, match="Corrupt or truncated TFRecord file") as error:
        list(dataset)
    assert str(damaged) in str(error.value)
    _assert_clean(str(error.value))

    damaged.unlink()
    with pytest.raises(ConfigError, match="RLDS data file is missing") as error:
        list(dataset)
    assert str(damaged) in str(error.value) and "download or convert" in str(error.value)
    _assert_clean(str(error.value))


def test_dataset_folder_without_version_folder(toy_data_root: Path, tmp_path: Path) -> None:
    root, version_dir = _copy_toy(toy_data_root, tmp_path, keep_cache=True)
    for path in version_dir.iterdir():  # the files one level too high, as a hand copy might leave them
        path.rename(root / TOY / path.name)
    version_dir.rmdir()
    for call in (
        lambda: resolve_mixture_dirs(root, TOY),
        lambda: resolve_mixture_dirs(
            root, TOY, skip_missing_datasets=True
        ),  # present but broken: not skipped
        lambda: make_interleaved_dataset(
            StreamSpec(root, TOY, resize_resolution=(16, 16), shuffle_buffer_size=4)
        ),
    ):
        with pytest.raises(ConfigError, match="has no version folder") as error:
            call()
        assert f"'{root / TOY}'" in str(error.value) and f"'{root / TOY}/1.0.0/'" in str(error.value)
        assert "lie directly in it" in str(error.value)

    (root / TOY / VERSION).mkdir()  # a version folder without dataset_info.json: an interrupted download
    with pytest.raises(ConfigError, match="hold no dataset_info.json"):
        resolve_mixture_dirs(root, TOY)


def test_unreadable_dataset_metadata_is_named(toy_data_root: Path, tmp_path: Path) -> None:
    root, version_dir = _copy_toy(toy_data_root, tmp_path, keep_cache=True)
    (version_dir / "features.json").write_text("{ not json")
    with pytest.raises(ConfigError, match="Cannot read the RLDS dataset metadata") as error:
        mixture_statistics(root, TOY)
    assert str(version_dir) in str(error.value)


# === Statistics ===


def test_malformed_statistics_cache_is_named(toy_data_root: Path, tmp_path: Path) -> None:
    root, version_dir = _copy_toy(toy_data_root, tmp_path, keep_cache=False)
    mixture_statistics(root, TOY)
    (cache,) = version_dir.glob("dataset_statistics_*.json")
    good = json.loads(cache.read_text())
    for bad_text, words in (
        ('{"action": {"mean": [0.1, ', "is not valid JSON (line 1"),
        (json.dumps({**good, "action": {**good["action"], "q99": [float("nan")] * 7}}), "NaN"),
        (json.dumps({**good, "proprio": {**good["proprio"], "q01": "low"}}), "'proprio.q01' is not a list"),
        ("[1, 2]", "not a JSON object"),
    ):
        cache.write_text(bad_text)
        with pytest.raises(ConfigError, match="statistics cache") as error:
            mixture_statistics(root, TOY)
        assert str(cache) in str(error.value) and words in str(error.value)
        assert "Delete it and it will be computed again" in str(error.value)


def test_malformed_dataset_statistics_file(tmp_path: Path) -> None:
    """What `export_hf.py --dataset_statistics FILE` (and a run's norm_stats) goes through."""
    path = tmp_path / "stats.json"
    good = {"my_robot": {"action": {"q01": [-1.0, 0.0], "q99": [1.0, 1.0], "mask": [True, False]}}}
    path.write_text(json.dumps(good))
    assert read_statistics_file(path, "--dataset_statistics file", per_dataset=True) == good
    for bad_text, words in (
        ("not json at all", "is not valid JSON"),
        ('{"my_robot": {"action": {"q01": [0.0], "q99": [Infinity]}}}', "Infinity is not a valid statistic"),
        ('{"my_robot": {"action": {"q01": [0.0]}}}', "dataset 'my_robot': no 'action.q99'"),
        ('{"my_robot": {"action": {"q01": [0.0], "q99": [1.0, 2.0]}}}', "different lengths"),
        ("{}", "top level is not an object"),
    ):
        path.write_text(bad_text)
        with pytest.raises(ConfigError, match="--dataset_statistics file") as error:
            read_statistics_file(path, "--dataset_statistics file", per_dataset=True)
        assert str(path) in str(error.value) and words in str(error.value)
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_statistics_file(path, "--dataset_statistics file", per_dataset=True)


def test_non_finite_values_stop_the_statistics_pass() -> None:
    good = {"action": np.zeros((3, 7), np.float32), "proprio": np.zeros((3, 8), np.float32)}
    bad_action = good["action"].copy()
    bad_action[2, 4] = np.nan
    with pytest.raises(ConfigError) as error:
        compute_statistics([good, {**good, "action": bad_action}], dataset_name="my_robot")
    message = str(error.value)
    assert "Dataset 'my_robot'" in message and "'action'" in message and "NaN or inf" in message
    assert "episode #1" in message and "split 'all'" in message and "step 2" in message and "[4]" in message
    bad_proprio = good["proprio"].copy()
    bad_proprio[0, 0] = -np.inf
    with pytest.raises(ConfigError, match="'proprio' holds NaN or inf"):
        compute_statistics([{**good, "proprio": bad_proprio}], dataset_name="my_robot")
    with pytest.raises(ConfigError, match="no steps"):
        compute_statistics([], dataset_name="my_robot")


# === Checkpoints ===


def test_random_bytes_and_truncated_checkpoints(tmp_path: Path) -> None:
    good = tmp_path / "step-000002-epoch-00-loss=1.0000.pt"
    torch.save({"model": {"projector": {"w": torch.ones(64, 64)}}, "train_state": {"step": 2}}, good)
    cases = {
        "random.pt": np.random.default_rng(1).bytes(5000),
        "truncated.pt": good.read_bytes()[: good.stat().st_size // 2],
        "tail_cut.pt": good.read_bytes()[:-10],
        "empty.pt": b"",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ConfigError) as error:
            load_checkpoint_file(path)
        message = str(error.value)
        assert f"'{path}'" in message and "not a checkpoint written by this tool" in message, message
        assert "truncated or damaged" in message
        _assert_clean(message)
    with pytest.raises(ConfigError, match="a folder without DCP's .metadata"):
        load_checkpoint_file(tmp_path)
    assert "model" in load_checkpoint_file(good)


def test_checkpoint_without_training_state_cannot_resume(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no 'optimizer'.*--is_resume false"):
        saved_train_state({"model": {}}, tmp_path / "merged.pt")


def test_resume_as_another_experiment_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    saved = {
        "vla_id": "tiny+mx-toy",
        "seed": 7,
        "data_mix": "toy",
        "base_vlm": "tiny-vit+tiny-llama",
        "step": 40,
    }
    path = Path("runs/a/checkpoints/step-000040-epoch-01")

    def check(allow: bool = False, **changes):
        return check_resume_compatible(saved, {**saved, **changes}, path=path, allow_config_change=allow)

    assert check() == []
    with pytest.raises(ConfigError) as error:
        check(seed=8)
    message = str(error.value)
    assert "--seed 8 (the checkpoint's run used 7)" in message and "Pass --seed 7" in message
    assert "--allow_config_change true" in message and "--is_resume false" in message
    with pytest.raises(ConfigError, match="--vla.type tiny-icy\\+mx-toy \\(the checkpoint's run used tiny"):
        check(vla_id="tiny-icy+mx-toy")
    with pytest.raises(ConfigError, match="--vla.data_mix toy_push \\(the checkpoint's run used toy\\)"):
        check(data_mix="toy_push")
    with pytest.raises(ConfigError, match="--vla.base_vlm other \\(the checkpoint's run used tiny-vit"):
        check(base_vlm="other")
    with pytest.raises(
        ConfigError, match="--data.statistics_split train \\(the checkpoint's run used all\\)"
    ):
        check_resume_compatible(
            {**saved, "data.statistics_split": "all"},
            {**saved, "data.statistics_split": "train"},
            path=path,
            allow_config_change=False,
        )
    with caplog.at_level(logging.WARNING):
        changes = check(allow=True, vla_id="tiny-icy+mx-toy", seed=8)
    assert len(changes) == 2 and "--allow_config_change" in caplog.text
    # Checkpoints of older versions without these keys are not refused.
    assert check_resume_compatible({}, {"vla_id": "x", "seed": 1}, path=path, allow_config_change=False) == []


# === Writing: folders that are files, read-only and full disks ===


@pytest.fixture
def file_size_limit() -> Iterator[int]:
    """A real write failure: writes past 64 KiB fail with EFBIG (SIGXFSZ ignored) until the test ends."""
    limit = 64 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_failed_checkpoint_write_leaves_nothing_half_written(tmp_path: Path, file_size_limit: int) -> None:
    path = tmp_path / "checkpoints" / "step-000001-epoch-00-loss=1.0000.pt"
    atomic_torch_save({"model": {"w": torch.ones(4)}}, path)
    with pytest.raises(ConfigError) as error:
        atomic_torch_save({"model": {"w": torch.zeros(file_size_limit)}}, path)  # 4 bytes per value: too big
    message = str(error.value)
    assert (
        message.startswith(f"Could not write the checkpoint to '{path}'") and "Nothing was written" in message
    )
    assert os.listdir(path.parent) == [path.name]  # no temporary file left
    assert torch.equal(torch.load(path, weights_only=True)["model"]["w"], torch.ones(4))  # previous intact


def test_full_and_read_only_disks_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run" / "config.json"
    with pytest.raises(ConfigError, match="the disk is full. Nothing was written there") as error:
        with atomic_write(path, "run config", text=True) as f:
            f.write("{")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert f"'{path}'" in str(error.value) and "run config" in str(error.value)
    assert os.listdir(path.parent) == []

    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(ConfigError, match="the file system is read-only. .*Choose a writable folder"):
        save_dataset_statistics({"a": {}}, tmp_path / "run")
    monkeypatch.undo()
    assert os.listdir(path.parent) == []


def test_folders_that_are_files(tmp_path: Path) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("a file where the run root should be")
    with pytest.raises(ConfigError, match="cannot be created: '.*/runs' is a file, not a folder"):
        check_dir_writable(blocker / "my_run", "run folder (--run_root_dir / --run_id)")
    with pytest.raises(ConfigError, match="'.*/runs' is a file, not a folder"):
        make_dirs(blocker / "my_run", "run folder")
    with pytest.raises(ConfigError, match="dataset statistics"):
        save_dataset_statistics({"a": {}}, blocker)
    with pytest.raises(ConfigError, match="checkpoint"):
        atomic_torch_save({"model": {}}, blocker / "checkpoints" / "x.pt")
    write_text_atomic(tmp_path / "ok" / "config.yaml", "a: 1\n", "run config")
    check_dir_writable(tmp_path / "new" / "nested", "run folder")  # creatable: fine, nothing made
    assert not (tmp_path / "new").exists()


# === The converter (vla_scripts/convert_to_rlds.py) ===


def _episode(num_steps: int = 4, **overrides: np.ndarray) -> dict[str, np.ndarray]:
    episode = {
        "image": np.zeros((num_steps, 8, 8, 3), np.uint8),
        "state": np.zeros((num_steps, 8), np.float32),
        "action": np.zeros((num_steps, 7), np.float32),
        "instruction": np.array("stack the cups"),
    }
    return {**episode, **overrides}


def _episodes_dir(tmp_path: Path, count: int, **overrides_of: dict[str, np.ndarray]) -> Path:
    folder = tmp_path / "episodes"
    folder.mkdir(exist_ok=True)
    for i in range(count):
        np.savez(folder / f"ep{i}.npz", **_episode(**overrides_of.get(f"ep{i}", {})))
    return folder


def test_converter_refuses_bad_arguments(tmp_path: Path) -> None:
    convert = import_script("convert_to_rlds").convert
    episodes = _episodes_dir(tmp_path, 3)
    for fraction in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(ConfigError, match=f"--val_fraction {fraction} is outside \\[0, 1\\)"):
            convert(episodes, tmp_path / "rlds", "mine", val_fraction=fraction)
    with pytest.raises(ConfigError, match="leaves none for training"):
        convert(episodes, tmp_path / "rlds", "mine", val_fraction=0.9)
    with pytest.raises(ConfigError, match="--num_shards 0 must be at least 1"):
        convert(episodes, tmp_path / "rlds", "mine", num_shards=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="No .npz/.hdf5/.h5 episode files"):
        convert(tmp_path / "empty", tmp_path / "rlds", "mine")
    assert not (tmp_path / "rlds" / "mine").exists()


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            {"action": np.zeros((3, 7), np.float32)},
            "different numbers of steps (action: 3, image: 4, state: 4)",
        ),
        ({"image": np.zeros((4, 8, 8, 3), np.float32)}, "'image' must be uint8[T, H, W, 3]"),
        (
            {"action": np.full((4, 7), np.nan, np.float32)},
            "'action' holds NaN or inf values (first at step 0)",
        ),
    ],
)
def test_converter_names_the_bad_episode_file(tmp_path: Path, overrides: dict, words: str) -> None:
    episodes = _episodes_dir(tmp_path, 3, ep1=overrides)
    with pytest.raises(ConfigError) as error:
        import_script("convert_to_rlds").convert(episodes, tmp_path / "rlds", "mine")
    assert f"'{episodes / 'ep1.npz'}'" in str(error.value) and words in str(error.value)
    assert not (tmp_path / "rlds" / "mine").exists()  # nothing half-written


def test_converter_names_missing_keys_unreadable_and_unlike_episodes(tmp_path: Path) -> None:
    convert = import_script("convert_to_rlds").convert
    episodes = _episodes_dir(tmp_path, 2)
    np.savez(episodes / "ep2.npz", image=np.zeros((4, 8, 8, 3), np.uint8), state=np.zeros((4, 8)))
    with pytest.raises(ConfigError, match="ep2.npz' has no 'action' array \\(it has: image, state\\)"):
        convert(episodes, tmp_path / "rlds", "mine")
    (episodes / "ep2.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(ConfigError, match="Cannot read episode file '.*ep2.npz': it is not a readable .npz"):
        convert(episodes, tmp_path / "rlds", "mine")
    np.savez(episodes / "ep2.npz", **_episode(image=np.zeros((4, 16, 8, 3), np.uint8)))
    with pytest.raises(ConfigError) as error:
        convert(episodes, tmp_path / "rlds", "mine")
    assert f"'{episodes / 'ep2.npz'}' does not match the first episode '{episodes / 'ep0.npz'}'" in str(
        error.value
    )
    assert "'image' [16, 8, 3] here, [8, 8, 3] there" in str(error.value)
    assert not (tmp_path / "rlds" / "mine").exists()


def test_converter_clamps_shards_and_refuses_to_overwrite_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    convert = import_script("convert_to_rlds").convert
    episodes = _episodes_dir(tmp_path, 3)
    root = tmp_path / "rlds"
    with caplog.at_level(logging.WARNING):
        target = convert(episodes, root, "mine", val_fraction=0.34, num_shards=4)
    assert "--num_shards 4 is more than the 1 episode(s) of the smallest split" in caplog.text
    assert sorted(p.name for p in target.glob("*.tfrecord*")) == [
        "mine-train.tfrecord-00000-of-00001",
        "mine-val.tfrecord-00000-of-00001",
    ]
    assert sorted(p.name for p in (root / "mine").iterdir()) == [VERSION]  # no staging folder left
    info = (target / "dataset_info.json").read_bytes()

    np.savez(episodes / "ep3.npz", **_episode())
    with pytest.raises(ConfigError, match="already holds an RLDS dataset. Pass --overwrite"):
        convert(episodes, root, "mine")
    assert (target / "dataset_info.json").read_bytes() == info  # old data untouched

    np.savez(episodes / "ep3.npz", **_episode(image=np.zeros((4, 16, 8, 3), np.uint8)))
    with pytest.raises(ConfigError, match="does not match the first episode"):
        convert(episodes, root, "mine", overwrite=True)
    assert (target / "dataset_info.json").read_bytes() == info  # a failed overwrite keeps the old dataset

    np.savez(episodes / "ep3.npz", **_episode())
    convert(episodes, root, "mine", overwrite=True)
    assert json.loads((target / "dataset_info.json").read_text())["splits"][0]["shardLengths"] == ["4"]

    data_root_file = tmp_path / "not_a_folder"
    data_root_file.write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        convert(episodes, data_root_file, "mine")
