"""A run folder holds no token, the files the tool writes respect the umask, and a resume cannot change the run.

One real 2-step training run (one process, tiny preset, toy data, W&B offline) is given a Hugging Face token both
as `--hf_token` and as `$HF_TOKEN`; neither may appear in any file of the run folder (config.yaml, config.json,
W&B's offline files) or in its logs. The run is made under umask 022: every file the tool writes must come out
0644 (group-readable), not 0600. Resuming its checkpoint with another `--seed` must be refused in one paragraph.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scripts import import_script
from train_runs import free_port

from prismatic.util.files import atomic_write, current_umask, normal_permissions, write_json_atomic
from prismatic.util.redact import REDACTED, redact_argv, redact_config

REPO = Path(__file__).resolve().parents[1]
FLAG_TOKEN = "hf_FlagSecretToken1234567890abcdefXYZ"
ENV_TOKEN = "hf_EnvSecretToken0987654321zyxwvuABC"
WRITTEN_BY_THE_TOOL = (
    "config.yaml",
    "config.json",
    "dataset_statistics.json",
    "metrics.jsonl",
    "wandb_run_id.txt",
)


def _train(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    """`python vla_scripts/train.py ARGS` as one process under umask 022, with $HF_TOKEN set, W&B offline."""
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "HF_TOKEN": ENV_TOKEN,
        "HF_HOME": str(tmp / "hf_home"),  # no token store of the machine's user
        "MASTER_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.run(
        [sys.executable, str(REPO / "vla_scripts" / "train.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=600,
        preexec_fn=lambda: os.umask(0o022),
    )


def _tiny(data_root: Path, run_root: Path, *extra: str) -> list[str]:
    return [
        "--vla.type",
        "tiny+mx-toy",
        "--vla.expected_world_size",
        "1",
        "--vla.global_batch_size",
        "8",
        "--vla.shuffle_buffer_size",
        "100",
        "--data_root_dir",
        str(data_root),
        "--run_root_dir",
        str(run_root),
        *extra,
    ]


@pytest.fixture(scope="module")
def secret_run(toy_data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("secret_run")
    args = _tiny(toy_data_root, tmp / "runs", "--run_id", "r", "--vla.max_steps", "2", "--save_interval", "2")
    proc = _train([*args, "--hf_token", FLAG_TOKEN, "--trackers", "jsonl", "wandb"], tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return tmp / "runs" / "r", proc.stdout + proc.stderr


def test_run_folder_and_logs_hold_no_token(secret_run: tuple[Path, str]) -> None:
    run_dir, logs = secret_run
    files = [p for p in run_dir.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.suffix == ".wandb" for p in files) and (run_dir / "config.yaml").is_file()
    for path in files:
        content = path.read_bytes()
        for token in (FLAG_TOKEN, ENV_TOKEN):
            assert token.encode() not in content, f"token found in {path}"
    for token in (FLAG_TOKEN, ENV_TOKEN):
        assert token not in logs
    assert "hf_token: null" in (run_dir / "config.yaml").read_text()
    # W&B still records the command line, with the secret's value redacted.
    assert REDACTED.encode() in next(p for p in files if p.suffix == ".wandb").read_bytes()


def test_files_the_tool_writes_are_group_readable(secret_run: tuple[Path, str], toy_data_root: Path) -> None:
    run_dir, _ = secret_run
    checkpoint_files = sorted(p for p in run_dir.glob("checkpoints/**/*") if p.is_file())
    # Per checkpoint: DCP's .metadata and one shard file per rank, train_state.json, each rank's data snapshot.
    assert {p.name for p in checkpoint_files} >= {"latest", ".metadata", "__0_0.distcp", "train_state.json"}
    written = [run_dir / name for name in WRITTEN_BY_THE_TOOL] + checkpoint_files
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644, f"{path}: {oct(path.stat().st_mode)}"
    caches = sorted(toy_data_root.glob("*/*/dataset_statistics_*.json"))
    assert caches and all(p.stat().st_mode & 0o044 == 0o044 for p in caches)  # written under pytest's umask


def test_resume_with_another_seed_is_refused(secret_run: tuple[Path, str], toy_data_root: Path) -> None:
    run_dir, _ = secret_run
    (checkpoint,) = run_dir.glob("checkpoints/step-000002-*")
    args = _tiny(toy_data_root, run_dir.parent, "--resume", str(checkpoint))
    proc = _train([*args, "--seed", "8"], run_dir.parent)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Refusing to resume" in proc.stderr and "--seed 8 (the checkpoint's run used 7)" in proc.stderr
    assert "--allow_config_change true" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_respect_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    previous = os.umask(umask)
    try:
        with atomic_write(tmp_path / "a.bin", "test file") as f:
            f.write(b"x")
        write_json_atomic(tmp_path / "b.json", {"a": 1}, "test file")
    finally:
        os.umask(previous)
    for name in ("a.bin", "b.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode


def test_library_written_files_get_normal_permissions(tmp_path: Path) -> None:
    """safetensors' `save_file` (HF export shards) creates 0600 files; `normal_permissions` gives them 0644."""
    import torch
    from safetensors.torch import save_file

    previous = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        path = tmp_path / "model.safetensors"
        save_file({"w": torch.zeros(2)}, str(path))
        normal_permissions(path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_converter_output_is_group_readable(tmp_path: Path) -> None:
    module = import_script("convert_to_rlds")
    episodes = tmp_path / "episodes"
    episodes.mkdir()
    for i in range(2):
        np.savez(
            episodes / f"ep{i}.npz",
            image=np.zeros((3, 8, 8, 3), np.uint8),
            action=np.zeros((3, 7), np.float32),
            instruction=np.array("wave"),
        )
    previous = os.umask(0o022)
    try:
        target = module.convert(episodes, tmp_path / "rlds", "mine")
    finally:
        os.umask(previous)
    paths = [tmp_path / "rlds" / "mine", *target.parent.rglob("*")]
    for path in paths:
        expected = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == expected, f"{path}: {oct(path.stat().st_mode)}"


def test_redaction_helpers() -> None:
    argv = ["--hf_token", FLAG_TOKEN, "--export.hf_token=abc", "--seed", "7", "--hf_token_note", "x"]
    assert redact_argv(argv) == [
        "--hf_token",
        REDACTED,
        f"--export.hf_token={REDACTED}",
        "--seed",
        "7",
        "--hf_token_note",
        "x",
    ]
    config = {"hf_token": FLAG_TOKEN, "vla": {"hf_token": "x", "seed": 1}, "seed": 7}
    assert redact_config(config) == {"hf_token": None, "vla": {"hf_token": None, "seed": 1}, "seed": 7}


def test_hf_token_defaults_to_the_environment_and_hf_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    from prismatic.conf.train import TrainConfig

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))  # not the machine user's store
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN", ENV_TOKEN)
    assert TrainConfig().resolve_hf_token() == ENV_TOKEN
    monkeypatch.setenv("MY_TOKEN_VAR", FLAG_TOKEN)
    assert TrainConfig(hf_token="MY_TOKEN_VAR").resolve_hf_token() == FLAG_TOKEN
    assert TrainConfig(hf_token=FLAG_TOKEN).resolve_hf_token() == FLAG_TOKEN
    monkeypatch.delenv("HF_TOKEN")
    assert TrainConfig().resolve_hf_token() is None
    (tmp_path / "token").write_text("hf_StoredByHuggingfaceCliLogin")  # what `huggingface-cli login` writes
    assert TrainConfig().resolve_hf_token() == "hf_StoredByHuggingfaceCliLogin"
