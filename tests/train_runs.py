"""Running `vla_scripts/train.py` from tests: the command, the tiny run's flags, and reading its checkpoints.

The uninterrupted reference run (`full_run`, tests/conftest.py) is shared by every end-to-end test module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from prismatic.models.checkpoint_format import complete_checkpoints

REPO = Path(__file__).resolve().parents[1]
TRAIN = str(REPO / "vla_scripts" / "train.py")
STEPS, SAVE_EVERY = 6, 3


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


ENV = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}


def run_torchrun_worker(script: str, out_dir: Path, timeout: int) -> None:
    """`torchrun --nproc-per-node 2 SCRIPT OUT_DIR` on a free port: a test file whose `__main__` is a 2-rank gloo
    worker writing what it measured under OUT_DIR, for the test functions to compare."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", script, str(out_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def torchrun_command(nproc: int, args: list[str]) -> list[str]:
    """`torchrun --standalone --nproc-per-node N vla_scripts/train.py ARGS` with this interpreter."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    return [*cmd, "--nproc-per-node", str(nproc), TRAIN, *args]


def run_train(args: list[str], nproc: int | None = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(ENV)
    if nproc is None:
        # A plain process joins a group of one on MASTER_PORT (29500 by default): pick a free port so that
        # concurrent test runs on the same machine do not collide (torchrun --standalone picks its own).
        env["MASTER_PORT"] = str(free_port())
        cmd = [sys.executable, TRAIN, *args]
    else:
        cmd = torchrun_command(nproc, args)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def parameter_memory_line(stderr: str) -> str:
    """The start-up report's one `Parameter memory:` line (bytes per dtype, trainable share)."""
    (line,) = [line for line in stderr.splitlines() if "Parameter memory:" in line]
    return line


def tiny_args(
    data_root: Path, run_root: Path, run_id: str, *extra: str, trackers: tuple[str, ...] = ("jsonl",)
) -> list[str]:
    """The tiny preset for STEPS steps, a checkpoint every SAVE_EVERY. W&B only where a test reads what it wrote:
    starting it costs a few CPU seconds per run (its service process, and its launch module's import)."""
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
        "--trackers",
        *trackers,
        *extra,
    ]


def checkpoints(run_dir: Path) -> dict[int, Path]:
    """Complete checkpoint folders by step."""
    return {int(p.name[5:11]): p for p in complete_checkpoints(run_dir / "checkpoints")}


def consolidated(checkpoint: Path, tmp_path: Path) -> dict:
    """Everything a sharded checkpoint holds, in one process (DCP's own converter, not our reader)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp_path / f"{checkpoint.name}-{checkpoint.parent.parent.name}.pt"
    dcp_to_torch_save(checkpoint, out)
    return torch.load(out, weights_only=False)


TRAINING_KEYS = ("loss", "action_accuracy", "l1_loss", "learning_rate", "grad_norm", "frames", "epoch")


def assert_same_training_curve(expected: list[dict], got: list[dict]) -> None:
    """Bit-identical: every training metric `==` (validation and timing keys aside)."""
    assert [r["step"] for r in got] == [r["step"] for r in expected]
    for a, b in zip(expected, got, strict=True):
        for key in TRAINING_KEYS:
            assert b[key] == a[key], (a["step"], key, a[key], b[key])
