"""A crash at any point of a checkpoint save never leaves `latest` naming a folder that is not a complete checkpoint.

One process, the real `CheckpointManager` on a tiny model: a first save completes, then the second one is stopped
at each point of its way (the data snapshot, train_state.json, before / inside / after the DCP write, the rename of
`.tmp-*` into place, the pointer's write and its atomic replace, keep_last's deletions, and, when the same step is
saved again, the move of the old folder aside) by making the function called there raise. After each crash: the
`latest` pointer names an existing complete checkpoint, and `newest_checkpoint` / `latest_checkpoint` return one,
holding the weights of the step it is named after (compared with copies the test took before saving). The order
itself is pinned too: the folder is renamed into place before the pointer names it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import prismatic.training.checkpointing as checkpointing
from prismatic.models.checkpoint_format import latest_checkpoint, load_checkpoint_file, newest_checkpoint
from prismatic.run_layout import (
    CHECKPOINTS_DIR,
    DCP_METADATA,
    LATEST_POINTER,
    TMP_PREFIX,
    TRAIN_STATE_FILE,
    checkpoint_dir_name,
)
from prismatic.training.checkpointing import CheckpointManager, training_state


class Crash(BaseException):
    """The process dies here: nothing in the code under test may handle it (as with a kill)."""


class TinyVLM(torch.nn.Module):
    """Three parts under the names a VLM's state dict uses."""

    def __init__(self) -> None:
        super().__init__()
        self.vision_backbone = torch.nn.Linear(3, 4)
        self.projector = torch.nn.Linear(4, 4)
        self.llm_backbone = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.llm_backbone(self.projector(self.vision_backbone(x)))


class Run:
    """A model, its optimizer and schedule, a manager, and the weights each saved step held (taken here)."""

    def __init__(self, run_dir: Path, keep_last: int | None = None) -> None:
        torch.manual_seed(0)
        self.model = TinyVLM()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: 1.0 / (1 + step))
        self.manager = CheckpointManager(
            run_dir, save_interval=1, keep_last=keep_last, async_save=False, rank=0
        )
        self.dir = run_dir / CHECKPOINTS_DIR
        self.weights: dict[str, torch.Tensor] = {}

    def train_and_save(self, step: int, write_rank_files: Callable[[Path], None] | None = None) -> Path:
        self.model(torch.randn(5, 3)).pow(2).mean().backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad()
        name = checkpoint_dir_name(step, 0)
        self.weights[name] = self.model.projector.weight.detach().clone()
        counters = {"step": step, "epoch": 0, "frames": step * 8}
        state = training_state(self.model, self.optimizer, self.scheduler, counters)
        return self.manager.save(state, {**counters, "seed": 7, "world_size": 1}, write_rank_files)

    def assert_complete(self, folder: Path) -> None:
        """`folder` is a checkpoint of ours, readable, with the weights of the step it is named after."""
        assert folder.parent == self.dir and folder.is_dir(), folder
        assert (folder / DCP_METADATA).is_file() and (folder / TRAIN_STATE_FILE).is_file(), folder
        ckpt = load_checkpoint_file(folder)
        assert checkpoint_dir_name(ckpt["train_state"]["step"], 0) == folder.name
        assert torch.equal(ckpt["model"]["projector"]["weight"], self.weights[folder.name]), folder

    def assert_latest_is_complete(self) -> Path:
        pointer = self.dir / LATEST_POINTER
        assert pointer.is_file()
        named = self.dir / pointer.read_text().strip()
        self.assert_complete(named)
        newest = newest_checkpoint(self.dir)
        self.assert_complete(newest)
        assert latest_checkpoint(self.dir.parent) == newest
        return named


def _raise(*args: object, **kwargs: object) -> None:
    raise Crash


def _crash_when(real: Callable, hit: Callable[..., bool]) -> Callable:
    """`real`, except that it crashes instead of running when `hit(*args)` says so."""

    def patched(*args: object, **kwargs: object) -> object:
        if hit(*args, **kwargs):
            raise Crash
        return real(*args, **kwargs)

    return patched


