"""End to end: `torchrun --nproc-per-node 2 vla_scripts/train.py` on the toy mixture, then resume.

The resumed run must reproduce the uninterrupted run exactly: same per-step losses and learning rates after
the resume point, and the same final weights and optimizer moments. That can only hold if the model, optimizer,
LR schedule and data position were all restored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prismatic.training.trackers import read_metrics

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "vla_scripts" / "train.py")
STEPS, SAVE_EVERY = 6, 3


def run_train(args: list[str], nproc: int | None = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}
    if nproc is None:
        cmd = [sys.executable, TRAIN, *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(nproc),
            TRAIN,
            *args,
        ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def tiny_args(data_root: Path, run_root: Path, run_id: str, *extra: str) -> list[str]:
    return [
        "--vla.type",
        "tiny+mx-toy",
        "--data_root_dir",
        str(data_root),
        "--run_root_dir",
        str(run_root),
        "--run_id",
        run_id,
        "--vla.max_steps",
        str(STEPS),
        "--save_interval",
        str(SAVE_EVERY),
        *extra,
    ]


def checkpoints(run_dir: Path) -> dict[int, Path]:
    return {int(p.name[5:11]): p for p in (run_dir / "checkpoints").glob("step-*.pt")}


@pytest.fixture(scope="module")
def full_run(toy_data_root: Path, tmp_path_factory) -> Path:
    run_root = tmp_path_factory.mktemp("runs")
    proc = run_train(tiny_args(toy_data_root, run_root, "full"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return run_root / "full"


def test_run_folder_contents(full_run: Path):
    config = json.loads((full_run / "config.json").read_text())
    assert config["vla"]["type"] == "tiny+mx-toy" and config["vla"]["max_steps"] == STEPS
    assert (full_run / "config.yaml").read_text().startswith("vla:")

    stats = json.loads((full_run / "dataset_statistics.json").read_text())
    assert set(stats) == {"toy_pick_place", "toy_push"}
    for entry in stats.values():
        assert {"mean", "std", "min", "max", "q01", "q99", "mask"} <= set(entry["action"])
        assert len(entry["action"]["q99"]) == 7 and entry["num_transitions"] > 0

    records = read_metrics(full_run)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for key in (
        "loss",
        "action_accuracy",
        "l1_loss",
        "learning_rate",
        "step_time_s",
        "samples_per_s",
        "toy_pick_place/action_accuracy",
        "toy_push/l1_loss",
    ):
        assert key in records[-1], key
    assert records[-1]["loss"] < records[0]["loss"]

    assert sorted(checkpoints(full_run)) == [3, 6]
    wandb_id = (full_run / "wandb_run_id.txt").read_text().strip()
    offline = list((full_run / "wandb").glob(f"offline-run-*-{wandb_id}"))
    assert len(offline) == 1 and (offline[0] / f"run-{wandb_id}.wandb").stat().st_size > 0


def test_checkpoint_loads_without_distributed_setup(full_run: Path):
    from prismatic.models import build_vlm

    ckpt = torch.load(checkpoints(full_run)[6], map_location="cpu", weights_only=True)
    assert set(ckpt["model"]) == {"vision_backbone", "projector", "llm_backbone"}
    assert ckpt["train_state"]["step"] == 6 and ckpt["train_state"]["world_size"] == 2
    vlm = build_vlm("tiny-vit+tiny-llama")
    flat = {f"{m}.{k}": v for m, sd in ckpt["model"].items() for k, v in sd.items()}
    result = vlm.load_state_dict(flat, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert all(v.dtype == torch.float32 for v in flat.values())


def test_resume_continues_exactly_like_an_uninterrupted_run(
    full_run: Path, toy_data_root: Path, tmp_path: Path
):
    # A copy of the run as it stood after step 3 (later checkpoints removed, logs kept: they must be cut back).
    resumed = tmp_path / "resumed"
    shutil.copytree(full_run, resumed)
    for step, path in checkpoints(resumed).items():
        if step > SAVE_EVERY:
            path.unlink()
    ckpt = checkpoints(resumed)[SAVE_EVERY]
    args = tiny_args(
        toy_data_root,
        tmp_path,
        "ignored",
        "--pretrained_checkpoint",
        str(ckpt),
        "--resume_step",
        str(SAVE_EVERY),
        "--resume_epoch",
        ckpt.name[18:20],
    )
    args[args.index("--run_id") : args.index("--run_id") + 2] = []  # resume into the checkpoint's run folder
    proc = run_train(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    full, again = read_metrics(full_run), read_metrics(resumed)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1))  # log continued, not restarted
    for a, b in zip(full[SAVE_EVERY:], again[SAVE_EVERY:], strict=True):
        assert b["learning_rate"] == pytest.approx(a["learning_rate"], rel=1e-12)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
        assert b["action_accuracy"] == pytest.approx(a["action_accuracy"], abs=1e-9)

    end_full = torch.load(checkpoints(full_run)[STEPS], weights_only=True)
    end_again = torch.load(checkpoints(resumed)[STEPS], weights_only=True)
    for name, moments in end_full["optimizer"]["state"].items():
        assert int(end_again["optimizer"]["state"][name]["step"]) == STEPS
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                end_again["optimizer"]["state"][name][key], moments[key], rtol=1e-4, atol=1e-7
            )
    for module, sd in end_full["model"].items():
        for key, value in sd.items():
            torch.testing.assert_close(end_again["model"][module][key], value, rtol=1e-4, atol=1e-6)
    assert end_again["lr_scheduler"]["last_epoch"] == STEPS
    assert (resumed / "wandb_run_id.txt").read_text() == (full_run / "wandb_run_id.txt").read_text()


def test_restored_optimizer_state_equals_the_saved_one(full_run: Path, tmp_path: Path):
    """Load a checkpoint into a fresh model + optimizer the way resume does, and read the state back."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from prismatic.models import build_vlm
    from prismatic.training.checkpointing import Checkpointer, load_checkpoint_file
    from prismatic.training.optim import build_lr_scheduler, build_optimizer

    path = checkpoints(full_run)[SAVE_EVERY]
    ckpt = load_checkpoint_file(path)
    vlm = build_vlm("tiny-vit+tiny-llama")
    vlm.freeze_backbones("vla-full-train")
    opt = build_optimizer(vlm, 1e-3, 0.01)
    sched = build_lr_scheduler(opt, "linear-warmup+cosine-decay", STEPS, 0.1)
    Checkpointer.load_model_weights(vlm, ckpt, path)
    state = Checkpointer.load_training_state(vlm, opt, sched, ckpt, path)
    assert state["step"] == SAVE_EVERY and state["samples_per_rank"] == SAVE_EVERY * 8
    restored = get_optimizer_state_dict(vlm, opt, options=StateDictOptions(full_state_dict=True))
    for name, saved in ckpt["optimizer"]["state"].items():
        assert torch.equal(restored["state"][name]["exp_avg"], saved["exp_avg"])
        assert torch.equal(restored["state"][name]["exp_avg_sq"], saved["exp_avg_sq"])
        assert float(restored["state"][name]["step"]) == SAVE_EVERY
    assert sched.last_epoch == SAVE_EVERY
    assert sched.get_last_lr()[0] == pytest.approx(read_metrics(full_run)[SAVE_EVERY]["learning_rate"])


