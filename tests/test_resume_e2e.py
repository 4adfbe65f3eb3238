"""Interrupted runs under torchrun on CPU: kill -9 in the middle of saves, SIGTERM, another world size, two
"nodes" on one machine, and resumes that must be refused.

The reference is an uninterrupted run of the same command (`full_run` of tests/conftest.py, 6 steps of 8
frames on 2 processes); a resumed run must reproduce its training curve bit for bit (`==`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_runs import (
    ENV,
    REPO,
    SAVE_EVERY,
    STEPS,
    TRAIN,
    assert_same_training_curve,
    checkpoints,
    consolidated,
    free_port,
    run_train,
    tiny_args,
    torchrun_command,
)

from prismatic.models.checkpoint_format import complete_checkpoints, load_checkpoint_file, newest_checkpoint
from prismatic.training.trackers import read_metrics


def start_train(args: list[str], log: Path) -> subprocess.Popen:
    """torchrun with 2 processes in its own process group (so a signal can reach all of it), output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            torchrun_command(2, args),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=ENV,
            cwd=REPO,
            start_new_session=True,
        )


def wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"training ended early ({proc.returncode}):\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.05)


def kill_9_all(launcher: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers at once. torchrun starts each worker in a session of its own, so killing
    its process group alone would leave them running (until the launcher watchdog ends them a second later)."""
    workers = [
        int(stat.name)
        for stat in Path("/proc").iterdir()
        if stat.name.isdigit() and (stat / "stat").exists() and _parent_pid(stat / "stat") == launcher.pid
    ]
    for pid in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os.killpg(launcher.pid, signal.SIGKILL)


def _parent_pid(stat_file: Path) -> int | None:
    try:
        return int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def steps_logged(run_dir: Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def test_kill_9_mid_save_then_sigterm_then_resume_reproduce_the_uninterrupted_run(
    full_run: Path, toy_data_root: Path, tmp_path: Path
):
    """One run, interrupted twice: kill -9 of the whole process group while it saves after every step, then (resumed)
    SIGTERM, then resumed to the end. The result must be the uninterrupted run's, bit for bit: every training and
    validation metric, the final weights and optimizer moments."""
    run_dir, ckpts = tmp_path / "interrupted", tmp_path / "interrupted" / "checkpoints"
    args = tiny_args(
        toy_data_root,
        tmp_path,
        "interrupted",
        "--save_interval",
        "1",
        "--checkpoint.keep_last",
        "2",
        trackers=("jsonl", "wandb"),
    )
    args += ["--eval.interval", "3", "--eval.num_batches", "1"]

    # 1. kill -9 at a random moment once the first checkpoint exists: with a save after every step it very likely
    # lands inside one. The newest complete checkpoint must load; the half-written one is cleaned up later.
    log = tmp_path / "killed.log"
    proc = start_train(args, log)
    wait_for(lambda: len(complete_checkpoints(ckpts)) >= 1, proc, log)
    time.sleep(random.Random(0).uniform(0.0, 0.3))
    assert proc.poll() is None, "the run finished before it could be killed"
    kill_9_all(proc)
    proc.wait(timeout=60)
    killed_at = load_checkpoint_file(newest_checkpoint(ckpts))["train_state"]["step"]
    assert 1 <= killed_at <= 3, killed_at
    original_config = (run_dir / "config.yaml").read_text()

    # 2. Resumed, then SIGTERM (what a cluster sends; the launcher and its workers get it): every rank finishes its
    # step, saves and exits. This part makes its batches on the prefetch thread, ahead of the loop: the data
    # snapshot it saves must still be where the loop stands (step 3 resumes it without the thread).
    log = tmp_path / "preempted.log"
    proc = start_train([*args, "--resume", "--vla.speed.prefetch_batches", "2"], log)
    # The signal arrives as the loop starts (its first line logged): the run stops after the step it is in.
    wait_for(
        lambda: f"Training steps {killed_at + 1} to {STEPS}" in log.read_text(errors="replace"), proc, log
    )
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)
    text = log.read_text()
    assert "Stopped by SIGTERM after step" in text, text[-4000:]
    # torchrun, which got the signal too, prints its own SignalException; no worker failed.
    assert "prismatic/" not in text.split("Stopped by SIGTERM")[-1] and "ChildFailedError" not in text, text[
        -4000:
    ]
    stopped_at = load_checkpoint_file(newest_checkpoint(ckpts))["train_state"]["step"]
    assert killed_at < stopped_at < STEPS and steps_logged(run_dir) == stopped_at

    # 3. Resumed to the end.
    proc = run_train([*args, "--resume"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "restored at frame" in proc.stderr and "(snapshot)" in proc.stderr
    full, again = read_metrics(full_run), read_metrics(run_dir)
    assert_same_training_curve(full, again)
    assert [r.get("val/loss") for r in again] == [r.get("val/loss") for r in full]
    end_full = consolidated(checkpoints(full_run)[STEPS], tmp_path)
    end_again = consolidated(checkpoints(run_dir)[STEPS], tmp_path)
    for name, moments in end_full["optimizer"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(end_again["optimizer"]["state"][name][key], moments[key]), name
    for key, value in end_full["model"].items():
        assert torch.equal(end_again["model"][key], value), key
    assert end_again["lr_scheduler"]["last_epoch"] == STEPS

    # keep_last 2: only the two newest remain and no half-written folder is left; the original config is kept and
    # each resume wrote its own.
    assert [p.name for p in complete_checkpoints(ckpts)] == ["step-000005-epoch-00", "step-000006-epoch-00"]
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".tmp-")]
    assert (run_dir / "config.yaml").read_text() == original_config
    assert len(list(run_dir.glob("config.resume-step-*.yaml"))) == 2
    # W&B: each of the three starts logged offline into the same W&B run (its id kept in the run folder).
    wandb_id = (run_dir / "wandb_run_id.txt").read_text().strip()
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 3 and all(p.name.endswith(f"-{wandb_id}") for p in offline), offline


def test_resume_on_one_process_continues_at_the_same_frame(
    full_run: Path, toy_data_root: Path, tmp_path: Path
):
    """2 -> 1 process: DCP reshards model and optimizer; the single rank continues after 3 x 16 = 48 frames."""
    run_dir = tmp_path / "full"
    shutil.copytree(full_run, run_dir)
    shutil.rmtree(checkpoints(run_dir)[STEPS])
    args = tiny_args(toy_data_root, tmp_path, "full", "--resume", "--vla.expected_world_size", "1")
    args += ["--vla.per_device_batch_size", "8"]
    proc = run_train(args, nproc=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "world size 2 -> 1" in proc.stderr and "restored at frame 48 (skip)" in proc.stderr, proc.stderr[
        -3000:
    ]
    records = read_metrics(run_dir)
    assert [r["frames"] for r in records] == [16 * step for step in range(1, STEPS + 1)]
    assert records[3]["learning_rate"] == read_metrics(full_run)[3]["learning_rate"]
    assert load_checkpoint_file(checkpoints(run_dir)[STEPS])["train_state"]["world_size"] == 1


def test_resume_with_another_seed_is_refused(full_run: Path, toy_data_root: Path, tmp_path: Path):
    run_dir = tmp_path / "full"
    shutil.copytree(full_run, run_dir)
    args = tiny_args(
        toy_data_root, tmp_path, "full", "--resume", "--seed", "8", "--vla.expected_world_size", "1"
    )
    proc = run_train(args, nproc=None)
    assert proc.returncode == 2
    assert "--seed 8 (the checkpoint's run used 7)" in proc.stderr and "Traceback" not in proc.stderr


def test_a_new_run_into_a_folder_with_checkpoints_is_refused_and_a_crash_before_any_is_not(
    full_run: Path,
    toy_data_root: Path,
    tmp_path: Path,
):
    run_dir = tmp_path / "full"
    shutil.copytree(full_run, run_dir)
    one = ("--vla.expected_world_size", "1")
    proc = run_train(tiny_args(toy_data_root, tmp_path, "full", *one), nproc=None)
    assert proc.returncode == 2
    assert f"newest: '{checkpoints(run_dir)[STEPS]}'" in proc.stderr and "plus --resume" in proc.stderr
    # Without a checkpoint the same command starts over, and --resume says there is nothing to resume.
    shutil.rmtree(run_dir / "checkpoints")
    proc = run_train([*tiny_args(toy_data_root, tmp_path, "full", *one), "--resume"], nproc=None)
    assert proc.returncode == 2 and "found no complete checkpoint of run 'full'" in proc.stderr


def two_node_command(node_rank: int, port: int, args: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--node_rank",
        str(node_rank),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        f"two-nodes-{port}",
        TRAIN,
        *args,
    ]


def run_two_nodes(args: list[str], tmp_path: Path, name: str) -> str:
    port = free_port()
    logs = [tmp_path / f"{name}-node{i}.log" for i in range(2)]
    procs = []
    for i, log in enumerate(logs):
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    two_node_command(i, port, args), stdout=out, stderr=subprocess.STDOUT, env=ENV, cwd=REPO
                )
            )
    for proc in procs:
        proc.wait(timeout=600)
    text = "\n".join(log.read_text() for log in logs)
    assert all(proc.returncode == 0 for proc in procs), text[-6000:]
    return text


def test_two_nodes_on_one_machine_resume_train_and_save(full_run: Path, toy_data_root: Path, tmp_path: Path):
    """torchrun --nnodes 2 (one process each, c10d rendezvous) resumes the 2-process run at step 3 on a hybrid mesh
    (2 nodes x 1 rank), trains to the end and saves. The same 16 frames per step as the 2-process run, so the same
    curve (to float rounding: the hybrid mesh all-reduces what the flat one reduce-scatters), and the checkpoint the
    two nodes wrote is whole: DCP's converter reads every parameter and moment back in one process."""
    run_dir = tmp_path / "full"
    shutil.copytree(full_run, run_dir)
    shutil.rmtree(checkpoints(run_dir)[STEPS])
    args = tiny_args(
        toy_data_root, tmp_path, "full", "--resume", "--eval.interval", "3", "--eval.num_batches", "1"
    )
    text = run_two_nodes(args, tmp_path, "resumed")
    assert "FSDP mesh: hybrid, 2 nodes (replicate) x 1 ranks (shard)" in text
    assert "(snapshot)" in text and f"Training steps {SAVE_EVERY + 1} to {STEPS}" in text, text[-3000:]
    full, again = read_metrics(full_run), read_metrics(run_dir)
    assert [r["step"] for r in again] == list(range(1, STEPS + 1))
    assert [r["frames"] for r in again] == [r["frames"] for r in full]
    for a, b in zip(full[SAVE_EVERY:], again[SAVE_EVERY:], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (a["step"], a["loss"], b["loss"])
    assert sorted(checkpoints(run_dir)) == [SAVE_EVERY, STEPS]
    (tmp_path / "ours").mkdir()
    (tmp_path / "reference").mkdir()
    ours = consolidated(checkpoints(run_dir)[STEPS], tmp_path / "ours")
    reference = consolidated(checkpoints(full_run)[STEPS], tmp_path / "reference")
    assert ours["model"].keys() == reference["model"].keys()
    assert ours["optimizer"]["state"].keys() == reference["optimizer"]["state"].keys()
    for key, value in reference["model"].items():
        torch.testing.assert_close(ours["model"][key], value, rtol=1e-4, atol=1e-5, msg=key)
    assert load_checkpoint_file(checkpoints(run_dir)[STEPS])["train_state"]["step"] == STEPS


def test_a_lora_run_resumes_across_ddp_and_fsdp2_bit_for_bit(toy_data_root: Path, tmp_path: Path):
    """`--vla.train_strategy auto` trains a LoRA run on GPUs under DDP where DDP fits every GPU and under FSDP2
    where it does not (and trained it under FSDP2 before `auto`, or on several GPUs before 2026-11-28), so a
    checkpoint moves between the two.
    One process, FP32: DDP 3 steps (the reference); resumed from step 1 under FSDP2, then from step 2 under DDP,
    the curve is the reference's, `==`."""
    one = ["--vla.expected_world_size", "1", "--vla.per_device_batch_size", "16"]
    args = tiny_args(toy_data_root, tmp_path, "lora", *one)
    args[1] = "tiny-lora+mx-toy"
    args[args.index("--vla.max_steps") + 1], args[args.index("--save_interval") + 1] = "3", "1"
    proc = run_train([*args, "--vla.train_strategy", "ddp"], nproc=None)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    reference = read_metrics(tmp_path / "lora")
    assert [r["step"] for r in reference] == [1, 2, 3]

    for strategy, from_step, source in (("fsdp-full-shard", 1, "lora"), ("ddp", 2, "lora-fsdp-full-shard")):
        run_id = f"lora-{strategy}"
        shutil.copytree(tmp_path / source, tmp_path / run_id)
        for step, folder in checkpoints(tmp_path / run_id).items():
            if step > from_step:
                shutil.rmtree(folder)
        run_args = [*args, "--resume", "--vla.train_strategy", strategy]
        run_args[run_args.index("--run_id") + 1] = run_id
        proc = run_train(run_args, nproc=None)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        assert f"at step {from_step}," in proc.stderr, proc.stderr[-3000:]
        assert ("FSDP mesh:" in proc.stderr) is (
            strategy == "fsdp-full-shard"
        )  # the strategy it resumed under
        assert_same_training_curve(reference, read_metrics(tmp_path / run_id))
