"""The run folder's decisions (prismatic/training/run_folder.py): a run's identity, and what `--resume` /
`--pretrained_checkpoint` name when their checkpoint is missing.

`train_state.json` records the identity and a resume is refused when it differs, so every key and value matters;
the expected dicts are written out here by hand from the preset's published values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from prismatic.conf.data import DataOptions
from prismatic.conf.train import TrainConfig
from prismatic.conf.vla import VLAConfig
from prismatic.training.run_folder import IDENTITY, Resume, ResumePoint, resume_point, run_identity
from prismatic.util.errors import ConfigError


def _tiny(**overrides) -> TrainConfig:
    return TrainConfig(vla=VLAConfig.get_choice_class("tiny+mx-toy")(), **overrides)


def test_identity_is_every_experiment_key_and_data_option() -> None:
    cfg = _tiny(seed=11, data=DataOptions(nonfinite="drop", chunk_end="drop"))
    assert run_identity(cfg) == {
        "vla_id": "tiny+mx-toy",
        "seed": 11,
        "data_mix": "toy",
        "base_vlm": "tiny-vit+tiny-llama",
        "action_head": "tokens",
        "chunk_size": 1,
        "use_proprio": False,
        "num_images": 1,
        "data.statistics_split": "all",
        "data.skip_unlabeled": True,
        "data.nonfinite": "drop",
        "data.load_proprio": False,
        "data.unused_dims": "zero",
        "data.zero_action_bounds": "openvla",
        "data.chunk_end": "drop",
    }
    assert IDENTITY["vla_id"][0] == "--vla.type" and IDENTITY["data.chunk_end"][0] == "--data.chunk_end"


def test_a_resume_of_a_run_without_checkpoints_names_the_folder_it_looked_in(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r"
    cfg = _tiny(resume="latest")
    with pytest.raises(ConfigError) as error:
        resume_point(cfg, run_dir)
    assert f"in '{run_dir}':" in str(error.value)
    (run_dir / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError) as error:
        resume_point(cfg, run_dir)
    assert f"in '{run_dir / 'checkpoints'}':" in str(error.value)


def test_a_missing_checkpoint_is_named_with_the_flag_that_gave_it(tmp_path: Path) -> None:
    missing = tmp_path / "step-000010-epoch-01"
    with pytest.raises(ConfigError, match=r"^--resume '.*step-000010-epoch-01' does not exist\.$"):
        resume_point(_tiny(resume=str(missing)))
    with pytest.raises(
        ConfigError, match=r"^--pretrained_checkpoint '.*step-000010-epoch-01' does not exist\.$"
    ):
        resume_point(_tiny(pretrained_checkpoint=missing))


def test_a_resume_splits_the_frames_consumed_over_this_run_s_ranks(tmp_path: Path) -> None:
    point = ResumePoint(tmp_path / "step-000040-epoch-01", 40, 1)
    (tmp_path / "step-000040-epoch-01").mkdir()
    same = Resume(point, {"frames": 96, "world_size": 2}, world_size=2)
    assert (same.frames, same.rank_frames, same.same_world_size) == (96, 48, True)
    assert same.data_snapshot == tmp_path / "step-000040-epoch-01" / "data"
    assert same.checkpoint_name == "step-000040-epoch-01"  # the name of its config.resume-<name>.* files
    with pytest.raises(dataclasses.FrozenInstanceError):  # decided once: no room changes it
        same.world_size = 4
    uneven = Resume(point, {"frames": 97, "world_size": 2}, world_size=2)
    assert uneven.rank_frames == 48 and isinstance(uneven.rank_frames, int)
    assert Resume(point, {"world_size": 2}, world_size=2).frames == 0  # no count recorded: from the start
    fewer = Resume(point, {"frames": 96, "world_size": 2}, world_size=3)
    assert (fewer.rank_frames, fewer.same_world_size, fewer.saved_world_size) == (32, False, 2)
    # An older single-file checkpoint counted samples per rank, not frames over all ranks.
    legacy = Resume(
        ResumePoint(tmp_path / "step-000010-epoch-00-loss=1.0.pt", 10, 0),
        {"samples_per_rank": 8, "world_size": 4},
        2,
    )
    assert (legacy.frames, legacy.rank_frames, legacy.data_snapshot) == (32, 16, None)
