"""`vla_scripts/eval_libero.py` end to end on CPU: the tiny OFT LIBERO preset trained on the LIBERO-shaped toy data,
then evaluated in the simulator (1 task, 2 episodes, 12 policy steps): OpenVLA-OFT's inputs (wrist view, proprio,
whole chunks) and the report in process on one simulator, the same episodes on two simulators through `serve.py`
behind a token, and bad input refused in one paragraph with exit code 2.

Simulators cost seconds of CPU each (LIBERO builds its scene at start and rebuilds it at every reset), so the module
runs two evaluations: one simulator in process, two behind the server; their episodes must agree, which covers both
"the same for 1 and 2 simulators" and "the server gives the in-process episodes"."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import numpy as np
import pytest
import torch  # noqa: F401  (torch before TensorFlow in this process)
from scripts import import_script
from served import served
from train_runs import free_port, run_train

from prismatic.vla.datasets.rlds.toy import build_libero_toy_datasets

SMOKE = ["--task_suite", "libero_spatial", "--tasks", "0", "--num_trials_per_task", "2", "--max_steps", "12"]


@pytest.fixture(scope="module")
def libero_run(libero_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny-oft+libero_spatial` (8-action chunks, proprio, wrist image, image augmentation), 2 steps on the
    LIBERO-shaped toy data."""
    root = tmp_path_factory.mktemp("libero_runs")
    build_libero_toy_datasets(root / "data", suites=("spatial",))
    args = [
        "--vla.type",
        "tiny-oft+libero_spatial",
        "--vla.max_steps",
        "2",
        "--data_root_dir",
        str(root / "data"),
    ]
    args += ["--run_root_dir", str(root / "runs"), "--run_id", "oft", "--trackers", "jsonl"]
    proc = run_train(args, nproc=None)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root / "runs" / "oft"


def _script_main():
    return import_script("eval_libero").main


def evaluate(args: list[str], out_dir: Path) -> dict:
    """Run the script's `main` in this process (torch and TensorFlow already loaded) and read its report."""
    assert _script_main()([*args, "--out_dir", str(out_dir)]) == 0
    return json.loads((out_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def in_process(libero_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The run evaluated in this process with one simulator, W&B (offline) and jsonl on, and a video per episode:
    (report, its folder)."""
    out = tmp_path_factory.mktemp("in_process")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")  # W&B never needs a login in tests
        flags = ["--checkpoint", str(libero_run), *SMOKE, "--num_envs", "1", "--save_videos"]
        return evaluate([*flags, "--trackers", "jsonl", "wandb"], out), out


def episode_table(report: dict) -> list[tuple]:
    """What the success table is made of, per episode."""
    return [(e["task_id"], e["episode"], e["success"], e["steps"]) for e in report["episodes"]]


def assert_same_episodes(got: dict, expected: dict) -> None:
    """The same success table; the same trajectories: a continuous head's actions within float rounding of a
    different batch size (the end effector within 0.1 mm)."""
    assert episode_table(got) == episode_table(expected)
    for a, b in zip(got["episodes"], expected["episodes"], strict=True):
        assert np.allclose(a["final_eef_pos"], b["final_eef_pos"], rtol=0, atol=1e-4)


def test_chunk_head_rollout_reads_ofts_inputs_and_reports(in_process: tuple[dict, Path]) -> None:
    one, one_dir = in_process
    assert [e["episode"] for e in one["episodes"]] == [0, 1]
    # 10 settling steps + 12 policy steps, unless the (untrained) policy succeeded first.
    assert all(e["steps"] == 22 or e["success"] for e in one["episodes"])
    # Two different initial states give two different episodes.
    assert one["episodes"][0]["actions_digest"] != one["episodes"][1]["actions_digest"]
    assert one["protocol"] == {
        "unnorm_key": "libero_spatial_no_noops",
        "center_crop": True,  # the preset trains with image augmentation
        "image_size": [64, 64],  # tiny-vit-64px
        "num_images": 2,  # agent view + wrist
        "proprio": True,
        "open_loop_steps": 8,  # the whole chunk, as OpenVLA-OFT
        "max_steps": 12,
        "num_steps_wait": 10,
    }
    assert one["overall"]["episodes"] == 2 and one["tasks"][0]["task_id"] == 0
    records = [json.loads(line) for line in (one_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]  # one per episode, then the total
    assert records[-1]["success_rate"] == one["overall"]["success_rate"]
    # W&B (offline in tests) wrote its run into the evaluation folder.
    (offline,) = (one_dir / "wandb").glob("offline-run-*")
    assert sum(f.stat().st_size for f in offline.glob("run-*.wandb")) > 0
    # --save_videos: one mp4 per episode, named by task, episode and outcome.
    videos = sorted(p.name for p in (one_dir / "videos").iterdir())
    assert videos == [f"task00-episode0{i}-success={e['success']}.mp4" for i, e in enumerate(one["episodes"])]
    assert all((one_dir / "videos" / name).stat().st_size > 1000 for name in videos)


def test_two_simulators_behind_a_token_give_the_in_process_episodes_of_one(
    libero_run: Path, in_process: tuple[dict, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`serve.py --auth_token_env` on the chunk-head run (wrist view, proprio), driven by `--policy_url` with
    `--policy_auth_token_env` and two simulators: the server answers no request without the token, the wrist view or
    the proprio, and its chunks give the episodes of one simulator in process (the same table however many
    simulators run, and through the server), one query per chunk of 8 policy steps."""
    import requests

    token = secrets.token_urlsafe(32)
    monkeypatch.setenv("LIBERO_TEST_CLIENT_TOKEN", token)
    args = ["--checkpoint", str(libero_run), "--auth_token_env", "LIBERO_TEST_SERVER_TOKEN"]
    with served(args, tmp_path / "serve.log", env={"LIBERO_TEST_SERVER_TOKEN": token}) as url:
        remote_flags = ["--policy_url", url, "--policy_auth_token_env", "LIBERO_TEST_CLIENT_TOKEN"]
        remote = evaluate([*remote_flags, *SMOKE, "--num_envs", "2"], tmp_path / "remote")
        served_requests = requests.get(f"{url}/health", timeout=30).json()["requests_served"]
    local, _ = in_process
    assert_same_episodes(remote, local)
    # The server told the client what the run trained with: the same protocol either way.
    assert remote["protocol"] == local["protocol"]
    assert served_requests == sum(-(-(e["steps"] - 10) // 8) for e in remote["episodes"])
    assert token not in (tmp_path / "serve.log").read_text()


def refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """The script's `main` in this process must exit 2 with one paragraph and no traceback (its command line's
    exit code is tests/test_cli_errors.py's catalogue's)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        _script_main()(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_bad_input_is_one_paragraph(
    libero_run: Path, libero_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """What needs a run or the machine to find out (flag mistakes are in tests/test_cli_errors.py's catalogue)."""
    run = str(libero_run)
    with monkeypatch.context() as patch:
        patch.setenv("MUJOCO_GL", "glfw")
        text = refused(["--checkpoint", run, "--tasks", "0"], capsys)
    assert "MUJOCO_GL=glfw" in text and "egl, osmesa" in text
    text = refused(["--checkpoint", run, "--task_suite", "libero_goal", "--tasks", "0"], capsys)
    assert "libero_goal" in text and "libero_spatial_no_noops" in text  # the keys it has
    port = free_port()  # nothing listens there
    text = refused(["--policy_url", f"http://127.0.0.1:{port}", "--tasks", "0"], capsys)
    assert f"127.0.0.1:{port}" in text and "serve.py" in text
