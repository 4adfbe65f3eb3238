"""Which checkpoint is "latest" among several (steps compared as numbers, incomplete and temporary folders ignored,
the `latest` pointer trusted only when it names the newest), the precedence of checkpoint kinds in a run folder,
the run folder of a checkpoint, and reading weights back in the requested dtype."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from prismatic.models.checkpoint_format import (
    complete_checkpoints,
    flatten_modules,
    group_by_module,
    is_sharded_checkpoint,
    latest_checkpoint,
    load_checkpoint_file,
    newest_checkpoint,
    read_sharded_model_weights,
    run_folder_of,
)
from prismatic.run_layout import checkpoint_dir_name
from prismatic.util.errors import ConfigError


def _fake_sharded(ckpts, name, *, metadata=True, state=True):
    folder = ckpts / name
    folder.mkdir(parents=True)
    if metadata:
        (folder / ".metadata").write_bytes(b"x")
    if state:
        (folder / "train_state.json").write_text(json.dumps({"step": 1}))
    return folder


def test_folder_names():
    assert checkpoint_dir_name(40, 1) == "step-000040-epoch-01"
    assert checkpoint_dir_name(1234567, 12) == "step-1234567-epoch-12"


def test_complete_checkpoints_sorted_by_step_number_not_by_name(tmp_path):
    ckpts = tmp_path / "checkpoints"
    big = _fake_sharded(ckpts, "step-1000000-epoch-03")
    small = _fake_sharded(ckpts, "step-999999-epoch-02")
    first = _fake_sharded(ckpts, "step-000002-epoch-00")
    _fake_sharded(ckpts, "step-000005-epoch-00", metadata=False)  # incomplete
    _fake_sharded(ckpts, "step-000006-epoch-00", state=False)  # incomplete
    _fake_sharded(ckpts, ".tmp-step-2000000-epoch-04")  # being written
    _fake_sharded(ckpts, "other-000001")
    (ckpts / "step-3000000-epoch-05").write_text("a file, not a folder")
    assert complete_checkpoints(ckpts) == [first, small, big]
    assert newest_checkpoint(ckpts) == big
    assert (
        complete_checkpoints(tmp_path / "missing") == [] and newest_checkpoint(tmp_path / "missing") is None
    )
    assert not is_sharded_checkpoint(ckpts / "step-3000000-epoch-05")


@pytest.mark.parametrize(
    ("pointer", "expected"),
    [
        ("step-000010-epoch-01\n", "step-000010-epoch-01"),  # names the newest: used
        ("step-000002-epoch-00\n", "step-000010-epoch-01"),  # one behind (crash before the pointer update)
        ("step-000099-epoch-09\n", "step-000010-epoch-01"),  # names nothing complete
        (None, "step-000010-epoch-01"),
    ],
)
def test_latest_pointer_is_trusted_only_when_it_names_the_newest(tmp_path, pointer, expected):
    ckpts = tmp_path / "checkpoints"
    _fake_sharded(ckpts, "step-000002-epoch-00")
    _fake_sharded(ckpts, "step-000010-epoch-01")
    if pointer is not None:
        (ckpts / "latest").write_text(pointer)
    assert newest_checkpoint(ckpts) == ckpts / expected
    assert latest_checkpoint(tmp_path) == ckpts / expected


def test_no_checkpoint_at_all_is_none(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    assert newest_checkpoint(tmp_path / "checkpoints") is None
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        latest_checkpoint(tmp_path)


def test_run_folder_precedence_sharded_then_model_then_legacy_then_highest_step_file(tmp_path):
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    for name in (
        "step-000001-epoch-00-loss=2.0000.pt",
        "step-000004-epoch-00-loss=0.5000.pt",
        "step-000003-epoch-00-loss=1.0000.pt",
    ):
        (ckpts / name).write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == ckpts / "step-000004-epoch-00-loss=0.5000.pt"
    (ckpts / "latest-checkpoint.pt").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == ckpts / "latest-checkpoint.pt"
    (ckpts / "model.safetensors").write_bytes(b"x")
    assert latest_checkpoint(tmp_path) == ckpts / "model.safetensors"
    sharded = _fake_sharded(ckpts, "step-000002-epoch-00")
    assert latest_checkpoint(tmp_path) == sharded


def test_run_folder_of_a_checkpoint(tmp_path):
    ckpts = tmp_path / "run" / "checkpoints"
    sharded = _fake_sharded(ckpts, "step-000002-epoch-00")
    pt = ckpts / "step-000001-epoch-00-loss=1.0000.pt"
    pt.write_bytes(b"x")
    assert run_folder_of(sharded) == tmp_path / "run"
    assert run_folder_of(pt) == tmp_path / "run"
    assert run_folder_of(tmp_path / "run") == tmp_path / "run"
    loose = tmp_path / "elsewhere.pt"
    loose.write_bytes(b"x")
    assert run_folder_of(loose) == loose  # not inside a checkpoints/ folder
    incomplete = _fake_sharded(ckpts, "step-000003-epoch-00", metadata=False)
    assert run_folder_of(incomplete) == incomplete


def test_group_by_module_splits_at_the_first_dot_and_flatten_inverts_it():
    flat = {"llm_backbone.llm.w": 1, "projector.fc1.bias": 2, "extra_head.w": 3}
    grouped = group_by_module(flat)
    assert grouped == {
        "vision_backbone": {},
        "projector": {"fc1.bias": 2},
        "llm_backbone": {"llm.w": 1},
        "extra_head": {"w": 3},
    }
    assert flatten_modules(grouped) == flat


def test_sharded_weights_are_read_in_the_requested_dtype(tmp_path):
    """bf16 (frozen) weights come back as FP32 by default or bf16 on request; integer buffers stay integers."""
    weights = {
        "projector.w": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "projector.steps": torch.tensor([3, 4], dtype=torch.int64),
    }
    dcp.save({"model": weights, "trainer": {"step": torch.tensor(1)}}, checkpoint_id=str(tmp_path / "c"))
    out = read_sharded_model_weights(tmp_path / "c")
    assert set(out) == {"projector.w", "projector.steps"}
    assert out["projector.w"].dtype == torch.float32 and out["projector.w"].tolist() == [1.5, -2.25]
    assert out["projector.steps"].dtype == torch.int64 and out["projector.steps"].tolist() == [3, 4]
    assert read_sharded_model_weights(tmp_path / "c", torch.bfloat16)["projector.w"].dtype == torch.bfloat16


def test_sharded_folder_without_model_weights_is_refused(tmp_path):
    dcp.save({"trainer": {"step": torch.tensor(1)}}, checkpoint_id=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="holds no model weights"):
        read_sharded_model_weights(tmp_path / "c")


def test_load_checkpoint_file_kinds_and_refusals(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_checkpoint_file(tmp_path / "missing.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"the file is empty \(0 bytes\)"):
        load_checkpoint_file(tmp_path / "empty.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip at all")
    with pytest.raises(ConfigError, match="not a torch.save archive"):
        load_checkpoint_file(tmp_path / "junk.pt")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="without DCP's"):
        load_checkpoint_file(tmp_path / "folder")
    torch.save({"optimizer": {}}, tmp_path / "nomodel.pt")
    with pytest.raises(ConfigError, match="no 'model' entry"):
        load_checkpoint_file(tmp_path / "nomodel.pt")
    save_file({"projector.w": torch.tensor([1.0, 2.0])}, tmp_path / "model.safetensors")
    assert load_checkpoint_file(tmp_path / "model.safetensors")["model"]["projector"]["w"].tolist() == [
        1.0,
        2.0,
    ]
    torch.save(
        {"model": {"projector": {"w": torch.tensor([3.0])}}, "train_state": {"step": 2}}, tmp_path / "ok.pt"
    )
    ckpt = load_checkpoint_file(tmp_path / "ok.pt")
    assert ckpt["model"]["projector"]["w"].tolist() == [3.0] and ckpt["train_state"] == {"step": 2}


def test_a_pickle_of_arbitrary_objects_is_refused(tmp_path):
    """Unpickling arbitrary classes could run code: such a file is refused, not loaded."""
    import datetime

    torch.save({"model": {}, "when": datetime.date(2020, 1, 1)}, tmp_path / "objects.pt")
    with pytest.raises(ConfigError, match="Python objects other than tensors"):
        load_checkpoint_file(tmp_path / "objects.pt")
