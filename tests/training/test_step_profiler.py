"""`--profile.*`: the flags' ranges, a window the run never reaches (a warning, nothing profiled), and a profile
that cannot be written (a warning; training goes on). The window itself, inside the loop, is pinned in
test_train_loop_step.py and, under torchrun, in test_train_e2e.py."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from prismatic.conf.train import ProfileConfig, TrainConfig
from prismatic.training.profiling import StepProfiler, build_profiler
from prismatic.util.errors import ConfigError
from prismatic.util.kernel_profile import ProfileWindow

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ProfileConfig(start_step=0), "--profile.start_step=0 is out of range: it must be an integer >= 1"),
        (
            ProfileConfig(start_step=5, num_steps=0),
            "--profile.num_steps=0 is out of range: it must be an integer >= 1",
        ),
    ],
)
def test_bad_window_is_refused_while_parsing(options: ProfileConfig, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(profile=options)


def test_no_start_step_no_profiler(tmp_path: Path) -> None:
    assert build_profiler(ProfileConfig(), tmp_path, 0, CPU, 1, 100) is None


@pytest.mark.parametrize("start_step", [10, 101])
def test_a_window_outside_the_run_profiles_nothing_and_says_so(
    start_step: int, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A resumed run that starts after the window (steps 11-100 here), or one that ends before it."""
    with caplog.at_level(logging.WARNING):
        assert build_profiler(ProfileConfig(start_step=start_step), tmp_path, 0, CPU, 11, 100) is None
    assert (
        f"--profile.start_step {start_step} is outside the steps this run trains (11 to 100)" in caplog.text
    )


def test_a_window_inside_the_run_is_profiled(tmp_path: Path) -> None:
    profiler = build_profiler(ProfileConfig(start_step=11, num_steps=3), tmp_path, 2, CPU, 11, 100)
    assert isinstance(profiler, StepProfiler)
    assert (profiler.start_step, profiler.end_step, profiler.rank) == (11, 14, 2)


def test_a_profile_that_cannot_be_written_warns_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "profile").write_text("a file where the folder goes")
    profiler = StepProfiler(run_dir, 0, CPU, 1, 1)
    with caplog.at_level(logging.WARNING):
        profiler.before_step(1)
        torch.ones(4).sum()
        profiler.before_step(2)  # ends the window: the write fails
        profiler.close()
    assert profiler.written == []
    assert "Could not write the profile of steps 1-1" in caplog.text
    assert sorted(p.name for p in run_dir.iterdir()) == ["profile"]


def test_closing_after_a_failed_step_never_raises_over_the_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop closes the profiler in its `finally`: if the device that failed the step also fails the window's
    sync, the profiler stops, warns, and the loop's own error is the one that propagates."""
    profiler = StepProfiler(tmp_path, 0, CPU, 1, 3)
    profiler.before_step(1)

    def failed_sync(window: ProfileWindow) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING):
        patch.setattr(ProfileWindow, "_sync", failed_sync)
        profiler.close()
    assert "The profile of steps 1-1 was not written: CUDA error" in caplog.text
    assert profiler.written == [] and not (tmp_path / "profile").exists()
    # the profiler was stopped: a new one can start in this process
    other = StepProfiler(tmp_path, 0, CPU, 1, 1)
    other.before_step(1)
    other.close()
    assert [p.name for p in other.written] == [
        "rank00000-steps-000001-000001.trace.json",
        "rank00000-steps-000001-000001.summary.json",
    ]