def test_ddp_with_gradient_accumulation_matches_fsdp(full_run: Path, toy_data_root: Path, tmp_path: Path):
    """DDP, 2 micro-batches of 4 per step: the same samples per step as FSDP's 1 x 8, so the same losses."""
    proc = run_train(
        tiny_args(
            toy_data_root,
            tmp_path,
            "ddp",
            "--vla.train_strategy",
            "ddp",
            "--vla.per_device_batch_size",
            "4",
            "--vla.max_steps",
            "3",
            "--save_interval",
            "100",
        )
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ddp, fsdp = read_metrics(tmp_path / "ddp"), read_metrics(full_run)
    assert [r["step"] for r in ddp] == [1, 2, 3]
    # lr differs (3-step vs 6-step cosine), so only step 1 is comparable exactly; later steps stay close.
    assert ddp[0]["loss"] == pytest.approx(fsdp[0]["loss"], rel=1e-4)
    assert ddp[0]["action_accuracy"] == pytest.approx(fsdp[0]["action_accuracy"], abs=1e-9)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--vla.type", "tiny+mx-tyo"], "Unknown --vla.type 'tiny+mx-tyo'. Did you mean 'tiny+mx-toy'?"),
        (["--vla.type", "tiny+mx-toy", "--data_root_dir", "/nonexistent/data"], "expected_world_size=2"),
        (
            [
                "--vla.type",
                "tiny+mx-toy",
                "--vla.expected_world_size",
                "1",
                "--vla.global_batch_size",
                "8",
                "--data_root_dir",
                "/nonexistent/data",
            ],
            "data_root_dir '/nonexistent/data' does not exist",
        ),
    ],
)
def test_bad_input_exits_with_a_clear_message(args, message):
    proc = run_train(args, nproc=None)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_resume_step_mismatch_is_a_clear_error(full_run: Path, toy_data_root: Path, tmp_path: Path):
    ckpt = checkpoints(full_run)[SAVE_EVERY]
    proc = run_train(
        [
            "--vla.type",
            "tiny+mx-toy",
            "--vla.expected_world_size",
            "1",
            "--vla.global_batch_size",
            "8",
            "--data_root_dir",
            str(toy_data_root),
            "--pretrained_checkpoint",
            str(ckpt),
            "--resume_step",
            "4",
            "--resume_epoch",
            "0",
        ],
        nproc=None,
    )
    assert proc.returncode == 2
    assert f"do not match checkpoint '{ckpt.name}'" in proc.stderr and "Traceback" not in proc.stderr


