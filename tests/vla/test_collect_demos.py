"""`vla_scripts/collect_demos.py`: scripted Meta-World demonstrations written as an own-data RLDS dataset (4-d
actions, a val split holding every task), the same episodes for any number of workers, and the cache of a
collection run again. Two tasks x two demonstrations at 32 px without shadows; skipped without Meta-World.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from scripts import import_script

from prismatic.util.errors import ConfigError
from prismatic.vla.datasets.rlds import configs, transforms

MISSING = [name for name in ("metaworld", "mujoco") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING), reason=f"Meta-World is not installed (missing {', '.join(MISSING)}): `make install`"
)
TASKS = {"reach-v3": "Reach a goal position", "button-press-topdown-v3": "Press a button from the top"}
FLAGS = ["--tasks", "reach-v3,button-press-topdown-v3", "--episodes_per_task", "2", "--resolution", "32"]
FLAGS += ["--shadows", "false", "--val_fraction", "0.1", "--name", "mw_demos"]


@pytest.fixture(scope="module")
def collect() -> ModuleType:
    return import_script("collect_demos")


@pytest.fixture(scope="module")
def collected(collect: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data root of one collection with two workers."""
    root = tmp_path_factory.mktemp("demos")
    assert collect.main(["--data_root_dir", str(root), "--num_workers", "2", *FLAGS]) == 0
    return root


def read_episodes(version_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """split -> its episodes as stored (images decoded), in file-path order."""
    from prismatic.util.tf import import_tensorflow

    import_tensorflow()
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(version_dir))
    out: dict[str, list[dict[str, Any]]] = {}
    for split in builder.info.splits:
        episodes = []
        for episode in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            steps = list(episode["steps"])
            episodes.append(
                {
                    "file_path": episode["episode_metadata"]["file_path"].decode(),
                    "image": np.stack([s["observation"]["image"] for s in steps]),
                    "state": np.stack([s["observation"]["state"] for s in steps]),
                    "action": np.stack([s["action"] for s in steps]),
                    "instructions": {s["language_instruction"].decode() for s in steps},
                }
            )
        out[split] = sorted(episodes, key=lambda e: e["file_path"])
    return out


def test_dataset_holds_every_task_in_both_splits(collected: Path) -> None:
    splits = read_episodes(collected / "mw_demos" / "1.0.0")
    # MT50 ids: button-press-topdown-v3 4, reach-v3 40; the last demonstration of each task is held out.
    assert {split: [e["file_path"] for e in episodes] for split, episodes in splits.items()} == {
        "train": ["04_button-press-topdown-v3_000000.npz", "40_reach-v3_000000.npz"],
        "val": ["04_button-press-topdown-v3_000001.npz", "40_reach-v3_000001.npz"],
    }
    for episodes in splits.values():
        assert [e["instructions"] for e in episodes] == [
            {TASKS["button-press-topdown-v3"]},
            {TASKS["reach-v3"]},
        ]
        for episode in episodes:
            num_steps = len(episode["action"])
            assert 10 < num_steps < 500
            assert episode["image"].shape == (num_steps, 32, 32, 3)
            assert episode["state"].shape == episode["action"].shape == (num_steps, 4)
            assert np.abs(episode["action"]).max() <= 1 and episode["action"].dtype == np.float32
    record = json.loads((collected / "mw_demos" / "1.0.0" / "collect_config.json").read_text())
    assert record["key"]["tasks"] == ["button-press-topdown-v3", "reach-v3"]
    assert record["episodes"] == {"button-press-topdown-v3": [0, 1], "reach-v3": [0, 1]}