def _after(real: Callable, then: Callable[..., None] | None = None) -> Callable:
    """`real` runs, then `then(*args)` (damage it left half-done), then the crash."""

    def patched(*args: object, **kwargs: object) -> None:
        real(*args, **kwargs)
        if then is not None:
            then(*args, **kwargs)
        raise Crash

    return patched


def _unlink_metadata(state: object, checkpoint_id: str, **kwargs: object) -> None:
    (Path(checkpoint_id) / DCP_METADATA).unlink()


def _delete_metadata_only(path: Path, *args: object, **kwargs: object) -> None:
    (Path(path) / DCP_METADATA).unlink(missing_ok=True)


FIRST, SECOND = checkpoint_dir_name(1, 0), checkpoint_dir_name(2, 0)


def _rename_then_crash() -> Callable:
    """Path.rename that moves the second checkpoint into place and then crashes (before anything else runs)."""
    real = Path.rename

    def patched(src: Path, dst: Path) -> Path:
        out = real(src, dst)
        if Path(dst).name == SECOND:
            raise Crash
        return out

    return patched


# Where the second save (step 2, after a complete step 1) dies: name -> how to make that point crash.
CRASH_POINTS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "train_state.json": lambda mp: mp.setattr(checkpointing, "write_json_atomic", _raise),
    "DCP write starts": lambda mp: mp.setattr(checkpointing.dcp, "save", _raise),
    "DCP shards written, metadata not": lambda mp: mp.setattr(
        checkpointing.dcp, "save", _after(checkpointing.dcp.save, _unlink_metadata)
    ),
    "DCP write done": lambda mp: mp.setattr(checkpointing.dcp, "save", _after(checkpointing.dcp.save)),
    "rename into place": lambda mp: mp.setattr(
        Path, "rename", _crash_when(Path.rename, lambda src, dst: Path(dst).name == SECOND)
    ),
    "after the rename": lambda mp: mp.setattr(Path, "rename", _rename_then_crash()),
    "pointer write": lambda mp: mp.setattr(checkpointing, "write_text_atomic", _raise),
    "pointer replace": lambda mp: mp.setattr(
        os, "replace", _crash_when(os.replace, lambda src, dst: Path(dst).name == LATEST_POINTER)
    ),
    "after the pointer": lambda mp: mp.setattr(
        checkpointing, "write_text_atomic", _after(checkpointing.write_text_atomic)
    ),
}


# The pointer moves to the second checkpoint only once it has been written; until then it names the first.
POINTER_AFTER = {point: FIRST for point in CRASH_POINTS} | {"after the pointer": SECOND}


@pytest.mark.parametrize("point", list(CRASH_POINTS))
def test_a_crash_in_a_save_leaves_latest_naming_a_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    run = Run(tmp_path)
    run.train_and_save(1)
    with monkeypatch.context() as mp:
        CRASH_POINTS[point](mp)
        with pytest.raises(Crash):
            run.train_and_save(2)
    assert run.assert_latest_is_complete().name == POINTER_AFTER[point]


def test_a_crash_while_writing_the_data_snapshot_leaves_latest_on_the_first(tmp_path: Path) -> None:
    run = Run(tmp_path)
    first = run.train_and_save(1)

    def crash(folder: Path) -> None:
        (folder / "partial").write_bytes(b"half")
        raise Crash

    with pytest.raises(Crash):
        run.train_and_save(2, write_rank_files=crash)
    assert run.assert_latest_is_complete() == first


@pytest.mark.parametrize("damage", ["nothing deleted", "old folder half deleted"])
def test_a_crash_during_keep_last_deletion_leaves_latest_on_the_new_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    run = Run(tmp_path, keep_last=1)
    run.train_and_save(1)
    real = shutil.rmtree
    with monkeypatch.context() as mp:
        if damage == "nothing deleted":
            mp.setattr(shutil, "rmtree", _raise)
        else:
            mp.setattr(shutil, "rmtree", _after(_delete_metadata_only))
        with pytest.raises(Crash):
            run.train_and_save(2)
    assert shutil.rmtree is real
    assert run.assert_latest_is_complete().name == SECOND