def test_mixture_dataset_missing_from_data_root_is_a_clear_error(toy_data_root: Path, tmp_path: Path):
    partial = tmp_path / "data"
    partial.mkdir()
    (partial / "toy_pick_place").symlink_to(toy_data_root / "toy_pick_place")
    proc = run_train(
        [
            "--vla.type",
            "tiny+mx-toy",
            "--vla.expected_world_size",
            "1",
            "--vla.global_batch_size",
            "8",
            "--data_root_dir",
            str(partial),
            "--run_root_dir",
            str(tmp_path / "runs"),
        ],
        nproc=None,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "toy_push" in proc.stderr and "Traceback" not in proc.stderr


def test_fused_backbone_shard_grad_op_bf16_last_layer(toy_data_root: Path, tmp_path: Path):
    """The other code paths: fused DINO+SigLIP backbone, ZeRO-2 sharding, bf16 mixed precision, frozen stages."""
    proc = run_train(
        [
            "--vla.type",
            "tiny-dinosiglip+mx-toy",
            "--data_root_dir",
            str(toy_data_root),
            "--run_root_dir",
            str(tmp_path),
            "--run_id",
            "fused",
            "--vla.max_steps",
            "2",
            "--vla.train_strategy",
            "fsdp-shard-grad-op",
            "--vla.enable_mixed_precision_training",
            "true",
            "--vla.freeze_vision_backbone",
            "true",
            "--vla.freeze_llm_backbone",
            "true",
            "--vla.unfreeze_last_llm_layer",
            "true",
            "--trackers",
            "[jsonl]",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    records = read_metrics(tmp_path / "fused")
    assert len(records) == 2 and all(r["loss"] == r["loss"] for r in records)  # finite, not NaN
    ckpt = torch.load(checkpoints(tmp_path / "fused")[2], weights_only=True)
    assert all(t.dtype == torch.float32 for sd in ckpt["model"].values() for t in sd.values())
    trained = set(ckpt["optimizer"]["state"])
    assert trained and all(name.startswith("llm_backbone.") for name in trained)