def test_plugin_registers_four_dim_actions_and_the_pipeline_reads_them(
    collected: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prismatic.vla.datasets.rlds.interleave import make_interleaved_dataset
    from prismatic.vla.datasets.stream_spec import StreamSpec

    datasets, functions = set(configs.DATASET_CONFIGS), set(transforms.STANDARDIZE_FNS)
    runpy.run_path(str(collected / "mw_demos" / "mw_demos_dataset.py"))
    for registry, before in ((configs.DATASET_CONFIGS, datasets), (transforms.STANDARDIZE_FNS, functions)):
        for key in set(registry) - before:
            monkeypatch.setitem(registry, key, registry.pop(key))  # removed again at teardown
    config = configs.get_dataset_config("mw_demos")
    assert config.action_encoding == configs.ActionEncoding.EEF_XYZ_GRIPPER and config.action_dim == 4
    assert config.state_encoding == configs.StateEncoding.POS_GRIPPER and config.standardize_fn == "identity"
    assert config.absolute_action_mask == (False, False, False, True)  # xyz deltas, absolute gripper
    pipeline = make_interleaved_dataset(
        StreamSpec(collected, "mw_demos", resize_resolution=(32, 32), shuffle_buffer_size=4, train=False)
    )
    frames = list(pipeline.dataset.as_numpy_iterator())
    expected = sum(len(e["action"]) for e in read_episodes(collected / "mw_demos" / "1.0.0")["val"])
    assert len(frames) == expected and frames[0]["action"].shape[-1] == 4
    assert len(pipeline.dataset_statistics["mw_demos"]["action"]["q01"]) == 4


def test_same_flags_same_episodes_and_the_cache(
    collect: ModuleType, collected: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    version_dir = collected / "mw_demos" / "1.0.0"
    shards = {path: path.stat().st_mtime_ns for path in version_dir.glob("*.tfrecord*")}
    capsys.readouterr()
    assert collect.main(["--data_root_dir", str(collected), "--num_workers", "1", *FLAGS]) == 0
    assert "reusing" in capsys.readouterr().out  # the worker count is not part of the data
    assert {path: path.stat().st_mtime_ns for path in version_dir.glob("*.tfrecord*")} == shards

    with pytest.raises(SystemExit) as info:  # a ConfigError: one paragraph, exit 2
        collect.main(["--data_root_dir", str(collected), *FLAGS, "--seed", "1"])
    assert info.value.code == 2
    assert "already holds an RLDS dataset, but it was collected with other seed" in capsys.readouterr().err

    # One worker and one of the two tasks: its episodes are the two-worker, two-task collection's, byte for byte (an
    # episode depends on its task, its index and the seed only).
    reach_only = [*FLAGS]
    reach_only[reach_only.index("--tasks") + 1] = "reach-v3"
    assert collect.main(["--data_root_dir", str(tmp_path), "--num_workers", "1", *reach_only]) == 0
    again, first = read_episodes(tmp_path / "mw_demos" / "1.0.0"), read_episodes(version_dir)
    for split, episodes in first.items():
        reach = [e for e in episodes if "reach-v3" in e["file_path"]]
        assert len(reach) == 1
        for a, b in zip(reach, again[split], strict=True):
            for key in ("file_path", "image", "state", "action"):
                assert np.array_equal(a[key], b[key]), (split, a["file_path"], key)


def test_flag_mistakes(collect: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match="--benchmark 'libero' has no scripted experts.*Valid choices: metaworld"
    ):
        collect.CollectConfig(tmp_path, benchmark="libero")
    with pytest.raises(ConfigError, match="Unknown Meta-World task suite 'mt10'"):
        collect.CollectConfig(tmp_path, task_suite="mt10")
    with pytest.raises(ConfigError, match="--action_noise 2.0 is outside"):
        collect.CollectConfig(tmp_path, action_noise=2.0)
    with pytest.raises(
        ConfigError, match="'reach-v4' is not a task id of this suite.*Did you mean 'reach-v3'"
    ):
        collect.task_list(collect.CollectConfig(tmp_path, tasks="reach-v4"))
    with pytest.raises(ConfigError, match="--episodes_per_task 1 leaves no training demonstration"):
        collect.CollectConfig(tmp_path, episodes_per_task=1)
    assert collect.CollectConfig(tmp_path, episodes_per_task=1, val_fraction=0).val_fraction == 0
    assert collect.CollectConfig(tmp_path, task_suite="MT10").name == "metaworld_mt10"


def test_failed_demonstrations_are_replaced_within_a_limit(collect: ModuleType) -> None:
    tasks = ["a", "b"]
    assert collect.next_round(tasks, 3, {}, {}) == {"a": [0, 1, 2], "b": [0, 1, 2]}
    # a succeeded 3 times; b twice of 3 tries, then not at all in 2 more: 6 tries (twice 3) is its limit.
    assert collect.next_round(tasks, 3, {"a": 3, "b": 2}, {"a": 3, "b": 3}) == {"b": [3]}
    assert collect.next_round(tasks, 3, {"a": 3, "b": 2}, {"a": 3, "b": 4}) == {"b": [4]}
    assert collect.next_round(tasks, 3, {"a": 3, "b": 2}, {"a": 3, "b": 6}) == {}