@pytest.mark.parametrize(
    ("point", "expected"),
    [("rename of the new folder", FIRST), ("deleting the old copy", SECOND)],
)
def test_a_crash_while_the_same_step_is_saved_again_leaves_latest_naming_a_complete_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str, expected: str
) -> None:
    """A run resumed from step 1 saves step 2 again: while the old step-2 folder is moved aside, `latest` names
    step 1 (the run's previous save); once the new folder is in place, it names step 2 again."""
    run = Run(tmp_path)
    run.train_and_save(1)
    run.train_and_save(2)
    with monkeypatch.context() as mp:
        if point == "deleting the old copy":
            mp.setattr(shutil, "rmtree", _raise)
        else:
            mp.setattr(
                Path,
                "rename",
                _crash_when(Path.rename, lambda src, dst: Path(src).name.startswith(TMP_PREFIX + SECOND)),
            )
        with pytest.raises(Crash):
            run.train_and_save(2)
    assert run.assert_latest_is_complete().name == expected


@pytest.mark.parametrize(("again", "expected"), [(3, 2), (2, 1)])
def test_while_a_step_is_saved_again_latest_names_the_newest_earlier_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, again: int, expected: int
) -> None:
    """Steps 1-3 saved, then step `again` saved again (a run resumed from an earlier checkpoint): a crash before the
    new folder is in place leaves `latest` on the newest step before it, never on the abandoned later step 3."""
    run = Run(tmp_path)
    for step in (1, 2, 3):
        run.train_and_save(step)
    name = checkpoint_dir_name(again, 0)
    with monkeypatch.context() as mp:
        mp.setattr(
            Path,
            "rename",
            _crash_when(Path.rename, lambda src, dst: Path(src).name.startswith(TMP_PREFIX + name)),
        )
        with pytest.raises(Crash):
            run.train_and_save(again)
    assert run.assert_latest_is_complete().name == checkpoint_dir_name(expected, 0)


def test_saving_the_only_checkpoint_s_step_again_never_leaves_a_dangling_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no earlier checkpoint to fall back to, the pointer is removed while the old copy is aside (readers then
    scan for complete folders) and written again once the new one is in place."""
    run = Run(tmp_path)
    run.train_and_save(1)
    with monkeypatch.context() as mp:
        mp.setattr(
            Path,
            "rename",
            _crash_when(Path.rename, lambda src, dst: Path(src).name.startswith(TMP_PREFIX + FIRST)),
        )
        with pytest.raises(Crash):
            run.train_and_save(1)
    assert not (run.dir / LATEST_POINTER).exists()
    run.train_and_save(1)
    assert run.assert_latest_is_complete().name == FIRST


def test_the_folder_is_renamed_into_place_before_the_pointer_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path)
    run.train_and_save(1)
    events: list[tuple[str, ...]] = []
    real_rename, real_write = Path.rename, checkpointing.write_text_atomic

    def rename(src: Path, dst: Path) -> Path:
        if Path(dst).parent == run.dir:  # checkpoint folders (not DCP's own .metadata.tmp -> .metadata)
            events.append(("rename", Path(src).name, Path(dst).name))
        return real_rename(src, dst)

    def write_text(path: Path, content: str, what: str) -> Path:
        events.append(("write", Path(path).name, content.strip()))
        return real_write(path, content, what)

    monkeypatch.setattr(Path, "rename", rename)
    monkeypatch.setattr(checkpointing, "write_text_atomic", write_text)
    run.train_and_save(2)
    assert events == [("rename", TMP_PREFIX + SECOND, SECOND), ("write", LATEST_POINTER, SECOND)]
    run.assert_latest_is_complete()
